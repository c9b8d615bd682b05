"""The Recorder follows each env's observations: an ``envs.reset()`` it was not told of is refused with
the fix, not stored as wrong rows (helper 56); the habits around it get rlbuf's way."""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from _snapshot import same, snapshot

from rlbuf import (
    DistillationBuffer,
    EpisodeStats,
    MissingFieldError,
    NextStepResetWarning,
    ReplayBuffer,
    ShapeError,
)
from rlbuf.errors import DtypeError, StreamError
from rlbuf.gym import Recorder

LIMIT = 4  # every episode is cut at 4 steps: CartPole's reward is 1 at every real step, 0 at a reset step


def cartpole(num_envs: int = 2) -> Any:
    return gym.vector.SyncVectorEnv([lambda: gym.wrappers.TimeLimit(gym.make("CartPole-v1"), LIMIT)] * num_envs)


def replay(envs: Any) -> ReplayBuffer:
    return ReplayBuffer(1000, observation_space=envs.single_observation_space, action_space=envs.single_action_space,
                        num_envs=envs.num_envs, stats=EpisodeStats(envs.num_envs))


def run(envs: Any, recorder: Recorder, obs: Any, steps: int) -> Any:
    for _ in range(steps):
        action = np.zeros(envs.num_envs, np.int64)
        next_obs, reward, terminated, truncated, info = envs.step(action)
        recorder.record(obs, action, reward, next_obs, terminated, truncated, info)
        obs = next_obs
    return obs


def test_an_envs_reset_the_recorder_was_not_told_of_is_refused_with_the_fix_and_changes_nothing() -> None:
    envs = cartpole()
    buffer = replay(envs)
    recorder = Recorder(envs, buffer)
    run(envs, recorder, envs.reset(seed=0)[0], 6)  # an episode of 4, a reset step, one step of the next
    before = snapshot(buffer), snapshot(buffer.stats)
    obs, _ = envs.reset(seed=1)
    with pytest.raises(StreamError, match=r"^obs: env 0's observation is not the next_obs recorded with its previous "
                                          r"step.*After envs.reset\(\), call recorder.reset\(\)"):
        run(envs, recorder, obs, 1)
    assert same((snapshot(buffer), snapshot(buffer.stats)), before)


def test_told_of_each_reset_the_recorder_stores_every_real_step_and_no_reset_step() -> None:
    envs = cartpole()
    buffer = replay(envs)
    recorder = Recorder(envs, buffer)
    obs = envs.reset(seed=0)[0]
    for round_, steps in enumerate([6, 4, 4]):  # each round ends the episodes at its 4th step
        if round_:
            obs = envs.reset(seed=round_)[0]
            recorder.reset()
        run(envs, recorder, obs, steps)
    assert len(buffer) == 2 * (5 + 4 + 4)  # all but the reset step of round 0
    assert buffer.sample_all().reward.tolist() == [1.0] * len(buffer)
    assert buffer.stats.recent_lengths().count(LIMIT) == 6  # 3 episodes of 4 steps per env


def test_an_envs_reset_right_after_every_episode_ended_makes_the_next_step_real() -> None:
    envs = cartpole()
    buffer = replay(envs)
    recorder = Recorder(envs, buffer)
    run(envs, recorder, envs.reset(seed=0)[0], LIMIT)  # both envs end: their next step would be a reset step
    run(envs, recorder, envs.reset(seed=1)[0], 1)  # but envs.reset() came first: a real step, not left out
    assert len(buffer) == 2 * (LIMIT + 1) and recorder.skipped == 0
    assert buffer.sample_all().reward.tolist() == [1.0] * len(buffer)


class Envs:
    """A vector env that does not say which envs are in their reset step."""

    num_envs = 2

    def __init__(self, mode: str) -> None:
        self.metadata = {"autoreset_mode": mode}


