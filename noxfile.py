"""nox sessions: `tests` (lint, type check, tests, doctests, README/docs examples) and `demo`.

Every session installs through constraints-cpu.txt, which pins the CPU torch wheel present on
these machines, so no session downloads a CUDA build.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["tests"]
nox.options.default_venv_backend = "venv"

PYTHON = "3.11"
CONSTRAINTS = ("-c", "constraints-cpu.txt")


def _install(session: nox.Session, extras: str) -> None:
    # torch first, alone and pinned: pip then never considers a CUDA build for it.
    session.install(*CONSTRAINTS, "torch")
    session.install(*CONSTRAINTS, "-e", f".[{extras}]")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Lint, strict type check, the test suite, doctests, and every README/docs example."""
    _install(session, "dev")
    session.run("ruff", "check", "rlbuf", "tests", "benchmarks", "noxfile.py")
    session.run("mypy", "rlbuf")
    session.run("pytest", "-q", "-p", "no:cacheprovider", "tests", "--doctest-modules", "rlbuf", *session.posargs)


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The main job: a short replay-buffer training loop (see examples/)."""
    _install(session, "demo")
    session.run("python", "examples/replay_quickstart.py", *session.posargs)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks against the peers (not part of CI): `nox -s bench -- replay`."""
    _install(session, "dev,bench")
    for name in session.posargs or ["replay"]:
        session.run("python", f"benchmarks/{name}.py")
