"""How much memory does a pixel transition take, and how fast is it sampled, next to the peers?

Atari-shaped data: ``4×84×84`` uint8 frame stacks (gymnasium's ``FrameStackObservation``,
newest frame last), random frames (never zeros: a buffer never written is backed by the
kernel's shared zero page), int64 actions, episodes of random length ending by termination or
truncation. For each peer: bytes per stored transition (what its arrays take, divided by its
capacity) and the median µs of ``sample(32)`` and ``sample(256)`` on a full buffer.

Peers, each in this process, filled through its own API:

* ``sb3``: Stable-Baselines3 ``ReplayBuffer`` storing ``obs`` and ``next_obs``
  (``handle_timeout_termination=True``: truncations bootstrap correctly).
* ``sb3-optimized``: ``optimize_memory_usage=True`` (``next_obs`` is the next row's ``obs``);
  SB3 refuses it together with ``handle_timeout_termination``, so truncated episodes bootstrap
  from the wrong observation.
* ``torchrl``: ``TensorDictReplayBuffer(storage=LazyMemmapStorage(n))`` with ``observation``
  and ``("next", "observation")`` stacks.
* ``cpprb``: cpprb ``ReplayBuffer(next_of="obs", stack_compress="obs")`` (channels-last
  stacks, as its ``stack_compress`` expects); memory measured with ``tracemalloc``.
* ``rlbuf``: :class:`rlbuf.ReplayBuffer` with ``frame_stack=4`` (one frame per row, compact
  layout), ``storage="memory"`` at the peers' size, and ``storage="memmap"`` at ``--size``.
* ``rlbuf-classic``: ``compact=False`` (whole ``obs`` and ``next_obs`` stacks, like TorchRL).

* ``torchrl-catframes``: TorchRL's single-frame recipe, ``CatFrames.make_rb_transform_and_sampler``:
  a ``ReplayBuffer(storage=LazyMemmapStorage(n))`` storing the newest frame of ``observation``
  and of ``("next", "observation")`` (two frames per row), a ``SliceSampler`` drawing slices
  of 4 consecutive steps of one episode (ends found from ``("next", "done")``) and the
  ``CatFrames`` transform rebuilding the stacks of each slice's last step. It never samples an
  episode's first 3 steps (no slice of 4 ends there). Slow to sample: it is timed with one
  call per round.

Peers have a lot of memory each (sb3: 5.6 GB at 100k), so they are built one at a time, and
each one's sample times are interleaved with rlbuf's (same process, rotating order, medians;
see ``_timing.py``); ratios are rlbuf's time divided by the peer's (below 1: rlbuf is faster).
The machine this ran on is shared and noisy: read the ratios, not the µs.

``--layouts`` instead compares rlbuf's two layouts without frame stacks or n-step (``compact=True``
against the default ``compact=False``), sampling 17-float observations and single ``4×84×84``
uint8 observations: the measurement behind the choice of default layout.

    PYTHONPATH=. python benchmarks/pixels.py --quick                 # smoke run, ~1 minute
    PYTHONPATH=. python benchmarks/pixels.py --layouts               # ~1 minute
    PYTHONPATH=. python benchmarks/pixels.py --peer-size 100000 --size 1000000
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import shutil
import tempfile
import time
import tracemalloc
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from _timing import time_interleaved
from cpprb import ReplayBuffer as CpprbBuffer
from gymnasium import spaces
from stable_baselines3.common.buffers import ReplayBuffer as Sb3Buffer
from tensordict import TensorDict
from torchrl.data import LazyMemmapStorage, TensorDictReplayBuffer
from torchrl.data import ReplayBuffer as TorchrlBuffer
from torchrl.envs import CatFrames

from rlbuf import ReplayBuffer

STACK, SIDE = 4, 84
FRAME_BYTES = SIDE * SIDE
ATARI: dict[str, Any] = {"obs_shape": (STACK, SIDE, SIDE), "action_shape": (), "obs_dtype": torch.uint8,
                         "action_dtype": torch.int64}


class Stream:
    """One env's steps: stacked observations (reset padding), flags, random frames."""

    def __init__(self, rng: np.random.Generator, mean_episode: int) -> None:
        self.rng = rng
        self.mean_episode = mean_episode
        self.stack = self._reset()

    def _reset(self) -> deque[np.ndarray[Any, Any]]:
        first = self.rng.integers(0, 256, (SIDE, SIDE), dtype=np.uint8)
        return deque([first] * STACK, maxlen=STACK)

    def chunk(self, steps: int) -> dict[str, np.ndarray[Any, Any]]:
        obs = np.empty((steps, STACK, SIDE, SIDE), np.uint8)
        next_obs = np.empty_like(obs)
        frames = self.rng.integers(0, 256, (steps, SIDE, SIDE), dtype=np.uint8)
        ends = self.rng.random(steps) < 1 / self.mean_episode
        terminated = ends & (self.rng.random(steps) < 0.5)
        for t in range(steps):
            obs[t] = self.stack
            self.stack.append(frames[t])
            next_obs[t] = self.stack
            if ends[t]:
                self.stack = self._reset()
        return {"obs": obs, "next_obs": next_obs, "action": self.rng.integers(0, 18, steps),
                "reward": self.rng.standard_normal(steps).astype(np.float32), "terminated": terminated,
                "truncated": ends & ~terminated}


