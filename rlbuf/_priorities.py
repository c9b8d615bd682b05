"""Priorities as users give them (``|TD error|`` per sampled index), read into one checked float64 tensor.

Example:
    >>> priorities(np.array([0.5, 2.0]), 2).dtype
    torch.float64
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlbuf._convert import as_array
from rlbuf.errors import PriorityError

MAX_PRIORITY = 1e100


def priorities(priority: Any, count: int) -> torch.Tensor:
    """``count`` priorities (e.g. ``|TD error|``) as float64, each finite, non-negative and at most 1e100.

    Raises:
        PriorityError: not numbers, not ``count`` of them, or a value out of range.

    Example:
        >>> priorities([0.5, 2], 2).tolist()
        [0.5, 2.0]
        >>> priorities([-1.0], 1)
        Traceback (most recent call last):
        ...
        rlbuf.errors.PriorityError: priority: expected finite, non-negative values up to 1e+100
    """
    array = as_array("priority", priority, PriorityError)
    if array.dtype.kind == "b":
        raise PriorityError(f"priority: expected numbers, got dtype {array.dtype}")
    values = torch.from_numpy(array.astype(np.float64)).reshape(-1)
    if values.numel() != count:
        raise PriorityError(f"priority: expected {count} values (one per index), got {values.numel()}")
    # Priorities are summed in float64: a bound far below its range keeps every total finite.
    if not bool(torch.isfinite(values).all()) or bool((values < 0).any()) or bool((values > MAX_PRIORITY).any()):
        raise PriorityError(f"priority: expected finite, non-negative values up to {MAX_PRIORITY:g}")
    return values
