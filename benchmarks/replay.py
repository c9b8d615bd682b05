"""How fast is rlbuf's ReplayBuffer at add and sample, next to the buffers people use instead?

Measured, per observation type (48 float32 values; an 84x84x4 uint8 Atari frame):

* ``add 1``: one transition per call (``num_envs=1``, inputs shaped ``[1, ...]`` as a VecEnv
  of one env returns them).
* ``add 64``: 64 transitions per call (``num_envs=64``).
* ``sample 256`` and ``sample 4096``: one batch drawn uniformly from a full buffer.
* ``add 1 + sample 256``: one step of a DQN/SAC loop (rlbuf's sample reads the pending rows in
  place, computing their ``done``; TorchRL's bookkeeping waits for the next commit).

Peers, all in this process, on full buffers (prefilled before timing, so adds overwrite):

* ``rlbuf-mem`` / ``rlbuf-mmap``: :class:`rlbuf.ReplayBuffer` with ``storage="memory"`` /
  ``"memmap"``; adds are timed twice, fed torch tensors (``-t``) and numpy arrays (``-np``).
* ``torchrl``: ``TensorDictReplayBuffer(storage=LazyTensorStorage(capacity))``; ``extend`` of a
  prebuilt TensorDict of 1 or 64 rows, ``sample(n)`` (returns a TensorDict).
* ``sb3``: Stable-Baselines3 ``ReplayBuffer`` (``handle_timeout_termination=False``: it stores
  one ``done`` flag, as cpprb does here; rlbuf stores ``terminated`` and ``truncated`` and
  derives ``done``), fed numpy arrays as from a VecEnv; ``sample(n)`` returns torch tensors.
* ``cpprb``: cpprb ``ReplayBuffer`` with a ``done`` field; ``sample(n)`` returns numpy arrays.

Actions are ``(4,)`` float32 with 48-value observations and a discrete int64 index with
images. Each table gives the median µs per call over rounds in which every peer runs in turn
(see ``_timing.py``), and rlbuf's time divided by each peer's: below 1 means rlbuf is faster.
A "targets" section at the end checks rlbuf's performance goals (DESIGN.md).

One torch thread. Run from the repository root::

    PYTHONPATH=. python benchmarks/replay.py           # about 1 minute on 2 cores
    PYTHONPATH=. python benchmarks/replay.py --quick   # smoke run, a few seconds
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
from _timing import print_table, time_interleaved
from cpprb import ReplayBuffer as CpprbBuffer
from gymnasium import spaces
from stable_baselines3.common.buffers import ReplayBuffer as Sb3Buffer
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

from rlbuf import ReplayBuffer

_FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")


@dataclass(frozen=True)
class Case:
    """One observation type and how long to time it."""

    label: str
    obs_shape: tuple[int, ...]
    obs_dtype: torch.dtype
    discrete: bool
    capacity: int
    repeats: int
    number: dict[str, int]  # calls per peer per round, by op; rlbuf stages 256 rows, so
    # add counts are whole blocks: every peer's round pays the same share of flushes.


def cases(quick: bool) -> list[Case]:
    if quick:
        return [
            Case("obs (48,) float32", (48,), torch.float32, False, 20_000, 3,
                 {"add 1": 256, "add 64": 8, "sample 256": 16, "sample 4096": 4, "step": 16}),
            Case("obs (84, 84, 4) uint8", (84, 84, 4), torch.uint8, True, 2_000, 3,
                 {"add 1": 256, "add 64": 4, "sample 256": 2, "sample 4096": 1, "step": 4}),
        ]
    return [
        Case("obs (48,) float32", (48,), torch.float32, False, 100_000, 31,
             {"add 1": 512, "add 64": 64, "sample 256": 64, "sample 4096": 16, "step": 64}),
        Case("obs (84, 84, 4) uint8", (84, 84, 4), torch.uint8, True, 20_000, 11,
             {"add 1": 256, "add 64": 8, "sample 256": 8, "sample 4096": 1, "step": 16}),
    ]


# -- data ----------------------------------------------------------------------------------
def transitions(case: Case, rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``rows`` transitions as numpy arrays in VecEnv layout (``obs`` and ``next_obs`` share data)."""
    if case.obs_dtype == torch.uint8:
        # Random frames are costly to draw; a block of them tiled is as good for timing.
        block = rng.integers(0, 256, (min(rows, 1024), *case.obs_shape), dtype=np.uint8)
        obs = np.resize(block, (rows, *case.obs_shape))
    else:
        obs = rng.standard_normal((rows, *case.obs_shape), dtype=np.float32)
    if case.discrete:
        action = rng.integers(0, 18, rows, dtype=np.int64)
    else:
        action = rng.uniform(-1, 1, (rows, 4)).astype(np.float32)
    terminated = rng.random(rows) < 0.01
    return {"obs": obs, "action": action, "reward": rng.standard_normal(rows, dtype=np.float32),
            "next_obs": obs, "terminated": terminated, "truncated": ~terminated & (rng.random(rows) < 0.01)}


