"""How the learner splits a batch over a [`ReplayService`][rlbuf.ray.ReplayService]'s shards around their
rate limiters: a shard whose limiter holds its share is left out, and the learner waits only when all hold,
until any one of them lets its share be drawn.

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
    holds does the learner wait (``wait(held)``, each held shard with the share it was held for), until
    any one of them lets its share be drawn; then it asks them again and splits again. Waiting
    draws nothing, so a timeout leaves every shard's counters as they were. ``stats`` is updated in
    place (``stats_of``: fresh ones).
    """
    held_first = [k for k, count in drawn if not may(stats[k], count)]
    for k, stat in zip(held_first, stats_of(held_first), strict=True):  # inserts may have made room
        stats[k] = stat
    split = drawn
    while True:
        free, held = mass.copy(), dict[int, int]()
        while newly := {k: count for k, count in split if not may(stats[k], count)}:
            held.update(newly)
            free[list(held)] = 0.0
            if not free.sum() > 0:
                break
            split = _split(rng, batch_size, free)
        else:
            return split
        wait(sorted(held.items()))
        for k, stat in zip(held, stats_of(list(held)), strict=True):
            stats[k] = stat
        split = _split(rng, batch_size, mass)


def _split(rng: np.random.Generator, batch_size: int, mass: np.ndarray[Any, Any]) -> Drawn:
    """``batch_size`` rows drawn over the shards in proportion to ``mass``: ``(shard, rows)`` of those drawn."""
    counts = rng.multinomial(batch_size, mass / mass.sum())
    return [(k, int(count)) for k, count in enumerate(counts) if count > 0]


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