def chunks(total: int, num_envs: int, *, seed: int, size: int = 2048,
           mean_episode: int = 1000) -> Iterator[list[dict[str, np.ndarray[Any, Any]]]]:
    """``total`` steps in chunks: a list of one chunk per env, ``size`` steps in all."""
    rng = np.random.default_rng(seed)
    streams = [Stream(rng, mean_episode) for _ in range(num_envs)]
    done = 0
    while done < total:
        steps = min(size, total - done) // num_envs or 1
        yield [stream.chunk(steps) for stream in streams]
        done += steps * num_envs


# -- peers --------------------------------------------------------------------------------
def build_rlbuf(capacity: int, storage: str, *, compact: bool, num_envs: int = 4) -> tuple[ReplayBuffer, float]:
    buf = ReplayBuffer(capacity, obs_shape=(STACK, SIDE, SIDE), action_shape=(), obs_dtype=torch.uint8,
                       action_dtype=torch.int64, num_envs=num_envs, storage=storage,  # type: ignore[arg-type]
                       frame_stack=STACK if compact else 1, compact=compact, seed=0)
    for parts in chunks(capacity, num_envs, seed=1):
        def column(name: str, parts: list[dict[str, Any]] = parts) -> torch.Tensor:
            return torch.from_numpy(np.stack([p[name] for p in parts]))
        buf.extend(TensorDict({"observation": column("obs"), "action": column("action"),
                               "next": {"observation": column("next_obs"), "reward": column("reward"),
                                        "terminated": column("terminated"), "truncated": column("truncated")}},
                              batch_size=[num_envs, len(parts[0]["action"])]))
    return buf, rlbuf_bytes(buf) / capacity


def rlbuf_bytes(buf: ReplayBuffer) -> float:
    """What the buffer's storage, stream bookkeeping and final observations take."""
    total = sum(leaf.numel() * leaf.element_size() for leaf in buf._ring.leaves.values())
    compact = buf._compact
    if compact is not None:
        streams = compact.streams
        total += sum(a.nbytes for a in (streams.back, streams.next, streams.terminated, streams.truncated,
                                        streams.final_slot))
        total += streams.finals.top * FRAME_BYTES
    return float(total)


def build_sb3(capacity: int, *, optimized: bool) -> tuple[Sb3Buffer, float]:
    space = spaces.Box(0, 255, (STACK, SIDE, SIDE), np.uint8)
    buf = Sb3Buffer(capacity, space, spaces.Discrete(18), device="cpu", n_envs=1,
                    optimize_memory_usage=optimized, handle_timeout_termination=not optimized)
    for (part,) in chunks(capacity, 1, seed=1):
        for t in range(len(part["action"])):
            buf.add(part["obs"][t:t + 1], part["next_obs"][t:t + 1], part["action"][t:t + 1],
                    part["reward"][t:t + 1], part["terminated"][t:t + 1] | part["truncated"][t:t + 1],
                    [{"TimeLimit.truncated": bool(part["truncated"][t])}])
    arrays = [buf.observations, buf.actions, buf.rewards, buf.dones, buf.timeouts]
    if not optimized:
        arrays.append(buf.next_observations)
    return buf, sum(a.nbytes for a in arrays) / capacity


