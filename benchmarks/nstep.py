"""n-step replay of low-dimensional observations, against SB3's ``NStepReplayBuffer``: add of one step, sample.

Real steps: gymnasium's ``CartPole-v1`` vector env (random actions, its 500-step time limit, gymnasium's
default ``NEXT_STEP`` autoreset), recorded first and fed in order to:

* ``rlbuf``: ``ReplayBuffer(n_step=3, gamma=0.99)`` (each env's stream followed, so each observation is
  stored once), ``add`` with ``env_mask=~(prev_terminated | prev_truncated)`` leaving out the reset steps,
  as docs/gymnasium.md says;
* ``sb3-nstep``: Stable-Baselines3 ``NStepReplayBuffer(n_steps=3, gamma=0.99)`` (obs and next_obs stored
  per row; it stores the reset steps too: it has no way to leave them out).

Each buffer is cleared before every round and fed the same steps; medians of interleaved rounds
(``_timing.py``), as ratios. Then ``sample(256)`` on the filled buffers: both return the n-step
reward, the observation n steps later (or at the episode's end) and the bootstrap discount.

    PYTHONPATH=. python benchmarks/nstep.py            # ~1 minute
    PYTHONPATH=. python benchmarks/nstep.py --quick
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

import numpy as np
import torch
from _timing import print_table, time_interleaved

from rlbuf import ReplayBuffer


def record_steps(num_envs: int, steps: int, seed: int = 0) -> tuple[Any, list[tuple[Any, ...]]]:
    """``steps`` steps of ``num_envs`` CartPole envs: (obs, action, reward, next_obs, terminated, truncated)."""
    import gymnasium as gym

    envs = gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="sync")
    envs.action_space.seed(seed)
    obs, _ = envs.reset(seed=seed)
    recorded = []
    for _ in range(steps):
        action = envs.action_space.sample()
        next_obs, reward, terminated, truncated, _ = envs.step(action)
        recorded.append((obs, action, reward, next_obs, terminated, truncated))
        obs = next_obs
    return envs, recorded


def peers(envs: Any, steps: list[tuple[Any, ...]], capacity: int) -> tuple[dict[str, Any], ReplayBuffer, Any]:
    """Feeds of one recorded step per call (from the first again after the last), and the two buffers."""
    from stable_baselines3.common.buffers import NStepReplayBuffer

    n = envs.num_envs
    ours = ReplayBuffer(capacity, observation_space=envs.single_observation_space,
                        action_space=envs.single_action_space, num_envs=n, n_step=3, gamma=0.99, seed=0)
    sb3 = NStepReplayBuffer(capacity, envs.single_observation_space, envs.single_action_space, device="cpu",
                            n_envs=n, n_steps=3, gamma=0.99)
    infos = [[{"TimeLimit.truncated": bool(cut)} for cut in step[5]] for step in steps]
    state = {"rlbuf": 0, "sb3": 0, "ended": np.zeros(n, np.bool_)}

    def restart_ours() -> None:
        ours.clear()
        state["rlbuf"], state["ended"] = 0, np.zeros(n, np.bool_)

    def restart_sb3() -> None:
        sb3.reset()
        state["sb3"] = 0

    def add_ours() -> None:
        if state["rlbuf"] == len(steps):
            restart_ours()
        obs, action, reward, next_obs, terminated, truncated = steps[state["rlbuf"]]
        ours.add(obs, action, reward, next_obs, terminated, truncated, env_mask=~state["ended"])
        state["ended"] = terminated | truncated
        state["rlbuf"] += 1

    def add_sb3() -> None:
        if state["sb3"] == len(steps):
            restart_sb3()
        obs, action, reward, next_obs, terminated, truncated = steps[state["sb3"]]
        sb3.add(obs, next_obs, action, reward, terminated | truncated, infos[state["sb3"]])
        state["sb3"] += 1

    add_ours.restart, add_sb3.restart = restart_ours, restart_sb3  # type: ignore[attr-defined]
    return {"rlbuf": add_ours, "sb3-nstep": add_sb3}, ours, sb3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds")
    args = parser.parse_args()
    steps, repeats, number = (1000, 5, 200) if args.quick else (5000, 15, 500)
    warnings.simplefilter("ignore", DeprecationWarning)
    torch.set_num_threads(1)
    for num_envs in (1, 8):
        envs, recorded = record_steps(num_envs, steps)
        feeds, ours, sb3 = peers(envs, recorded, capacity=steps * num_envs)
        medians = time_interleaved(feeds, repeats=repeats, number=number)
        print_table(f"add of one step of {num_envs} CartPole env(s), n_step=3", medians, ours=["rlbuf"])
        for feed in feeds.values():  # every recorded step in both buffers, to sample from
            feed.restart()
            for _ in recorded:
                feed()
        sampled = time_interleaved({"rlbuf": lambda b=ours: b.sample(256), "sb3-nstep": lambda b=sb3: b.sample(256)},
                                   repeats=repeats, number=max(1, number // 5))
        print_table(f"sample(256) of {len(ours)} rows ({num_envs} env(s))", sampled, ours=["rlbuf"])
        envs.close()


if __name__ == "__main__":
    main()
