"""nox sessions: `tests` (lint, types, tests, doctests, doc examples), `stress`, `demo`, `demos-full`, `pendulum-compare`,
`her-compare`, `docs`,
`bench`, `compat` (the tests against TorchRL's and tensordict's nightly builds); on a GPU machine `gpu`,
fed by `gpu-wheels` on a networked one (see docs/devices.md).

Every session but `gpu` installs through constraints-cpu.txt, which pins the CPU torch wheel
present on these machines, so no session downloads a CUDA build; `gpu` reuses the GPU machine's.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

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
    # Two workers (the CI machine's two cores), each test file on one worker: a file's module fixtures (a
    # local Ray cluster) start once. `nox -s tests -- -n 0` runs in one process.
    session.run("pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile", "tests",
                "--doctest-modules", "rlbuf", *session.posargs)


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The main job: PPO on CartPole-v1 until the last 20 episodes average 475 (under a minute).

    Extra arguments go to the command: `nox -s demo -- --seed 2 --out runs/ppo`.
    """
    _install(session)
    session.run("rlbuf", "demo", "ppo", *session.posargs)


@nox.session(name="demos-full", python=PYTHON)
def demos_full(session: nox.Session) -> None:
    """Every demo with its default budget: PPO, DQN, DQN with PER, distillation of the PPO run, PPO on
    Pendulum, and DQN on bit flipping with and without hindsight."""
    _install(session)
    runs = f"runs/full-{time.strftime('%Y%m%d-%H%M%S')}"
    session.run("rlbuf", "demo", "ppo", "--out", f"{runs}/ppo", *session.posargs)
    session.run("rlbuf", "demo", "dqn", "--out", f"{runs}/dqn", *session.posargs)
    session.run("rlbuf", "demo", "dqn", "--prioritized", "--out", f"{runs}/dqn-per", *session.posargs)
    session.run("rlbuf", "demo", "distill", "--teacher", f"{runs}/ppo", "--out", f"{runs}/distill", *session.posargs)
    session.run("rlbuf", "demo", "ppo-continuous", "--out", f"{runs}/ppo-continuous", *session.posargs)
    session.run("rlbuf", "demo", "her", "--out", f"{runs}/her", *session.posargs)
    session.run("rlbuf", "demo", "her", "--no-hindsight", "--out", f"{runs}/her-no-hindsight", *session.posargs)
    session.log(f"all outputs in {runs}/ (curve.png, summary.json, model.pt, checkpoints/ in each)")


@nox.session(name="pendulum-compare", python=PYTHON)
def pendulum_compare(session: nox.Session) -> None:
    """PPO on Pendulum-v1, bootstrapped timeouts against CleanRL's folded done, over seeds, in one figure.

    `nox -s pendulum-compare -- --seeds 5` (default 3 seeds each, one run after the other).
    """
    _install(session)
    session.run("python", "-m", "rlbuf.demos.ppo_continuous", "compare", "--seeds", "3",
                "--out", f"runs/pendulum-compare-{time.strftime('%Y%m%d-%H%M%S')}", *session.posargs)


@nox.session(name="her-compare", python=PYTHON)
def her_compare(session: nox.Session) -> None:
    """DQN on 15-bit flipping with and without hindsight relabelling, over seeds, in one figure.

    `nox -s her-compare -- --seeds 5` (default 3 seeds each, one run after the other).
    """
    _install(session)
    session.run("python", "-m", "rlbuf.demos.her", "compare", "--seeds", "3",
                "--out", f"runs/her-compare-{time.strftime('%Y%m%d-%H%M%S')}", *session.posargs)


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
    ours = ("torch", "torchrl", "tensordict")
    requirements = [r for r in _project_requirements(("test",)) if re.split(r"[<>=!~ \[;]", r, maxsplit=1)[0] not in ours]
    session.install("-c", str(pin), *requirements)
    session.install("--no-deps", "-e", ".")
    session.run("python", "-c", "import torch, torchrl, tensordict; "
                "print('torch', torch.__version__, '| torchrl', torchrl.__version__, '| tensordict', tensordict.__version__)")
    session.run("pytest", "-q", "-p", "no:cacheprovider", *(session.posargs or ["tests"]))


# -- GPU machine ----------------------------------------------------------------------------------
GPU_EXTRAS = ("test", "gpu")
MANYLINUX_X86_64 = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
                    "manylinux2014_x86_64", "manylinux1_x86_64")


def _options(posargs: list[str], defaults: dict[str, str | None],
             flags: tuple[str, ...] = ()) -> tuple[dict[str, str | None], list[str]]:
    """``--name value`` options named in ``defaults`` and ``flags`` (set to ``"yes"``) out of
    ``posargs``, and the other arguments in order."""
    options: dict[str, str | None] = {**defaults, **dict.fromkeys(flags)}
    rest, args = [], list(posargs)
    while args:
        arg = args.pop(0)
        name, _, value = arg.partition("=")
        if arg in flags:
            options[arg] = "yes"
        elif name in defaults:
            options[name] = value or (args.pop(0) if args else None)
        else:
            rest.append(arg)
    return options, rest


def _project_requirements(extras: tuple[str, ...]) -> list[str]:
    """rlbuf's dependencies and those of ``extras`` (``rlbuf[x]`` inside an extra expanded)."""
    import tomllib

    with open("pyproject.toml", "rb") as file:
        pyproject = tomllib.load(file)
    project, pending, seen = pyproject["project"], list(extras), set()
    requirements = [*project["dependencies"], *pyproject["build-system"]["requires"]]
    while pending:
        extra = pending.pop()
        if extra not in seen:
            seen.add(extra)
            for requirement in project["optional-dependencies"][extra]:
                if requirement.startswith("rlbuf["):
                    pending.extend(requirement.removeprefix("rlbuf[").removesuffix("]").split(","))
                else:
                    requirements.append(requirement)
    return requirements


