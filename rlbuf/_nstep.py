"""n-step returns of sampled transitions: discounted reward sums and bootstrap discounts.

A transition that starts at step ``t`` and spans ``m ≤ n`` steps (fewer when its episode ends
first) has ``reward = sum_{i<m} gamma**i * r_{t+i}`` and bootstraps from the observation ``m``
steps later with ``discount = gamma**m``, or 0 when the episode terminated within those steps
(a truncation bootstraps). With ``n = 1`` this is the one-step target's ``gamma * (1 - terminated)``.

Example:
    >>> import torch
    >>> rewards = torch.tensor([[1.0, 1.0, 1.0], [1.0, 2.0, 9.0]])
    >>> steps, terminated = torch.tensor([3, 2]), torch.tensor([False, True])
    >>> nstep_return(rewards, steps, 0.5).tolist()
    [1.75, 2.0]
    >>> nstep_discount(steps, terminated, 0.5).tolist()
    [0.125, 0.0]
"""

from __future__ import annotations

import numpy as np
import torch


def nstep_return(rewards: torch.Tensor, steps: torch.Tensor, gamma: float) -> torch.Tensor:
    """``sum_{i<m} gamma**i * rewards[:, i]`` per row (float64, summed in step order; float32 result), as the
    compiled ``rlbuf._streams_numba.nstep_targets`` sums them.

    Args:
        rewards: ``[B, n]`` rewards of the steps after each transition's start (entries at
            ``i >= m`` are ignored).
        steps: ``m`` per row ``[B]``.
        gamma: the discount.
    """
    if rewards.is_cpu and steps.is_cpu:  # numpy: each small torch op costs several times more on the CPU
        values, counts = rewards.numpy().astype(np.float64), steps.numpy()
        total = np.where(counts > 0, values[:, 0], 0.0)  # from the first term: a reward of -0.0 stays -0.0
        for i in range(1, rewards.shape[1]):
            total = np.where(i < counts, total + values[:, i] * gamma**i, total)
        return torch.from_numpy(total.astype(np.float32))
    values_t = rewards.to(torch.float64)
    counts_t = steps.to(rewards.device)
    total_t = torch.where(counts_t > 0, values_t[:, 0], 0.0)
    for i in range(1, rewards.shape[1]):
        total_t = torch.where(i < counts_t, total_t + values_t[:, i] * gamma**i, total_t)
    return total_t.to(torch.float32)


def nstep_discount(steps: torch.Tensor, terminated: torch.Tensor, gamma: float) -> torch.Tensor:
    """``gamma**m``, or 0 where the episode terminated within the ``m`` steps (float32 ``[B]``)."""
    if steps.is_cpu and terminated.is_cpu:
        discount = np.array([gamma**m for m in range(int(steps.max()) + 1 if steps.numel() else 1)], np.float32)
        return torch.from_numpy(np.where(terminated.numpy(), np.float32(0.0), discount[steps.numpy()]))
    discount_t = (gamma ** steps.to(torch.float64)).to(torch.float32)
    return discount_t.masked_fill_(terminated, 0.0)
