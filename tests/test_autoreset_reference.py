"""The NEXT_STEP reset-step warning against a plain reference, whatever types the flags come in.

Reference: an env's step is a reset step when its previous stored row ended (terminated or
truncated), its ``obs`` equals that row's ``next_obs``, its reward is 0 and it has no flag. A step
after an end whose ``obs`` equals that ``next_obs`` with a reward or a flag shows a reset observation
stored as ``next_obs`` (``SAME_STEP`` without ``info["final_obs"]``) once every step after an end so
far, three at least, did so. The buffer must warn at the first such step and at no other, with
flags given as Python bools, numpy bools, 0-d or 1-d arrays or tensors, mixed within one call.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlbuf import NextStepResetWarning, ReplayBuffer


def _as(kind: str, flag: bool) -> object:
    return {"py": flag, "np": np.bool_(flag), "arr": np.array([flag]), "torch": torch.tensor([flag])}[kind]


flag_kinds = st.sampled_from(["py", "np", "arr", "torch"])
steps = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.sampled_from([0.0, 1.0]), st.booleans(),
                           st.booleans(), flag_kinds, flag_kinds), min_size=1, max_size=25)


# uint8: the watcher compares integer rows by their bytes, floats by value
@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8])
@settings(max_examples=150, deadline=None)
@given(given_steps=steps)
def test_the_warning_comes_exactly_at_the_first_reset_step_of_the_reference(dtype, given_steps):
    buffer = ReplayBuffer(100, obs_shape=(1,), action_shape=(), obs_dtype=dtype, seed=0)
    np_dtype = np.float32 if dtype == torch.float32 else np.uint8
    expected_at = None
    starts = equal = 0  # steps after an end, and those from that end's next_obs
    previous: tuple[bool, int] | None = None  # (ended, next_obs) of the last stored row
    for i, (obs, next_obs, reward, terminated, truncated, _, _) in enumerate(given_steps):
        if expected_at is None and previous is not None and previous[0]:
            if obs == previous[1] and reward == 0.0 and not terminated and not truncated:
                expected_at = i  # NEXT_STEP's reset step
            else:
                starts, equal = starts + 1, equal + (obs == previous[1])
                if equal >= 3 and equal == starts:
                    expected_at = i
        previous = (terminated or truncated, next_obs)
    warned_at = None
    for i, (obs, next_obs, reward, terminated, truncated, kind_te, kind_tr) in enumerate(given_steps):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            buffer.add(np.array([obs], np_dtype), 0.0, reward, np.array([next_obs], np_dtype),
                       _as(kind_te, terminated), _as(kind_tr, truncated))
        if any(issubclass(w.category, NextStepResetWarning) for w in caught):
            assert warned_at is None, "warned twice"
            warned_at = i
    assert warned_at == expected_at
    assert len(buffer) == len(given_steps)


def _cartpole_rows(mask_from: str) -> tuple[ReplayBuffer, list[warnings.WarningMessage]]:
    import gymnasium as gym

    envs = gym.make_vec("CartPole-v1", num_envs=4)  # NEXT_STEP, gymnasium's default
    buffer = ReplayBuffer(2000, observation_space=envs.single_observation_space,
                          action_space=envs.single_action_space, num_envs=4, seed=0)
    envs.action_space.seed(0)
    obs, _ = envs.reset(seed=0)
    previous_end = np.zeros(4, bool)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(120):
            action = envs.action_space.sample()
            next_obs, reward, terminated, truncated, _ = envs.step(action)
            mask = ~(terminated | truncated) if mask_from == "this step" else ~previous_end
            buffer.add(obs, action, reward, next_obs, terminated=terminated, truncated=truncated, env_mask=mask)
            previous_end = terminated | truncated
            obs = next_obs
    envs.close()
    return buffer, [w for w in caught if issubclass(w.category, NextStepResetWarning)]


def test_a_mask_built_from_this_steps_flags_is_warned_with_the_previous_steps_fix():
    buffer, caught = _cartpole_rows("this step")
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "env_mask leaves out env" in message and "ends an episode" in message
    assert "env_mask=~(prev_terminated | prev_truncated)" in message and "PREVIOUS step" in message
    assert not buffer.sample_all().terminated.any()  # what the habit loses: every episode end


def test_a_mask_of_the_previous_steps_flags_stores_every_end_without_a_warning():
    buffer, caught = _cartpole_rows("previous step")
    assert caught == []
    rows = buffer.sample_all()
    assert rows.terminated.any() and bool((rows.reward == 1).all())  # no reset step stored


def test_the_warning_points_at_the_users_line_on_every_path():
    for options in ({}, {"extra_fields": {"cost": ((), torch.float32)}}):  # the plain add, the general one
        buffer = ReplayBuffer(10, obs_shape=(1,), action_shape=(), **options)
        extra = {"cost": 0.0} if options else {}
        buffer.add(np.zeros(1), 0.0, 1.0, np.ones(1), terminated=True, truncated=False, **extra)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            buffer.add(np.ones(1), 0.0, 0.0, np.ones(1), terminated=False, truncated=False, **extra)
        [warning] = caught
        assert warning.category is NextStepResetWarning and warning.filename == __file__