def _comes_with_torch(name: str) -> bool:
    """Packages the GPU machine's own CUDA build of torch provides (never downloaded or installed)."""
    name = name.lower().replace("_", "-")
    return name in ("torch", "triton") or name.startswith(("nvidia-", "cuda-"))


@nox.session(name="gpu-wheels", python=False)
def gpu_wheels(session: nox.Session) -> None:
    """On a networked machine, download the wheels `nox -s gpu` installs on an offline GPU machine.

    `nox -s gpu-wheels -- .whl` resolves rlbuf's dependencies with the test and gpu extras, its
    build requirements and nox itself for CPython 3.12 on manylinux x86_64, next to the GPU
    machine's torch 2.11 (so every version chosen works with it), and downloads them all but
    torch and its CUDA libraries. Change the target with `--python-version`, `--torch`
    (a release prefix) and `--platform` (comma-separated tags; every manylinux level of
    x86_64 by default, since pip matches each tag exactly).
    """
    options, rest = _options(session.posargs, {"--python-version": "3.12", "--torch": "2.11",
                                               "--platform": ",".join(MANYLINUX_X86_64)})
    if len(rest) != 1:
        session.error("usage: nox -s gpu-wheels -- DIR [--python-version 3.12] [--torch 2.11] "
                      "[--platform TAG[,TAG...]]")
    target = Path(rest[0]).resolve()
    # pip takes a wheel only if one of its tags is named exactly: each manylinux level, not the newest alone.
    platforms = [arg for tag in str(options["--platform"]).split(",") for arg in ("--platform", tag)]
    binary = ["--only-binary=:all:", "--python-version", str(options["--python-version"]), *platforms]
    scratch = Path(session.create_tmp())
    report = scratch / "resolution.json"
    session.run(sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                "--target", str(scratch / "unused"), "--report", str(report), *binary,
                *_project_requirements(GPU_EXTRAS), f"torch=={options['--torch']}.*", "nox")
    resolved = [item["metadata"] for item in json.loads(report.read_text())["install"]]
    pins = [f"{meta['name']}=={meta['version']}" for meta in resolved if not _comes_with_torch(meta["name"])]
    session.run(sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(target),
                *binary, *pins)
    session.log(f"{len(pins)} wheels in {target} (torch {options['--torch']} and its CUDA libraries left out). "
                f"On the GPU machine: python3 -m pip install --no-index --find-links {rest[0]} nox, then "
                f"python3 -m nox -s gpu -- --wheels {rest[0]}")


def _cuda_problem() -> str | None:
    """Why this machine cannot run the `gpu` session (the torch nox runs with, as the session sees it)."""
    try:
        import torch
    except ImportError:
        return (f"`nox -s gpu` reuses the machine's CUDA build of torch, but {sys.executable} cannot import "
                f"torch: run nox with the Python that has it (python3 -m nox -s gpu ...)")
    if not torch.cuda.is_available():
        return (f"CUDA is not available to torch {torch.__version__} at {sys.executable}: `nox -s gpu` runs "
                f"the CUDA tests and the GPU benchmarks and needs a GPU. On a machine without one, run "
                f"`nox -s tests` and `python benchmarks/gpu.py --device cpu`, or rehearse this session's "
                f"steps with `nox -s gpu -- --rehearse`")
    return None


# A venv with --system-site-packages sees the machine's torch (a CUDA build that pip must never
# replace) while everything installed here stays out of the machine's own environment.
@nox.session(venv_params=["--system-site-packages"])
def gpu(session: nox.Session) -> None:
    """The CUDA tests and the GPU benchmarks, on a GPU machine: `python3 -m nox -s gpu -- --wheels .whl`.

    Reuses the machine's torch; installs rlbuf and its other dependencies from the wheel folder
    made by `nox -s gpu-wheels` (`--wheels DIR`, offline) or from the package index. Runs every
    test marked `gpu` and `benchmarks/gpu.py --device cuda` (other arguments go to the
    benchmark). `--rehearse` runs the same steps on a machine without CUDA: the CUDA tests are
    skipped and the benchmark runs `--device cpu --quick`.
    """
    options, bench_args = _options(session.posargs, {"--wheels": None}, flags=("--rehearse",))
    problem = _cuda_problem()
    if problem is not None and not (options["--rehearse"] and problem.startswith("CUDA is not available")):
        session.error(problem)
    import torch

    if sys.prefix != sys.base_prefix:
        # nox itself runs in a virtualenv, whose packages --system-site-packages does not reach:
        # point the session's venv at the directory holding this torch instead.
        site_packages = next(Path(session.virtualenv.location).glob("lib/python*/site-packages"))
        (site_packages / "machine-torch.pth").write_text(f"{Path(torch.__file__).parents[1]}\n")
    wheels = options["--wheels"]
    index = ["--no-index", "--find-links", str(Path(wheels).resolve())] if wheels else []
    session.install(*index, "-e", f".[{','.join(GPU_EXTRAS)}]")
    session.run("python", "-c", "import sys, torch, torchrl, tensordict; "
                "print(f'torch {torch.__version__} (CUDA {torch.version.cuda}) from {torch.__file__}; "
                "torchrl {torchrl.__version__}; tensordict {tensordict.__version__}; "
                "device: {torch.cuda.get_device_name() if torch.cuda.is_available() else None}'); "
                f"sys.exit(0 if torch.__version__ == {torch.__version__!r} else 'the session sees another torch')")
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "-rs", "tests")
    device = ["--device", "cpu", "--quick"] if problem is not None else ["--device", "cuda"]
    session.run("python", "benchmarks/gpu.py", *device, *bench_args)
