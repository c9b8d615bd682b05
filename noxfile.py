"""nox sessions: `tests` (lint, types, tests, doctests, doc examples), `demo`, `demos-full`, `docs`.

Every session installs through constraints-cpu.txt, which pins the CPU torch wheel present on
these machines, so no session downloads a CUDA build.
"""

from __future__ import annotations

import shutil
import subprocess
import time

import nox

nox.options.sessions = ["tests"]
nox.options.default_venv_backend = "venv"

CONSTRAINTS = ("-c", "constraints-cpu.txt")
# The supported range, as in pyproject.toml (requires-python, classifiers) and the docs.
SUPPORTED_PYTHONS = ("3.11", "3.12", "3.13")


def first_python(versions: tuple[str, ...] = SUPPORTED_PYTHONS) -> str | None:
    """The first of ``versions`` whose ``pythonX.Y`` runs here (a pyenv shim may name a missing one)."""
    for version in versions:
        found = shutil.which(f"python{version}")
        if found and subprocess.run([found, "-c", ""], capture_output=True, check=False).returncode == 0:
            return version
    return None


# Every session runs on the first supported interpreter found. Naming one version would make
# nox report a missing interpreter as "skipped" and exit 0; with none at all, nox fails here.
PYTHON = first_python()
if PYTHON is None:
    raise SystemExit(f"noxfile.py: no supported Python on PATH: rlbuf needs Python {SUPPORTED_PYTHONS[0]} to "
                     f"{SUPPORTED_PYTHONS[-1]} (looked for {', '.join('python' + v for v in SUPPORTED_PYTHONS)})")


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
    session.log(f"all outputs in {runs}/ (curve.png, summary.json, model.pt, checkpoints/ in each)")


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
