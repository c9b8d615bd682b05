"""How much does one ``ReplayBuffer.add`` of one transition cost, next to Stable-Baselines3's ``add``?

One transition per call (``num_envs=1``, inputs shaped ``[1, ...]`` as a VecEnv of one env
returns them): obs 48 float32, action 4 float32, reward, terminated, truncated. Buffers of
100,000 rows are filled with random transitions first, so every add overwrites a stored row.

Peers, all in this process:

* ``rlbuf-mem-t`` / ``rlbuf-mem-np``: ``ReplayBuffer(storage="memory")`` fed torch tensors /
  numpy arrays; ``rlbuf-mmap-t`` / ``rlbuf-mmap-np``: the same with ``storage="memmap"``.
  Every validation runs (shape, dtype kind and range, device, finiteness).
* ``sb3``: Stable-Baselines3's ``ReplayBuffer.add`` (``handle_timeout_termination=False``)
  fed numpy arrays, as a VecEnv gives them; it validates nothing.

Targets (issue 20): torch input ≤ 2.5× SB3, numpy input ≤ 1.5× SB3. Each table gives the
median µs per call over rounds in which every peer runs in turn (see ``_timing.py``), timed by
this thread's CPU time: the machine these run on is shared, and wall time also counts the time
other processes hold the cores (``--wall`` times by the wall clock). Figures still move by about
10% between runs.

Where a torch add's time goes: every field is read by its ``RowReader`` (``rlbuf/spec.py``) and
written with one numpy assignment into the storage's numpy view. ``Tensor.numpy()`` alone costs
about 0.7 µs per array field and ``tolist()`` 0.2 µs per scalar field, so three array fields
cost about 2 µs before any check, most of SB3's whole add. The six fields are read and written by
six direct calls, not a loop (``rlbuf/_one_row.py``: 1–1.5 µs less). A numpy array of the stored
dtype and shape is taken as it is.

One torch thread. Run from the repository root::

    PYTHONPATH=. python benchmarks/add.py           # about 30 seconds
    PYTHONPATH=. python benchmarks/add.py --quick   # a smoke run
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import time
from collections.abc import Callable
from functools import partial

import numpy as np
import torch
from _timing import print_table, time_interleaved
from gymnasium import spaces
from stable_baselines3.common.buffers import ReplayBuffer as Sb3Buffer
from tensordict import TensorDict

from rlbuf import ReplayBuffer

_FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")
_TARGETS = {"t": 2.5, "np": 1.5}


def transitions(rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    obs = rng.standard_normal((rows, 48), dtype=np.float32)
    terminated = rng.random(rows) < 0.01
    return {"obs": obs, "action": rng.uniform(-1, 1, (rows, 4)).astype(np.float32),
            "reward": rng.standard_normal(rows, dtype=np.float32),
            "next_obs": rng.standard_normal((rows, 48), dtype=np.float32),
            "terminated": terminated, "truncated": ~terminated & (rng.random(rows) < 0.01)}


def filled_rlbuf(capacity: int, storage: str, fill: dict[str, np.ndarray]) -> ReplayBuffer:
    buf = ReplayBuffer(capacity, obs_shape=(48,), action_shape=(4,), storage=storage, seed=0)  # type: ignore[arg-type]
    t = {name: torch.from_numpy(value) for name, value in fill.items()}
    buf.extend(TensorDict({
        "observation": t["obs"], "action": t["action"],
        ("next", "observation"): t["next_obs"], ("next", "reward"): t["reward"].unsqueeze(-1),
        ("next", "terminated"): t["terminated"].unsqueeze(-1), ("next", "truncated"): t["truncated"].unsqueeze(-1),
    }, batch_size=[capacity]))
    return buf


def filled_sb3(capacity: int, fill: dict[str, np.ndarray]) -> Sb3Buffer:
    sb3 = Sb3Buffer(capacity, spaces.Box(-np.inf, np.inf, (48,), np.float32), spaces.Box(-1, 1, (4,), np.float32),
                    device="cpu", handle_timeout_termination=False)
    sb3.observations[:] = fill["obs"].reshape(sb3.observations.shape)
    sb3.next_observations[:] = fill["next_obs"].reshape(sb3.next_observations.shape)
    sb3.actions[:] = fill["action"].reshape(sb3.actions.shape)
    sb3.rewards[:] = fill["reward"].reshape(sb3.rewards.shape)
    sb3.dones[:] = (fill["terminated"] | fill["truncated"]).reshape(sb3.dones.shape)
    sb3.full, sb3.pos = True, 0
    return sb3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 10,000 rows, 3 rounds")
    parser.add_argument("--wall", action="store_true",
                        help="time by the wall clock (default: this thread's CPU time, see the module)")
    args = parser.parse_args()
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    capacity, repeats, number = (10_000, 3, 256) if args.quick else (100_000, 41, 1024)
    versions = ", ".join(f"{name} {importlib.metadata.version(name)}"
                         for name in ("torch", "torchrl", "numpy", "stable-baselines3"))
    print(f"rlbuf add benchmark: one transition per call, obs (48,) float32; {versions}; 1 torch thread; "
          f"median of {repeats} interleaved rounds of {number} calls, {'wall' if args.wall else 'CPU'} time")
    rng = np.random.default_rng(0)
    fill = transitions(capacity, rng)
    step = transitions(1, rng)
    np_values = [step[name] for name in _FIELDS]
    torch_values = [torch.from_numpy(value.copy()) for value in np_values]
    memory, memmap = filled_rlbuf(capacity, "memory", fill), filled_rlbuf(capacity, "memmap", fill)
    sb3 = filled_sb3(capacity, fill)
    peers: dict[str, Callable[[], object]] = {
        "rlbuf-mem-t": partial(memory.add, *torch_values),
        "rlbuf-mem-np": partial(memory.add, *np_values),
        "rlbuf-mmap-t": partial(memmap.add, *torch_values),
        "rlbuf-mmap-np": partial(memmap.add, *np_values),
        "sb3": partial(sb3.add, step["obs"], step["next_obs"], step["action"], step["reward"],
                       step["terminated"] | step["truncated"], [{}]),
    }
    try:
        medians = time_interleaved(peers, repeats=repeats, number=number,
                                   clock=time.perf_counter if args.wall else time.thread_time)
    finally:
        memmap.close()
    print_table("add 1 · obs (48,) float32", medians, [name for name in peers if name.startswith("rlbuf")])
    print("\ntargets (rlbuf time ÷ SB3 time)")
    for name in peers:
        if name.startswith("rlbuf"):
            target = _TARGETS[name.rsplit("-", 1)[1]]
            ratio = medians[name] / medians["sb3"]
            print(f"  {'PASS' if ratio <= target else 'MISS'}  {name:<14} ≤ {target}× SB3   ratio {ratio:.2f}")


if __name__ == "__main__":
    main()
