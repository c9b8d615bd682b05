"""Hindsight replay against Stable-Baselines3's ``HerReplayBuffer``: sample and add cost.

Both buffers are filled with the same real bit-flipping transitions (4 envs, random actions,
episodes of up to 15 steps, so many end inside a batch of steps) and relabel 80% of a batch
with the ``future`` strategy (SB3: ``n_sampled_goal=4``), rewards from the env's vectorised
``compute_reward``. Timings are interleaved medians (``_timing``). SB3's samples are numpy
turned into torch tensors on the CPU, as rlbuf's are; both on the CPU.

Run: ``python benchmarks/hindsight.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import print_table, time_interleaved

from rlbuf import Hindsight, ReplayBuffer
from rlbuf.demos.bitflip import BitFlipEnv

N_ENVS, N_BITS = 4, 15


def record(steps: int, seed: int = 0) -> list[tuple[Any, ...]]:
    """``steps`` vector steps of random actions: (obs, action, reward, next_obs, terminated, truncated)."""
    envs = [BitFlipEnv(N_BITS) for _ in range(N_ENVS)]
    rng = np.random.default_rng(seed)
    obs = [env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]
    out = []
    for _ in range(steps):
        action = rng.integers(0, N_BITS, N_ENVS)
        results = [env.step(int(a)) for env, a in zip(envs, action, strict=True)]
        next_obs = [r[0] for r in results]
        stacked = {key: np.stack([o[key] for o in obs]) for key in obs[0]}
        stacked_next = {key: np.stack([o[key] for o in next_obs]) for key in obs[0]}
        out.append((stacked, action, np.array([r[1] for r in results], np.float32), stacked_next,
                    np.array([r[2] for r in results]), np.array([r[3] for r in results])))
        obs = [env.reset()[0] if r[2] or r[3] else r[0] for env, r in zip(envs, results, strict=True)]
    return out


def rlbuf_buffer(capacity: int) -> ReplayBuffer:
    env = BitFlipEnv(N_BITS)
    return ReplayBuffer(capacity, observation_space=env.observation_space, action_space=env.action_space,
                        num_envs=N_ENVS, seed=0, hindsight=Hindsight("future", 0.8, BitFlipEnv.compute_reward))


def sb3_buffer(capacity: int) -> Any:
    from stable_baselines3 import HerReplayBuffer
    from stable_baselines3.common.vec_env import DummyVecEnv

    vec = DummyVecEnv([lambda: BitFlipEnv(N_BITS)] * N_ENVS)
    return HerReplayBuffer(capacity, vec.observation_space, vec.action_space, vec, device="cpu", n_envs=N_ENVS,
                           n_sampled_goal=4, goal_selection_strategy="future")


def sb3_add(buffer: Any, step: tuple[Any, ...]) -> None:
    obs, action, reward, next_obs, terminated, truncated = step
    infos = [{"TimeLimit.truncated": bool(t and not d)} for t, d in zip(truncated, terminated, strict=True)]
    buffer.add(obs, next_obs, action[:, None], reward, terminated | truncated, infos)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    steps = record(args.capacity // N_ENVS)
    ours, sb3 = rlbuf_buffer(args.capacity), sb3_buffer(args.capacity // N_ENVS)
    for step in steps:
        obs, action, reward, next_obs, terminated, truncated = step
        ours.add(obs, action, reward, next_obs, terminated, truncated)
        sb3_add(sb3, step)
    print(f"{len(ours)} transitions each ({N_ENVS} envs, {N_BITS} bits), batch {args.batch_size}, future, ratio 0.8")
    medians = time_interleaved({"rlbuf": lambda: ours.sample(args.batch_size),
                                "SB3 HerReplayBuffer": lambda: sb3.sample(args.batch_size)},
                               repeats=args.repeats, number=20)
    print_table(f"sample({args.batch_size})", medians, ["rlbuf"])
    fresh_ours, fresh_sb3 = rlbuf_buffer(args.capacity), sb3_buffer(args.capacity // N_ENVS)
    cursor = {"ours": 0, "sb3": 0}

    def add_ours() -> None:
        obs, action, reward, next_obs, terminated, truncated = steps[cursor["ours"] % len(steps)]
        fresh_ours.add(obs, action, reward, next_obs, terminated, truncated)
        cursor["ours"] += 1

    def add_sb3() -> None:
        sb3_add(fresh_sb3, steps[cursor["sb3"] % len(steps)])
        cursor["sb3"] += 1

    medians = time_interleaved({"rlbuf": add_ours, "SB3 HerReplayBuffer": add_sb3}, repeats=args.repeats, number=200)
    print_table(f"add (one step of {N_ENVS} envs)", medians, ["rlbuf"])


if __name__ == "__main__":
    main()