def fill_torchrl(buf: TorchrlBuffer, capacity: int, key: str,
                 frames: Callable[[np.ndarray[Any, Any]], np.ndarray[Any, Any]]) -> float:
    """Fill a TorchRL buffer, observations under ``key`` as ``frames`` cuts them; return its bytes per transition."""
    for (part,) in chunks(capacity, 1, seed=1):
        flags = {name: torch.from_numpy(part[name])[:, None] for name in ("reward", "terminated", "truncated")}
        buf.extend(TensorDict({
            key: torch.from_numpy(frames(part["obs"])), "action": torch.from_numpy(part["action"]),
            "next": {key: torch.from_numpy(frames(part["next_obs"])), **flags,
                     "done": flags["terminated"] | flags["truncated"]}},
            batch_size=[len(part["action"])]))
    stored = buf._storage._storage
    return sum(v.numel() * v.element_size() for v in stored.values(True, True)) / capacity


def build_torchrl(capacity: int, scratch: str) -> tuple[TensorDictReplayBuffer, float]:
    buf = TensorDictReplayBuffer(storage=LazyMemmapStorage(capacity, scratch_dir=scratch), batch_size=None)
    return buf, fill_torchrl(buf, capacity, "observation", lambda obs: obs)


def build_torchrl_catframes(capacity: int, scratch: str) -> tuple[TorchrlBuffer, float]:
    frames = CatFrames(N=STACK, dim=-3, in_keys=["frame"], out_keys=["observation"], reset_key="_reset",
                       done_key="done")
    transform, sampler = frames.make_rb_transform_and_sampler(batch_size=32, end_key=("next", "done"))
    buf = TorchrlBuffer(storage=LazyMemmapStorage(capacity, scratch_dir=scratch), sampler=sampler,
                        transform=transform)
    per_transition = fill_torchrl(buf, capacity, "frame", lambda obs: obs[:, -1:])  # the newest frame only
    batch = buf.sample(2)
    assert batch["observation"].shape == batch["next", "observation"].shape == (2, STACK, SIDE, SIDE)
    return buf, per_transition


def build_cpprb(capacity: int) -> tuple[CpprbBuffer, float]:
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    buf = CpprbBuffer(capacity, env_dict={"obs": {"shape": (SIDE, SIDE, STACK), "dtype": np.uint8},
                                          "act": {"dtype": np.int64}, "rew": {}, "done": {}},
                      next_of="obs", stack_compress="obs")
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    for (part,) in chunks(capacity, 1, seed=1):
        buf.add(obs=np.moveaxis(part["obs"], 1, -1), next_obs=np.moveaxis(part["next_obs"], 1, -1),
                act=part["action"], rew=part["reward"], done=part["terminated"] | part["truncated"])
    return buf, held / capacity


# -- report -------------------------------------------------------------------------------
def sample_peers(ours: dict[str, Callable[[int], Any]], peer: str, sample: Callable[[int], Any],
                 repeats: int, *, slow: bool = False) -> dict[tuple[str, str, int], float]:
    """Median seconds of ``sample(32)``/``sample(256)``, by (group, name, batch): rlbuf's interleaved with one peer
    (``slow``: one call per round)."""
    result = {}
    for batch in (32, 256):
        peers = {name: (lambda f=f, batch=batch: f(batch)) for name, f in {**ours, peer: sample}.items()}
        number = 1 if slow else 20 if batch == 32 else 5
        for name, seconds in time_interleaved(peers, repeats=repeats, number=number).items():
            result[(peer, name, batch)] = seconds
    return result


