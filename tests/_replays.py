"""A small replay buffer filled the same way by the checkpoint attack tests, and exact state comparison.

Example:
    >>> buffer = filled()
    >>> len(buffer), same_state(buffer.state_dict(), filled().state_dict())
    (10, True)
"""

from __future__ import annotations

from typing import Any

import torch

from rlbuf import EpisodeStats, ReplayBuffer


def filled(prioritized: bool = False, stats: bool = False) -> ReplayBuffer:
    """A buffer of capacity 16 holding 10 rows (episode ends and truncations among them)."""
    buffer = ReplayBuffer(16, obs_shape=(3,), action_shape=(), seed=0, prioritized=prioritized,
                          stats=EpisodeStats(1) if stats else None)
    for i in range(10):
        buffer.add(torch.full((3,), float(i)), float(i % 3), float(i), torch.full((3,), i + 0.5), i % 4 == 0, i % 5 == 0)
    return buffer


def same_state(a: Any, b: Any) -> bool:
    """Whether two states (nested dicts, lists, tensors) are equal exactly, dtypes included."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b, strict=True))
    return a is b or a == b
