"""Per-step metrics given to ``add`` reach the buffer's ``EpisodeStats`` (rl-buffer's "episode info").

The buffers pass ``metrics=`` to the statistics' planned update: checked with the step before any row
is stored, recorded once the rows are. Compared with a plain per-env reference loop.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _snapshot import same, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st

from rlbuf import (
    ConfigError,
    EpisodeStats,
    MissingFieldError,
    NonFiniteError,
    ReplayBuffer,
    RolloutBuffer,
)
from rlbuf.gym import Recorder


def _replay(num_envs: int, **options: object) -> ReplayBuffer:
    return ReplayBuffer(64, obs_shape=(2,), action_shape=(), num_envs=num_envs, seed=0, **options)


def _step(buffer: ReplayBuffer, done: list[bool], **metrics_and_options: object) -> None:
    n = len(done)
    buffer.add(np.zeros((n, 2), np.float32), np.zeros(n, np.float32), np.ones(n, np.float32),
               np.ones((n, 2), np.float32), terminated=np.array(done), truncated=np.zeros(n, bool),
               **metrics_and_options)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.lists(st.booleans(), min_size=2, max_size=2),
                          st.lists(st.floats(-100, 100), min_size=2, max_size=2),
                          st.lists(st.floats(-100, 100), min_size=2, max_size=2)), min_size=1, max_size=30))
def test_summed_and_last_metrics_match_a_plain_reference(steps):
    stats = EpisodeStats(2, metrics={"energy": "sum", "x": "last"})
    buffer = _replay(2, stats=stats)
    running = [0.0, 0.0]
    ended_energy: list[float] = []
    ended_x: list[float] = []
    for done, energy, x in steps:
        _step(buffer, done, metrics={"energy": np.array(energy), "x": np.array(x)})
        for env in range(2):
            running[env] += energy[env]
            if done[env]:
                ended_energy.append(running[env])
                ended_x.append(x[env])
                running[env] = 0.0
    assert len(buffer) == 2 * len(steps)
    if ended_energy:
        assert stats.recent_metric("energy") == pytest.approx(ended_energy)
        assert stats.recent_metric("x") == pytest.approx(ended_x)
    else:
        assert stats.episodes_finished == 0


def test_a_rollout_feeds_its_metrics_too():
    stats = EpisodeStats(2, metrics={"energy": "sum"})
    buffer = RolloutBuffer(3, 2, obs_shape=(2,), action_shape=(), stats=stats, seed=0)
    for t in range(3):
        buffer.add(torch.zeros(2, 2), torch.zeros(2), torch.ones(2), torch.tensor([t == 1, t == 2]),
                   torch.zeros(2), torch.zeros(2), truncated=False, metrics={"energy": torch.tensor([1.0, 2.0])})
    assert stats.recent_metric("energy") == [2.0, 6.0]


def test_metrics_without_statistics_are_refused_with_the_fix_and_nothing_stored():
    buffer = _replay(1)
    with pytest.raises(ConfigError, match=r"stats=EpisodeStats\(num_envs, metrics="):
        _step(buffer, [False], metrics={"energy": np.array([1.0])})
    assert len(buffer) == 0


@pytest.mark.parametrize(("metrics", "error", "words"), [
    (None, ConfigError, "energy"),
    ({"energy": np.array([1.0, float("nan")])}, NonFiniteError, "energy"),
    ({"energy": np.array([1.0, 2.0, 3.0])}, ValueError, "energy"),
])
def test_a_refused_metric_changes_neither_the_buffer_nor_its_statistics(metrics, error, words):
    stats = EpisodeStats(2, metrics={"energy": "sum"})
    buffer = _replay(2, stats=stats)
    _step(buffer, [False, True], metrics={"energy": np.array([1.0, 2.0])})
    before, stats_before = snapshot(buffer), snapshot(stats)
    with pytest.raises(error, match=words):
        _step(buffer, [True, True], **({} if metrics is None else {"metrics": metrics}))
    assert same(snapshot(buffer), before)
    assert same(snapshot(stats), stats_before)
    assert stats.recent_metric("energy") == [2.0]


def test_an_extra_field_named_metrics_is_refused_at_construction():
    with pytest.raises(ConfigError, match="metrics"):
        _replay(1, extra_fields={"metrics": ((), torch.float32)})


def test_the_recorder_passes_metrics_on():
    import gymnasium as gym

    envs = gym.make_vec("Pendulum-v1", num_envs=2, vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP})
    stats = EpisodeStats(2, metrics={"torque": "sum"})
    buffer = ReplayBuffer(1000, observation_space=envs.single_observation_space,
                          action_space=envs.single_action_space, num_envs=2, stats=stats, seed=0)
    recorder = Recorder(envs, buffer)
    obs, _ = envs.reset(seed=0)
    for _ in range(205):
        action = np.full((2, 1), 0.5, np.float32)
        next_obs, reward, terminated, truncated, info = envs.step(action)
        recorder.record(obs, action, reward, next_obs, terminated, truncated, info,
                        metrics={"torque": np.abs(action[:, 0]).astype(np.float64)})
        obs = next_obs
    envs.close()
    assert stats.recent_metric("torque") == [100.0, 100.0]   # 200 steps of 0.5 each, per env
    with pytest.raises(MissingFieldError):
        buffer.add(obs, action, reward, next_obs, terminated)