def test_the_same_values_in_another_dtype_or_object_continue_the_trail() -> None:
    buffer = ReplayBuffer(10, obs_shape=(2,), action_shape=(), num_envs=2)
    recorder = Recorder(Envs("same_step"), buffer)
    flags = np.zeros(2, bool)
    next_obs = np.array([[0.1, np.nan], [0.3, 0.4]])  # float64, as an env gives it
    recorder.record(np.zeros((2, 2)), np.zeros(2), np.ones(2), next_obs, flags, flags, {})
    recorder.record(torch.tensor(next_obs, dtype=torch.float32), np.zeros(2), np.ones(2), next_obs + 1, flags, flags, {})
    assert len(buffer) == 4
    with pytest.raises(StreamError, match="env 1's observation"):
        recorder.record(next_obs + np.array([[1, 0], [1, 9]]), np.zeros(2), np.ones(2), next_obs, flags, flags, {})


def test_disabled_envs_reset_after_their_end_are_not_refused() -> None:
    buffer = ReplayBuffer(10, obs_shape=(1,), action_shape=(), num_envs=2)
    recorder = Recorder(Envs("disabled"), buffer)
    ends = np.array([False, True])
    recorder.record(np.zeros((2, 1)), np.zeros(2), np.ones(2), np.ones((2, 1)), ends, ~ends, {})
    recorder.record(np.array([[1.0], [7.0]]), np.zeros(2), np.ones(2), np.ones((2, 1)), ~ends, ~ends, {})  # env 1 reset
    assert len(buffer) == 4
    with pytest.raises(StreamError, match="env 1's observation"):  # env 1 ended nothing: it had to continue
        recorder.record(np.array([[1.0], [7.0]]), np.zeros(2), np.ones(2), np.ones((2, 1)), ~ends, ~ends, {})


def test_a_recorder_that_cannot_see_pending_resets_warns_when_the_envs_ran_before() -> None:
    buffer = ReplayBuffer(10, obs_shape=(1,), action_shape=(), num_envs=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Recorder(Envs("next_step"), buffer)  # an empty buffer: the envs are taken as fresh
        buffer.add(np.zeros((2, 1)), np.zeros(2), np.ones(2), np.ones((2, 1)), np.ones(2, bool), np.zeros(2, bool))
        Recorder(Envs("next_step"), buffer, resetting=np.ones(2, bool))
    recorder = Recorder(Envs("next_step"), buffer)  # warned at the first record: a recorder.reset() may come first
    flags = np.zeros(2, bool)
    with pytest.warns(NextStepResetWarning, match=r"pass resetting=terminated \| truncated of their last step"):
        recorder.record(np.ones((2, 1)), np.zeros(2), np.ones(2), np.ones((2, 1)), flags, flags, {})
    answered = Recorder(Envs("next_step"), buffer)
    answered.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        answered.record(np.ones((2, 1)), np.zeros(2), np.ones(2), np.ones((2, 1)), flags, flags, {})


def test_a_distillation_recorder_holds_each_field_to_one_row_per_env() -> None:
    buffer = DistillationBuffer(10, obs_shape=(3,), action_shape=(), num_envs=4)
    envs = Envs("same_step")
    envs.num_envs = 4
    recorder = Recorder(envs, buffer)
    flags = np.zeros(4, bool)
    before = snapshot(buffer)
    with pytest.raises(ShapeError, match=r"^obs: expected 4 rows \(one per env\), got shape \(2, 3\)"):
        recorder.record(np.zeros((2, 3)), np.zeros(2), np.zeros(2), np.zeros((4, 3)), flags, flags, {})
    assert same(snapshot(buffer), before)


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda rec, o, a: rec.record(o, a, np.ones(2), o, np.zeros(2, bool)), MissingFieldError,
     r"^truncated: required: record\(obs, action, reward, next_obs, terminated, truncated, info\).*CleanRL's done"),
    (lambda rec, o, a: rec.record(o, a, np.ones(2), o, np.zeros(2, bool), [{}, {}]), MissingFieldError,
     r"^truncated: got a list of info dicts.*rlbuf.gym.sb3_step\(dones, infos\)"),
    (lambda rec, o, a: EpisodeStats(2).update(np.ones(2), dones=np.zeros(2, bool)), MissingFieldError,
     r"^update: got dones=, which it does not take; pass terminated= and truncated="),
    (lambda rec, o, a: EpisodeStats(2).update(torch.ones(2), torch.tensor([0.0, 1.0])), DtypeError,
     r"^terminated: expected dtype bool, got float32; pass flags as bools \(a tensor's .bool\(\)"),
])
def test_cleanrl_and_sb3_habits_with_the_recorder_get_rlbufs_way(call: Any, error: type[Exception],
                                                                 message: str) -> None:
    recorder = Recorder(Envs("same_step"), ReplayBuffer(10, obs_shape=(1,), action_shape=(), num_envs=2))
    with pytest.raises(error, match=message):
        call(recorder, np.zeros((2, 1)), np.zeros(2))


