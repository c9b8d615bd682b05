"""The compiled stream check, record, walk, stacks and n-step targets agree with the numpy path and a plain numpy walk, table for table.

The numpy path (``Streams.check``/``Streams.record`` for rows of any envs) is the reference here,
itself held to a plain reference by the compact layout's property tests. Steps are drawn with
hypothesis: continuing stacks, episode ends, resets with either padding, and broken stacks
(a wrong observation, a wrong shift, a wrong padding), across the ring's wrap.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlbuf import ReplayBuffer, _streams, _streams_numba
from rlbuf._nstep import nstep_discount, nstep_return
from rlbuf._streams import Chain, Streams
from rlbuf.errors import StreamError


def _streams_pair(capacity: int, num_envs: int, stack: int, padding: str,
                  frame: tuple[int, ...], count: int = 2) -> tuple[Streams, ...]:
    shape = (stack, *frame) if stack > 1 else frame
    return tuple(Streams(capacity, num_envs, shape, torch.uint8, frame_stack=stack, padding_type=padding,
                         n_step=2, storing_device=torch.device("cpu")) for _ in range(count))


def _tables(streams: Streams) -> list[Any]:
    return [streams.back.tolist(), streams.next.tolist(), streams.terminated.tolist(), streams.truncated.tolist(),
            streams.final_slot.tolist(), streams.env.tolist(), streams.last.tolist(), streams.expected.tolist(),
            streams.finals.frames[:streams.finals.top].tolist(), sorted(streams.finals.free)]


def _outcome(call: Any, *args: Any) -> str:
    try:
        call(*args)
    except StreamError as error:
        return str(error)
    return ""


@settings(max_examples=80, deadline=None)
@given(capacity=st.integers(2, 9), num_envs=st.integers(1, 3), stack=st.integers(1, 3),
       padding=st.sampled_from(["reset", "zero"]), frame=st.sampled_from([(2,), (8,), (2, 8)]), data=st.data())
def test_the_compiled_path_matches_the_numpy_path(capacity: int, num_envs: int, stack: int, padding: str,
                                                   frame: tuple[int, ...], data: st.DataObject) -> None:
    """Frames of 2 bytes are compared byte by byte, of 8 and 16 in 8-byte words: the same refusals, which leave the
    tables as they were, and the same tables."""
    compiled, reference = _streams_pair(capacity, num_envs, stack, padding, frame)
    frames = iter(np.random.default_rng(data.draw(st.integers(0, 2**16))).integers(1, 255, (10_000, *frame),
                                                                                  dtype=np.uint8))
    pad = (lambda first: first) if padding == "reset" else (lambda first: np.zeros_like(first))
    stacks = [None] * num_envs  # each env's open stack (a deque of frames), None at an episode's start
    write_count = 0
    for _ in range(data.draw(st.integers(1, 25))):
        obs, next_obs = [], []
        for env in range(num_envs):
            if stacks[env] is None:
                first = next(frames)
                stacks[env] = deque([pad(first)] * (stack - 1) + [first], maxlen=stack)
            current = np.stack(stacks[env])
            stacks[env].append(next(frames))
            following = np.stack(stacks[env])
            fault = data.draw(st.sampled_from(["none"] * 8 + ["obs", "shift", "padding"]))
            if fault == "obs":
                current = current.copy()
                current.reshape(stack, -1)[-1, -1] ^= 1
            elif fault == "shift":
                following = following.copy()
                following.reshape(stack, -1)[0, -1] ^= 1
            elif fault == "padding" and stack > 1:
                current = current.copy()
                current.reshape(stack, -1)[0, -1] ^= 1
            obs.append(current if stack > 1 else current[0])
            next_obs.append(following if stack > 1 else following[0])
        terminated = np.array(data.draw(st.lists(st.booleans(), min_size=num_envs, max_size=num_envs)))
        truncated = np.array(data.draw(st.lists(st.booleans(), min_size=num_envs, max_size=num_envs)))
        envs = np.arange(num_envs, dtype=np.int64)
        obs_t, next_t = np.stack(obs), np.stack(next_obs)
        step = (obs_t, next_t, envs, terminated, truncated)
        expected = _outcome(reference_check, reference, *step)
        before = _tables(compiled)
        assert _outcome(compiled.check, obs_t, next_t, envs, terminated, truncated) == expected
        if expected:
            assert _tables(compiled) == before
            return  # refused by all, alike: the rest of the sequence would build on a step never stored
        write_count += num_envs
        size = min(write_count, capacity)
        compiled.record(envs, write_count - num_envs, next_t, terminated, truncated, write_count=write_count,
                        size=size)
        reference_record(reference, envs, write_count - num_envs, next_t, terminated, truncated, write_count, size)
        assert _tables(compiled) == _tables(reference)
        positions = np.arange(size, dtype=np.int64)
        walked, expected_walk = compiled.walk(positions, write_count=write_count, size=size), reference_walk(
            reference, positions, write_count, size)
        for name in Chain.__slots__:
            assert getattr(walked, name).tolist() == getattr(expected_walk, name).tolist(), name
        _assert_compiled_batches_match(compiled, walked, frame, data)
        for env in np.flatnonzero(terminated | truncated):
            stacks[env] = None


def _assert_compiled_batches_match(streams: Streams, walked: Chain, frame: tuple[int, ...],
                                   data: st.DataObject) -> None:
    """The compiled stacks and n-step targets of the complete walked rows equal ``Streams.stacks`` and
    ``rlbuf._nstep``'s, on stored frames and rewards drawn at random (zeros, ties and signs included)."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    stored = rng.integers(0, 255, (streams.capacity, *frame), dtype=np.uint8)
    rewards = rng.choice(np.array([0.0, -0.0, 1.0, -1.5, 0.1, 3e7], np.float32), streams.capacity)
    complete = np.flatnonzero(walked.complete)
    chain = Chain(*(getattr(walked, name)[complete] for name in Chain.__slots__))
    built = streams.stacks_from(stored, chain)
    expected = streams.stacks(frame, chain, lambda positions: torch.from_numpy(stored[positions]))
    for got, want in zip(built, expected, strict=True):
        assert got.dtype == want.dtype and got.tolist() == want.tolist()
    gamma = data.draw(st.sampled_from([0.99, 0.5, 1.0, 0.0]))
    reward, discount = streams.nstep_from(rewards, chain, np.array([gamma**i for i in range(streams.n_step + 1)]))
    start = streams.frame_stack - 1
    walked_rewards = torch.from_numpy(rewards[chain.rows[:, start:start + streams.n_step]])
    steps, ended_by_death = torch.from_numpy(chain.steps), torch.from_numpy(chain.terminated)
    assert reward.tolist() == nstep_return(walked_rewards, steps, gamma).tolist()
    assert discount.tolist() == nstep_discount(steps, ended_by_death, gamma).tolist()
    for row, m in enumerate(chain.steps.tolist()):  # summed in step order, as a plain loop sums them
        total = sum(gamma**i * float(rewards[chain.rows[row, start + i]]) for i in range(m))
        assert reward[row].item() == np.float32(total)


