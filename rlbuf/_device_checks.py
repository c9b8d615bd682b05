"""Finiteness of several tensors on an accelerator, checked with one wait for the device.

``bool(torch.isfinite(t).all())`` waits for the device once per tensor: four waits for a
rollout step's reward, value, log-prob and bootstrap value. Here every tensor is summed on
its device, the sums are added up, and one ``float()`` reads the total: NaN or inf anywhere
makes the total non-finite. Only then (or should huge finite values overflow the sum) is each
tensor checked exactly, so the refusal names the field and row as ever.

Example:
    >>> import torch
    >>> from rlbuf.spec import FieldSpec
    >>> reward = FieldSpec("reward", ("next", "reward"), (), torch.float32, finite=True)
    >>> check_finite_together([(reward, torch.tensor([0.0, 1.0]))])
    >>> check_finite_together([(reward, torch.tensor([0.0, float("nan")]))])
    Traceback (most recent call last):
    ...
    rlbuf.errors.NonFiniteError: reward: expected finite values, got nan at row 1
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from rlbuf.spec import FieldSpec


def check_finite_together(checks: Sequence[tuple[FieldSpec, torch.Tensor]]) -> None:
    """Raise ``NonFiniteError`` for the first ``(spec, rows)`` pair holding NaN or inf; one device wait."""
    if not checks:
        return
    # Half types are summed in float32 (their own range overflows at 65504); casting wider
    # types to float64 would cost a copy of each tensor on the device.
    sums = [rows.detach().sum(dtype=torch.float32 if rows.element_size() < 4 else None) for _, rows in checks]
    if math.isfinite(float(functools.reduce(torch.add, sums))):
        return
    for spec, rows in checks:
        spec.check_tensor(rows, tuple(rows.shape[: rows.ndim - len(spec.shape)]), (rows.device,))
