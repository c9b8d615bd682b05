"""The staged add (each field's fast reader) against the general path of the same pipeline.

``RowReader.checked`` is the general path of a field's reader: ``RowReader.read`` only takes
shortcuts for inputs it would take as they are. A buffer whose ring reads every field with
``checked``, and one whose adds all go the tensor way (``RowReader.tensor``, then one write),
must end with the same rows and state as the fast one, and refuse the same inputs with the
same error, leaving everything as it was.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from _snapshot import same, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from rlbuf import (
    DeviceError,
    DtypeError,
    MissingFieldError,
    NonFiniteError,
    ReplayBuffer,
    RlbufError,
    ShapeError,
    _torchrl,
)
from rlbuf._one_row import reading_all
from rlbuf.spec import all_finite, float_limit

OBS, ACTION = (3,), (2,)
FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")


def make(storage: str = "memory", num_envs: int = 1, capacity: int = 5) -> ReplayBuffer:
    """A buffer whose whole storage holds the same rows as every other one made here."""
    buf = ReplayBuffer(capacity, obs_shape=OBS, action_shape=ACTION, num_envs=num_envs, storage=storage,  # type: ignore[arg-type]
                       seed=0)
    for step in range(math.ceil(capacity / num_envs)):
        rows = torch.arange(num_envs, dtype=torch.float32) + 10 * step
        buf.add(rows[:, None].expand(num_envs, 3), rows[:, None].expand(num_envs, 2), rows,
                rows[:, None].expand(num_envs, 3) + 0.5, rows > 20, rows == 5)
    return buf


def checked_by_reference(buf: ReplayBuffer) -> ReplayBuffer:
    """``buf`` with every field read by its reader's general path (``RowReader.checked``)."""
    ring = buf._ring
    ring._reads = tuple(ring.reader(spec, ring.rows_per_add).checked for spec in ring.input_specs)
    ring._read_all = reading_all(ring._reads)  # the staged add reads through this one call, made at construction
    return buf


def never_staged(buf: ReplayBuffer) -> ReplayBuffer:
    """``buf`` with every add going the tensor way (``RowReader.tensor``, then one write)."""
    buf._ring.add = buf._ring.add_unstaged
    return buf


# -- inputs --------------------------------------------------------------------------------
# Floats that probe the checks: signed zero, subnormals, float32's edge, beyond it, inf, NaN.
EDGES = [-0.0, 1e-45, 1e-310, 3.4028234e38, 3.5e38, 1e300, math.inf, -math.inf, math.nan]
floats = st.one_of(st.floats(-1e6, 1e6, width=32), st.sampled_from(EDGES))


def _array_value(kind: str, values: list[float], shape: tuple[int, ...], batched: bool) -> Any:
    full = (1, *shape) if batched else shape
    array = np.array(values, np.float64).reshape(full)
    if kind == "torch32":
        return torch.tensor(array, dtype=torch.float32)  # beyond float32: inf
    if kind == "torch64":
        return torch.tensor(array)
    if kind == "torch-grad":
        return torch.tensor(array, dtype=torch.float32, requires_grad=True)
    if kind == "bfloat16":
        return torch.tensor(array, dtype=torch.bfloat16)
    if kind == "numpy32":
        return _float32(array)
    if kind == "numpy64":
        return array
    if kind == "strided":  # every other value of a longer array
        return np.repeat(_float32(array), 2, axis=-1)[..., ::2]
    if kind == "big-endian":
        return _float32(array).astype(">f4")
    if kind == "int":
        return np.zeros(full, np.int64)
    if kind == "bool-tensor":
        return torch.zeros(full, dtype=torch.bool)
    if kind == "uint16-tensor":  # an int dtype numpy has and rlbuf does not take
        return torch.zeros(full, dtype=torch.uint16)
    if kind == "wrong-shape":
        return torch.zeros((2, *shape))
    if kind == "list":
        return array.tolist()
    if kind == "meta":
        return torch.zeros(full, device="meta")
    return _tensor_view(kind, array, full)


