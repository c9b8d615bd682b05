"""RolloutBuffer.add fed every step of gymnasium's NEXT_STEP envs (CleanRL's loop) warns of the reset steps."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from _snapshot import same, snapshot
from gymnasium.vector import AutoresetMode
from tensordict import TensorDict

from rlbuf import EpisodeStats, NextStepResetWarning, RolloutBuffer
from rlbuf.gym import Recorder

N = 4


class _FirstStepPaysNothing(gym.Wrapper):  # type: ignore[type-arg]
    """Reward 0 at the first step of each episode (a real step, which a reset step looks like)."""

    def reset(self, **kwargs: Any) -> Any:
        self._first = True
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        reward, self._first = (0.0 if self._first else reward), False
        return obs, reward, terminated, truncated, info


class _PaidAtTheEnd(gym.Wrapper):  # type: ignore[type-arg]
    """A sparse reward: 1 at an episode's end, 0 at every other step (MiniGrid's kind)."""

    def step(self, action: Any) -> Any:
        obs, _, terminated, truncated, info = self.env.step(action)
        return obs, float(terminated or truncated), terminated, truncated, info


def _envs(mode: AutoresetMode, wrapper: Callable[[gym.Env], gym.Env] | None = None) -> gym.vector.VectorEnv:
    envs = gym.make_vec("CartPole-v1", num_envs=N, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": mode}, wrappers=[] if wrapper is None else [wrapper])
    envs.action_space.seed(0)
    return envs


def _rollout(**options: Any) -> RolloutBuffer:
    return RolloutBuffer(16, N, obs_shape=(4,), action_shape=(), action_dtype=torch.int64, **options)


def _collect(envs: gym.vector.VectorEnv, rollout: RolloutBuffer, steps: int, *, recorder: bool = False,
             tensors: bool = False, before_add: Callable[[], None] | None = None,
             error: bool = False) -> list[warnings.WarningMessage]:
    """CleanRL's loop: every envs.step added to the rollout (cleared when full); the warnings it gave (``error``:
    a NextStepResetWarning raises)."""
    zeros = torch.zeros(N) if tensors else np.zeros(N, np.float32)
    record = Recorder(envs, rollout, bootstrap=lambda final: torch.zeros(len(final))).record if recorder else None
    obs, _ = envs.reset(seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if error:
            warnings.simplefilter("error", NextStepResetWarning)
        for _ in range(steps):
            if rollout.is_full:
                rollout.clear()
            action = envs.action_space.sample()
            next_obs, reward, terminated, truncated, info = envs.step(action)
            if record is not None:
                record(obs, action, reward, next_obs, terminated, truncated, info, value=zeros, log_prob=zeros)
            else:
                if before_add is not None:
                    before_add()
                rollout.add(torch.as_tensor(obs) if tensors else obs, action, reward, terminated, value=zeros,
                            log_prob=zeros, truncated=truncated, bootstrap_value=zeros)
            obs = next_obs
    return [warning for warning in caught if issubclass(warning.category, NextStepResetWarning)]


@pytest.mark.parametrize(("tensors", "own_vector_env", "shared"),
                         [(False, False, False), (True, False, False), (False, True, False), (True, False, True)],
                         ids=["numpy", "tensors", "make_vec-default", "shared-storage"])
def test_cleanrl_loop_on_next_step_envs_warns_once_naming_the_fix(tensors: bool, own_vector_env: bool,
                                                                    shared: bool) -> None:
    rollout = _rollout()
    if shared:  # as for worker processes: every add is read as tensors (the path of a GPU rollout's device tensors)
        rollout._ring.share_storage()
    if own_vector_env:  # gym.make_vec("CartPole-v1", 4): CartPole's own vector env, NEXT_STEP
        envs = gym.make_vec("CartPole-v1", N)
        envs.action_space.seed(0)
    caught = _collect(envs if own_vector_env else _envs(AutoresetMode.NEXT_STEP), rollout, 200, tensors=tensors)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "reset steps of gymnasium's NEXT_STEP autoreset" in message
    assert "AutoresetMode.SAME_STEP" in message and "rlbuf.gym.Recorder" in message
    assert "filterwarnings('ignore', category=rlbuf.NextStepResetWarning)" in message
    assert caught[0].filename == __file__  # at the user's add
    assert not rollout._resets.watching and rollout._resets.ends >= 3


def test_the_warning_made_an_error_leaves_the_buffer_and_its_statistics_as_they_were() -> None:
    rollout = _rollout(stats=EpisodeStats(N))
    before: list[Any] = []
    with pytest.raises(NextStepResetWarning):
        _collect(_envs(AutoresetMode.NEXT_STEP), rollout, 200, error=True,
                 before_add=lambda: before.__setitem__(slice(None), [snapshot(rollout), snapshot(rollout.stats)]))
    assert same(before[0], snapshot(rollout)) and same(before[1], snapshot(rollout.stats))
    assert rollout._resets.watching  # not warned yet: the next reset step is warned of


def test_ends_are_counted_across_rollouts() -> None:
    """One episode end per rollout in one env (fewer than 3 in any rollout): the third one is warned of."""
    rollout = RolloutBuffer(6, 1, obs_shape=(1,), action_shape=())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rollout_index in range(4):
            for step in range(6):  # an end at step 2, its reset step at 3
                rollout.add(np.zeros((1, 1)), [0.0], [0.0 if step == 3 else 1.0], [step == 2], [0.0], [0.0],
                            truncated=False)
            assert len(caught) == (rollout_index >= 2)
            rollout.clear()


@pytest.mark.parametrize(("zeros", "warned"), [(5, True), (6, False)])
def test_warned_only_while_fewer_than_half_of_the_other_steps_pay_exactly_0(zeros: int, warned: bool) -> None:
    """3 ends, each followed by reward 0 and no flag; of the 12 other steps, ``zeros`` pay 0."""
    rollout = RolloutBuffer(15, 1, obs_shape=(1,), action_shape=())
    rewards = iter([0.0] * zeros + [1.0] * (12 - zeros))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(15):  # steps 3, 8, 13 end episodes; 4, 9, 14 follow them
            reward = 0.0 if step in (4, 9, 14) else next(rewards)
            rollout.add(np.zeros((1, 1)), [0.0], [reward], [step in (3, 8, 13)], [0.0], [0.0], truncated=False)
    assert len(caught) == warned


def test_a_step_after_an_end_that_pays_or_ends_stops_the_watch() -> None:
    rollout = RolloutBuffer(12, 1, obs_shape=(1,), action_shape=())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(12):  # the first end is followed by a reward: the envs reset in the same step
            reward = 0.0 if step in (6, 9, 11) else 1.0
            rollout.add(np.zeros((1, 1)), [0.0], [reward], [step in (2, 5, 8, 10)], [0.0], [0.0], truncated=False)
    assert not caught and not rollout._resets.watching


def test_a_sparse_reward_env_is_watched_for_a_hundred_quiet_ends_then_no_more() -> None:
    """Every step pays 0 (a sparse-reward env): the rule cannot hold, and after 100 quiet ends the add stops
    checking it; 101 ends would keep it watching without the bound."""
    rollout = RolloutBuffer(4, 1, obs_shape=(1,), action_shape=())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for end in range(101):
            for step in range(2):  # an end, then a quiet step after it
                rollout.add(np.zeros((1, 1)), [0.0], [0.0], [step == 0], [0.0], [0.0], truncated=False)
            assert rollout._resets.watching == (end < 99)
            rollout.clear()
    assert not caught


def test_an_extend_forgets_each_envs_previous_step() -> None:
    rollout = RolloutBuffer(9, 1, obs_shape=(1,), action_shape=())
    zeros = torch.zeros(1, 1)
    collector = TensorDict({"observation": zeros, "action": torch.zeros(1), "state_value": torch.zeros(1, 1),
                            "sample_log_prob": torch.zeros(1),
                            "next": {"reward": torch.ones(1, 1), "terminated": torch.zeros(1, 1, dtype=torch.bool),
                                     "truncated": torch.zeros(1, 1, dtype=torch.bool)}}, batch_size=[1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(9):  # the third end is followed by a collector's step, then a reward-0 one
            if step == 7:
                rollout.extend(collector)
                continue
            rollout.add(np.zeros((1, 1)), [0.0], [0.0 if step in (2, 5, 8) else 1.0], [step in (1, 4, 6)], [0.0],
                        [0.0], truncated=False)
    assert not caught and rollout._resets.ends == 2


def test_a_step_written_through_torchrl_between_adds_is_not_taken_for_the_one_after_an_end() -> None:
    """Each end is followed by a step written through ``buffer.torchrl`` (which pays), then a reward-0 add: that
    add does not follow the end, so nothing is counted or warned of."""
    rollout = RolloutBuffer(12, 1, obs_shape=(1,), action_shape=())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            rollout.add(np.zeros((1, 1)), [0.0], [1.0], [True], [0.0], [0.0], truncated=False)
            step = rollout.torchrl.storage[0].clone().unsqueeze(0)  # a stored row, made one that pays and goes on
            step["next", "terminated"][:], step["next", "done"][:], step["next", "reward"][:] = False, False, 1.0
            rollout.torchrl.extend(step)
            rollout.add(np.zeros((1, 1)), [0.0], [0.0], [False], [0.0], [0.0], truncated=False)
    assert not caught and rollout._resets.ends == 0


@pytest.mark.parametrize("wrapper", [None, _PaidAtTheEnd], ids=["cartpole", "sparse"])
def test_same_step_envs_do_not_warn(wrapper: Callable[[gym.Env], gym.Env] | None) -> None:
    rollout = _rollout()
    assert not _collect(_envs(AutoresetMode.SAME_STEP, wrapper), rollout, 200)
    resets = rollout._resets
    if wrapper is None:  # the first step after an end paid 1: these envs reset in the same step
        assert not resets.watching
    else:  # every end followed by a step paying 0 with no flag, as most other steps
        assert resets.watching and resets.ends >= 3 and 2 * resets.other_zeros >= resets.others


@pytest.mark.parametrize("wrapper", [None, _FirstStepPaysNothing], ids=["cartpole", "first-step-pays-0"])
def test_a_rollout_fed_by_the_recorder_does_not_warn(wrapper: Callable[[gym.Env], gym.Env] | None) -> None:
    """An env whose first step pays exactly 0 looks like NEXT_STEP's: the plain loop warns (silence it there),
    the Recorder knows the steps are real."""
    assert not _collect(_envs(AutoresetMode.SAME_STEP, wrapper), _rollout(), 200, recorder=True)
    assert len(_collect(_envs(AutoresetMode.SAME_STEP, wrapper), _rollout(), 200)) == (wrapper is not None)
