"""Small buffers, filled or not, that ``tests/test_foreign_names*.py`` call with other libraries' habits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from rlbuf import (
    DistillationBuffer,
    ReplayBuffer,
    RolloutBuffer,
)
from rlbuf.mixing import MixedReplay

Z = torch.zeros(2, 3)
F = torch.zeros(2, dtype=torch.bool)


def replay() -> ReplayBuffer:
    return ReplayBuffer(8, obs_shape=(3,), action_shape=(), num_envs=2)


def rollout() -> RolloutBuffer:
    return RolloutBuffer(4, 2, obs_shape=(3,), action_shape=())


def distill() -> DistillationBuffer:
    return DistillationBuffer(8, obs_shape=(3,), action_shape=(), num_envs=2)


def filled(make: Callable[[], Any]) -> Any:
    buf = make()
    if isinstance(buf, ReplayBuffer):
        buf.add(Z, torch.zeros(2), torch.ones(2), Z, F, truncated=F)
    elif isinstance(buf, RolloutBuffer):
        buf.add(Z, torch.zeros(2), torch.ones(2), F, torch.zeros(2), torch.zeros(2), truncated=F)
    else:
        buf.add(Z, torch.zeros(2))
    return buf


def _ready_rollout() -> RolloutBuffer:
    buf = RolloutBuffer(1, 2, obs_shape=(3,), action_shape=())
    buf.add(Z, torch.zeros(2), torch.ones(2), F, torch.zeros(2), torch.zeros(2), truncated=F)
    return buf


def _with_advantages() -> RolloutBuffer:
    buf = _ready_rollout()
    buf.compute_returns_and_advantages(torch.zeros(2))
    return buf


def _mixed() -> MixedReplay:
    return MixedReplay(filled(replay), filled(replay), seed=0)
