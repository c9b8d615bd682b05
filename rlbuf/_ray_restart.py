"""Shards that Ray restarts from the last checkpoint (``ReplayService(..., restart_from=path)``), never silently.

With ``restart_from``, each shard actor is started with Ray's ``max_restarts=-1``: when its
process dies, Ray starts it again under the same handle, and the shard rebuilds itself from its
part of the checkpoint at ``restart_from`` (empty if none was written yet). Every reply that
carries a shard's stats names the shard's *incarnation*; when the learner hears a new one it
warns with [`ShardRestartedWarning`][rlbuf.ray.ShardRestartedWarning], saying what was lost
(the rows the shard had taken after the checkpoint, at least as many as the learner had seen),
and records it in [`ReplayService.shard_restarts`][rlbuf.ray.ReplayService.shard_restarts].

Example:
    >>> restarts = Restarts([{"incarnation": "a", "write_count": 0}])
    >>> restarts.heard(0, {"incarnation": "a", "write_count": 96}, lambda: {})
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     restarts.heard(0, {"incarnation": "b", "write_count": 64},
    ...                    lambda: {"restored_from": {"path": "/ckpt/shard_0", "write_count": 64}})
    >>> restarts.events
    [{'shard': 0, 'restored_from': '/ckpt/shard_0', 'write_count': 64, 'lost_at_least': 32}]
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from rlbuf._ray_calls import ShardRestartingError, answered
from rlbuf.errors import ConfigError, RlbufWarning

T = TypeVar("T")


class ShardRestartedWarning(RlbufWarning):
    """A shard's actor died and Ray restarted it from the last checkpoint: its rows taken since are gone."""


def restart_path(restart_from: Any) -> str | None:
    """``restart_from`` checked: ``None``, or a directory path made absolute.

    Raises:
        ConfigError: not a path.
    """
    if restart_from is None:
        return None
    if not isinstance(restart_from, str | Path) or not str(restart_from):
        raise ConfigError(f"restart_from: expected None or the path service.save writes to, got {restart_from!r}")
    return str(Path(restart_from).absolute())


class Restarts:
    """What the learner last heard from each shard: which actor answered, and its write count."""

    def __init__(self, infos: Sequence[Mapping[str, Any]]) -> None:
        self.incarnations = [str(info["incarnation"]) for info in infos]
        self.write_counts = [int(info["write_count"]) for info in infos]
        self.events: list[dict[str, Any]] = []

    def heard(self, shard: int, stat: Mapping[str, Any], info_of: Callable[[], Mapping[str, Any]]) -> None:
        """Note shard ``shard``'s ``stat``; warn if another actor answers than last time.

        ``info_of`` asks the shard what it was rebuilt from (called only then).
        """
        incarnation, write_count = str(stat["incarnation"]), int(stat["write_count"])
        if incarnation == self.incarnations[shard]:
            self.write_counts[shard] = write_count
            return
        restored = info_of().get("restored_from")
        known = self.write_counts[shard]
        path = None if restored is None else str(restored["path"])
        saved = 0 if restored is None else int(restored["write_count"])
        lost = max(known - saved, 0)
        self.events.append({"shard": shard, "restored_from": path, "write_count": saved, "lost_at_least": lost})
        self.incarnations[shard], self.write_counts[shard] = incarnation, write_count
        where = (f"from {path} (write count {saved})" if path is not None
                 else "empty (no checkpoint at restart_from yet)")
        warnings.warn(ShardRestartedWarning(
            f"shard {shard}: its Ray actor died and was restarted {where}; the rows it had taken after that are "
            f"gone: {lost} the learner knew of (write count {known}), and any written since it last heard from the "
            "shard. The service goes on; service.shard_restarts lists every restart"), stacklevel=4)


def retried(call: Callable[[], T], shards: Sequence[Any], heard: Callable[[int, dict[str, Any]], None], *,
            timeout: float | None, reads: bool) -> T:
    """``call()``, made again once a shard that Ray was restarting when the call reached it answers, within
    ``timeout`` seconds (``None``: no limit); ``heard(shard, stats)`` is told of the restarted shard first.

    Made again only where that is exact: a call that changes nothing in the shards (``reads``), or one whose
    actor died before finishing it (what it did died with it). A call Ray cannot say was run or not
    (``ActorUnavailableError``) that changes a shard is never made twice: its ``ShardDiedError`` is raised.

    Raises:
        ShardDiedError: the shard did not answer within ``timeout``, or the call's fate is unknown.

    Example:
        >>> retried(lambda: 3, [], lambda shard, stats: None, timeout=1.0, reads=True)
        3
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            return call()
        except ShardRestartingError as error:
            if error.fate_unknown and not reads:
                raise
            stats = answered(shards[error.shard], deadline)
            if stats is None:
                raise
            heard(error.shard, stats)
