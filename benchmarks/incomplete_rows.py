"""The incomplete rows of a compact buffer (``incomplete_positions``, paid by every Ray shard stats call and every
draw among complete transitions alone): rows found from the stream tables, against the windows doubled up to a
walk of every row that it replaced, at 200k and 1M rows.

Cases, 8 envs (episodes of 1,000 steps, ending at staggered steps), ``frame_stack`` 4 and 1, ``n_step=3``, the ring full:

* ``normal``: every env adds every step;
* ``stopped``: env 7 stops adding halfway, its episode open;
* ``never``: env 7 never adds (``env_mask`` leaves it out).

CPU time of this thread (``time.thread_time``), medians of interleaved rounds (``_timing.py``).

    PYTHONPATH=. python benchmarks/incomplete_rows.py            # ~2 minutes
    PYTHONPATH=. python benchmarks/incomplete_rows.py --quick    # 200k rows alone
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import torch
from _timing import print_table, time_interleaved

from rlbuf import ReplayBuffer
from rlbuf._complete_rows import incomplete_positions

NUM_ENVS = 8


def filled(capacity: int, frame_stack: int, case: str) -> ReplayBuffer:
    """A full compact buffer of ``capacity`` rows of ``case``."""
    shape = (frame_stack, 1) if frame_stack > 1 else (1,)
    buf = ReplayBuffer(capacity, obs_shape=shape, action_shape=(), num_envs=NUM_ENVS, obs_dtype=torch.uint8,
                       frame_stack=frame_stack, n_step=3, compact=True)
    obs = torch.zeros((NUM_ENVS, *shape), dtype=torch.uint8)
    zeros, ones = torch.zeros(NUM_ENVS), torch.ones(NUM_ENVS)
    every = np.ones(NUM_ENVS, np.bool_)
    step = 0
    while len(buf) < capacity:
        mask = every.copy()
        mask[-1] = case == "normal" or (case == "stopped" and buf._ring.write_count < capacity // 2)
        ends = torch.from_numpy((step + 137 * np.arange(NUM_ENVS)) % 1000 == 999)
        with warnings.catch_warnings():  # the stopped env's episode end left out: it stays open, as meant
            warnings.simplefilter("ignore")
            buf.add(obs, zeros, ones, obs, ends, torch.zeros(NUM_ENVS, dtype=torch.bool), env_mask=mask)
        step += 1
    return buf


def walked_every_row_before(layout: object) -> np.ndarray:
    """The replaced search: windows at the ring's two ends, doubled, else every row walked."""
    ring, streams = layout.ring, layout.streams  # type: ignore[attr-defined]
    size, write_count, capacity = len(ring), ring.write_count, ring.capacity
    oldest = write_count - size
    width = streams.num_envs * (layout.n_step + layout.frame_stack)  # type: ignore[attr-defined]
    positions = None
    while 2 * width < size and positions is None:
        envs = streams.env[np.concatenate([np.arange(oldest, oldest + width),
                                           np.arange(write_count - width, write_count)]) % capacity]
        newest = np.bincount(envs[width:], minlength=streams.num_envs)
        first = np.bincount(envs[:width], minlength=streams.num_envs)
        if ((envs >= 0).all() and (newest[streams.last >= oldest] >= layout.n_step).all()  # type: ignore[attr-defined]
                and (layout.frame_stack == 1 or (first >= layout.frame_stack - 1).all())):  # type: ignore[attr-defined]
            positions = np.sort(np.concatenate([np.arange(oldest, oldest + width),
                                                np.arange(write_count - width, write_count)]) % capacity)
        width *= 2
    if positions is None:
        positions = np.arange(size, dtype=np.int64)
    return positions[~layout.walk(positions).complete]  # type: ignore[attr-defined, no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200k rows alone, fewer rounds")
    args = parser.parse_args()
    for rows in (200_000,) if args.quick else (200_000, 1_000_000):
        for frame_stack in (4, 1):
            for case in ("normal", "stopped", "never"):
                layout = filled(rows, frame_stack, case)._compact
                assert np.array_equal(incomplete_positions(layout), walked_every_row_before(layout))
                medians = time_interleaved({"tables": lambda at=layout: incomplete_positions(at),
                                            "before": lambda at=layout: walked_every_row_before(at)},
                                           repeats=5 if args.quick else 9, number=3, clock=time.thread_time)
                print_table(f"{rows:,} rows, frame_stack={frame_stack}, n_step=3, {case}", medians, ["tables"])


if __name__ == "__main__":
    main()
