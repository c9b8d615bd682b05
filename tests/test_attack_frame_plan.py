"""An attacker's checks of the compressed sample's plan and kernels' views (this session's core changes).

``plan_stacks`` (one compiled pass with an open-addressing hash table) is held to a plain per-place
reference on walks drawn to collide: few distinct rows at many places, positions a power of two
apart (which Fibonacci hashing maps near one another in a small table), padded places with and
without ``zero_pad``, episodes ending within the steps. Then compressed buffers are held to their
uncompressed twins for the observation dtypes the stream kernels view in words (float16 as uint16,
bool, int16, float32), frame stacks 1 to 3, either padding, n_step 1 and 3, across the ring's wrap.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from _snapshot import same, snapshot
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from rlbuf import EmptyBufferError, ReplayBuffer
from rlbuf._frames_numba import plan_stacks
from rlbuf.errors import StreamError

pytestmark = pytest.mark.usefixtures("small_dictionary_threshold")


@st.composite
def _walks(draw: Any) -> tuple[Any, ...]:
    """A walk as ``Streams.walk`` gives it (``rows``, ``padded``, ``steps``, ``ended``), its stack and padding."""
    stack, n_step = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    count = draw(st.integers(0, 12))
    # Few distinct positions, spaced to collide: a row asked for at many places, probed past its neighbours.
    spacing = draw(st.sampled_from([1, 2**10, 2**20, 2**40]))
    pool = draw(st.lists(st.integers(0, 2**22), min_size=1, max_size=6, unique=True))
    width = stack + n_step
    rows = np.array(draw(st.lists(st.sampled_from(pool), min_size=count * width, max_size=count * width)),
                    np.int64).reshape(count, width) * spacing
    padded = np.zeros((count, width), np.bool_)
    for i in range(count):  # the first k frames of a stack (before its episode start) are padding
        padded[i, :draw(st.integers(0, stack - 1))] = True
    steps = np.array(draw(st.lists(st.integers(1, n_step), min_size=count, max_size=count)), np.int64)
    ended = np.array(draw(st.lists(st.booleans(), min_size=count, max_size=count)), np.bool_)
    return rows, padded, steps, ended, stack, draw(st.booleans())


def _reference(rows: Any, padded: Any, steps: Any, ended: Any, stack: int, zero_pad: bool) -> list[Any]:
    """What each place of the batch holds, place by place: a stored row, zeros, or transition i's final obs."""
    count, held = len(steps), []
    for place in range(2 * count * stack):
        later = place >= count * stack
        i, j = (place - count * stack * later) // stack, place % stack
        column = steps[i] + j if later else j
        if later and j == stack - 1 and ended[i]:
            held.append(("final", i))
        elif zero_pad and padded[i, column]:
            held.append(("zero",))
        else:
            held.append(("row", int(rows[i, column])))
    return held


@settings(max_examples=150, deadline=None)
@given(_walks())
def test_plan_stacks_puts_every_place_where_a_plain_reference_does(walk: tuple[Any, ...]) -> None:
    rows, padded, steps, ended, stack, zero_pad = walk
    expected = _reference(*walk)
    decode, positions, destinations, sources, finals = plan_stacks(rows, padded, steps, ended, stack, zero_pad)
    held: list[Any] = [None] * len(expected)
    for place, position in zip(decode.tolist(), positions.tolist(), strict=True):
        held[place] = ("row", position)
    for k, place in enumerate(finals.tolist()):  # in the order of chain.final_slot[ended]
        held[place] = ("final", int(np.flatnonzero(ended)[k]))
    decoded = set(decode.tolist())
    for place, source in zip(destinations.tolist(), sources.tolist(), strict=True):
        assert source < 0 or source in decoded  # copied from a decoded place, after the decodes
        assert held[place] is None  # no place written twice
        held[place] = ("zero",) if source < 0 else held[source]
    assert held == expected
    # Each stored row decoded once, at the first place that holds it; decodes ascending (decode_rows asks it).
    assert len(set(positions.tolist())) == len(positions)
    assert decode.tolist() == sorted(decode.tolist())
    firsts = {value: place for place, value in reversed(list(enumerate(expected))) if value[0] == "row"}
    assert sorted(firsts.values()) == decode.tolist()
    assert finals.tolist() == sorted(finals.tolist())