def _tensor_view(kind: str, array: np.ndarray, full: tuple[int, ...]) -> Any:
    """float32 tensors whose bytes are not simply their values in order: what a reader must read by value."""
    values = torch.tensor(array, dtype=torch.float32)
    if kind == "offset":  # contiguous, starting inside a longer tensor
        return torch.cat([torch.full((5,), 123.0), values.flatten()])[5:].view(full)
    if kind == "expanded":  # one value repeated with stride 0
        return values.flatten()[:1].expand(full)
    if kind == "transposed":  # a column turned into a row: contiguous, with a size-1 dim of any stride
        column = values.reshape(-1, 1)
        return column.T if len(full) == 2 else column.T[0]
    if kind == "negated":  # holds the bytes of -values, with the negation bit set
        return torch.complex(torch.zeros(full), -values).conj().imag
    return None  # "none"


ARRAY_KINDS = ["torch32", "torch64", "torch-grad", "bfloat16", "numpy32", "numpy64", "strided", "big-endian", "int",
               "bool-tensor", "uint16-tensor", "wrong-shape", "list", "meta", "offset", "expanded", "transposed", "negated", "none"]


@st.composite
def array_values(draw: st.DrawFn, shape: tuple[int, ...], kinds: list[str] = ARRAY_KINDS) -> Any:
    values = draw(st.lists(floats, min_size=math.prod(shape), max_size=math.prod(shape)))
    return _array_value(draw(st.sampled_from(kinds)), values, shape, draw(st.booleans()))


def _float32(value: Any) -> Any:
    with np.errstate(over="ignore"):  # beyond float32: inf, as a user's own cast would give
        return np.float32(value)


def _reward_value(kind: str, value: float) -> Any:
    makers: dict[str, Callable[[], Any]] = {
        "float": lambda: value, "int": lambda: int(value) if math.isfinite(value) else 7, "bool": lambda: True,
        "np.float32": lambda: _float32(value), "np.float64": lambda: np.float64(value),
        "numpy32": lambda: np.array([_float32(value)]), "numpy64-0d": lambda: np.array(value),
        "numpy-int": lambda: np.array([3], np.int64), "numpy2": lambda: np.array([_float32(value)] * 2),
        "torch32": lambda: torch.tensor([value]), "torch64-0d": lambda: torch.tensor(value, dtype=torch.float64),
        "torch-int": lambda: torch.tensor([3]), "torch-bool": lambda: torch.tensor([True]),
        "torch11": lambda: torch.tensor([[value]]), "torch-empty": lambda: torch.zeros(0),
        "torch-grad": lambda: torch.tensor([value], requires_grad=True), "meta": lambda: torch.zeros(1, device="meta"),
        "torch-uint16": lambda: torch.tensor([3], dtype=torch.uint16),
        "str": lambda: "1.0", "none": lambda: None,
    }
    return makers[kind]()


REWARD_KINDS = ["float", "int", "bool", "np.float32", "np.float64", "numpy32", "numpy64-0d", "numpy-int", "numpy2",
                "torch32", "torch64-0d", "torch-int", "torch-bool", "torch11", "torch-empty", "torch-grad", "meta",
                "torch-uint16", "str", "none"]


def _flag_value(kind: str, flag: bool) -> Any:
    makers: dict[str, Callable[[], Any]] = {
        "bool": lambda: flag, "np.bool_": lambda: np.bool_(flag), "numpy": lambda: np.array([flag]),
        "numpy-0d": lambda: np.array(flag), "torch": lambda: torch.tensor([flag]), "torch-0d": lambda: torch.tensor(flag),
        "int": lambda: int(flag), "numpy-int": lambda: np.array([1]), "torch-float": lambda: torch.tensor([0.5]),
        "numpy2": lambda: np.array([flag, flag]),
        # A bool tensor may hold any byte (a uint8 tensor viewed as bool): stored as 0 or 1.
        "torch-byte": lambda: torch.tensor([7 * flag], dtype=torch.uint8).view(torch.bool),
        "torch-offset": lambda: torch.tensor([not flag, flag])[1:],
    }
    return makers[kind]()


