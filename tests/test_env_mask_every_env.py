"""An ``env_mask`` that keeps every env (``~ended`` on most steps) stores exactly what the add without a mask
stores: the same rows, statistics, cursor and random state, in every layout; a bad mask is still refused."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
from _replays import same_state
from _stacked_envs import Envs
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDictBase

from rlbuf import EpisodeStats, ReplayBuffer
from rlbuf.errors import EmptyBufferError, ShapeError

LAYOUTS = ["plain", "compact", "compact-dict", "stats", "extras"]


def _buffer(layout: str, num_envs: int) -> ReplayBuffer:
    kwargs: dict[str, Any] = dict(num_envs=num_envs, seed=3, action_shape=(), action_dtype=torch.int64)
    if layout == "plain":
        return ReplayBuffer(12, obs_shape=(2, 3, 2), obs_dtype=torch.uint8, **kwargs)
    if layout == "stats":
        return ReplayBuffer(12, obs_shape=(2, 3, 2), obs_dtype=torch.uint8, stats=EpisodeStats(num_envs), **kwargs)
    if layout == "extras":
        return ReplayBuffer(12, obs_shape=(2, 3, 2), obs_dtype=torch.uint8,
                            extra_fields={"cost": ((), torch.float32)}, **kwargs)
    if layout == "compact-dict":
        return ReplayBuffer(12, obs_shape={"image": (2, 3, 2), "state": (2, 2)},
                            obs_dtype={"image": torch.uint8, "state": torch.float32}, frame_stack=2, n_step=2,
                            **kwargs)
    return ReplayBuffer(12, obs_shape=(2, 3, 2), obs_dtype=torch.uint8, frame_stack=2, n_step=2, **kwargs)


@pytest.mark.filterwarnings("ignore::rlbuf.errors.NextStepResetWarning")  # a row ending an episode left out
@settings(max_examples=25, deadline=None)
@given(layout=st.sampled_from(LAYOUTS), num_envs=st.sampled_from([1, 3]), seed=st.integers(0, 2**16),
       steps=st.lists(st.tuples(st.lists(st.integers(0, 2), min_size=3, max_size=3), st.booleans(),
                                st.sampled_from(["numpy", "torch", "list"])), min_size=1, max_size=20))
def test_a_mask_of_every_env_stores_what_no_mask_stores(layout: str, num_envs: int, seed: int,
                                                       steps: list[tuple[list[int], bool, str]]) -> None:
    masked, unmasked = _buffer(layout, num_envs), _buffer(layout, num_envs)
    envs = Envs(num_envs, 2, "reset", torch.uint8, layout == "compact-dict", seed)
    for ends, leave_one_out, kind in steps:
        obs, action, reward, next_obs, terminated, truncated = envs.step(ends[:num_envs])
        keep = np.ones(num_envs, np.bool_)
        keep[0] = not (leave_one_out and layout in ("plain", "stats", "extras"))  # frame streams can't skip a step
        mask: Any = {"numpy": keep, "torch": torch.from_numpy(keep), "list": keep.tolist()}[kind]
        extras = {"cost": reward * 2} if layout == "extras" else {}
        masked.add(obs, action, reward, next_obs, terminated, truncated, env_mask=mask, **extras)
        unmasked.add(obs, action, reward, next_obs, terminated, truncated, env_mask=None if keep.all() else keep,
                     **extras)
        assert len(masked) == len(unmasked)
    assert same_state(masked.state_dict(), unmasked.state_dict())
    assert same_state(_sampled(masked), _sampled(unmasked))


def _sampled(buffer: ReplayBuffer) -> Any:
    try:
        batch = buffer.sample(4)
    except EmptyBufferError as error:  # no transition complete yet (a compact layout): both must say so
        return str(error)
    values = {field.name: getattr(batch, field.name) for field in dataclasses.fields(batch)}
    return {name: value.to_dict() if isinstance(value, TensorDictBase) else value for name, value in values.items()}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mask", [np.ones(3, np.bool_), np.ones((2, 1), np.bool_), np.ones(2, np.int64),
                                  np.ones(2, np.float32)], ids=["too-long", "2-d", "ints", "floats"])
def test_a_mask_of_every_env_is_still_checked(layout: str, mask: np.ndarray[Any, Any]) -> None:
    buffer = _buffer(layout, 2)
    envs = Envs(2, 2, "reset", torch.uint8, layout == "compact-dict", 0)
    obs, action, reward, next_obs, terminated, truncated = envs.step([0, 0])
    before = buffer.state_dict()
    extras = {"cost": reward} if layout == "extras" else {}
    with pytest.raises(ShapeError, match="env_mask: expected 2 bools"):
        buffer.add(obs, action, reward, next_obs, terminated, truncated, env_mask=mask, **extras)
    assert same_state(buffer.state_dict(), before)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("keep", [True, False, np.bool_(True), np.array(False), torch.tensor(True)], ids=str)
def test_one_envs_mask_may_leave_out_the_env_dim_as_its_values_may(layout: str, keep: Any) -> None:
    buffer = _buffer(layout, 1)
    envs = Envs(1, 2, "reset", torch.uint8, layout == "compact-dict", 0)
    obs, action, reward, next_obs, terminated, truncated = envs.step([0])
    extras = {"cost": reward} if layout == "extras" else {}
    buffer.add(obs, action, reward, next_obs, terminated, truncated, env_mask=keep, **extras)
    assert len(buffer) == int(bool(keep))
