"""A step the episode statistics refuse is not stored either, through every way a buffer takes steps.

Statistics are checked before the rows are written and recorded after they are, so a refusal by
either leaves both as they were. ``PickyStats`` refuses a reward of 7 (``EpisodeStats`` itself
refuses what would overflow a running return, which float32 rewards cannot reach in practice).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from _snapshot import same, snapshot
from tensordict import TensorDict

from rlbuf import ConfigError, EpisodeStats, NonFiniteError, ReplayBuffer, RolloutBuffer


class PickyStats(EpisodeStats):
    def planned_update(self, reward: Any, *args: Any, **kwargs: Any) -> Callable[[], None]:
        if bool((np.asarray(torch.as_tensor(reward)) == 7.0).any()):
            raise NonFiniteError("reward: 7 refused by this tracker")
        return super().planned_update(reward, *args, **kwargs)


def step(t: float, **extras: Any) -> dict[str, Any]:
    return dict(obs=torch.full((2, 3), t), action=torch.zeros(2), reward=torch.full((2,), t),
                next_obs=torch.full((2, 3), t + 1), terminated=torch.zeros(2, dtype=torch.bool),
                truncated=torch.zeros(2, dtype=torch.bool), **extras)


def refused_without_change(target: Any, stats: EpisodeStats, call: Callable[[], Any]) -> None:
    before, stats_before = snapshot(target), snapshot(stats)
    with pytest.raises(NonFiniteError, match="reward"):
        call()
    assert same(before, snapshot(target)) and same(stats_before, snapshot(stats))


@pytest.mark.parametrize("options", [{}, {"extra_fields": {"cost": ((), torch.float32)}}, {"n_step": 2},
                                     {"prioritized": True}], ids=["plain", "extras", "compact", "prioritized"])
@pytest.mark.parametrize("masked", [False, True])
def test_a_replay_add_the_stats_refuse_stores_nothing(options: dict[str, Any], masked: bool) -> None:
    stats = PickyStats(2)
    buffer = ReplayBuffer(8, obs_shape=(3,), action_shape=(), num_envs=2, seed=0, stats=stats, **options)
    extras = {"cost": torch.zeros(2)} if "extra_fields" in options else {}
    for t in range(3):
        buffer.add(**step(float(t), **extras))
    mask = {"env_mask": torch.tensor([True, False])} if masked else {}
    refused_without_change(buffer, stats, lambda: buffer.add(**{**step(3.0, **extras), "reward": torch.full((2,), 7.0)},
                                                             **mask))
    buffer.add(**step(3.0, **extras), **mask)  # the same step with another reward is taken
    assert len(buffer) == (7 if masked else 8)


def test_a_replay_extend_the_stats_refuse_stores_nothing() -> None:
    stats = PickyStats(2)
    buffer = ReplayBuffer(8, obs_shape=(3,), action_shape=(), num_envs=2, seed=0, stats=stats)
    td = TensorDict({"observation": torch.zeros(2, 3, 3), "action": torch.zeros(2, 3),
                     "next": {"observation": torch.ones(2, 3, 3),
                              "reward": torch.tensor([[0.0, 0.0, 7.0], [0.0, 0.0, 0.0]]).unsqueeze(-1),
                              "terminated": torch.tensor([[True, False, False]] * 2).unsqueeze(-1), "truncated": torch.zeros(2, 3, 1, dtype=torch.bool)}},
                    batch_size=[2, 3])
    refused_without_change(buffer, stats, lambda: buffer.extend(td))  # steps before the 7 are undone too


def test_a_rollout_add_or_extend_the_stats_refuse_stores_nothing() -> None:
    stats = PickyStats(2)
    rollout = RolloutBuffer(4, 2, obs_shape=(3,), action_shape=(), seed=0, stats=stats)
    refused_without_change(rollout, stats, lambda: rollout.add(
        torch.zeros(2, 3), torch.zeros(2), torch.full((2,), 7.0), torch.zeros(2, dtype=torch.bool),
        torch.zeros(2), torch.zeros(2), truncated=torch.zeros(2, dtype=torch.bool)))
    td = TensorDict({"observation": torch.zeros(2, 4, 3), "action": torch.zeros(2, 4),
                     "state_value": torch.zeros(2, 4, 1), "sample_log_prob": torch.zeros(2, 4),
                     "next": {"reward": torch.tensor([[1.0, 1.0, 7.0, 0.0]] * 2).unsqueeze(-1),
                              "terminated": torch.tensor([[True, False, False, False]] * 2).unsqueeze(-1), "truncated": torch.zeros(2, 4, 1, dtype=torch.bool)}},
                    batch_size=[2, 4])
    refused_without_change(rollout, stats, lambda: rollout.extend(td))


def test_rows_a_buffer_refuses_leave_the_stats_as_they_were() -> None:
    stats = EpisodeStats(2)
    rollout = RolloutBuffer(4, 2, obs_shape=(3,), action_shape=(), seed=0, stats=stats)
    td = TensorDict({"observation": torch.zeros(2, 4, 3), "action": torch.zeros(2, 4),
                     "state_value": torch.full((2, 4, 1), float("nan")), "sample_log_prob": torch.zeros(2, 4),
                     "next": {"reward": torch.ones(2, 4, 1),
                              "terminated": torch.tensor([[True, False, False, False]] * 2).unsqueeze(-1), "truncated": torch.zeros(2, 4, 1, dtype=torch.bool)}},
                    batch_size=[2, 4])
    before = snapshot(stats)
    with pytest.raises(NonFiniteError, match="value"):
        rollout.extend(td)  # the NaN values are found after the stats saw the steps: they are undone
    assert same(before, snapshot(stats)) and len(rollout) == 0


def test_hidden_state_shape_nested_too_deep_is_refused_by_name() -> None:
    shape: Any = (2,)
    for _ in range(2000):
        shape = {"k": shape}
    for build in (lambda: ReplayBuffer(4, obs_shape=(3,), action_shape=(), hidden_state_shape=shape),
                  lambda: RolloutBuffer(4, 1, obs_shape=(3,), action_shape=(), hidden_state_shape=shape)):
        with pytest.raises(ConfigError, match=r"hidden_state_shape.*nested 33 levels deep"):
            build()