FLAG_KINDS = ["bool", "np.bool_", "numpy", "numpy-0d", "torch", "torch-0d", "int", "numpy-int", "torch-float", "numpy2",
              "torch-byte", "torch-offset"]


@st.composite
def transitions(draw: st.DrawFn, array_kinds: list[str] = ARRAY_KINDS, reward_kinds: list[str] = REWARD_KINDS,
                flag_kinds: list[str] = FLAG_KINDS) -> tuple[Any, ...]:
    """One step for a one-env buffer, each field in one of many forms, good or bad."""
    return (
        draw(array_values(OBS, array_kinds)),
        draw(array_values(ACTION, array_kinds)),
        _reward_value(draw(st.sampled_from(reward_kinds)), draw(floats)),
        draw(array_values(OBS, array_kinds)),
        _flag_value(draw(st.sampled_from(flag_kinds)), draw(st.booleans())),
        _flag_value(draw(st.sampled_from(flag_kinds)), draw(st.booleans())),
    )


def outcome(buf: ReplayBuffer, step: tuple[Any, ...]) -> tuple[str, str] | None:
    """``None`` when ``buf`` takes ``step``, else the error; a refused step must change nothing."""
    before = snapshot(buf)
    try:
        buf.add(*step)
    except RlbufError as error:
        assert same(snapshot(buf), before), f"refused ({error}) but the buffer changed"
        return type(error).__name__, str(error)
    return None


# -- the fast readers agree with the reference, input by input -----------------------------
@settings(max_examples=60, deadline=None)
@given(steps=st.lists(transitions(), min_size=1, max_size=8))
def test_fast_readers_take_and_refuse_exactly_what_the_reference_does(steps: list[tuple[Any, ...]]) -> None:
    fast, reference = make(), checked_by_reference(make())
    for step in steps:
        assert outcome(fast, step) == outcome(reference, step)
    assert same(snapshot(fast), snapshot(reference))


@pytest.mark.parametrize("storage", ["memory", "memmap"])
@settings(max_examples=15, deadline=None)
@given(steps=st.lists(transitions(array_kinds=["torch32", "numpy32", "numpy64", "strided", "list", "offset", "expanded",
                                               "transposed", "negated"],
                                  reward_kinds=["float", "np.float32", "numpy32", "torch32", "torch64-0d", "torch-int"],
                                  flag_kinds=["bool", "np.bool_", "numpy", "torch", "torch-0d", "torch-offset"]),
                      min_size=1, max_size=8))
def test_the_staged_add_stores_what_the_tensor_way_stores(storage: str, steps: list[tuple[Any, ...]]) -> None:
    fast, tensor_way = make(storage), never_staged(make(storage))
    try:
        for step in steps:
            assert outcome(fast, step) == outcome(tensor_way, step)  # one reader: one wording
        assert same(snapshot(fast), snapshot(tensor_way))
    finally:
        fast.close()
        tensor_way.close()


@settings(max_examples=20, deadline=None)
@given(steps=st.lists(st.tuples(st.lists(floats, min_size=9, max_size=9), st.lists(st.booleans(), min_size=3, max_size=3),
                                st.sampled_from(["torch", "numpy"])), min_size=1, max_size=5))
def test_several_rows_per_add_agree_with_the_reference(steps: list[tuple[list[float], list[bool], str]]) -> None:
    fast, reference = make(num_envs=3, capacity=7), checked_by_reference(make(num_envs=3, capacity=7))
    for values, flags, kind in steps:
        obs = _float32(np.array(values)).reshape(3, 3)
        step: tuple[Any, ...] = (obs, obs[:, :2], obs[:, 2], obs + 1, np.array(flags), np.array(flags[::-1]))
        if kind == "torch":
            step = tuple(torch.from_numpy(np.ascontiguousarray(value)) for value in step)
        assert outcome(fast, step) == outcome(reference, step)
    assert same(snapshot(fast), snapshot(reference))


