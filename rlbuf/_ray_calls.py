"""Calls from the learner and writers to a [`ReplayService`][rlbuf.ray.ReplayService]'s shard actors: results,
errors (an rlbuf error raised as itself, a dead actor as [`ShardDiedError`][rlbuf.errors.ShardDiedError]), stopping.

Example:
    >>> get([])
    []
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rlbuf.errors import RateLimitTimeoutError, RlbufError, ShardDiedError

# Seconds a shard may take past the wait it was given to answer a learner's call (moving the rows, its queue).
ANSWER_GRACE = 10.0


class ShardRestartingError(ShardDiedError):
    """A call to shard ``shard`` that Ray's restart of its actor (``restart_from``) cut short.

    ``fate_unknown``: Ray could not tell whether the actor ran the call (``ActorUnavailableError``); else the
    actor died before finishing it (``ActorDiedError``), and whatever the call did inside it died with it.
    """

    def __init__(self, message: str, shard: int, fate_unknown: bool) -> None:
        super().__init__(message)
        self.shard, self.fate_unknown = shard, fate_unknown


def get(calls: Sequence[tuple[int, Any]], *, restarting: bool = False, wait: float | None = None) -> list[Any]:
    """Results of remote calls ``(shard, ref)``; rlbuf errors as themselves, a dead actor as ShardDiedError
    (``restarting``: the service was built with ``restart_from``, so Ray starts it again: ShardRestartingError).

    ``wait``: the seconds the calls may wait for a rate limiter (``None``: no limit); a call not answered
    within ``wait + ANSWER_GRACE`` is cancelled if it has not started, and RateLimitTimeoutError raised.
    """
    import ray
    from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayTaskError

    deadline = None if wait is None else time.monotonic() + wait + ANSWER_GRACE
    results = []
    for shard, ref in calls:
        try:
            results.append(ray.get(ref, timeout=None if deadline is None else max(0.0, deadline - time.monotonic())))
        except GetTimeoutError:
            for _, late in calls[len(results):]:
                ray.cancel(late)  # a call still queued never runs: no counter moves after the learner gave up
            raise RateLimitTimeoutError(
                f"shard {shard}: no answer within timeout={wait} s (+{ANSWER_GRACE:g} s to reply): its actor runs no "
                "call of the learner's (busy or stuck), and the call is cancelled where it had not started. Raise "
                "timeout, or look at the shard's actor") from None
        except RayTaskError as error:
            if isinstance(error.cause, RlbufError):
                raise error.cause from None
            raise
        except RayActorError as error:
            if restarting:
                raise ShardRestartingError(
                    f"shard {shard}: its Ray actor died during this call ({type(error).__name__}), which did not "
                    "complete; Ray starts it again from its part of the checkpoint at restart_from (the rows it took "
                    "after that are lost, reported by a ShardRestartedWarning): call again", shard,
                    isinstance(error, ActorUnavailableError)) from error
            raise ShardDiedError(
                f"shard {shard}: its Ray actor is gone ({type(error).__name__}); the rows it held since the last"
                " checkpoint are lost. Rebuild the service from that checkpoint with ReplayService.load(path)"
            ) from error
    return results


def wait_any(shards: Sequence[Any], held: Sequence[tuple[int, int]], wait_round: int, timeout: float | None, *,
             restarting: bool = False) -> None:
    """Return once one shard of ``held`` (``(shard, rows)`` pairs) lets its rows be sampled, or once a wait ended
    otherwise; the others' waits of this ``wait_round`` are ended then (``shard_stop_waiting``). Draws nothing.

    Raises:
        RateLimitTimeoutError: none let its rows be sampled within ``timeout`` seconds.
        ShardDiedError: a shard's actor is gone (as ``get``).
    """
    import ray

    waits = [(k, shards[k].shard_wait_sample.remote(count, timeout, wait_round)) for k, count in held]
    ray.wait([ref for _, ref in waits], num_returns=1, timeout=None if timeout is None else timeout + ANSWER_GRACE)
    for k, _ in held:
        shards[k].shard_stop_waiting.remote(wait_round)
    admitted, timed_out = False, None
    for k, ref in waits:
        try:
            admitted = get([(k, ref)], restarting=restarting, wait=timeout)[0] or admitted
        except RateLimitTimeoutError as error:
            timed_out = timed_out or error
    if timed_out is not None and not admitted:
        raise timed_out


def answered(shard: Any, deadline: float | None) -> dict[str, Any] | None:
    """``shard``'s stats once its actor answers (Ray restarting it), or ``None`` past ``deadline`` (monotonic)."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return None
        try:
            stats: dict[str, Any] = ray.get(shard.shard_stats.remote(), timeout=left)
            return stats
        except RayTaskError as error:  # the restarted shard could not rebuild itself: its error
            if isinstance(error.cause, RlbufError):
                raise error.cause from None
            raise
        except (RayActorError, GetTimeoutError):
            time.sleep(0.01)


def stop(shard: Any) -> None:
    """Stop a shard actor: it removes what it made (a memmap scratch directory) and exits, or is killed."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    with contextlib.suppress(RayActorError, GetTimeoutError):
        ray.get(shard.rlbuf_close.remote(), timeout=30)
    ray.kill(shard)
    wait_until_dead(shard)


def wait_until_dead(shard: Any, timeout: float = 30.0) -> None:
    """Return once ``shard``'s actor is gone (an exit or a kill is not instant)."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get(shard.synchronize.remote(), timeout=1.0)
        except (RayActorError, GetTimeoutError) as error:
            if isinstance(error, RayActorError):
                return
        time.sleep(0.01)


def start_ray(ray_init_config: Mapping[str, Any] | None) -> bool:
    import ray

    if ray.is_initialized():
        return False
    ray.init(**dict(ray_init_config or {}))
    return True
