"""A refused shape ends with the fix for the usual slips: a missing ``num_envs``, a trailing dim of
1 too many (``[N, 1]`` values from a critic) or too few (a scalar action for ``Box((1,))``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlbuf import DtypeError, ReplayBuffer, RolloutBuffer, ShapeError


def test_a_buffer_built_without_num_envs_says_to_pass_it():
    buffer = ReplayBuffer(10, obs_shape=(3,), action_shape=())
    with pytest.raises(ShapeError, match=r"got \(4, 3\); this buffer was built for one env .* build it with num_envs=4"):
        buffer.add(np.zeros((4, 3)), np.zeros(4), np.zeros(4), np.zeros((4, 3)), terminated=np.zeros(4, bool),
                   truncated=np.zeros(4, bool))
    assert len(buffer) == 0


def test_a_critics_n_by_1_values_are_told_to_squeeze():
    rollout = RolloutBuffer(2, 4, obs_shape=(3,), action_shape=())
    with pytest.raises(ShapeError, match=r"value: expected shape \(4,\), got \(4, 1\); drop the trailing dim of 1: "
                                         r"value.squeeze\(-1\)"):
        rollout.add(torch.zeros(4, 3), torch.zeros(4), torch.zeros(4), torch.zeros(4, dtype=torch.bool),
                    torch.zeros(4, 1), torch.zeros(4), truncated=False)
    assert rollout.steps == 0


@pytest.mark.parametrize(("num_envs", "action", "wanted"), [(1, 0.5, r"\(1,\)"), (3, np.zeros(3), r"\(3, 1\)")])
def test_a_scalar_action_for_a_box_of_one_is_told_the_shape(num_envs, action, wanted):
    buffer = ReplayBuffer(10, obs_shape=(2,), action_shape=(1,), num_envs=num_envs)
    obs = np.zeros((num_envs, 2)) if num_envs > 1 else np.zeros(2)
    flags = np.zeros(num_envs, bool) if num_envs > 1 else False
    with pytest.raises(ShapeError, match=r"action has a trailing dim of 1 in this buffer: give shape " + wanted):
        buffer.add(obs, action, np.zeros(num_envs) if num_envs > 1 else 0.0, obs, terminated=flags, truncated=flags)
    assert len(buffer) == 0


def test_a_plain_wrong_shape_gets_no_made_up_hint():
    buffer = ReplayBuffer(10, obs_shape=(3,), action_shape=())
    with pytest.raises(ShapeError) as caught:
        buffer.add(np.zeros(5), 0, 0.0, np.zeros(3), terminated=False, truncated=False)
    assert str(caught.value) == "obs: expected shape (1, 3) or (3,), got (5,)"


@pytest.mark.parametrize("given", [np.zeros(1), torch.zeros(1, 1)[0]])
def test_one_envs_reward_is_told_to_give_every_envs_not_to_squeeze(given):
    buffer = ReplayBuffer(10, obs_shape=(3,), action_shape=(), num_envs=4)
    flags = np.zeros(4, bool)
    with pytest.raises(ShapeError) as caught:
        buffer.add(np.zeros((4, 3)), np.zeros(4), given, np.zeros((4, 3)), terminated=flags, truncated=flags)
    assert str(caught.value).endswith("that is one env's reward: this buffer (num_envs=4) takes every env's at once, "
                                      "shape (4,)")
    assert len(buffer) == 0


@pytest.mark.parametrize("num_envs", [2, 4])
def test_one_envs_obs_is_told_to_give_every_envs(num_envs):
    """CartPole's obs has 4 values: with 4 envs one env's obs is also what a batched space's buffer takes."""
    buffer = ReplayBuffer(10, obs_shape=(4,), action_shape=(), num_envs=num_envs)
    flags = np.zeros(num_envs, bool)
    with pytest.raises(ShapeError) as caught:
        buffer.add(np.zeros(4), np.zeros(num_envs), np.zeros(num_envs), np.zeros((num_envs, 4)), terminated=flags,
                   truncated=flags)
    message = str(caught.value)
    assert "give every env's at once" in message or "takes every env's at once" in message
    assert ("single_observation_space" in message) == (num_envs == 4)


def test_other_libraries_methods_name_rlbufs():
    rollout = RolloutBuffer(2, 4, obs_shape=(3,), action_shape=())
    for method, hint in [("get", "minibatches(batch_size=...)"), ("reset", "clear()"),
                         ("compute_returns_and_advantage", "compute_returns_and_advantages(last_value")]:
        with pytest.raises(AttributeError, match=f"'RolloutBuffer' object has no attribute '{method}'; .*"
                                                 + hint.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
            getattr(rollout, method)
    with pytest.raises(AttributeError) as caught:
        rollout.nothing_like_it  # noqa: B018
    assert str(caught.value) == "'RolloutBuffer' object has no attribute 'nothing_like_it'"
    assert not hasattr(ReplayBuffer(4, obs_shape=(2,), action_shape=()), "reset")


def test_float_frames_into_a_uint8_buffer_are_not_told_to_be_cast() -> None:
    # The hint said obs.to(torch.uint8), which turns frames scaled to [0, 1] into 0s and 1s (helper 52).
    buffer = ReplayBuffer(8, obs_shape=(4, 6, 6), obs_dtype=torch.uint8, action_shape=(), frame_stack=4)
    frames = np.full((4, 6, 6), 0.5, np.float32)
    with pytest.raises(DtypeError, match=r"scale them after sampling, or build the buffer with obs_dtype=torch.float32"):
        buffer.add(frames, 0, 0.0, frames, False, truncated=False)
    assert "+ compressed frames" not in repr(buffer)
    compressed = ReplayBuffer(8, obs_shape=(4, 6, 6), obs_dtype=torch.uint8, action_shape=(), frame_stack=4,
                              compression="zstd")
    assert repr(compressed).endswith("+ compressed frames, fields=[obs: (6, 6) uint8 zstd-compressed, action: () "
                                     "float32, reward: () float32, terminated: () bool, truncated: () bool, "
                                     "done: () bool])")   # empty: the frames' size is not known yet