# A vector env's float64 rewards: float32's limit, the next float64 above it and the edges among them.
LIMIT = float_limit(np.dtype(np.float32))
rewards64 = st.lists(st.one_of(floats, st.sampled_from([LIMIT, -LIMIT, math.nextafter(LIMIT, math.inf)])), min_size=3,
                     max_size=3)


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(rewards64, min_size=1, max_size=5))
def test_float64_rewards_of_several_envs_are_taken_and_refused_as_the_general_path_does(steps: list[list[float]]) -> None:
    fast, reference = make(num_envs=3, capacity=7), checked_by_reference(make(num_envs=3, capacity=7))
    obs, no = np.zeros((3, 3), np.float32), np.zeros(3, np.bool_)
    for rewards in steps:
        step = (obs, obs[:, :2], np.array(rewards, np.float64), obs + 1, no, no)
        assert outcome(fast, step) == outcome(reference, step)
    assert same(snapshot(fast), snapshot(reference))


# -- refusals through the fast path --------------------------------------------------------
GOOD: tuple[Any, ...] = (torch.zeros(1, 3), torch.zeros(1, 2), torch.ones(1), torch.zeros(1, 3),
                         torch.tensor([False]), torch.tensor([False]))


@pytest.mark.parametrize(("field", "value", "error", "message"), [
    (0, torch.zeros(1, 4), ShapeError, "obs: expected shape (1, 3) or (3,), got (1, 4)"),
    (0, np.zeros((1, 3), np.uint8), DtypeError, "obs: expected dtype torch.float32"),
    (1, np.full((1, 2), 1e300), DtypeError, "action: values up to 1e+300 in magnitude do not fit torch.float32"),
    (2, torch.tensor([math.nan]), NonFiniteError, "reward: expected finite values, got nan"),
    (2, np.array([-math.inf], np.float32), NonFiniteError, "reward: expected finite values, got -inf"),
    (2, torch.tensor([True]), DtypeError, "reward: expected dtype torch.float32"),
    (2, torch.tensor([3], dtype=torch.uint16), DtypeError, "reward: expected dtype torch.float32 (or one that converts"
                                                           " to it without changing kind), got torch.uint16"),
    (0, torch.zeros(1, 3, dtype=torch.uint32), DtypeError, "got torch.uint32"),
    (3, torch.zeros(1, 3, device="meta"), DeviceError, "next_obs: expected a tensor on cpu, got one on meta"),
    (4, torch.tensor([[False]]), ShapeError, "terminated: expected shape (1,) or (), got (1, 1)"),
    (5, np.array([0.0]), DtypeError, "truncated: expected dtype torch.bool"),
    (5, None, MissingFieldError, "truncated: required with every step"),  # no silent default
    (5, False, None, None),  # truncated=False: taken
    (4, None, MissingFieldError, "terminated: a value is required"),
])
def test_a_refused_one_row_add_changes_nothing(storage: str, field: int, value: Any, error: type[Exception] | None,
                                                message: str | None) -> None:
    buf = make(storage, capacity=4)
    buf.add(*GOOD)  # a staged row pending
    for _ in range(3):
        buf.add(*GOOD)  # the stage is full: the next add commits it first
    before = snapshot(buf)
    step = list(GOOD)
    step[field] = value
    if error is None:
        buf.add(*step)
        assert buf.sample_all().truncated[-1].item() is False
        return
    with pytest.raises(error) as raised:
        buf.add(*step)
    assert message is not None and message in str(raised.value)
    assert same(snapshot(buf), before)
    buf.close()


def test_extras_and_hidden_states_are_still_checked_on_a_plain_buffer() -> None:
    buf = make()
    before = snapshot(buf)
    with pytest.raises(MissingFieldError, match="dones: not a field of this buffer"):
        buf.add(*GOOD, dones=torch.tensor([False]))
    with pytest.raises(MissingFieldError, match="hidden_state: this buffer was built without hidden_state_shape"):
        buf.add(*GOOD, hidden_state=torch.zeros(1, 4))
    assert same(snapshot(buf), before)