def test_a_distillation_buffer_names_a_row_count_that_differs_from_the_observations() -> None:
    buffer = DistillationBuffer(100, obs_shape=(4,), action_shape=(), action_dtype=torch.int64, num_envs=4)
    with pytest.raises(ShapeError, match=r"^expert_action: 4 rows \(shape \(4,\)\) where obs has 1 \(shape \(4,\)\)"):
        buffer.add(torch.zeros(4), torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ShapeError, match=r"^expert_action: 1 row \(shape \(1,\)\) where obs has 3"):
        buffer.add(torch.zeros(3, 4), torch.zeros(1, dtype=torch.int64))
    with pytest.raises(ShapeError, match=r"^obs: expected shape \(B, 4\) for B rows, or \(4,\) for one row, got "
                                         r"\(3, 5\)"):
        buffer.add(torch.zeros(3, 5), torch.zeros(3, dtype=torch.int64))
    assert len(buffer) == 0


def test_a_same_step_next_obs_holding_the_final_observation_is_no_break_after_the_end() -> None:
    # CleanRL's habit: real_next_obs (the final observation where an env ended) passed as next_obs.
    buffer = ReplayBuffer(10, obs_shape=(1,), action_shape=(), num_envs=2)
    recorder = Recorder(Envs("same_step"), buffer)
    ends, none = np.array([False, True]), np.zeros(2, bool)
    real_next_obs = np.array([[1.0], [9.0]])  # env 1 ended at 9 (and was reset to 0)
    info = {"final_obs": np.array([None, np.array([9.0])], dtype=object), "_final_obs": ends}
    recorder.record(np.zeros((2, 1)), np.zeros(2), np.ones(2), real_next_obs, ends, none, info)
    recorder.record(np.array([[1.0], [0.0]]), np.zeros(2), np.ones(2), np.ones((2, 1)), none, none, {})
    assert buffer.sample_all().obs.flatten().tolist() == [0.0, 0.0, 1.0, 0.0]


@pytest.mark.parametrize("scratch", [False, True], ids=["env copy=False", "loop reuses next_obs"])
def test_a_next_obs_array_changed_in_place_after_its_record_is_no_break(scratch: bool) -> None:
    # helper 64: the trail kept a reference only, so the env's (or the loop's) next write into the
    # array made the next step's correct obs look like a break.
    envs = gym.vector.SyncVectorEnv([lambda: gym.wrappers.TimeLimit(gym.make("CartPole-v1"), 20)] * 2,
                                    copy=scratch)
    buffer = replay(envs)
    recorder = Recorder(envs, buffer)
    obs = envs.reset(seed=0)[0].copy()
    for _ in range(30):
        action = np.zeros(2, np.int64)
        next_obs, reward, terminated, truncated, info = envs.step(action)
        recorder.record(obs, action, reward, next_obs, terminated, truncated, info)
        obs = next_obs.copy()
        if scratch:
            next_obs[:] = 0
    assert len(buffer) + recorder.skipped == 60