def as_tensordict(data: dict[str, np.ndarray]) -> TensorDict:
    """The transitions in TorchRL layout (scalars, and discrete actions, get a trailing 1)."""
    t = {name: torch.from_numpy(value) for name, value in data.items()}
    rows = t["obs"].shape[0]
    action = t["action"].unsqueeze(-1) if t["action"].dim() == 1 else t["action"]
    return TensorDict({
        "observation": t["obs"],
        "action": action,
        "next": {
            "observation": t["next_obs"],
            "reward": t["reward"].unsqueeze(-1),
            "terminated": t["terminated"].unsqueeze(-1),
            "truncated": t["truncated"].unsqueeze(-1),
            "done": (t["terminated"] | t["truncated"]).unsqueeze(-1),
        },
    }, batch_size=[rows])


# -- peers ---------------------------------------------------------------------------------
class Buffers:
    """Every peer's buffer for one case and ``num_envs``, full of the same transitions."""

    def __init__(self, case: Case, num_envs: int, fill: dict[str, np.ndarray]) -> None:
        action_shape: tuple[int, ...] = () if case.discrete else (4,)
        action_dtype = torch.int64 if case.discrete else torch.float32
        common: dict[str, Any] = dict(obs_shape=case.obs_shape, action_shape=action_shape, num_envs=num_envs,
                                      obs_dtype=case.obs_dtype, action_dtype=action_dtype, seed=0)
        fill_td = as_tensordict(fill)
        self.rlbuf_mem = ReplayBuffer(case.capacity, storage="memory", **common)
        self.rlbuf_mmap = ReplayBuffer(case.capacity, storage="memmap", **common)
        self.rlbuf_mem.extend(fill_td)
        self.rlbuf_mmap.extend(fill_td)

        self.torchrl = TensorDictReplayBuffer(storage=LazyTensorStorage(case.capacity))
        self.torchrl.extend(fill_td)

        np_obs_dtype = np.uint8 if case.obs_dtype == torch.uint8 else np.float32
        low, high = (0, 255) if case.obs_dtype == torch.uint8 else (-np.inf, np.inf)
        obs_space = spaces.Box(low, high, case.obs_shape, np_obs_dtype)
        act_space = spaces.Discrete(18) if case.discrete else spaces.Box(-1, 1, (4,), np.float32)
        self.sb3 = Sb3Buffer(case.capacity, obs_space, act_space, device="cpu", n_envs=num_envs,
                             handle_timeout_termination=False)
        steps = self.sb3.buffer_size  # SB3 keeps capacity // num_envs steps of num_envs rows
        rows = steps * num_envs
        self.sb3.observations[:] = fill["obs"][:rows].reshape(self.sb3.observations.shape)
        self.sb3.next_observations[:] = fill["next_obs"][:rows].reshape(self.sb3.next_observations.shape)
        self.sb3.actions[:] = fill["action"][:rows].reshape(self.sb3.actions.shape)
        self.sb3.rewards[:] = fill["reward"][:rows].reshape(steps, num_envs)
        self.sb3.dones[:] = (fill["terminated"] | fill["truncated"])[:rows].reshape(steps, num_envs)
        self.sb3.full, self.sb3.pos = True, 0

        act: dict[str, Any] = {"dtype": np.int64} if case.discrete else {"shape": 4}
        self.cpprb = CpprbBuffer(case.capacity, env_dict={
            "obs": {"shape": case.obs_shape, "dtype": np_obs_dtype}, "act": act, "rew": {},
            "next_obs": {"shape": case.obs_shape, "dtype": np_obs_dtype}, "done": {}})
        self.cpprb.add(**cpprb_kwargs(fill))

    def close(self) -> None:
        self.rlbuf_mmap.close()


def cpprb_kwargs(data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"obs": data["obs"], "act": data["action"], "rew": data["reward"], "next_obs": data["next_obs"],
            "done": data["terminated"] | data["truncated"]}


def add_peers(buffers: Buffers, step: dict[str, np.ndarray]) -> dict[str, Callable[[], object]]:
    """One add of ``step``'s rows into each peer, from its natural input type."""
    np_values = [step[name] for name in _FIELDS]
    torch_values = [torch.from_numpy(value) for value in np_values]
    done = step["terminated"] | step["truncated"]
    infos: list[dict[str, Any]] = [{} for _ in range(len(done))]
    return {
        "rlbuf-mem-t": partial(buffers.rlbuf_mem.add, *torch_values),
        "rlbuf-mem-np": partial(buffers.rlbuf_mem.add, *np_values),
        "rlbuf-mmap-t": partial(buffers.rlbuf_mmap.add, *torch_values),
        "rlbuf-mmap-np": partial(buffers.rlbuf_mmap.add, *np_values),
        "torchrl": partial(buffers.torchrl.extend, as_tensordict(step)),
        "sb3": partial(buffers.sb3.add, step["obs"], step["next_obs"], step["action"], step["reward"], done,
                       infos),
        "cpprb": partial(buffers.cpprb.add, **cpprb_kwargs(step)),
    }