def test_an_input_changed_after_the_add_leaves_the_stored_row_as_it_was() -> None:
    buf = make(capacity=3)
    obs, reward = torch.full((1, 3), 7.0), np.array([2.0], np.float32)
    buf.add(obs, torch.zeros(1, 2), reward, obs, torch.tensor([False]), truncated=False)
    obs += 1
    reward += 1
    buf.add(obs, torch.zeros(1, 2), reward, obs, torch.tensor([False]), truncated=False)
    batch = buf.sample_all()
    assert batch.obs[-2:, 0].tolist() == [7.0, 8.0]
    assert batch.reward[-2:].tolist() == [2.0, 3.0]


# -- values whose bytes are not their values -----------------------------------------------
def test_a_negated_view_that_is_contiguous_is_stored_with_its_values_not_its_bytes() -> None:
    buf = ReplayBuffer(4, obs_shape=(1,), action_shape=(1,), seed=0)
    negated = torch.complex(torch.zeros(1, 1), torch.tensor([[-2.5]])).conj().imag  # the value 2.5, bytes of -2.5
    assert negated.is_contiguous() and negated.is_neg()
    buf.add(negated, negated, 1.0, negated, False, truncated=False)
    batch = buf.sample_all()
    assert batch.obs.item() == batch.action.item() == batch.next_obs.item() == 2.5


def test_a_bool_given_as_any_nonzero_byte_is_stored_as_true() -> None:
    buf = ReplayBuffer(4, obs_shape=(2,), action_shape=(), extra_fields={"mask": ((3,), torch.bool)}, seed=0)
    bytes_ = torch.tensor([[0, 7, 255]], dtype=torch.uint8)
    buf.add(torch.zeros(1, 2), torch.zeros(1), 0.0, torch.zeros(1, 2), bytes_[:, 1].view(torch.bool),
            bytes_[:, 2].view(torch.bool), mask=bytes_.view(torch.bool))
    stored = buf.sample_all()
    assert stored.terminated.view(torch.uint8).tolist() == stored.truncated.view(torch.uint8).tolist() == [1]
    assert stored.extras["mask"].view(torch.uint8).tolist() == [[0, 1, 1]]


def test_many_fields_and_mixed_inputs_agree_with_the_reference() -> None:
    """Dict observations of five keys: thirteen fields, numpy and torch mixed."""
    keys = {f"k{i}": (i + 1,) for i in range(5)}

    def made() -> ReplayBuffer:
        return ReplayBuffer(6, obs_shape=keys, action_shape=(2,), seed=0)

    fast, reference = made(), checked_by_reference(made())
    rng = np.random.default_rng(0)
    for step in range(9):
        obs = {key: rng.standard_normal((1, *shape)).astype(np.float32) for key, shape in keys.items()}
        as_torch = step % 3  # 0: all numpy, 1: all torch, 2: every other field torch
        obs = {key: torch.from_numpy(value) if as_torch == 1 or (as_torch == 2 and i % 2) else value
               for i, (key, value) in enumerate(obs.items())}
        values = (obs, torch.ones(1, 2) * step, float(step), obs, torch.tensor([step == 4]), np.array([step == 5]))
        assert outcome(fast, values) == outcome(reference, values)
    assert same(snapshot(fast), snapshot(reference))


def test_torch_adds_land_in_the_storage_after_it_moves_to_shared_memory() -> None:
    buf = make(capacity=4)
    ring = buf._ring
    ring.share_storage()  # what handing the buffer to a worker process does: the storage moves
    buf.add(torch.full((1, 3), 4.0), torch.full((1, 2), 5.0), 6.0, torch.full((1, 3), 7.0), torch.tensor([True]), truncated=False)
    stored = buf.sample_all()  # oldest first
    assert (stored.obs[-1].tolist(), stored.action[-1].tolist(), stored.next_obs[-1].tolist()) == (
        [4.0] * 3, [5.0] * 2, [7.0] * 3)
    assert stored.terminated[-1].item() is True


