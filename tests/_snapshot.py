"""A full, comparable snapshot of a buffer's or tracker's state, and the invariants of a buffer.

``snapshot`` clones everything a refused call must leave as it was: every stored row (the
whole storage, not only the rows counted), the cursor, the write count, the length, the
sampler's state (priorities), every random generator (sampling, epochs, the current epoch
iterator's), the iterator's position, attached extras, the advantages flag and the episode
statistics. ``same`` compares two snapshots exactly (NaN equals NaN, bit for bit).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from rlbuf import EpisodeStats
from rlbuf._buffer import RingBuffer
from rlbuf.epochs import EpochIterator


def _frozen(value: Any) -> Any:
    """A deep copy of ``value`` in which tensors and arrays become (dtype, shape, bytes)."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        return ("tensor", str(tensor.dtype), tuple(tensor.shape), tensor.view(torch.uint8).numpy().tobytes()
                if tensor.numel() else b"")
    if isinstance(value, np.ndarray):
        return ("array", str(value.dtype), value.shape, np.ascontiguousarray(value).tobytes())
    if isinstance(value, Mapping):
        return {str(k): _frozen(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_frozen(v) for v in value]
    if isinstance(value, float) and value != value:
        return ("nan",)
    return value


def snapshot(target: RingBuffer[Any] | EpisodeStats | EpochIterator[Any]) -> Any:
    """Everything observable about ``target``'s state, frozen for comparison."""
    if isinstance(target, (EpisodeStats, EpochIterator)):
        return _frozen(target.state_dict())
    ring = target._ring
    return _frozen({
        "state": target.state_dict(),
        "storage": {name: leaf for name, leaf in ring.leaves.items()},
        "len": len(target),
        "cursor": ring.cursor,
        "write_count": ring.write_count,
        "current_epochs": id(target.current_epochs),
        "beta": getattr(ring.rb.sampler, "beta", None),
    })


def same(a: Any, b: Any) -> bool:
    """Whether two snapshots are identical."""
    return bool(a == b)


def check_invariants(buffer: RingBuffer[Any]) -> None:
    """Assert what must hold after every accepted call (the DQN Zoo ``check_valid`` idea)."""
    ring = buffer._ring
    size = len(buffer)
    assert 0 <= size <= buffer.capacity
    assert ring.write_count >= size
    assert ring.cursor == (ring.write_count % buffer.capacity)
    if size == 0:
        return
    columns = ring.gather(ring.chronological_index())
    if "done" in columns:
        expected = columns["terminated"].to(torch.bool) | columns["truncated"].to(torch.bool)
        assert torch.equal(columns["done"].to(torch.bool), expected)
    for spec in ring.specs:
        if spec.finite:
            assert bool(torch.isfinite(columns[spec.name]).all()), spec.name
    for name, value in ring.rb.sampler.state_dict().items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            # A min tree's unused leaves hold +inf (the identity of min); nothing is ever NaN or negative.
            assert not bool(value.isnan().any()) and bool((value >= 0).all()), name
            if name != "min_leaves":
                assert bool(torch.isfinite(value).all()), name
