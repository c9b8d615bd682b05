"""A snapshot of the ring for ``save`` and ``state_dict``: what it copies its rows into, and what it returns.

[`snapshot`][rlbuf._row_sinks.snapshot] copies every row into a sink while writers run, then, under
the lock, only the rows written meanwhile.

Example:
    >>> sink = RowCopies()
    >>> sink.copy({"reward": torch.arange(4.0)}, 2)
    >>> sink.patch({"reward": torch.arange(4.0) * 10}, [(1, 3)], 3)["reward"].tolist()
    [0.0, 10.0, 20.0]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import torch

from rlbuf import _torchrl

if TYPE_CHECKING:
    from rlbuf._ring import RowRing


class RowSink(Protocol):
    """Where a snapshot's rows go: copied without the lock, then patched under it."""

    def copy(self, leaves: Mapping[str, torch.Tensor], size: int) -> None:
        """Copy rows ``[0, size)`` of every leaf while writers may run."""

    def patch(self, leaves: Mapping[str, torch.Tensor], segments: Sequence[tuple[int, int]],
              size: int) -> Mapping[str, Any]:
        """Under the lock: re-copy ``segments``, keep ``size`` rows, return the rows of the snapshot."""


class RowCopies:
    """A [`RowSink`][rlbuf._row_sinks.RowSink] into fresh tensors (``state_dict``)."""

    def __init__(self) -> None:
        self.rows: dict[str, torch.Tensor] = {}

    def copy(self, leaves: Mapping[str, torch.Tensor], size: int) -> None:
        """Clone rows ``[0, size)`` of every leaf."""
        self.rows = {name: leaf[:size].clone() for name, leaf in leaves.items()}

    def patch(self, leaves: Mapping[str, torch.Tensor], segments: Sequence[tuple[int, int]],
              size: int) -> dict[str, torch.Tensor]:
        """Re-copy ``segments`` into the clones, grown or cut to ``size`` rows."""
        for name, leaf in leaves.items():
            rows = self.rows[name]
            if rows.shape[0] != size:
                resized = leaf.new_empty((size, *leaf.shape[1:]))
                kept = min(size, rows.shape[0])
                resized[:kept] = rows[:kept]
                rows = self.rows[name] = resized
            for start, stop in segments:
                rows[start:stop] = leaf[start:stop]
        return self.rows


class Snapshot(NamedTuple):
    """One write count's rows and counters, and what the caller captured under the same lock."""

    size: int
    cursor: int
    write_count: int
    rows: Mapping[str, Any]
    captured: Any


def snapshot(ring: RowRing, sink: RowSink | None, capture: Callable[[], Any]) -> Snapshot:
    """A consistent snapshot of one write count of ``ring``, without stopping writers for the whole copy.

    The rows are copied into ``sink`` while writers run; then, under the lock that every
    write takes (rlbuf's, TorchRL's and worker processes'), only the rows written since
    the copy began are copied again and ``capture()`` reads the rest of the state. When
    more than ``capacity`` rows were written meanwhile, or rows changed without a write
    (``clear``, a load, TorchRL's ``__setitem__``), every row is copied again.

    Args:
        ring: the buffer's ring.
        sink: where the rows go (``None``: counters and ``capture()`` only).
        capture: called under the lock; its result is returned as ``captured``.
    """
    with ring.lock:
        ring.flush()
        with _torchrl.write_lock(ring.rb):
            size, cursor, count = ring.counters()
            generation = ring.generation
    if sink is not None:
        sink.copy(ring.leaves, size)
    with ring.lock:
        ring.flush()
        with _torchrl.write_lock(ring.rb):
            new_size, new_cursor, new_count = ring.counters()
            written = new_count - count
            if ring.generation != generation or not 0 <= written < ring.capacity or new_size < size:
                segments = [(0, new_size)]
            else:
                segments = [(cursor, min(cursor + written, ring.capacity))]
                if cursor + written > ring.capacity:
                    segments.append((0, cursor + written - ring.capacity))
                segments = [(start, stop) for start, stop in segments if stop > start]
            rows = {} if sink is None else sink.patch(ring.leaves, segments, new_size)
            return Snapshot(new_size, new_cursor, new_count, rows, capture())
