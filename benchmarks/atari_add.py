"""The compact add on real Atari frames, against SB3's optimized buffer: one env step, 1 and 8 envs.

Real frames: ale-py's Breakout with the standard DQN preprocessing (gymnasium's
``AtariPreprocessing``: frame skip 4, 84×84 grey, life loss ends an episode; a 400-step time
limit for truncations; ``FrameStackObservation(4)``), gymnasium's default ``NEXT_STEP``
autoreset. The steps are recorded first, then fed to each buffer in order:

* ``rlbuf``: ``ReplayBuffer(frame_stack=4, n_step=3)`` (one frame per row, every stack
  checked against its env's stream), ``add`` with ``env_mask`` leaving out the reset steps;
* ``rlbuf-recorder``: the same buffer fed by [`Recorder`][rlbuf.gym.Recorder];
* ``sb3-optimized``: Stable-Baselines3 ``ReplayBuffer(optimize_memory_usage=True)`` (which
  stores the reset steps as transitions: it has no way to leave them out).

Each buffer is cleared before every round and fed the same steps; medians of interleaved rounds
(``_timing.py``), as ratios, by wall clock and by this thread's CPU time (``time.thread_time``,
which leaves out the time other processes hold the cores of a shared machine). Then ``sample(32)``
and ``sample(256)`` on the filled buffers.

    PYTHONPATH=. python benchmarks/atari_add.py            # ~2 minutes
    PYTHONPATH=. python benchmarks/atari_add.py --quick
"""

from __future__ import annotations

import argparse
import time
import warnings
from typing import Any

import numpy as np
from _timing import print_table, time_interleaved

from rlbuf import ReplayBuffer
from rlbuf.gym import Recorder


def record_steps(num_envs: int, steps: int, seed: int = 0, game: str = "Breakout") -> tuple[Any, list[tuple[Any, ...]]]:
    """``steps`` steps of ``num_envs`` preprocessed envs of ``game``: (obs, action, reward, next_obs, terminated,
    truncated, info)."""
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    wrappers = [lambda env: gym.wrappers.AtariPreprocessing(env, frame_skip=4, terminal_on_life_loss=True),
                lambda env: gym.wrappers.TimeLimit(env, 400),
                lambda env: gym.wrappers.FrameStackObservation(env, 4)]
    envs = gym.make_vec(f"{game}NoFrameskip-v4", num_envs=num_envs, vectorization_mode="sync", wrappers=wrappers)
    envs.action_space.seed(seed)
    obs, _ = envs.reset(seed=seed)
    recorded = []
    for _ in range(steps):
        action = envs.action_space.sample()
        next_obs, reward, terminated, truncated, info = envs.step(action)
        recorded.append((obs, action, reward, next_obs, terminated, truncated, info))
        obs = next_obs
    return envs, recorded


class Feed:
    """Feeds the recorded steps to one buffer, one per call, from the first again after each ``restart``."""

    def __init__(self, steps: list[tuple[Any, ...]], add: Any, restart: Any) -> None:
        self.steps, self.add, self.restart, self.at = steps, add, restart, 0

    def __call__(self) -> None:
        if self.at == len(self.steps):
            self.restart()
            self.at = 0
        self.add(*self.steps[self.at])
        self.at += 1

    def refill(self) -> None:
        """Clear the buffer and feed it every step."""
        self.restart()
        for step in self.steps:
            self.add(*step)
        self.at = len(self.steps)


def peers(envs: Any, steps: list[tuple[Any, ...]], capacity: int) -> dict[str, Feed]:
    from stable_baselines3.common.buffers import ReplayBuffer as Sb3Buffer

    n = envs.num_envs
    space, actions = envs.single_observation_space, envs.single_action_space
    ours = ReplayBuffer(capacity, observation_space=space, action_space=actions, num_envs=n, frame_stack=4, n_step=3,
                        seed=0)
    recorded = ReplayBuffer(capacity, observation_space=space, action_space=actions, num_envs=n, frame_stack=4,
                            n_step=3, seed=0)
    recorder = [Recorder(envs, recorded, resetting=np.zeros(n, np.bool_))]
    sb3 = Sb3Buffer(capacity, space, actions, device="cpu", n_envs=n, optimize_memory_usage=True,
                    handle_timeout_termination=False)
    ended = [np.zeros(n, np.bool_)]
    no_infos = [{}] * n

    def add(obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any, info: Any) -> None:
        # NEXT_STEP: the step after an end is a reset step (the mask docs/gymnasium.md gives)
        ours.add(obs, action, reward, next_obs, terminated, truncated=truncated, env_mask=~ended[0])
        ended[0] = terminated | truncated

    def restart_ours() -> None:
        ours.clear()
        ended[0] = np.zeros(n, np.bool_)

    def restart_recorded() -> None:
        recorded.clear()
        recorder[0] = Recorder(envs, recorded, resetting=np.zeros(n, np.bool_))

    return {
        "rlbuf": Feed(steps, add, restart_ours),
        "rlbuf-recorder": Feed(steps, lambda *step: recorder[0].record(*step), restart_recorded),
        "sb3-optimized": Feed(steps, lambda o, a, r, no, te, tr, info: sb3.add(o, no, a, r, te | tr, no_infos),
                              sb3.reset),
        "_buffers": (ours, sb3),  # type: ignore[dict-item]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds")
    args = parser.parse_args()
    steps, repeats, number = (400, 5, 50) if args.quick else (1500, 15, 100)
    warnings.simplefilter("ignore", DeprecationWarning)
    for num_envs in (1, 8):
        envs, recorded = record_steps(num_envs, steps)
        feeds = peers(envs, recorded, capacity=steps * num_envs + 16)
        ours, sb3 = feeds.pop("_buffers")  # type: ignore[misc]
        for clock, unit in ((time.perf_counter, "wall"), (time.thread_time, "CPU time")):
            medians = time_interleaved(feeds, repeats=repeats, number=number, clock=clock)
            print_table(f"add of one step of {num_envs} env(s), real Breakout frames ({unit})", medians,
                        ours=["rlbuf", "rlbuf-recorder"])
        for name in ("rlbuf", "sb3-optimized"):  # full buffers to sample from: every recorded step
            feeds[name].refill()
        for batch in (32, 256):
            sampled = time_interleaved({"rlbuf": lambda b=batch, buffer=ours: buffer.sample(b),
                                        "sb3-optimized": lambda b=batch, buffer=sb3: buffer.sample(b)},
                                       repeats=repeats, number=max(1, number // 5))
            print_table(f"sample({batch}) of {len(ours)} rows ({num_envs} env(s))", sampled, ours=["rlbuf"])
        envs.close()


if __name__ == "__main__":
    main()
