"""Compressed frames on real Atari frames: memory per transition, add and sample, against the uncompressed buffer.

Real frames of ale-py's Pong, Breakout and MsPacman (the standard DQN preprocessing, life
loss ends an episode, a 400-step time limit, ``FrameStackObservation(4)``, 8 envs, gymnasium's
default ``NEXT_STEP`` autoreset, random actions). The recorded steps are fed in order, again and
again (each env's last recorded step marked truncated, so the recording loops as new episodes),
to three ``ReplayBuffer(frame_stack=4, n_step=3)`` of the same capacity, smaller than the
recording so that every add overwrites: ``compression=None``, ``"zstd"`` (level 3) and
``"lz4"``. Reported:

* memory: ``buffer.nbytes`` per stored transition once full (storage, stream tables, final
  observations, compressed frames and their offsets), and the uncompressed buffer's ÷ each;
* the add of one step of 8 envs (with ``env_mask`` leaving out the reset steps), interleaved;
* ``sample(32)`` and ``sample(256)``, interleaved.

    PYTHONPATH=. python benchmarks/compression.py             # about 5 minutes
    PYTHONPATH=. python benchmarks/compression.py --quick     # a smoke run
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

import numpy as np
from _timing import print_table, time_interleaved
from atari_add import record_steps

from rlbuf import ReplayBuffer

CODECS = {"uncompressed": None, "zstd": "zstd", "lz4": "lz4"}


def looped(steps: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The recording with each env's last step truncated: fed again, it goes on as new episodes."""
    obs, action, reward, next_obs, terminated, truncated, info = steps[-1]
    return [*steps[:-1], (obs, action, reward, next_obs, terminated, np.ones_like(truncated), info)]


class Feed:
    """Adds the recorded steps to one buffer in order, from the first again after the last."""

    def __init__(self, buffer: ReplayBuffer, steps: list[tuple[Any, ...]]) -> None:
        self.buffer, self.steps, self.at = buffer, steps, 0
        self.ended = np.zeros(buffer.num_envs, np.bool_)

    def __call__(self) -> None:
        obs, action, reward, next_obs, terminated, truncated, _ = self.steps[self.at]
        # NEXT_STEP: the step after an end is a reset step (the mask docs/gymnasium.md gives)
        self.buffer.add(obs, action, reward, next_obs, terminated, truncated=truncated, env_mask=~self.ended)
        self.at = (self.at + 1) % len(self.steps)
        # The recording's first step is a real one, from a reset: nothing to leave out when it comes again.
        self.ended = terminated | truncated if self.at else np.zeros_like(self.ended)


def run(game: str, steps: int, capacity: int, repeats: int, number: int) -> None:
    envs, recorded = record_steps(8, steps, game=game)
    recorded = looped(recorded)
    space, actions = envs.single_observation_space, envs.single_action_space
    feeds = {name: Feed(ReplayBuffer(capacity, observation_space=space, action_space=actions, num_envs=8,
                                     frame_stack=4, n_step=3, seed=0, compression=codec), recorded)
             for name, codec in CODECS.items()}
    for feed in feeds.values():  # full, and past the dictionary's training
        for _ in range(capacity // 8 + steps // 4):
            feed()
    print(f"\n## {game}: {steps} steps of 8 envs, capacity {capacity}")
    per_row = {name: feed.buffer.nbytes / len(feed.buffer) for name, feed in feeds.items()}
    for name, held in per_row.items():
        print(f"memory  {name:13s} {held:10.1f} bytes per transition   uncompressed ÷ this: "
              f"{per_row['uncompressed'] / held:6.1f}")
    medians = time_interleaved(dict(feeds), repeats=repeats, number=number)
    print_table(f"add of one step of 8 envs ({game})", medians, ours=["zstd", "lz4"])
    for batch in (32, 256):
        sampled = time_interleaved({name: lambda b=batch, buffer=feed.buffer: buffer.sample(b)
                                    for name, feed in feeds.items()}, repeats=repeats, number=max(1, number // 10))
        print_table(f"sample({batch}) ({game})", sampled, ours=["zstd", "lz4"])
    envs.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds")
    parser.add_argument("--games", nargs="+", default=["Pong", "Breakout", "MsPacman"])
    args = parser.parse_args()
    steps, capacity, repeats, number = (300, 2000, 3, 20) if args.quick else (1500, 10_000, 11, 100)
    warnings.simplefilter("ignore", DeprecationWarning)
    for game in args.games:
        run(game, steps, capacity, repeats, number)


if __name__ == "__main__":
    main()
