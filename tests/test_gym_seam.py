"""A Recorder made while NEXT_STEP envs are mid-run leaves out their reset steps too.

What rlbuf assumes of gymnasium's private attributes (``rlbuf/_gym_seam.py``) is pinned here
against the installed gymnasium: a release that renames them fails here first.
"""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from rlbuf import ConfigError, NextStepResetWarning, ReplayBuffer
from rlbuf._gym_seam import pending_resets
from rlbuf.gym import Recorder

CHANGED = "gymnasium changed what rlbuf._gym_seam relies on: {}"


def _envs(mode: str) -> Any:
    if mode == "cartpole vector env":  # make_vec's default for CartPole-v1: its own vector env
        return gym.make_vec("CartPole-v1", num_envs=3)
    return gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode=mode)


def _transitions(batch: Any) -> list[tuple[Any, ...]]:
    return sorted(zip(batch.obs.tolist(), batch.action.tolist(), batch.reward.tolist(), batch.next_obs.tolist(),
                      strict=True))


def _record(envs: Any, recorder: Recorder, obs: Any, steps: int) -> None:
    """Step ``envs`` ``steps`` times from ``obs`` with random actions, every step recorded."""
    for _ in range(steps):
        action = envs.action_space.sample()
        next_obs, reward, terminated, truncated, info = envs.step(action)
        recorder.record(obs, action, reward, next_obs, terminated, truncated, info)
        obs = next_obs


def _buffer() -> ReplayBuffer:
    space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    return ReplayBuffer(2000, observation_space=space, action_space=gym.spaces.Discrete(2), num_envs=3)


@pytest.mark.filterwarnings("ignore::rlbuf.errors.NextStepResetWarning")  # a vector env it cannot see
@pytest.mark.parametrize("mode", ["sync", "cartpole vector env", "async"])
def test_a_recorder_made_mid_run_stores_what_one_made_at_the_start_stores(mode: str) -> None:
    envs = _envs(mode)
    whole, late = _buffer(), _buffer()
    from_start = Recorder(envs, whole)
    late_recorder = None
    obs, _ = envs.reset(seed=1)
    envs.action_space.seed(1)
    ended_before_join = None
    for _ in range(150):
        if late_recorder is None and ended_before_join is not None and ended_before_join.any():
            # The envs that ended at the last step are in their reset step now.
            resetting = ended_before_join if mode == "async" else None
            late_recorder = Recorder(envs, late, resetting=resetting)
            joined_at = len(whole)
        action = envs.action_space.sample()
        next_obs, reward, terminated, truncated, info = envs.step(action)
        for recorder in (from_start, late_recorder):
            if recorder is not None:
                recorder.record(obs, action, reward, next_obs, terminated, truncated, info)
        ended_before_join = terminated | truncated
        obs = next_obs
    envs.close()
    assert late_recorder is not None and late_recorder.skipped > 0
    assert _transitions(late.sample_all()) == _transitions(whole.sample_by_index(np.arange(joined_at, len(whole))))


def test_pending_resets_reads_the_envs_that_just_ended() -> None:
    for mode in ("sync", "cartpole vector env"):
        envs = _envs(mode)
        envs.reset(seed=0)
        assert pending_resets(envs) is not None, CHANGED.format(f"{type(envs.unwrapped).__name__} says nothing")
        for _ in range(200):
            _, _, terminated, truncated, _ = envs.step(envs.action_space.sample())
            pending = pending_resets(envs)
            assert pending is not None
            assert pending.tolist() == (terminated | truncated).tolist(), CHANGED.format(
                f"{type(envs.unwrapped).__name__}'s pending resets are not the last step's ends")
        envs.close()
    envs = _envs("async")
    assert pending_resets(envs) is None  # kept in the worker processes
    envs.close()


def test_resetting_is_checked() -> None:
    envs = _envs("sync")
    with pytest.raises(ValueError, match=r"resetting: expected shape \(3,\)"):
        Recorder(envs, _buffer(), resetting=[True, False])
    same_step = gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync",
                             vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP})
    with pytest.raises(ConfigError, match="resetting: only NEXT_STEP envs"):
        Recorder(same_step, _buffer(), resetting=[True, False, False])
    envs.close()
    same_step.close()


def test_a_recorder_made_mid_run_then_reset_stores_every_step() -> None:
    envs = _envs("sync")
    envs.reset(seed=2)
    envs.action_space.seed(2)
    while True:  # run until an env is in its reset step
        _, _, terminated, truncated, _ = envs.step(envs.action_space.sample())
        if (terminated | truncated).any():
            break
    buffer = _buffer()
    recorder = Recorder(envs, buffer)
    obs, _ = envs.reset(seed=3)  # every step after this is real: its obs is not the final one the envs returned
    _record(envs, recorder, obs, 5)
    envs.close()
    assert recorder.skipped == 0 and len(buffer) == 15


