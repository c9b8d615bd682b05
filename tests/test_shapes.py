"""One shape check for every shape option: flat, dict leaves, hidden states, actions; nesting has a limit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlbuf import ConfigError, DistillationBuffer, ReplayBuffer, RolloutBuffer
from rlbuf._obs import MAX_DEPTH

BAD_SHAPES = [(3.5,), (2, 2.0), (True,), ("3",), "3", (-1,), 3.0, None, [[3]]]
BUILDERS: dict[str, Callable[[Any], Any]] = {
    "ReplayBuffer obs_shape": lambda shape: ReplayBuffer(10, obs_shape=shape, action_shape=()),
    "ReplayBuffer action_shape": lambda shape: ReplayBuffer(10, obs_shape=(3,), action_shape=shape),
    "RolloutBuffer obs_shape": lambda shape: RolloutBuffer(4, 2, obs_shape=shape, action_shape=()),
    "DistillationBuffer obs_shape": lambda shape: DistillationBuffer(10, obs_shape=shape, action_shape=()),
    "hidden_state_shape": lambda shape: ReplayBuffer(10, obs_shape=(3,), action_shape=(), hidden_state_shape=shape),
    "RolloutBuffer hidden_state_shape": lambda shape: RolloutBuffer(4, 2, obs_shape=(3,), action_shape=(),
                                                                    hidden_state_shape=shape),
    "dict obs_shape leaf": lambda shape: ReplayBuffer(10, obs_shape={"a": (2,), "b": shape}, action_shape=()),
    "nested dict leaf": lambda shape: RolloutBuffer(4, 2, obs_shape={"s": {"t": shape}}, action_shape=()),
    "hidden state leaf": lambda shape: ReplayBuffer(10, obs_shape=(3,), action_shape=(),
                                                    hidden_state_shape={"h": shape}),
    "privileged_obs_shape": lambda shape: RolloutBuffer(4, 2, obs_shape=(3,), action_shape=(),
                                                        privileged_obs_shape=shape),
    "extra_fields": lambda shape: ReplayBuffer(10, obs_shape=(3,), action_shape=(),
                                               extra_fields={"x": (shape, torch.float32)}),
}
OPTION = {"ReplayBuffer obs_shape": r"obs_shape", "ReplayBuffer action_shape": r"action_shape",
          "RolloutBuffer obs_shape": r"obs_shape", "DistillationBuffer obs_shape": r"obs_shape",
          "hidden_state_shape": r"hidden_state_shape", "RolloutBuffer hidden_state_shape": r"hidden_state_shape",
          "dict obs_shape leaf": r"obs_shape\['b'\]", "nested dict leaf": r"obs_shape\['s'\]\['t'\]",
          "hidden state leaf": r"hidden_state_shape\['h'\]", "privileged_obs_shape": "privileged_obs_shape",
          "extra_fields": r"extra_fields\['x'\]"}


@pytest.mark.parametrize("shape", BAD_SHAPES, ids=repr)
@pytest.mark.parametrize("where", list(BUILDERS))
def test_a_shape_that_is_not_a_tuple_of_ints_is_refused_naming_the_option_and_key(where: str, shape: Any) -> None:
    if shape is None and where in ("hidden_state_shape", "RolloutBuffer hidden_state_shape", "privileged_obs_shape"):
        pytest.skip("None means no such field")
    if shape is None and where.endswith(("obs_shape", "action_shape")):
        match = f"{OPTION[where]}: required"
    else:
        match = rf"{OPTION[where]}: expected a tuple of non-negative ints, got "
    with pytest.raises(ConfigError, match=match):
        BUILDERS[where](shape)


@pytest.mark.parametrize("shape", [(3,), [3], 3, np.int64(3), (np.int32(3),), torch.Size([3]), np.array([3])],
                         ids=repr)
def test_ints_of_every_kind_give_the_same_shape(shape: Any) -> None:
    assert ReplayBuffer(10, obs_shape={"a": shape}, action_shape=()).fields[0].shape == (3,)
    assert ReplayBuffer(10, obs_shape=shape, action_shape=()).fields[0].shape == (3,)


def deep(levels: int, leaf: Any = (3,)) -> Any:
    for _ in range(levels):
        leaf = {"k": leaf}
    return leaf


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 2_000])
def test_a_dict_nested_too_deep_is_refused_with_a_config_error_not_a_recursion_error(levels: int) -> None:
    message = rf"obs_shape\['k'\]\['k'\]\['k'\]\.\.\.: nested {MAX_DEPTH + 1} levels deep, more than the {MAX_DEPTH}"
    for build in (lambda: ReplayBuffer(10, obs_shape=deep(levels), action_shape=()),
                  lambda: RolloutBuffer(4, 2, obs_shape=deep(levels), action_shape=()),
                  lambda: DistillationBuffer(10, obs_shape=deep(levels), action_shape=())):
        with pytest.raises(ConfigError, match=message):
            build()
    with pytest.raises(ConfigError, match=r"obs_dtype\['k'\]\['k'\]\['k'\]\.\.\.: nested"):
        ReplayBuffer(10, obs_shape={"k": (3,)}, obs_dtype=deep(levels, torch.float32), action_shape=())


def test_a_gymnasium_dict_space_nested_too_deep_is_refused() -> None:
    space: Any = gym.spaces.Box(-1, 1, (2,), np.float32)
    for _ in range(MAX_DEPTH + 1):
        space = gym.spaces.Dict({"k": space})
    with pytest.raises(ConfigError, match="nested"):
        ReplayBuffer(10, observation_space=space, action_shape=())


def test_the_deepest_nesting_allowed_builds() -> None:
    buffer = ReplayBuffer(10, obs_shape=deep(MAX_DEPTH), action_shape=())
    assert buffer.fields[0].shape == (3,)
