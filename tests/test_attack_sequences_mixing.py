"""Helper 102's attack on replay sequences, mixed offline/online pairs and their checkpoints: each refused call
leaves every buffer, cursor, table and random generator exactly as it was."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch
from _snapshot import same, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st

from rlbuf import Hindsight, ReplayBuffer
from rlbuf.errors import BatchSizeError, CheckpointError, DtypeError, NonFiniteError, RlbufError
from rlbuf.mixing import MixedReplay


def _episodes(capacity: int, steps: int, num_envs: int = 1, **options: Any) -> ReplayBuffer:
    buffer = ReplayBuffer(capacity, obs_shape=(4,), action_shape=(), num_envs=num_envs, seed=0, **options)
    for t in range(steps):
        obs = torch.full((num_envs, 4), float(t)).squeeze(0)
        buffer.add(obs, torch.zeros(num_envs).squeeze(0), torch.ones(num_envs).squeeze(0), obs + 0.5,
                   torch.full((num_envs,), t % 50 == 49).squeeze(0), truncated=False)
    return buffer


# -- sample_sequences -----------------------------------------------------------------------------
@pytest.mark.parametrize(("batch_size", "length", "burn_in"), [(10**8, 900, 0), (10**7, 400, 500)])
def test_sequences_no_memory_could_hold_are_refused_before_anything_is_drawn(batch_size: int, length: int,
                                                                              burn_in: int) -> None:
    # The memory check counted batch_size rows, not batch_size * (burn_in + length): torch's allocation failed
    # (a RuntimeError, not an rlbuf error) after the start of every sequence was drawn from the buffer's generator.
    buffer = _episodes(2000, 1000)
    before = snapshot(buffer)
    with pytest.raises(BatchSizeError, match=r"^batch_size, length: \d+ sequences of burn_in \+ length = \d+ steps"):
        buffer.sample_sequences(batch_size, length, burn_in=burn_in)
    assert same(snapshot(buffer), before)
    genuine = _episodes(2000, 1000)
    assert torch.equal(buffer.sample_sequences(4, 8).index, genuine.sample_sequences(4, 8).index)


@settings(max_examples=12, deadline=None, derandomize=True)
@given(batch_size=st.one_of(st.integers(-2, 6), st.just(10**12), st.floats(0, 4), st.none()),
       length=st.one_of(st.integers(-1, 40), st.just(10**12), st.booleans()),
       burn_in=st.one_of(st.integers(-1, 40), st.just(2**63), st.booleans()))
def test_sample_sequences_accepts_or_refuses_by_name_and_leaves_the_buffer_as_it_was(
        batch_size: Any, length: Any, burn_in: Any) -> None:
    # Pins down: every refusal is an rlbuf error naming its argument, raised before a draw; every accepted batch
    # is of consecutive steps of the one env within what is stored (never across the cursor).
    buffer = _episodes(24, 30, num_envs=2)
    before = snapshot(buffer)
    try:
        batch = buffer.sample_sequences(batch_size, length, burn_in=burn_in)
    except RlbufError as error:
        assert str(error).split(":")[0] in ("batch_size", "length", "burn_in", "batch_size, length")
        assert same(snapshot(buffer), before)
        return
    obs = batch.obs[..., 0]
    assert batch.obs.shape[:2] == (batch_size, length + burn_in)
    assert bool((obs[:, 1:] - obs[:, :-1] == 1).all())
    assert bool((obs >= 30 - 12).all())  # 12 steps of each env held: none older, none overwritten


# -- MixedReplay ----------------------------------------------------------------------------------
def _pair(**online_options: Any) -> MixedReplay:
    offline = _episodes(64, 40, prioritized=True)
    online = _episodes(64, 20, **online_options)
    return MixedReplay(offline, online, offline_fraction=0.5, seed=3)


def _states(mixed: MixedReplay) -> Any:
    return (snapshot(mixed.offline), snapshot(mixed.online), mixed._generator.get_state().tolist(),
            mixed.offline_fraction, mixed.split)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(priority=st.one_of(
    st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=0, max_size=10),
    st.lists(st.floats(0, 10), min_size=8, max_size=8)),
    offset=st.integers(-1, 70), row=st.integers(0, 7))
def test_a_refused_priority_update_of_a_pair_changes_neither_buffer(priority: list[float], offset: int,
                                                                      row: int) -> None:
    # Pins down: a priority update is checked whole (each part's positions and values) before either buffer's
    # tree changes; an accepted one sets exactly the rows of the buffer each came from.
    mixed = _pair(prioritized=True)
    batch = mixed.sample(8)
    index = batch.index.clone()
    index[row] += offset
    before = _states(mixed)
    try:
        mixed.update_priority(index, priority, from_online=batch.from_online)
    except RlbufError:
        assert _states(mixed) == before
        return
    reference = _pair(prioritized=True)  # the same pair, each part given to its own buffer's update_priority
    assert torch.equal(reference.sample(8).index, batch.index)
    for buffer, rows in ((reference.offline, ~batch.from_online), (reference.online, batch.from_online)):
        if bool(rows.any()):
            buffer.update_priority(index[rows], torch.tensor(priority, dtype=torch.float64)[rows])
    # The rows stored and both trees (state_dict: storage past the rows is uninitialised memory in each pair)
    assert [part["state"] for part in _states(mixed)[:2]] == [part["state"] for part in _states(reference)[:2]]


# -- hindsight rewards --------------------------------------------------------------------------------
def _goal_buffer(reward_fn: Any) -> ReplayBuffer:
    buffer = ReplayBuffer(32, obs_shape={"observation": 2, "achieved_goal": 2, "desired_goal": 2}, action_shape=(),
                          seed=0, hindsight=Hindsight("future", ratio=1.0, reward_fn=reward_fn))
    for t in range(8):
        obs = {"observation": torch.full((2,), t + 0.0), "achieved_goal": torch.full((2,), t + 0.0),
               "desired_goal": torch.full((2,), 9.0)}
        following = {key: value + (1.0 if key != "desired_goal" else 0.0) for key, value in obs.items()}
        buffer.add(obs, 0.0, -1.0, following, False, truncated=t % 4 == 3)
    return buffer


@pytest.mark.parametrize(("reward", "error", "match"), [
    (1e300, DtypeError, r"hindsight reward_fn: values up to 1e\+300 in magnitude do not fit torch.float32"),
    (-1e39, DtypeError, r"hindsight reward_fn: values up to 1e\+39 in magnitude do not fit torch.float32"),
    (float("nan"), NonFiniteError, "hindsight reward_fn: expected finite rewards, got nan"),
    (float("-inf"), NonFiniteError, "hindsight reward_fn: expected finite rewards, got -inf"),
])
def test_relabelled_rewards_beyond_float32_are_refused_for_what_they_are(reward: float, error: type[Exception],
                                                                          match: str) -> None:
    # A reward_fn returning 1e300 was refused as "expected finite rewards, got inf" (the value after its cast to
    # float32, not the one returned), with numpy's overflow warning; rlbuf names overflow as a DtypeError.
    buffer = _goal_buffer(lambda achieved, desired, info: np.full(len(achieved), reward))
    before = snapshot(buffer)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(error, match=match):
            buffer.sample(8)
    assert same(snapshot(buffer), before)


@pytest.mark.parametrize("key", ["size", "write_count"])
def test_a_pair_state_whose_part_counter_is_a_tensor_is_refused_by_name(key: str) -> None:
    # MixedReplay._check_part compared the recorded counter with the part's by != : a tensor of several values
    # there raised torch's "Boolean value of Tensor ... is ambiguous" out of load_state_dict.
    state = _pair().state_dict()
    state["online"] = {**state["online"], key: torch.zeros(3)}
    target = _pair()
    before = _states(target)
    with pytest.raises(CheckpointError, match="online: the buffer holds size"):
        target.load_state_dict(state)
    assert _states(target) == before
