"""A rollout's GAE pass: advantages and returns of its stored ``[T, N]`` columns, written into them.

Example:
    >>> import torch
    >>> columns = {name: torch.zeros(2, 1) for name in ("reward", "value", "bootstrap_value", "advantage", "returns")}
    >>> columns |= {"reward": torch.ones(2, 1), "terminated": torch.zeros(2, 1, dtype=torch.bool)}
    >>> columns["truncated"] = torch.zeros(2, 1, dtype=torch.bool)
    >>> write_advantages(columns, torch.zeros(1), gamma=0.5, gae_lambda=1.0, normalize=False, scratch=None)
    >>> columns["returns"].flatten().tolist()
    [1.5, 1.0]
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from rlbuf.errors import NonFiniteError
from rlbuf.gae import compute_gae


def write_advantages(columns: Mapping[str, torch.Tensor], last: torch.Tensor, *, gamma: float, gae_lambda: float,
                     normalize: bool, scratch: tuple[torch.Tensor, torch.Tensor] | None) -> None:
    """Compute GAE over a full rollout's columns (``reward`` ... ``bootstrap_value``) and write ``advantage`` and
    ``returns``; call while the ring is being rewritten (``RowRing.rewriting``).

    A refused call leaves current advantages as they were: with ``scratch`` (two ``[T, N]`` tensors, kept by the
    buffer: fresh ones every call cost more than the kernel) they are computed there, checked, then copied.
    Without it the columns hold the zeros every commit derives (or stale values): they are computed in place and
    zeroed again if refused. The PPO loop (clear, add, compute) takes the second way.

    Raises:
        NonFiniteError: advantages or returns beyond float32 (rewards near ``3e38``), or normalizing them gave
            NaN or inf.
    """
    stored = (columns["advantage"], columns["returns"])
    try:
        advantage, returns = compute_gae(
            columns["reward"], columns["value"], columns["terminated"], columns["truncated"], last,
            gamma=gamma, gae_lambda=gae_lambda, bootstrap_value=columns["bootstrap_value"],
            out=stored if scratch is None else scratch)
        if normalize:
            # One row has no spread (its std is NaN): it is only centred.
            spread = advantage.std() if advantage.numel() > 1 else torch.zeros((), device=advantage.device)
            advantage.sub_(advantage.mean()).div_(spread + 1e-8)
            _check_normalized(advantage, spread)
    except NonFiniteError:
        if scratch is None:
            for column in stored:
                column.zero_()
        raise
    if scratch is not None:
        _store_computed(columns["advantage"], advantage)
        _store_computed(columns["returns"], returns)


def _check_normalized(advantage: torch.Tensor, spread: torch.Tensor) -> None:
    """Refuse normalized advantages that are not finite, or divided by an infinite spread (beyond float32: all
    zeros), before they are stored."""
    if not bool(torch.isfinite(spread)) or (not bool(torch.isfinite(advantage.sum()))
                                            and not bool(torch.isfinite(advantage).all())):
        raise NonFiniteError("advantage: normalizing gave NaN or inf (the advantages spread beyond float32); "
                             "scale the rewards and values down, or normalize them yourself in float64")


def _store_computed(column: torch.Tensor, values: torch.Tensor) -> None:
    """Copy checked advantages or returns into their stored column (by numpy on the CPU: torch's copy threads,
    left spinning, would slow the next GAE kernel down on a machine of few cores)."""
    if column.device.type == "cpu":
        np.copyto(column.detach().as_subclass(torch.Tensor).numpy(), values.numpy())
    else:
        column.copy_(values)
