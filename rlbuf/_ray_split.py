"""How the learner splits a batch over a [`ReplayService`][rlbuf.ray.ReplayService]'s shards around their
rate limiters: a shard whose limiter holds its share is left out, and the learner waits only when all hold.

Example:
    >>> may_sample(None, {"limiter": None}, 256)
    True
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlbuf._rate_limit import RateLimiter
from rlbuf.errors import RateLimitTimeoutError

Stats = list[dict[str, Any]]
Drawn = list[tuple[int, int]]


def may_sample(limiter_config: Mapping[str, Any] | None, stats: Mapping[str, Any], count: int) -> bool:
    """Whether a shard's limiter lets ``count`` rows be sampled, judged from its last known counters.

    Since then only inserts can have moved them (the learner is the one sampler), and
    inserts only make room: a yes stays a yes.
    """
    if limiter_config is None:
        return True
    return RateLimiter.from_config(limiter_config, stats["limiter"]).can_sample(count)


def split_around_held(rng: np.random.Generator, batch_size: int, mass: np.ndarray[Any, Any], stats: Stats,
                      drawn: Drawn, *, may: Callable[[Mapping[str, Any], int], bool],
                      stats_of: Callable[[Sequence[int]], Stats], wait: Callable[[Drawn], None]) -> Drawn:
    """The batch split again over the shards whose limiters let their share be drawn now.

    A shard the learner is ahead on is left out of this batch (as Reverb's clients of several
    servers leave out a server whose limiter holds): the others keep being sampled, and their
    writers are not held by a shard whose own writers have stopped. Only when every shard
    holds does the learner wait (``wait(drawn)``), on all the first split's shards before drawing any, so a
    timeout leaves every shard's counters as they were. ``stats`` is updated in place (``stats_of``: fresh ones).
    """
    held = [k for k, count in drawn if not may(stats[k], count)]
    for k, stat in zip(held, stats_of(held), strict=True):  # inserts may have made room
        stats[k] = stat
    free, split = mass.copy(), drawn
    while not all(may(stats[k], count) for k, count in split):
        free[[k for k, count in split if not may(stats[k], count)]] = 0.0
        if not free.sum() > 0:
            wait(drawn)
            return drawn
        counts = rng.multinomial(batch_size, free / free.sum())
        split = [(k, int(count)) for k, count in enumerate(counts) if count > 0]
    return split


def await_rows(all_stats: Callable[[float | None], Stats], batch_size: int, timeout: float | None) -> Stats:
    """The shards' stats (``all_stats(timeout)``) once one of them holds a row (every shard is empty until the
    writers start).

    Raises:
        RateLimitTimeoutError: still empty after ``timeout`` seconds.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        stats = all_stats(timeout)
        if any(stat["size"] for stat in stats):
            return stats
        if deadline is not None and time.monotonic() >= deadline:
            raise RateLimitTimeoutError(f"sample: the rate limiters held {batch_size} rows for {timeout} s: every "
                                        "shard is still empty; start the writers or raise timeout")
        time.sleep(0.01)