# -- the finiteness check ------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("size", [1, 2, 16, 17, 64])
def test_all_finite_finds_any_nan_or_inf_anywhere(dtype: type[np.floating[Any]], size: int) -> None:
    info = np.finfo(dtype)
    edges = np.array([-0.0, info.smallest_subnormal, info.tiny, info.max, -info.max], dtype)
    values = np.resize(edges, size)
    assert all_finite(values) and all_finite(values.reshape(1, size))
    for bad in (math.nan, math.inf, -math.inf):
        for position in {0, size // 2, size - 1}:
            spoiled = values.copy()
            spoiled[position] = bad
            assert not all_finite(spoiled)


@pytest.mark.parametrize("num_envs", [1, 4, 20])
def test_non_finite_rewards_are_refused_not_warned_about_even_under_warnings_as_errors(num_envs: int) -> None:
    buf = make(num_envs=num_envs, capacity=num_envs)
    obs = np.zeros((num_envs, 3), np.float32)
    flags = np.zeros(num_envs, bool)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        huge = np.full(num_envs, 3e38, np.float32)  # finite, though its sum overflows
        buf.add(obs, obs[:, :2], huge, obs, flags, truncated=False)
        for bad in (np.inf, -np.inf, np.nan):
            reward = huge.copy()
            reward[-1] = bad
            reward[0] = -np.inf if num_envs > 1 else bad  # inf - inf: NaN in a sum
            with pytest.raises(NonFiniteError, match="reward: expected finite values"):
                buf.add(obs, obs[:, :2], reward, obs, flags, truncated=False)


# -- one pipeline: every path stores the same rows, a refused add changes nothing --------------
def raw_state(buf: ReplayBuffer) -> Any:
    """The ring's state without committing anything: pending rows, counters, every stored byte, RNG."""
    ring = buf._ring
    return (ring.pending, ring._pending_start, ring._derived_rows, ring.cursor, ring.write_count, ring.generation,
            _torchrl.size(ring.rb), _torchrl.cursor(ring.rb), _torchrl.write_count(ring.rb),
            ring.generator.get_state().numpy().tobytes(),
            {name: leaf.detach().clone().view(torch.uint8).numpy().tobytes() for name, leaf in ring.leaves.items()})


def _as_form(value: np.ndarray, form: str) -> Any:
    """``value`` (the rows of one field) as a tensor, an array, a list, or a number for one scalar."""
    if form == "tensor":
        return torch.from_numpy(value.copy())
    if form == "list":
        return value.tolist()
    if form == "number" and value.size == 1:
        return value.reshape(()).item()
    return value.copy()


@st.composite
def _steps(draw: st.DrawFn, num_envs: int) -> list[tuple[Any, ...]]:
    forms = st.sampled_from(["tensor", "array", "list", "number"])
    finite = st.floats(-1e6, 1e6, width=32)
    steps = []
    for _ in range(draw(st.integers(1, 6))):
        obs = np.array(draw(st.lists(finite, min_size=3 * num_envs, max_size=3 * num_envs)), np.float32)
        action = np.array(draw(st.lists(finite, min_size=2 * num_envs, max_size=2 * num_envs)), np.float32)
        reward = np.array(draw(st.lists(finite, min_size=num_envs, max_size=num_envs)), np.float32)
        flags = np.array(draw(st.lists(st.booleans(), min_size=2 * num_envs, max_size=2 * num_envs)), np.bool_)
        rows = (obs.reshape(num_envs, 3), action.reshape(num_envs, 2), reward, obs.reshape(num_envs, 3)[::-1] + 1,
                flags[:num_envs], flags[num_envs:])
        if num_envs == 1 and draw(st.booleans()):  # one row may omit its row dim
            rows = tuple(row[0] for row in rows)
        steps.append(tuple(_as_form(np.asarray(row), draw(forms)) for row in rows))
    return steps


@pytest.mark.parametrize("storage", ["memory", "memmap"])
@pytest.mark.parametrize("num_envs", [1, 3])
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_the_fast_path_and_the_general_paths_store_exactly_the_same_rows(storage: str, num_envs: int,
                                                                          data: st.DataObject) -> None:
    """Tensors, arrays, lists and numbers; one row and blocks; CPU memory and memmap: the fast reader,
    the general path of the same reader and the tensor way end with the same bytes and counters."""
    steps = data.draw(_steps(num_envs))
    bufs = [make(storage, num_envs, capacity=7), checked_by_reference(make(storage, num_envs, capacity=7)),
            never_staged(make(storage, num_envs, capacity=7))]
    try:
        for step in steps:
            for buf in bufs:
                buf.add(*step)
        for buf in bufs:
            buf._ring.settle()  # the derived done of pending rows: computed when they are first read
        states = [raw_state(buf)[3:] for buf in bufs]  # pending rows differ by design: the tensor way commits
        assert states[0] == states[1] and states[0][:2] == states[2][:2]
        assert same(snapshot(bufs[0]), snapshot(bufs[1])) and same(snapshot(bufs[0]), snapshot(bufs[2]))
    finally:
        for buf in bufs:
            buf.close()


_BAD = {  # a value each field refuses, whatever the entry path
    0: lambda n: torch.zeros(n, 4), 1: lambda n: np.full((n, 2), 1e300), 2: lambda n: np.full(n, np.nan, np.float32),
    3: lambda n: "obs", 4: lambda n: np.full(n, 0.5), 5: lambda n: np.zeros((n, 2), np.bool_),
}


@pytest.mark.parametrize("storage", ["memory", "memmap"])
@pytest.mark.parametrize("way", ["one-row", "rows", "env_mask", "extend"])
@pytest.mark.parametrize("field", sorted(_BAD))
def test_a_refused_write_leaves_pending_rows_counters_bytes_and_rng_as_they_were(storage: str, way: str,
                                                                                field: int) -> None:
    num_envs = 1 if way == "one-row" else 3
    buf = make(storage, num_envs, capacity=6)
    good = tuple(torch.zeros(num_envs, *shape) for shape in ((3,), (2,), ()))
    step: list[Any] = [*good, torch.ones(num_envs, 3), torch.zeros(num_envs, dtype=torch.bool),
                       torch.zeros(num_envs, dtype=torch.bool)]
    buf.add(*step)  # a pending row (and on a full ring, a claimed position) before the refusal
    buf.sample(2)   # moves the generator; the refusal must not
    before = raw_state(buf)
    step[field] = _BAD[field](num_envs)
    with pytest.raises(RlbufError):
        if way == "extend":
            buf.extend(TensorDict({"observation": step[0], "action": step[1], ("next", "reward"): step[2],
                                   ("next", "observation"): step[3], ("next", "terminated"): step[4],
                                   ("next", "truncated"): step[5]}, batch_size=[num_envs]))
        elif way == "env_mask":
            buf.add(*step, env_mask=np.array([True, False, True]))
        else:
            buf.add(*step)
    assert raw_state(buf) == before
    buf.close()


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.sampled_from(["counts", "add", "refused", "flush", "torchrl", "clear"]), max_size=30),
       storage=st.sampled_from(["memory", "memmap"]))
