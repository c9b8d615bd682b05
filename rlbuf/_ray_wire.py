"""How rlbuf's Ray actors send values: tensors as numpy arrays, which Ray moves without pickling their bytes.

Example:
    >>> wire = to_wire({"obs": torch.zeros(2)})
    >>> type(wire["obs"]).__name__, from_wire(wire)["obs"].tolist()
    ('ndarray', [0.0, 0.0])
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlbuf.batches import ReplayBatch

BATCH_FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated", "done", "index", "weight",
                 "discount", "hidden_state")


def fields_of(batch: ReplayBatch) -> dict[str, Any]:
    fields: dict[str, Any] = {name: getattr(batch, name) for name in BATCH_FIELDS}
    fields["extras"] = dict(batch.extras)
    return fields


def to_wire(value: Any) -> Any:
    """Tensors (also inside dicts and lists) as numpy arrays, which Ray sends without pickling."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        try:
            return tensor.numpy()
        except TypeError:  # a dtype numpy lacks (bfloat16): pickled as a tensor
            return tensor
    if isinstance(value, dict):
        return {key: to_wire(item) for key, item in value.items()}
    if isinstance(value, list):
        return [to_wire(item) for item in value]
    return value


def from_wire(value: Any) -> Any:
    """Undo ``to_wire``. Arrays Ray hands over are read-only views of its buffers: copied."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value if value.flags.writeable else value.copy())
    if isinstance(value, dict):
        return {key: from_wire(item) for key, item in value.items()}
    if isinstance(value, list):
        return [from_wire(item) for item in value]
    return value


def concat(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Fields of several shards' batches in wire form, row-concatenated (nested dicts key by key,
    ``None`` kept): numpy arrays by one copy, which also makes them writable."""
    first = parts[0]
    merged: dict[str, Any] = {}
    for name, value in first.items():
        values = [part[name] for part in parts]
        if value is None:
            merged[name] = None
        elif isinstance(value, dict):
            merged[name] = concat(values)
        elif len(values) == 1:
            merged[name] = value
        elif isinstance(value, np.ndarray):
            merged[name] = np.concatenate(values)
        else:  # a dtype numpy lacks travels as a tensor
            merged[name] = torch.cat(values)
    return merged

