"""What a snapshot of the ring copies its rows into, and what it returns.

[`RowRing.snapshot`][rlbuf._ring.RowRing.snapshot] copies every row into a sink while writers run,
then, under the lock, only the rows written meanwhile.

Example:
    >>> sink = RowCopies()
    >>> sink.copy({"reward": torch.arange(4.0)}, 2)
    >>> sink.patch({"reward": torch.arange(4.0) * 10}, [(1, 3)], 3)["reward"].tolist()
    [0.0, 10.0, 20.0]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import torch


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