def sample_peers(buffers: Buffers, batch_size: int) -> dict[str, Callable[[], object]]:
    return {
        "rlbuf-mem": partial(buffers.rlbuf_mem.sample, batch_size),
        "rlbuf-mmap": partial(buffers.rlbuf_mmap.sample, batch_size),
        "torchrl": partial(buffers.torchrl.sample, batch_size),
        "sb3": partial(buffers.sb3.sample, batch_size),
        "cpprb": partial(buffers.cpprb.sample, batch_size),
    }


def then(first: Callable[[], object], second: Callable[[], object]) -> Callable[[], object]:
    def both() -> object:
        first()
        return second()
    return both


# -- running -------------------------------------------------------------------------------
def run_case(case: Case, results: dict[tuple[str, str], dict[str, float]], rng: np.random.Generator) -> None:
    fill = transitions(case, case.capacity, rng)
    for num_envs in (1, 64):
        op = f"add {num_envs}"
        buffers = Buffers(case, num_envs, fill)
        try:
            adds = add_peers(buffers, transitions(case, num_envs, rng))
            results[op, case.label] = time_interleaved(adds, repeats=case.repeats, number=case.number[op])
            print_table(f"{op} · {case.label}", results[op, case.label],
                        [name for name in adds if name.startswith("rlbuf")])
            if num_envs == 1:
                for batch_size in (256, 4096):
                    op = f"sample {batch_size}"
                    samples = sample_peers(buffers, batch_size)
                    results[op, case.label] = time_interleaved(samples, repeats=case.repeats,
                                                               number=case.number[op])
                    print_table(f"{op} · {case.label}", results[op, case.label], ["rlbuf-mem", "rlbuf-mmap"])
                samples = sample_peers(buffers, 256)
                steps = {name: then(adds[name if name in adds else name + "-t"], sample)
                         for name, sample in samples.items()}
                medians = time_interleaved(steps, repeats=case.repeats, number=case.number["step"])
                print_table(f"add 1 + sample 256 · {case.label}", medians, ["rlbuf-mem", "rlbuf-mmap"])
        finally:
            buffers.close()
            del buffers
            gc.collect()


def print_targets(results: dict[tuple[str, str], dict[str, float]]) -> None:
    print("\ntargets (rlbuf memory storage; ratio = rlbuf time ÷ peer time)")
    for label in dict.fromkeys(label for _, label in results):
        add1, s256, s4096 = (results[op, label] for op in ("add 1", "sample 256", "sample 4096"))
        checks = [
            ("add 1, torch input   ≤ 2× SB3", add1["rlbuf-mem-t"] / add1["sb3"], 2.0),
            ("add 1, numpy input   ≤ 2× SB3", add1["rlbuf-mem-np"] / add1["sb3"], 2.0),
            ("add 1, torch input   ≥ 10× faster than raw TorchRL", add1["rlbuf-mem-t"] / add1["torchrl"], 0.1),
            ("sample 256           ≤ 1× SB3", s256["rlbuf-mem"] / s256["sb3"], 1.0),
            ("sample 4096          ≤ 0.5× SB3", s4096["rlbuf-mem"] / s4096["sb3"], 0.5),
        ]
        print(f"  {label}")
        for what, ratio, limit in checks:
            print(f"    {'PASS' if ratio <= limit else 'MISS'}  {what:<52} ratio {ratio:.3f} (≤ {limit:g})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repeats and small buffers: a smoke run")
    args = parser.parse_args()
    logging.getLogger("torchrl").setLevel(logging.WARNING)  # storage-initialised notices
    torch.set_num_threads(1)
    torch.manual_seed(0)
    np.random.seed(0)  # SB3 samples from numpy's global generator
    versions = ", ".join(f"{name} {importlib.metadata.version(name)}"
                         for name in ("torch", "torchrl", "tensordict", "stable_baselines3", "cpprb", "numpy"))
    print(f"rlbuf replay benchmark{' (--quick)' if args.quick else ''}: {versions}; 1 torch thread")
    print("tables: median µs per call; 'X ÷' columns: X's time divided by the row's (< 1: X is faster)")
    started = time.perf_counter()
    results: dict[tuple[str, str], dict[str, float]] = {}
    rng = np.random.default_rng(0)
    for case in cases(args.quick):
        run_case(case, results, rng)
    print_targets(results)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
