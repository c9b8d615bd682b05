"""nox sessions: `tests` (lint, types, tests, doctests, doc examples), `stress`, `demo`, `demos-full`, `docs`,
`bench`, and `compat` (the tests against TorchRL's and tensordict's nightly builds).

Every session installs through constraints-cpu.txt, which pins the CPU torch wheel present on
these machines, so no session downloads a CUDA build.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

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


@nox.session(python=PYTHON)
def stress(session: nox.Session) -> None:
    """Long repetitions of the attack suites (races, SIGKILL during saves): `nox -s stress`.

    RLBUF_STRESS_REPEATS sets the repetitions (default 20), e.g.
    `RLBUF_STRESS_REPEATS=100 nox -s stress`; extra arguments go to pytest.
    """
    _install(session, "dev")
    session.run("pytest", "-q", "-s", "-p", "no:cacheprovider", "-m", "stress", "tests", *session.posargs)


@nox.session(python=PYTHON)
def compat(session: nox.Session) -> None:
    """The test suite against the nightly builds of TorchRL and tensordict (not part of CI).

    Installs `torchrl-nightly` and `tensordict-nightly` from PyPI with the CPU torch still pinned
    by constraints-cpu.txt (so no CUDA build is pulled), rlbuf's other dependencies, then rlbuf
    itself with `--no-deps` (its `torchrl<0.15` pin would refuse the nightlies), and runs the tests.
    A TorchRL change that breaks an assumption of rlbuf fails in tests/test_torchrl_seam.py first.
    Extra arguments go to pytest: `nox -s compat -- -x tests/test_replay.py`.
    """
    import tomllib

    torch_pin = next(line for line in Path("constraints-cpu.txt").read_text().splitlines()
                     if line.startswith("torch=="))
    pin = Path(session.create_tmp()) / "torch-only.txt"
    pin.write_text(f"{torch_pin}\n")
    session.install("-c", str(pin), "torch")
    try:
        session.install("-c", str(pin), "torchrl-nightly", "tensordict-nightly")
    except nox.command.CommandFailed:
        session.error(f"torchrl-nightly/tensordict-nightly do not install next to the pinned CPU {torch_pin} "
                      "(pip's message above says what they require, e.g. a newer torch); "
                      "not pulling a CUDA build of torch to find out")
    with open("pyproject.toml", "rb") as file:
        project = tomllib.load(file)["project"]
    ours = ("torch", "torchrl", "tensordict")
    requirements = [r for r in project["dependencies"] if re.split(r"[<>=!~ \[;]", r, maxsplit=1)[0] not in ours]
    session.install("-c", str(pin), *requirements, *project["optional-dependencies"]["test"])
    session.install("--no-deps", "-e", ".")
    session.run("python", "-c", "import torch, torchrl, tensordict; "
                "print('torch', torch.__version__, '| torchrl', torchrl.__version__, '| tensordict', tensordict.__version__)")
    session.run("pytest", "-q", "-p", "no:cacheprovider", *(session.posargs or ["tests"]))