def test_the_counts_kept_for_a_stage_are_torchrls_counters_after_every_kind_of_write(ops: list[str],
                                                                                      storage: str) -> None:
    buf = make(storage, 1, capacity=6)
    ring, row = buf._ring, [torch.zeros(3), torch.zeros(2), 0.0, torch.ones(3), False, False]
    try:
        for op in ops:
            if op == "add":
                buf.add(*row)
            elif op == "refused":
                with pytest.raises(RlbufError):
                    buf.add(*row[:2], math.nan, *row[3:])
            elif op == "flush":
                ring.flush()
            elif op == "torchrl":  # TorchRL's own extend: the stage is committed first
                buf.torchrl.extend(TensorDict({"observation": torch.zeros(2, 3), "action": torch.zeros(2, 2),
                                               ("next", "observation"): torch.ones(2, 3),
                                               ("next", "reward"): torch.zeros(2, 1),
                                               ("next", "terminated"): torch.zeros(2, 1, dtype=torch.bool),
                                               ("next", "truncated"): torch.zeros(2, 1, dtype=torch.bool)},
                                              batch_size=[2]))
            elif op == "clear":
                buf.clear()
            else:  # only here: a read at no pending rows reads TorchRL's counters again
                with ring.lock:
                    assert ring.counts() == (ring.write_count, len(ring))
    finally:
        buf.close()