FRAME = (3, 2)


def _frames(dtype: torch.dtype, rng: np.random.Generator) -> torch.Tensor:
    """A frame of ``dtype``: float16 with -0.0 and NaN (bytes that differ for equal values, or values never
    equal), bools, negative ints."""
    if dtype == torch.bool:
        return torch.from_numpy(rng.random(FRAME) < 0.5)
    if dtype.is_floating_point:
        frame = torch.from_numpy(rng.standard_normal(FRAME)).to(dtype)
        frame.view(-1)[int(rng.integers(0, frame.numel()))] = float(rng.choice([-0.0, float("nan"), 0.0]))
        return frame
    return torch.from_numpy(rng.integers(-100, 100, FRAME)).to(dtype)


def _steps(dtype: torch.dtype, num_envs: int, stack: int, padding: str, count: int,
           seed: int) -> Iterator[tuple[torch.Tensor, ...]]:
    """Steps of ``num_envs`` envs stacked as gymnasium's ``FrameStackObservation`` stacks them."""
    rng = np.random.default_rng(seed)

    def first(frame: torch.Tensor) -> list[torch.Tensor]:
        return [frame] * stack if padding == "reset" else [torch.zeros_like(frame)] * (stack - 1) + [frame]

    stacks = [first(_frames(dtype, rng)) for _ in range(num_envs)]
    shape = (num_envs, stack, *FRAME) if stack > 1 else (num_envs, *FRAME)
    for _ in range(count):
        ends = rng.random(num_envs) < 0.2
        cut = ends & (rng.random(num_envs) < 0.5)
        following = [[*stacks[env][1:], _frames(dtype, rng)] for env in range(num_envs)]
        yield (torch.stack([torch.stack(s) for s in stacks]).reshape(shape),
               torch.from_numpy(rng.integers(0, 4, num_envs)),
               torch.from_numpy(rng.standard_normal(num_envs).astype(np.float32)),
               torch.stack([torch.stack(s) for s in following]).reshape(shape),
               torch.from_numpy(ends & ~cut), torch.from_numpy(cut))
        stacks = [first(_frames(dtype, rng)) if ends[env] else following[env] for env in range(num_envs)]


