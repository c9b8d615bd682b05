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

import torch


def nstep_return(rewards: torch.Tensor, steps: torch.Tensor, gamma: float) -> torch.Tensor:
    """``sum_{i<m} gamma**i * rewards[:, i]`` per row (float64 sums, float32 result).

    Args:
        rewards: ``[B, n]`` rewards of the steps after each transition's start (entries at
            ``i >= m`` are ignored).
        steps: ``m`` per row ``[B]``.
        gamma: the discount.
    """
    n = rewards.shape[1]
    powers = torch.tensor([gamma**i for i in range(n)], dtype=torch.float64, device=rewards.device)
    used = torch.arange(n, device=rewards.device) < steps.to(rewards.device)[:, None]
    total = (rewards.to(torch.float64) * powers * used).sum(dim=1)
    return total.to(torch.float32)


def nstep_discount(steps: torch.Tensor, terminated: torch.Tensor, gamma: float) -> torch.Tensor:
    """``gamma**m``, or 0 where the episode terminated within the ``m`` steps (float32 ``[B]``)."""
    discount = (gamma ** steps.to(torch.float64)).to(torch.float32)
    return discount.masked_fill_(terminated, 0.0)
