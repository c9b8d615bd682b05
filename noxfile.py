"""nox sessions: `tests` (lint, types, tests, doctests, doc examples), `demo`, `demos-full`, `pendulum-compare`, `docs`.

Every session installs through constraints-cpu.txt, which pins the CPU torch wheel present on
these machines, so no session downloads a CUDA build.
"""

from __future__ import annotations

import time

import nox

nox.options.sessions = ["tests"]
nox.options.default_venv_backend = "venv"

PYTHON = "3.11"
CONSTRAINTS = ("-c", "constraints-cpu.txt")


def _install(session: nox.Session, extras: str = "") -> None:
    # torch first, alone and pinned: pip then never considers a CUDA build for it.
    session.install(*CONSTRAINTS, "torch")
    session.install(*CONSTRAINTS, "-e", f".[{extras}]" if extras else ".")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Lint, strict type check, the test suite, doctests, and every README/docs example."""
    _install(session, "dev,ray")
    session.run("ruff", "check", "rlbuf", "tests", "benchmarks", "noxfile.py")
    session.run("mypy", "rlbuf")
    session.run("pytest", "-q", "-p", "no:cacheprovider", "tests", "--doctest-modules", "rlbuf", *session.posargs)


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The main job: PPO on CartPole-v1 until the last 20 episodes average 475 (under a minute).

    Extra arguments go to the command: `nox -s demo -- --seed 2 --out runs/ppo`.
    """
    _install(session)
    session.run("rlbuf", "demo", "ppo", *session.posargs)


@nox.session(name="demos-full", python=PYTHON)
def demos_full(session: nox.Session) -> None:
    """Every demo with its default budget: PPO, DQN, DQN with PER, and distillation of the PPO run."""
    _install(session)
    runs = f"runs/full-{time.strftime('%Y%m%d-%H%M%S')}"
    session.run("rlbuf", "demo", "ppo", "--out", f"{runs}/ppo", *session.posargs)
    session.run("rlbuf", "demo", "dqn", "--out", f"{runs}/dqn", *session.posargs)
    session.run("rlbuf", "demo", "dqn", "--prioritized", "--out", f"{runs}/dqn-per", *session.posargs)
    session.run("rlbuf", "demo", "distill", "--teacher", f"{runs}/ppo", "--out", f"{runs}/distill", *session.posargs)
    session.run("rlbuf", "demo", "ppo-continuous", "--out", f"{runs}/ppo-continuous", *session.posargs)
    session.log(f"all outputs in {runs}/ (curve.png, summary.json, model.pt, checkpoints/ in each)")


@nox.session(name="pendulum-compare", python=PYTHON)
def pendulum_compare(session: nox.Session) -> None:
    """PPO on Pendulum-v1, bootstrapped timeouts against CleanRL's folded done, over seeds, in one figure.

    `nox -s pendulum-compare -- --seeds 5` (default 3 seeds each, one run after the other).
    """
    _install(session)
    session.run("python", "-m", "rlbuf.demos.ppo_continuous", "compare", "--seeds", "3",
                "--out", f"runs/pendulum-compare-{time.strftime('%Y%m%d-%H%M%S')}", *session.posargs)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks against the peers (not part of CI): `nox -s bench -- replay`."""
    _install(session, "dev,bench")
    for name in session.posargs or ["replay"]:
        session.run("python", f"benchmarks/{name}.py")


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Build the documentation site into site/, warnings as errors: `nox -s docs`.

    The API reference is read from the source by griffe (static analysis), so neither rlbuf
    nor torch is installed here: only the `docs` extra. The code blocks of the pages are run
    by the `tests` session (tests/test_docs.py).
    """
    import tomllib

    with open("pyproject.toml", "rb") as file:
        requirements = tomllib.load(file)["project"]["optional-dependencies"]["docs"]
    session.install(*requirements)
    session.run("mkdocs", "build", "--strict", "--site-dir", "site", *session.posargs,
                env={"NO_MKDOCS_2_WARNING": "1"})