def compare_layouts(repeats: int) -> None:
    """Sample time of compact=True ÷ compact=False, for small vectors and unstacked images."""
    print("compact ÷ classic layout, sample µs (medians, interleaved; noisy shared machine)")
    for name, shape, dtype in (("17 float32", (17,), torch.float32), ("4x84x84 uint8", (STACK, SIDE, SIDE), torch.uint8)):
        buffers = {}
        for compact in (False, True):
            buf = ReplayBuffer(20_000, obs_shape=shape, action_shape=(), obs_dtype=dtype, num_envs=4, compact=compact,
                               seed=0)
            generator = torch.Generator().manual_seed(0)
            obs = (torch.rand(4, *shape, generator=generator) * 255).to(dtype)
            for _ in range(5000):
                next_obs = (torch.rand(4, *shape, generator=generator) * 255).to(dtype)
                buf.add(obs, torch.zeros(4), torch.ones(4), next_obs, torch.rand(4, generator=generator) < 0.001, truncated=False)
                obs = next_obs
            buffers["compact" if compact else "classic"] = buf
        for batch in (32, 256):
            medians = time_interleaved({k: (lambda b=b, batch=batch: b.sample(batch)) for k, b in buffers.items()},
                                       repeats=repeats, number=20)
            print(f"  {name:14} sample {batch:>3}: classic {medians['classic'] * 1e6:8.0f}, compact "
                  f"{medians['compact'] * 1e6:8.0f}, ratio {medians['compact'] / medians['classic']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peer-size", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=1_000_000, help="rlbuf's memmap buffer")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="small buffers, few repeats")
    parser.add_argument("--peers", default="sb3,sb3-optimized,torchrl,torchrl-catframes,cpprb,rlbuf-classic")
    parser.add_argument("--layouts", action="store_true", help="only compare rlbuf's two layouts")
    args = parser.parse_args()
    if args.layouts:
        torch.set_num_threads(1)
        compare_layouts(args.repeats)
        return
    if args.quick:
        args.peer_size, args.size, args.repeats = 4000, 20_000, 5
    torch.set_num_threads(1)
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message="The last dimension of the tensordict should be marked as 'time'")
    scratch = tempfile.mkdtemp(prefix="rlbuf-bench-", dir=os.environ.get("RLBUF_BENCH_DIR"))
    start = time.perf_counter()
    big, big_bytes = build_rlbuf(args.size, "memmap", compact=True)
    print(f"rlbuf memmap {args.size:,} transitions filled in {time.perf_counter() - start:.0f} s; "
          f"{big_bytes:,.0f} B/transition ({big_bytes / FRAME_BYTES:.3f} frames); estimate "
          f"{ReplayBuffer.bytes_per_transition(**ATARI, frame_stack=STACK, episode_length=1000):,.0f} B", flush=True)
    small, small_bytes = build_rlbuf(args.peer_size, "memory", compact=True)
    ours = {f"rlbuf-mmap-{args.size // 1000}k": big.sample, f"rlbuf-mem-{args.peer_size // 1000}k": small.sample}
    memory = {f"rlbuf-mmap-{args.size // 1000}k": big_bytes, f"rlbuf-mem-{args.peer_size // 1000}k": small_bytes}
    times: dict[tuple[str, str, int], float] = {}
    builders: dict[str, Callable[[], tuple[Any, float]]] = {
        "sb3": lambda: build_sb3(args.peer_size, optimized=False),
        "sb3-optimized": lambda: build_sb3(args.peer_size, optimized=True),
        # A folder each: two memmap storages in one folder would both write action.memmap.
        "torchrl": lambda: build_torchrl(args.peer_size, os.path.join(scratch, "torchrl")),
        "torchrl-catframes": lambda: build_torchrl_catframes(args.peer_size, os.path.join(scratch, "catframes")),
        "cpprb": lambda: build_cpprb(args.peer_size),
        "rlbuf-classic": lambda: build_rlbuf(args.peer_size, "memory", compact=False),
    }
    try:
        for name in args.peers.split(","):
            peer, memory[name] = builders[name]()
            print(f"{name}: filled, {memory[name]:,.0f} B/transition", flush=True)
            times.update(sample_peers(ours, name, peer.sample, args.repeats, slow=name == "torchrl-catframes"))
            del peer
            gc.collect()
    finally:
        big.close()
        small.close()
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"\nbytes per transition and sample µs (medians; rlbuf's rows interleaved with each peer, "
          f"{args.repeats} rounds; noisy shared machine)")
    print(f"{'':24}{'B/transition':>14}{'÷ frame':>9}{'sample 32':>11}{'sample 256':>12}")
    for name, size in memory.items():
        t32 = np.median([s for (_, n, b), s in times.items() if n == name and b == 32]) * 1e6
        t256 = np.median([s for (_, n, b), s in times.items() if n == name and b == 256]) * 1e6
        print(f"{name:24}{size:>14,.0f}{size / FRAME_BYTES:>9.2f}{t32:>11.0f}{t256:>12.0f}")
    print("\nrlbuf ÷ peer (bytes per transition; sample 32 and 256 timed in the same rounds)")
    for name in memory:
        if name.startswith("rlbuf-m"):
            continue
        row = [f"{mine}: bytes {memory[mine] / memory[name]:.3f}, sample32 "
               f"{times[(name, mine, 32)] / times[(name, name, 32)]:.3g}, sample256 "
               f"{times[(name, mine, 256)] / times[(name, name, 256)]:.3g}" for mine in ours]
        print(f"  vs {name:18} " + " | ".join(row))


if __name__ == "__main__":
    main()
