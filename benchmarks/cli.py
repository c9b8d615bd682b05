"""How long does each ``rlbuf ... --help`` take, in a fresh interpreter, as a user types it?

Each command runs as ``python -m rlbuf ARGS --help`` in a new process (output discarded), so
a sample is what a user waits for: interpreter start, ``site`` (with rlbuf's editable-install
finder, when installed so), the imports the command needs and argparse. Peers, for scale:

* ``python -c pass``: the floor, an interpreter that imports nothing of its own;
* ``python -c "import torch"``: what every ``--help`` that imported torch paid on top (before
  issue 21, ``rlbuf demo ppo --help`` imported the demo's module: torch, TorchRL, gymnasium).

Each round runs every command once, in a rotating order, and the table gives the median over
rounds (the machines are small and busy: a burst of load lands on all commands alike), the
median less the floor, whether the command imported torch (checked once, in its own process,
from ``sys.modules``), and the verdict against issue 21's target of 0.5 s.

Run from the repository root::

    PYTHONPATH=. python benchmarks/cli.py              # 7 rounds, about 30 seconds
    PYTHONPATH=. python benchmarks/cli.py --repeats 15
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 0.5
"""Issue 21: every ``--help`` answers in under half a second."""

COMMANDS = {
    "rlbuf --help": ["--help"],
    "rlbuf demo --help": ["demo", "--help"],
    "rlbuf demo ppo --help": ["demo", "ppo", "--help"],
    "rlbuf demo dqn --help": ["demo", "dqn", "--help"],
    "rlbuf demo ppo-continuous --help": ["demo", "ppo-continuous", "--help"],
    "rlbuf demo distill --help": ["demo", "distill", "--help"],
    "rlbuf inspect --help": ["inspect", "--help"],
}
PEERS = {
    "python -c pass": ["-c", "pass"],
    "python -c 'import torch'": ["-c", "import torch"],
}


def _environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _argv(name: str) -> list[str]:
    return [sys.executable, *(PEERS[name] if name in PEERS else ["-m", "rlbuf", *COMMANDS[name]])]


def run_once(argv: list[str], env: dict[str, str]) -> float:
    """Seconds from starting ``argv`` to its exit (it must exit 0)."""
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=ROOT, check=True)
    return time.perf_counter() - start


def imports_torch(args: list[str], env: dict[str, str]) -> bool:
    """Whether ``rlbuf ARGS`` imports torch (run once in its own interpreter)."""
    probe = ("import runpy, sys\n"
             f"sys.argv = ['rlbuf', *{args!r}]\n"
             "try:\n    runpy.run_module('rlbuf', run_name='__main__')\nexcept SystemExit:\n    pass\n"
             "print('torch' in sys.modules, file=sys.stderr)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=ROOT,
                            check=True)
    return result.stderr.strip().splitlines()[-1] == "True"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="rounds (default: 7)")
    options = parser.parse_args()
    env = _environment()
    names = [*PEERS, *COMMANDS]
    for name in names:  # warm up: bytecode caches, the page cache
        run_once(_argv(name), env)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(options.repeats):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(run_once(_argv(name), env))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    floor = medians["python -c pass"]
    width = max(len(name) for name in names)
    print(f"median of {options.repeats} fresh processes each, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}, python {sys.version.split()[0]}")
    print(f"{'command':<{width}}  {'ms':>7}  {'- floor':>7}  {'torch?':>6}  target {TARGET_S * 1000:.0f} ms")
    for name in names:
        torch_loaded = "yes" if name in PEERS and "torch" in name else (
            "no" if name in PEERS else ("yes" if imports_torch(COMMANDS[name], env) else "no"))
        verdict = "" if name in PEERS else ("ok" if medians[name] < TARGET_S else "SLOW")
        print(f"{name:<{width}}  {medians[name] * 1000:7.0f}  {(medians[name] - floor) * 1000:7.0f}  "
              f"{torch_loaded:>6}  {verdict}")


if __name__ == "__main__":
    main()