def _same(a: Any, b: Any) -> bool:
    """Equal tensors, NaN equal to NaN, bit for bit (-0.0 is not 0.0)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(-1).view(torch.uint8) if a.dtype in (
        torch.float16, torch.float32) else a, b.view(-1).view(torch.uint8) if b.dtype in (torch.float16, torch.float32)
        else b)


@settings(max_examples=25, deadline=None)
@given(dtype=st.sampled_from([torch.float16, torch.bool, torch.int16, torch.float32, torch.uint8]),
       stack=st.integers(1, 3), n_step=st.sampled_from([1, 3]), padding=st.sampled_from(["reset", "zero"]),
       num_envs=st.integers(1, 3), capacity=st.sampled_from([9, 40]), codec=st.sampled_from(["zstd", "lz4"]),
       seed=st.integers(0, 2**16))
def test_compressed_batches_equal_uncompressed_ones_for_every_obs_dtype(
        dtype: torch.dtype, stack: int, n_step: int, padding: str, num_envs: int, capacity: int, codec: str,
        seed: int) -> None:
    shape = (stack, *FRAME) if stack > 1 else FRAME
    plain, compressed = (ReplayBuffer(capacity, obs_shape=shape, action_shape=(), obs_dtype=dtype,
                                      action_dtype=torch.int64, num_envs=num_envs, frame_stack=stack, n_step=n_step,
                                      padding_type=padding, compact=True, seed=1, compression=compression)
                         for compression in (None, codec))
    for step in _steps(dtype, num_envs, stack, padding, 24, seed):
        for buffer in (plain, compressed):
            buffer.add(*step)
    if not plain._compact.walk(np.arange(len(plain))).complete.any():  # type: ignore[union-attr]
        for buffer in (plain, compressed):
            with pytest.raises(EmptyBufferError):
                buffer.sample_all()
        return
    batches = [[buffer.sample_all(), *(buffer.sample(6) for _ in range(2))] for buffer in (plain, compressed)]
    for one, other in zip(*batches, strict=True):
        for name in ("obs", "next_obs", "reward", "discount", "terminated", "truncated", "index"):
            assert _same(getattr(one, name), getattr(other, name)), name


def _env_major(steps: list[tuple[torch.Tensor, ...]]) -> TensorDict:
    """``steps`` as one TensorDict of batch size ``[num_envs, T]`` (each env's rows consecutive: REPEATED envs)."""
    def stacked(k: int) -> torch.Tensor:
        return torch.stack([step[k] for step in steps], 1)
    return TensorDict({"observation": stacked(0), "action": stacked(1), ("next", "observation"): stacked(3),
                       ("next", "reward"): stacked(2), ("next", "terminated"): stacked(4),
                       ("next", "truncated"): stacked(5)}, batch_size=[len(steps[0][0]), len(steps)])


def _transitions(buffer: ReplayBuffer) -> list[tuple[bytes, ...]]:
    """Every complete transition, as bytes, in a canonical order."""
    batch = buffer.sample_all()
    fields = [getattr(batch, name).contiguous().view(len(batch), -1).view(torch.uint8).numpy() for name in (
        "obs", "next_obs", "reward", "discount", "terminated", "truncated", "action")]
    return sorted(tuple(field[i].tobytes() for field in fields) for i in range(len(batch)))


@settings(max_examples=10, deadline=None)
@given(dtype=st.sampled_from([torch.float16, torch.uint8, torch.bool]), stack=st.integers(1, 3),
       padding=st.sampled_from(["reset", "zero"]), codec=st.sampled_from([None, "zstd"]),
       broken=st.tuples(st.integers(0, 1), st.integers(0, 3)), seed=st.integers(0, 2**16))
def test_an_extend_of_several_steps_per_env_is_recorded_as_adds_are_and_a_refused_one_changes_nothing(
        dtype: torch.dtype, stack: int, padding: str, codec: str | None, broken: tuple[int, int], seed: int) -> None:
    shape = (stack, *FRAME) if stack > 1 else FRAME
    extended, added = (ReplayBuffer(16, obs_shape=shape, action_shape=(), obs_dtype=dtype, action_dtype=torch.int64,
                                    num_envs=2, frame_stack=stack, padding_type=padding, compact=True, seed=1,
                                    compression=codec) for _ in range(2))
    steps = list(_steps(dtype, 2, stack, padding, 12, seed))
    for first in range(0, 8, 4):  # the kernels decline [2, 4] (each env 4 times): the numpy path records them
        extended.extend(_env_major(steps[first:first + 4]))
        for step in steps[first:first + 4]:
            added.add(*step)
        assert _transitions(extended) == _transitions(added)  # stored in another order (env-major): no wrap
    env, t = broken
    rest = steps[8:]
    previous = steps[7 + t]  # the step before the broken one, whose next_obs it must continue
    assume(not bool(previous[4][env] | previous[5][env]))
    forged = _env_major(rest)
    obs = forged["observation"]
    obs[env, t] = ~obs[env, t] if dtype == torch.bool else obs[env, t] + 1  # breaks its stream
    before = snapshot(extended)
    with pytest.raises(StreamError, match=f"env {env}"):
        extended.extend(forged)
    assert same(snapshot(extended), before)