@pytest.mark.parametrize("wrapped", [False, True])
def test_a_recorder_made_mid_run_then_reset_stores_first_steps_of_no_reward(wrapped: bool) -> None:
    # The first real step after envs.reset() was told apart by its reward alone: a step of reward 0 (most Atari
    # steps) was dropped. A SyncVectorEnv seen as it is shows it by its obs; behind a vector wrapper the Recorder
    # cannot see the reset: recorder.reset() tells it, and it warns at the first record where nothing did.
    from gymnasium.wrappers.vector import TransformReward

    envs: Any = gym.vector.SyncVectorEnv([lambda: _CountingEnv() for _ in range(3)])
    envs = TransformReward(envs, lambda reward: reward - 0.01) if wrapped else envs
    envs.reset(seed=0)
    for _ in range(3):  # the episodes end, truncated: every env is in its reset step
        envs.step(np.zeros(3, np.int64))
    buffer = _buffer()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recorder = Recorder(envs, buffer)
        obs, _ = envs.reset(seed=1)
        if wrapped:
            recorder.reset()
        _record(envs, recorder, obs, 2)
    assert caught == []  # the documented order: envs.reset(), recorder.reset(), record
    envs.close()
    assert recorder.skipped == 0 and len(buffer) == 6


def test_a_recorder_that_cannot_see_an_envs_reset_warns_at_its_first_record_and_changes_nothing_if_refused() -> None:
    from gymnasium.wrappers.vector import TransformReward

    envs: Any = TransformReward(gym.vector.SyncVectorEnv([lambda: _CountingEnv() for _ in range(3)]),
                                lambda reward: reward - 0.01)
    envs.reset(seed=0)
    for _ in range(3):  # every env is in its reset step
        envs.step(np.zeros(3, np.int64))
    buffer = _buffer()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        recorder = Recorder(envs, buffer)  # nothing yet: a recorder.reset() may follow
        obs, _ = envs.reset(seed=1)
        next_obs, reward, terminated, truncated, info = envs.step(np.zeros(3, np.int64))
        with pytest.raises(NextStepResetWarning, match=r"envs \[0, 1, 2\] were in NEXT_STEP's reset step.*call "
                                                        r"recorder.reset\(\) too"):
            recorder.record(obs, np.zeros(3, np.int64), reward, next_obs, terminated, truncated, info)
    assert len(buffer) == 0
    with pytest.warns(NextStepResetWarning):  # still not answered: warned again, once
        recorder.record(obs, np.zeros(3, np.int64), reward, next_obs, terminated, truncated, info)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        recorder.record(next_obs, np.zeros(3, np.int64), reward, next_obs + 1, terminated, truncated, info)
    envs.close()
    assert recorder.skipped == 3 and len(buffer) == 3  # without recorder.reset(): the first step was left out


@pytest.mark.filterwarnings("ignore::rlbuf.errors.NextStepResetWarning")  # behind a wrapper: unseen
def test_a_recorder_made_mid_run_skips_reset_steps_whatever_a_reward_wrapper_makes_of_their_reward() -> None:
    # A living penalty made each reset step's reward nonzero, which was taken for proof of a real step: the
    # reset steps were stored as transitions, and the statistics counted them (helper 48).
    from gymnasium.wrappers.vector import TransformReward

    envs = TransformReward(_envs("sync"), lambda reward: reward - 0.01)
    obs, _ = envs.reset(seed=2)
    envs.action_space.seed(2)
    ended = np.zeros(3, np.bool_)
    while not ended.any():  # run until an env is in its reset step
        obs, _, terminated, truncated, _ = envs.step(envs.action_space.sample())
        ended = terminated | truncated
    buffer = _buffer()
    recorder = Recorder(envs, buffer)
    _record(envs, recorder, obs, 1)
    envs.close()
    assert recorder.skipped == int(ended.sum()) and len(buffer) == 3 - int(ended.sum())


class _CountingEnv(gym.Env[np.ndarray, np.int64]):
    """Observations count the episode's steps; no reward; truncated after 3 steps."""

    observation_space = gym.spaces.Box(0.0, 10.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)
    counts = True

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.steps = 0
        return np.zeros(4, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.steps += 1
        return np.full(4, self.steps if self.counts else 0, np.float32), 0.0, False, self.steps == 3, {}


class _IdleEnv(_CountingEnv):
    """An episode that ends, truncated, in the very state it starts from, with no reward (an idle Breakout)."""

    counts = False


def test_the_recorder_does_not_take_an_episode_ending_in_its_start_state_for_a_reset_step() -> None:
    import warnings

    from rlbuf import NextStepResetWarning

    envs = gym.vector.SyncVectorEnv([_IdleEnv, _IdleEnv])
    buffer = ReplayBuffer(100, observation_space=_IdleEnv.observation_space, action_space=_IdleEnv.action_space,
                          num_envs=2, frame_stack=1)
    recorder = Recorder(envs, buffer)
    obs, _ = envs.reset(seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NextStepResetWarning)
        _record(envs, recorder, obs, 12)
    envs.close()
    assert recorder.skipped == 2 * 3  # steps 4, 8 and 12 of each env: its reset steps
    assert len(buffer) == 2 * 12 - recorder.skipped