def _numpy_only(streams: Streams, call: Any) -> Any:
    """``call()`` with ``streams``' kernels declining every call, as they decline an env with two rows: the numpy
    path decides."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(streams, "_check_steps", lambda *args: (_streams.REPEATED, -1))
        patch.setattr(streams, "_record_steps", lambda *args: (_streams.REPEATED, 0))
        return call()


def reference_check(streams: Streams, *args: Any) -> None:
    _numpy_only(streams, lambda: streams.check(*args))


def reference_record(streams: Streams, envs: Any, first: int, next_obs: Any, terminated: Any, truncated: Any,
                     write_count: int, size: int) -> None:
    _numpy_only(streams, lambda: streams.record(envs, first, next_obs, terminated, truncated, write_count=write_count,
                                                size=size))


def reference_walk(streams: Streams, positions: Any, write_count: int, size: int) -> Chain:
    """``Streams.walk`` in plain numpy, step by step over the sampled rows (the code before the compiled one)."""
    capacity, stack, n_step = streams.capacity, streams.frame_stack, streams.n_step
    count = len(positions)
    oldest = write_count - size
    rows = np.empty((count, stack + n_step), np.int64)
    padded = np.zeros((count, stack + n_step), np.bool_)
    rows[:, stack - 1] = positions
    if stack > 1:
        back = streams.back[positions]
        before = back < 0
        serials = np.where(before, -1 - back, back)
        complete = np.asarray((serials >= oldest).all(axis=1))
        rows[:, :stack - 1] = serials % capacity
        padded[:, :stack - 1] = before
    else:
        complete = np.ones(count, np.bool_)
    row = positions
    steps = np.zeros(count, np.int64)
    terminated = np.zeros(count, np.bool_)
    truncated = np.zeros(count, np.bool_)
    final_slot = np.full(count, -1, np.int64)
    walking = complete.copy()
    for step in range(1, n_step + 1):
        row_terminated, row_truncated = streams.terminated[row], streams.truncated[row]
        ends = walking & (row_terminated | row_truncated)
        steps[ends] = step
        terminated |= ends & row_terminated
        truncated |= ends & row_truncated
        final_slot[ends] = streams.final_slot[row[ends]]
        walking &= ~ends
        link = streams.next[row]
        missing = walking & (link < 0)
        complete &= ~missing
        walking &= ~missing
        row = np.where(walking, link % capacity, row)
        rows[:, stack - 1 + step] = row
    steps[walking] = n_step
    return Chain(complete, rows, padded, steps, terminated, truncated, final_slot)


@given(st.lists(st.integers(0, 3), max_size=24), st.booleans())
def test_each_rows_previous_and_each_envs_last_row_in_a_call_are_found_as_a_loop_finds_them(
        envs: list[int], one_env: bool) -> None:
    """Also with one env, whose rows each follow the one before (a shortcut: no sort)."""
    envs, num_envs = ([0] * len(envs), 1) if one_env else (envs, 4)
    seen: dict[int, int] = {}
    expected = []
    for row, env in enumerate(envs):
        expected.append(seen.get(env, -1))
        seen[env] = row
    ids = np.array(envs, np.int64)
    assert _streams._previous_in_call(ids, num_envs).tolist() == expected
    assert _streams._last_in_call(ids, num_envs).tolist() == sorted(seen.values())
    assert _streams._distinct(ids, num_envs) == (len(set(envs)) == len(envs))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=6), st.booleans())
def test_the_kernels_decline_an_env_with_two_rows_and_take_one_row_of_each_env_changing_nothing_when_declining(
        envs: list[int], stack: bool) -> None:
    """Which calls the kernels take is theirs to say (no Python test of the env ids first): they decline exactly
    the calls ``_distinct`` refuses, before changing any table, and ``check`` and ``record`` then take the numpy path,
    which gives the same tables as the kernels for the calls they take."""
    compiled, reference = _streams_pair(8, 4, 2 if stack else 1, "reset", (8,))
    ids = np.array(envs, np.int64)
    rows = np.zeros((len(envs), *compiled.expected.shape[1:]), np.uint8)
    flags = np.zeros(len(envs), np.bool_)
    distinct = len(set(envs)) == len(envs)
    problem = compiled._check_steps(rows, rows, compiled._expected_words, ids, compiled.last, 1, False)[0]
    assert (problem == _streams.REPEATED) == (not distinct)
    before = _tables(compiled)
    freed = compiled._record_steps(ids, 0, flags, flags, 0, compiled.back, compiled._links, compiled._flags,
                                   compiled._per_env, rows, compiled._expected_bytes)[0]
    assert (freed == _streams.REPEATED) == (not distinct)
    if not distinct:
        assert _tables(compiled) == before
    compiled, reference = _streams_pair(8, 4, 2 if stack else 1, "reset", (8,))
    compiled.record(ids, 0, rows, flags, flags, write_count=len(envs), size=len(envs))
    reference_record(reference, ids, 0, rows, flags, flags, len(envs), len(envs))
    assert _tables(compiled) == _tables(reference)


def test_a_reward_of_minus_zero_stays_minus_zero_as_a_plain_buffer_stores_it() -> None:
    buf = ReplayBuffer(8, obs_shape=(2, 1), action_shape=(), frame_stack=2, seed=0)
    plain = ReplayBuffer(8, obs_shape=(2, 1), action_shape=(), seed=0)
    for target in (buf, plain):
        target.add(torch.tensor([[1.0], [1.0]]), 0.0, -0.0, torch.tensor([[1.0], [2.0]]), False, truncated=False)
        target.add(torch.tensor([[1.0], [2.0]]), 0.0, -0.0, torch.tensor([[2.0], [3.0]]), True, truncated=False)
    assert torch.signbit(buf.sample_all().reward).tolist() == torch.signbit(plain.sample_all().reward).tolist()
    assert torch.signbit(buf.sample_all().reward).all()
    rewards, steps = torch.tensor([[-0.0, 0.0, 5.0], [-0.0, -0.0, 1.0]]), torch.tensor([2, 1])
    for stored in (rewards, rewards.to(torch.float64)):  # rlbuf._nstep, the sum sampled hindsight rows take
        assert torch.signbit(nstep_return(stored, steps, 0.5)).tolist() == [False, True]



@pytest.mark.parametrize("dtype", [np.uint8, np.uint64])
@pytest.mark.parametrize("words", [0, 1, 63, 64, 65, 130, 200])
def test_the_compiled_word_compare_finds_a_differing_word_at_every_place_in_a_block_or_the_tail(
        dtype: Any, words: int) -> None:
    """``_same`` reads blocks of 64 words, then a tail (an Atari stack: 3,528 words, 55 blocks and 8 more),
    in ranges that start anywhere in either array."""
    rng = np.random.default_rng(words)
    for a_start, b_start in [(0, 0), (3, 0), (0, 5), (7, 66)]:
        b = rng.integers(0, 255, b_start + words, dtype=np.uint8).astype(dtype)
        a = np.concatenate([rng.integers(0, 255, a_start, dtype=np.uint8).astype(dtype), b[b_start:]])
        assert _streams_numba._same(a, a_start, b, b_start, words) is True
        for differ in range(words):
            changed = a.copy()
            changed[a_start + differ] ^= dtype(1 << (differ % 8))
            assert _streams_numba._same(changed, a_start, b, b_start, words) is False, (a_start, b_start, differ)


@settings(max_examples=60, deadline=None)
@given(num_envs=st.integers(1, 3), stack=st.integers(1, 3), padding=st.sampled_from(["reset", "zero"]),
       half=st.booleans(), data=st.data())
def test_float_rows_are_checked_by_bytes_and_by_value_where_bytes_differ(num_envs: int, stack: int, padding: str,
                                                                          half: bool, data: st.DataObject) -> None:
    """Float observations (an n-step buffer of MuJoCo or CartPole states): the compiled byte check decides
    every step whose bytes continue; -0.0 for 0.0 and NaNs of another payload continue by value, as the
    numpy path says, and real breaks are refused with its words (float16 rows, which numba does not type, as words
    viewed before the call); the compiled record stores NaNs' bytes as the reference does."""
    dtype, np_dtype = (torch.float16, np.float16) if half else (torch.float32, np.float32)
    compiled, reference = (Streams(16, num_envs, (stack, 3) if stack > 1 else (3,), dtype,
                                          frame_stack=stack, padding_type=padding, n_step=2,
                                          storing_device=torch.device("cpu")) for _ in range(2))
    # a NaN of another payload than np.nan
    quiet_nan = (np.array([0x7E01], np.uint16) if half else np.array([0x7FC00001], np.uint32)).view(np_dtype)[0]
    values = np.array([0.0, 1.5, -2.0, np.nan], np_dtype)
    same_value = {0.0: np_dtype(-0.0), 1.5: np_dtype(1.5), -2.0: np_dtype(-2.0)}
    stacks: list[Any] = [None] * num_envs
    write_count = 0
    for _ in range(data.draw(st.integers(1, 12))):
        obs, next_obs = [], []
        for env in range(num_envs):
            if stacks[env] is None:
                first = values[data.draw(st.lists(st.integers(0, 3), min_size=3, max_size=3))]
                pad = first if padding == "reset" else np.zeros(3, np_dtype)
                stacks[env] = deque([pad] * (stack - 1) + [first], maxlen=stack)
            current = np.stack(stacks[env]).copy()
            stacks[env].append(values[data.draw(st.lists(st.integers(0, 3), min_size=3, max_size=3))])
            following = np.stack(stacks[env])
            fault = data.draw(st.sampled_from(["none", "none", "same-value", "obs", "shift"]))
            flat = current.reshape(-1)
            if fault == "same-value":  # every value written as another bit pattern of itself
                flat[:] = [quiet_nan if np.isnan(v) else same_value[float(v)] for v in flat.tolist()]
            elif fault == "obs":
                flat[-1] = 7.0
            elif fault == "shift" and stack > 1:
                following = following.copy()
                following[0, -1] = 7.0
            obs.append(current if stack > 1 else current[0])
            next_obs.append(following if stack > 1 else following[0])
        ended = np.array(data.draw(st.lists(st.booleans(), min_size=num_envs, max_size=num_envs)))
        envs = np.arange(num_envs, dtype=np.int64)
        step = (np.stack(obs), np.stack(next_obs), envs, ended, np.zeros(num_envs, np.bool_))
        expected = _outcome(reference_check, reference, *step)
        before = _bytes(compiled)
        assert _outcome(compiled.check, *step) == expected
        if expected:
            assert _bytes(compiled) == before
            return
        write_count += num_envs
        for streams, record in ((compiled, Streams.record), (reference, None)):
            args = (envs, write_count - num_envs, step[1], ended, step[4])
            if record is None:
                reference_record(streams, *args, write_count, min(write_count, 16))
            else:
                streams.record(*args, write_count=write_count, size=min(write_count, 16))
        assert _bytes(compiled) == _bytes(reference)  # NaNs equal themselves as bytes
        for env in np.flatnonzero(ended):
            stacks[env] = None


def _bytes(streams: Streams) -> list[bytes]:
    return [table.tobytes() for table in (streams.back, streams.next, streams.terminated, streams.truncated,
                                          streams.final_slot, streams.env, streams.last, streams.expected.numpy(),
                                          streams.finals.frames[:streams.finals.top].numpy())]
