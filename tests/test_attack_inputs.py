"""Hostile input against every public method: a refused call raises a named rlbuf error and changes nothing.

Each example builds a buffer (or tracker, or iterator) in one of several states, calls one
public method with valid arguments except one, which hypothesis replaces by something hostile
(wrong shapes and dtypes, bfloat16, complex, object arrays, the meta device, NaN, inf, values
that overflow the stored dtype, ``10**400``, ``None``, strings, slices, ragged and nested lists,
generators ...). A call that raises must raise an ``RlbufError`` whose message names the field,
and leave a full snapshot of the state (``tests/_snapshot.py``) exactly as it was; a call that
succeeds must leave the buffer's invariants true.

The ``stress`` marker runs the same properties with many more examples (``nox -s stress``).
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from _snapshot import check_invariants, same, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

import rlbuf
from rlbuf import (
    BufferFullError,
    DistillationBuffer,
    EmptyBufferError,
    EpisodeStats,
    ReplayBuffer,
    RlbufError,
    RolloutBuffer,
    RolloutIncompleteError,
)
from rlbuf.epochs import EpochIterator

EXAMPLES = int(os.environ.get("RLBUF_ATTACK_EXAMPLES", "30"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# Tensordicts are slow to build: the extend properties draw fewer examples per run.
FUZZ_TD = settings(FUZZ, max_examples=max(10, EXAMPLES // 3))
# Long runs (``-m stress``) draw this many examples per RLBUF_STRESS_REPEATS.
STRESS_EXAMPLES = 100 * int(os.environ.get("RLBUF_STRESS_REPEATS", "20"))
TALLY: Counter[str] = Counter()  # hostile calls made and refused, printed by the stress run
# Errors about the buffer's state rather than about an argument: they name no field.
STATE_ERRORS = (EmptyBufferError, BufferFullError, RolloutIncompleteError)

# -- hostile values ------------------------------------------------------------------------
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.uint8,
           torch.int8, torch.bool, torch.complex64, torch.uint16]
_SHAPES = [(), (0,), (1,), (2,), (3,), (4,), (1, 3), (2, 3), (3, 1), (2, 2, 2), (6,), (4, 2)]
_FILLS = [0, 1, -1, 0.5, 300, -129, 70000.0, 2**40, 1e39, 1e300, -1e300, math.nan, math.inf, -math.inf]


def _tensor(shape: tuple[int, ...], dtype: torch.dtype, fill: float, device: str) -> torch.Tensor:
    with np.errstate(all="ignore"):
        try:
            return torch.full(shape, fill, dtype=dtype, device=device)
        except (RuntimeError, OverflowError, TypeError):
            return torch.zeros(shape, dtype=dtype, device=device)


def _array(shape: tuple[int, ...], dtype: str, fill: float) -> np.ndarray[Any, Any]:
    with np.errstate(all="ignore"), np.testing.suppress_warnings() as sup:
        sup.filter(RuntimeWarning)
        if dtype == "object":
            return np.full(shape, object(), dtype=object)
        if dtype == "str":
            return np.full(shape, "a")
        try:
            return np.full(shape, fill).astype(dtype)
        except (OverflowError, ValueError):
            return np.zeros(shape, dtype)


def _generator() -> Any:
    return (i for i in range(3))


tensors = st.builds(_tensor, st.sampled_from(_SHAPES), st.sampled_from(_DTYPES), st.sampled_from(_FILLS),
                    st.sampled_from(["cpu", "cpu", "cpu", "meta"]))
arrays = st.builds(_array, st.sampled_from(_SHAPES),
                   st.sampled_from(["float64", "float32", "float16", "int64", "uint8", "bool", "complex128",
                                    "object", "str", "uint64"]),
                   st.sampled_from(_FILLS))
scalars = st.one_of(
    # Small ints, and huge ones that no machine can serve as a size (a valid 10**8 would just allocate).
    st.none(), st.booleans(), st.integers(min_value=-1000, max_value=1000),
    st.sampled_from([10**400, -(10**400), 2**40, 10**12, 2**62, 2**63, 2**64, -(2**63), 1e300, 1e39, -1e39, 70000.0]),
    st.floats(allow_nan=True, allow_infinity=True), st.complex_numbers(max_magnitude=10),
    st.text(max_size=3), st.just(b"ab"), st.just(slice(0, 2)), st.just(object()), st.just({"a": 1}),
    st.builds(np.float64, st.sampled_from([1e300, math.nan, 0.5])), st.builds(np.int64, st.integers(-5, 5)),
)
lists = st.one_of(
    st.lists(st.one_of(st.integers(-1000, 1000), st.sampled_from([2**63, 2**64, -(2**65)]), st.floats(),
                       st.booleans()), max_size=4),
    st.just([[1.0, 2.0], [3.0]]), st.just([[1, 2, 3], [4, 5, 6]]), st.just([None, 1]), st.just([[[]]]),
    st.just([1.0, "a", 3.0]), st.just((1, 2, 3)),
)
HOSTILE = st.one_of(tensors, arrays, scalars, lists, st.builds(_generator))


# -- buffers in several states --------------------------------------------------------------
def _replay_step(buf: ReplayBuffer, i: int) -> None:
    n = buf.num_envs
    buf.add(torch.full((n, 3), float(i)), torch.zeros(n), torch.full((n,), float(i)), torch.zeros(n, 3),
            torch.tensor([i % 5 == 4] * n), torch.tensor([i % 7 == 6] * n), cost=torch.ones(n))


def make_replay(state: str, *, prioritized: bool = False, storage: str = "memory", num_envs: int = 1,
                obs_dtype: torch.dtype = torch.float32) -> ReplayBuffer:
    buf = ReplayBuffer(6, obs_shape=(3,), action_shape=(), num_envs=num_envs, prioritized=prioritized,
                       storage=storage, obs_dtype=obs_dtype, seed=1, extra_fields={"cost": ((), torch.float32)},
                       stats=EpisodeStats(num_envs))
    steps = {"empty": 0, "partial": 3 // num_envs, "full": 9 // num_envs + 1}[state]
    for i in range(steps):
        _replay_step(buf, i)
    if state == "full" and prioritized:
        buf.update_priority([0, 1, 2], [0.5, 2.0, 1.0])
    if state == "full":
        iterator = buf.epochs(batch_size=2, n_epochs=2)
        next(iterator)
    return buf


REPLAY_KINDS = [
    dict(state="empty"), dict(state="partial"), dict(state="full"), dict(state="full", prioritized=True),
    dict(state="partial", storage="memmap"), dict(state="full", num_envs=2), dict(state="full", obs_dtype=torch.float16),
]


def make_rollout(state: str) -> RolloutBuffer:
    buf = RolloutBuffer(3, 2, obs_shape=(3,), action_shape=(), seed=2, extra_fields={"cost": ((), torch.float32)},
                        stats=EpisodeStats(2))
    steps = {"empty": 0, "partial": 2, "full": 3, "ready": 3}[state]
    for t in range(steps):
        buf.add(torch.full((2, 3), float(t)), torch.zeros(2), torch.ones(2), torch.tensor([t == 2, False]),
                torch.zeros(2), torch.zeros(2), truncated=torch.tensor([False, t == 1]),
                bootstrap_value=torch.full((2,), 0.5), cost=torch.ones(2))
    if state == "ready":
        buf.compute_returns_and_advantages(torch.zeros(2), gamma=0.9, gae_lambda=0.8)
        buf.set_extras({"old_logits": torch.zeros(3, 2, 4)})
        next(buf.minibatches(batch_size=2, n_epochs=2))
    return buf


def make_distill(state: str) -> DistillationBuffer:
    buf = DistillationBuffer(5, obs_shape=(3,), action_shape=(2,), seed=3,
                             extra_fields={"expert_value": ((), torch.float32)})
    for i in range({"empty": 0, "partial": 2, "full": 7}[state]):
        buf.add(torch.full((3,), float(i)), torch.ones(2), expert_value=float(i))
    return buf


@dataclass
class Case:
    """A call: how to make it from one hostile value, and which names its error may carry."""

    call: Callable[[Any], Any]
    names: tuple[str, ...]


def field_cases(prefix: str, method: Callable[..., Any], good: dict[str, Any],
                also: dict[str, tuple[str, ...]] | None = None) -> dict[str, Case]:
    """One case per keyword of ``method``: ``good`` arguments with that one replaced by the hostile value."""
    return {f"{prefix}.{f}": Case(lambda v, f=f: method(**{**good, f: v}), (f, *(also or {}).get(f, ())))
            for f in good}


def attempt(target: Any, case: Case, value: Any, checked: Any = None) -> None:
    """Call, and check the promise: a named rlbuf error and no change, or success and invariants."""
    checked = target if checked is None else checked
    before = snapshot(checked)
    TALLY["calls"] += 1
    try:
        case.call(value)
    except RlbufError as error:
        TALLY["refused"] += 1
        after = snapshot(checked)
        assert same(before, after), f"a refused call changed the state: {error!r}"
        if not isinstance(error, STATE_ERRORS):
            message = str(error)
            assert any(name in message for name in case.names), f"{case.names} not named in {message!r}"
        return
    except BaseException as error:
        pytest.fail(f"foreign exception {type(error).__name__}: {error} for {value!r:.200}")
    if not isinstance(checked, (EpisodeStats, EpochIterator)):
        check_invariants(checked)


def attack(data: st.DataObject, target: Any, cases: dict[str, Case]) -> None:
    """Draw one method and one hostile value, and :func:`attempt` the call."""
    name = data.draw(st.sampled_from(sorted(cases)), label="method")
    attempt(target, cases[name], data.draw(HOSTILE, label="value"))


# -- ReplayBuffer --------------------------------------------------------------------------
def replay_cases(buf: ReplayBuffer) -> dict[str, Case]:
    n = buf.num_envs
    good: dict[str, Any] = dict(obs=torch.ones(n, 3), action=torch.zeros(n), reward=torch.ones(n),
                                next_obs=torch.ones(n, 3), terminated=torch.zeros(n, dtype=torch.bool),
                                truncated=torch.zeros(n, dtype=torch.bool), cost=torch.ones(n))

    def beta(v: Any) -> None:
        buf.beta = v

    cases = field_cases("add", buf.add, good)
    cases |= {
        "add.unknown_extra": Case(lambda v: buf.add(**good, bogus=v), ("bogus",)),
        "add.env_mask": Case(lambda v: buf.add(**good, env_mask=v), ("env_mask",)),
        "sample": Case(lambda v: buf.sample(v), ("batch_size",)),
        "sample_by_index.index": Case(lambda v: buf.sample_by_index(v), ("index",)),
        "sample_by_index.fields": Case(lambda v: buf.sample_by_index(0, fields=v), ("fields",)),
        "update_priority.index": Case(lambda v: buf.update_priority(v, [1.0]), ("index", "priority")),
        "update_priority.priority": Case(lambda v: buf.update_priority([0], v), ("priority", "index")),
        "epochs.batch_size": Case(lambda v: buf.epochs(batch_size=v), ("batch_size",)),
        "epochs.n_epochs": Case(lambda v: buf.epochs(batch_size=2, n_epochs=v), ("n_epochs", "batch_size")),
        # batch_size=2 is refused by name where an earlier call left one row (an empty buffer's first add).
        "epochs.drop_last": Case(lambda v: buf.epochs(batch_size=2, drop_last=v), ("drop_last", "batch_size")),
        "epochs.shuffle": Case(lambda v: buf.epochs(batch_size=2, shuffle=v), ("shuffle", "batch_size")),
        "num_batches": Case(lambda v: buf.num_batches(v), ("batch_size",)),
        "beta": Case(beta, ("beta",)),
    }
    return cases


@pytest.mark.parametrize("kind", REPLAY_KINDS, ids=lambda k: "-".join(str(v) for v in k.values()))
@FUZZ
@given(data=st.data())
def test_replay_buffer_refuses_hostile_input_without_change(kind: dict[str, Any], data: st.DataObject) -> None:
    buf = make_replay(**kind)
    attack(data, buf, replay_cases(buf))


_TD_KEYS = {"obs": "observation", "action": "action", "cost": "cost", "next_obs": ("next", "observation"),
            "reward": ("next", "reward"), "terminated": ("next", "terminated"), "truncated": ("next", "truncated")}


@pytest.mark.parametrize("kind", REPLAY_KINDS[:4], ids=lambda k: "-".join(str(v) for v in k.values()))
@FUZZ_TD
@given(data=st.data())
def test_replay_extend_refuses_hostile_tensordicts_without_change(kind: dict[str, Any], data: st.DataObject) -> None:
    buf = make_replay(**kind)
    field = data.draw(st.sampled_from(sorted(_TD_KEYS)), label="field")
    shape = data.draw(st.sampled_from([(2,), (2, 1), (2, 3), (2, 2), (2, 3, 1)]), label="shape")
    value = _tensor(shape, data.draw(st.sampled_from(_DTYPES)), data.draw(st.sampled_from(_FILLS)),
                    data.draw(st.sampled_from(["cpu", "cpu", "meta"])))
    td = TensorDict({"observation": torch.zeros(2, 3), "action": torch.zeros(2), "cost": torch.zeros(2),
                     "next": {"observation": torch.zeros(2, 3), "reward": torch.ones(2, 1),
                              "terminated": torch.zeros(2, 1, dtype=torch.bool),
                              "truncated": torch.zeros(2, 1, dtype=torch.bool)}}, batch_size=[2])
    td.set(_TD_KEYS[field], value)
    attempt(buf, Case(buf.extend, (field, "td")), td)


# -- RolloutBuffer -------------------------------------------------------------------------
def rollout_cases(buf: RolloutBuffer) -> dict[str, Case]:
    good: dict[str, Any] = dict(obs=torch.ones(2, 3), action=torch.zeros(2), reward=torch.ones(2),
                                terminated=torch.zeros(2, dtype=torch.bool), value=torch.zeros(2),
                                log_prob=torch.zeros(2), truncated=torch.zeros(2, dtype=torch.bool),
                                bootstrap_value=torch.zeros(2), cost=torch.ones(2))

    cases = field_cases("add", buf.add, good, also={"truncated": ("bootstrap_value",)})
    cases |= {
        "add.privileged_obs": Case(lambda v: buf.add(**good, privileged_obs=v), ("privileged_obs",)),
        "compute.last_value": Case(lambda v: buf.compute_returns_and_advantages(v), ("last_value",)),
        "compute.gamma": Case(lambda v: buf.compute_returns_and_advantages(torch.zeros(2), gamma=v), ("gamma",)),
        "compute.gae_lambda": Case(lambda v: buf.compute_returns_and_advantages(torch.zeros(2), gae_lambda=v),
                                   ("gae_lambda",)),
        "compute.normalize": Case(lambda v: buf.compute_returns_and_advantages(torch.zeros(2), normalize_advantages=v),
                                  ("normalize_advantages",)),
        "set_extras.advantage": Case(lambda v: buf.set_extras({"advantage": v, "returns": torch.zeros(3, 2)}),
                                     ("advantage",)),
        "set_extras.new": Case(lambda v: buf.set_extras({"old_values": v}), ("old_values",)),
        "set_extras.mapping": Case(lambda v: buf.set_extras(v), ("set_extras", "a")),
        "minibatches.batch_size": Case(lambda v: buf.minibatches(batch_size=v), ("batch_size",)),
        "minibatches.num_minibatches": Case(lambda v: buf.minibatches(num_minibatches=v), ("num_minibatches",)),
        "minibatches.n_epochs": Case(lambda v: buf.minibatches(batch_size=2, n_epochs=v), ("n_epochs",)),
        "minibatches.shuffle": Case(lambda v: buf.minibatches(batch_size=2, shuffle=v), ("shuffle",)),
        "epochs.batch_size": Case(lambda v: buf.epochs(batch_size=v), ("batch_size",)),
        "view": Case(lambda v: buf.view(v), ("fields",)),
        "num_batches": Case(lambda v: buf.num_batches(v), ("batch_size",)),
        "sample_by_index": Case(lambda v: buf.sample_by_index(v), ("index",)),
    }
    return cases


@pytest.mark.parametrize("state", ["empty", "partial", "full", "ready"])
@FUZZ
@given(data=st.data())
def test_rollout_buffer_refuses_hostile_input_without_change(state: str, data: st.DataObject) -> None:
    buf = make_rollout(state)
    attack(data, buf, rollout_cases(buf))


_ROLLOUT_TD_KEYS = {"obs": "observation", "action": "action", "cost": "cost", "value": "state_value",
                    "log_prob": "sample_log_prob", "reward": ("next", "reward"), "terminated": ("next", "terminated"),
                    "truncated": ("next", "truncated"), "bootstrap_value": ("next", "state_value"),
                    "advantage": "advantage", "returns": "value_target"}


@pytest.mark.parametrize("state", ["empty", "partial"])
@FUZZ_TD
@given(data=st.data())
def test_rollout_extend_refuses_hostile_tensordicts_without_change(state: str, data: st.DataObject) -> None:
    buf = make_rollout(state)
    steps = 3 - buf.steps
    field = data.draw(st.sampled_from(sorted(_ROLLOUT_TD_KEYS)), label="field")
    shape = data.draw(st.sampled_from([(2, steps), (2, steps, 1), (2, steps, 3), (2, steps, 2)]))
    value = _tensor(shape, data.draw(st.sampled_from(_DTYPES)), data.draw(st.sampled_from(_FILLS)),
                    data.draw(st.sampled_from(["cpu", "cpu", "meta"])))
    td = TensorDict({"observation": torch.zeros(2, steps, 3), "action": torch.zeros(2, steps),
                     "cost": torch.zeros(2, steps), "state_value": torch.zeros(2, steps, 1),
                     "sample_log_prob": torch.zeros(2, steps), "advantage": torch.zeros(2, steps, 1),
                     "value_target": torch.zeros(2, steps, 1),
                     "next": {"reward": torch.ones(2, steps, 1), "terminated": torch.zeros(2, steps, 1, dtype=torch.bool),
                              "truncated": torch.zeros(2, steps, 1, dtype=torch.bool),
                              "state_value": torch.zeros(2, steps, 1)}}, batch_size=[2, steps])
    td.set(_ROLLOUT_TD_KEYS[field], value)
    names = (field, "td", "bootstrap_value") if field == "truncated" else (field, "td")
    attempt(buf, Case(buf.extend, names), td)


# -- DistillationBuffer --------------------------------------------------------------------
def distill_cases(buf: DistillationBuffer) -> dict[str, Case]:
    good: dict[str, Any] = dict(obs=torch.ones(3), expert_action=torch.ones(2), expert_value=torch.ones(1))
    # Any batch size goes: obs of shape (k, 3) is k rows, and the error names a field that is not of k rows.
    batched = {"obs": ("expert_action", "expert_value")}
    return field_cases("add", buf.add, good, batched) | {
        "sample": Case(lambda v: buf.sample(v), ("batch_size",)),
        "sample_by_index": Case(lambda v: buf.sample_by_index(v), ("index",)),
        "epochs": Case(lambda v: buf.epochs(batch_size=v), ("batch_size",)),
    }


@pytest.mark.parametrize("state", ["empty", "partial", "full"])
@FUZZ
@given(data=st.data())
def test_distillation_buffer_refuses_hostile_input_without_change(state: str, data: st.DataObject) -> None:
    buf = make_distill(state)
    attack(data, buf, distill_cases(buf))


# -- EpisodeStats and EpochIterator --------------------------------------------------------
@FUZZ
@given(data=st.data())
def test_episode_stats_refuses_hostile_input_without_change(data: st.DataObject) -> None:
    stats = EpisodeStats(2, window=4)
    stats.update(np.ones(2), np.array([False, True]))
    good: dict[str, Any] = dict(reward=np.ones(2), terminated=np.array([True, False]),
                                truncated=np.array([False, False]))
    cases = field_cases("update", stats.update, good)
    cases |= {
        "update.metrics": Case(lambda v: stats.update(**good, metrics={"score": v}), ("score", "metrics")),
        "update.reasons": Case(lambda v: stats.update(**good, reasons=v), ("reasons",)),
        "summary": Case(lambda v: stats.summary(v), ("last",)),
        "recent_returns": Case(lambda v: stats.recent_returns(v), ("k",)),
        "recent_lengths": Case(lambda v: stats.recent_lengths(v), ("k",)),
    }
    attack(data, stats, cases)


@FUZZ
@given(data=st.data())
def test_epoch_iterator_refuses_hostile_options(data: st.DataObject) -> None:
    generator = torch.Generator().manual_seed(0)
    state = generator.get_state()
    option = data.draw(st.sampled_from(["batch_size", "num_batches", "n_epochs", "drop_last", "shuffle"]))
    value = data.draw(HOSTILE)
    options: dict[str, Any] = {"batch_size": 3, "n_epochs": 1, "drop_last": False, "shuffle": True}
    if option == "num_batches":
        options.pop("batch_size")
    options[option] = value
    try:
        iterator = EpochIterator(8, lambda index: index, **options, generator=generator)
    except RlbufError as error:
        assert option.replace("num_batches", "num_minibatches") in str(error) or "batch_size" in str(error)
        assert torch.equal(generator.get_state(), state)
        return
    batches = [batch for _, batch in zip(range(20), iterator, strict=False)]
    assert all(0 < len(batch) <= 8 for batch in batches)


# -- constructors --------------------------------------------------------------------------
_OPTIONS: dict[str, dict[str, Any]] = {
    "ReplayBuffer": dict(capacity=4, obs_shape=(3,), action_shape=(), num_envs=1, seed=0, alpha=0.6, beta=0.4,
                         prioritized=True, obs_dtype=torch.float32, action_dtype=torch.float32, extra_fields=None),
    "RolloutBuffer": dict(num_steps=2, num_envs=2, obs_shape=(3,), action_shape=(), seed=0, privileged_obs_shape=None,
                          obs_dtype=torch.float32, extra_fields=None),
    "DistillationBuffer": dict(capacity=4, obs_shape=(3,), action_shape=(), num_envs=1, seed=0,
                               action_dtype=torch.float32, extra_fields=None),
}


@FUZZ
@given(data=st.data())
def test_constructors_refuse_hostile_options_by_name(data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(sorted(_OPTIONS)))
    options = dict(_OPTIONS[kind])
    option = data.draw(st.sampled_from(sorted(options)))
    # Sizes stay small: a huge valid capacity would allocate, which is not what this test is about.
    value = data.draw(HOSTILE.filter(lambda v: not (isinstance(v, int) and not isinstance(v, bool) and v > 64)))
    options[option] = value
    try:
        buf = getattr(rlbuf, kind)(**options)
    except RlbufError as error:
        shown = {"capacity", "num_envs", "num_steps", "seed", "alpha", "beta", "prioritized", "obs_shape",
                 "action_shape", "privileged_obs_shape", "extra_fields"}
        if option in shown:
            assert option in str(error), str(error)
        return
    except BaseException as error:
        pytest.fail(f"foreign exception {type(error).__name__}: {error} for {option}={value!r:.200}")
    check_invariants(buf)


@pytest.mark.parametrize("name", ["state_value", "sample_log_prob", "value_target", "privileged_observation",
                                  "privileged_obs", "observation", "action", "next", "advantage", "done",
                                  "returns", "index", "extras", "action_log_prob", "bootstrap_value", "_weight"])
def test_extra_fields_that_alias_a_built_in_field_are_refused_by_every_buffer(name: str) -> None:
    declared = {name: ((), torch.float32)}
    builders = [
        lambda: RolloutBuffer(2, 1, obs_shape=(1,), action_shape=(), extra_fields=declared),
        lambda: ReplayBuffer(2, obs_shape=(1,), action_shape=(), extra_fields=declared),
        lambda: DistillationBuffer(2, obs_shape=(1,), action_shape=(), extra_fields=declared),
    ]
    refused = 0
    for build in builders:
        try:
            build()
        except rlbuf.ConfigError as error:
            assert repr(name) in str(error)
            refused += 1
    assert refused >= 1
    if name in ("state_value", "sample_log_prob", "value_target", "privileged_observation", "privileged_obs"):
        with pytest.raises(rlbuf.ConfigError, match=name):
            builders[0]()


# -- the generators are untouched by refused calls ------------------------------------------
def test_refused_epochs_and_minibatches_leave_the_resume_sequence_unchanged() -> None:
    reference, attacked = make_rollout("full"), make_rollout("full")
    for buf in (reference, attacked):
        buf.compute_returns_and_advantages(torch.zeros(2))
        buf.set_extras({"row": torch.arange(6).reshape(3, 2)})
    for bad in ({"batch_size": 0}, {"batch_size": 100}, {"num_minibatches": 7}, {"n_epochs": -1},
                {"batch_size": 2, "shuffle": "yes"}):
        with pytest.raises(RlbufError):
            attacked.minibatches(**bad)
        if "num_minibatches" not in bad:
            with pytest.raises(RlbufError):
                attacked.epochs(**{"batch_size": 2, **bad})
    assert [b.row.tolist() for b in reference.minibatches(batch_size=2)] == [b.row.tolist() for b in attacked.minibatches(batch_size=2)]


def test_a_refused_gae_call_keeps_the_advantages_computed_before() -> None:
    buf = make_rollout("full")
    buf.compute_returns_and_advantages(torch.zeros(2), gamma=0.9)
    advantage = buf.view("advantage").clone()
    for bad in ({"gamma": 2.0}, {"gae_lambda": -0.1}, {"normalize_advantages": "yes"}, {"gamma": math.nan},
                {"gae_lambda": 10**400}):
        with pytest.raises(RlbufError, match=next(iter(bad))):
            buf.compute_returns_and_advantages(torch.zeros(2), **bad)
    assert buf.advantages_ready
    assert torch.equal(buf.view("advantage"), advantage)


def test_nan_advantages_are_refused_by_set_extras() -> None:
    buf = make_rollout("full")
    with pytest.raises(rlbuf.NonFiniteError, match="advantage"):
        buf.set_extras({"advantage": torch.full((3, 2), math.nan), "returns": torch.zeros(3, 2)})
    assert not buf.advantages_ready


@pytest.mark.parametrize("value", [np.array([1e300]), np.array([1e39]), torch.tensor([1e300], dtype=torch.float64),
                                   1e300, np.float64(1e39), 10**400])
def test_rewards_that_would_be_stored_as_inf_are_refused_everywhere(value: Any) -> None:
    replay = make_replay("partial")
    with pytest.raises((rlbuf.DtypeError, rlbuf.NonFiniteError), match="reward"):
        replay.add(torch.zeros(3), 0.0, value, torch.zeros(3), False, cost=1.0, truncated=False)
    rollout = RolloutBuffer(2, 1, obs_shape=(1,), action_shape=())
    with pytest.raises((rlbuf.DtypeError, rlbuf.NonFiniteError), match="reward"):
        rollout.add(torch.zeros(1, 1), torch.zeros(1), value, torch.zeros(1, dtype=torch.bool), torch.zeros(1),
                    torch.zeros(1), truncated=False)
    distill = make_distill("partial")
    with pytest.raises((rlbuf.DtypeError, rlbuf.NonFiniteError), match="expert_value"):
        distill.add(torch.zeros(3), torch.zeros(2), expert_value=value)
    if isinstance(value, torch.Tensor):
        td = TensorDict({"observation": torch.zeros(1, 1, 3), "action": torch.zeros(1, 1), "cost": torch.zeros(1, 1),
                         "next": {"observation": torch.zeros(1, 1, 3), "reward": value.reshape(1, 1, 1),
                                  "terminated": torch.zeros(1, 1, 1, dtype=torch.bool), "truncated": torch.zeros(1, 1, 1, dtype=torch.bool)}}, batch_size=[1, 1])
        with pytest.raises(rlbuf.DtypeError, match="reward"):
            replay.extend(td)


def test_bfloat16_input_is_stored_exactly() -> None:
    buf = make_replay("empty")
    obs = torch.tensor([1.5, -2.25, 3e38], dtype=torch.bfloat16)
    buf.add(obs, 0.0, torch.tensor(1.0, dtype=torch.bfloat16), obs, False, cost=1.0, truncated=False)
    assert torch.equal(buf.sample_all().obs[0], obs.float())
    half = make_replay("empty", obs_dtype=torch.float16)
    with pytest.raises(rlbuf.DtypeError, match="obs"):
        half.add(obs, 0.0, 1.0, obs, False, cost=1.0, truncated=False)


@settings(max_examples=STRESS_EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def _hostile_sequences(data: st.DataObject) -> None:
    which = data.draw(st.sampled_from(["replay", "rollout", "distill"]))
    if which == "replay":
        buf: Any = make_replay(**data.draw(st.sampled_from(REPLAY_KINDS)))
        cases = replay_cases(buf)
    elif which == "rollout":
        buf = make_rollout(data.draw(st.sampled_from(["empty", "partial", "full", "ready"])))
        cases = rollout_cases(buf)
    else:
        buf = make_distill(data.draw(st.sampled_from(["empty", "partial", "full"])))
        cases = distill_cases(buf)
    for _ in range(data.draw(st.integers(1, 5))):
        attack(data, buf, cases)


@pytest.mark.stress
def test_stress_every_buffer_kind() -> None:
    TALLY.clear()
    _hostile_sequences()
    print(f"\nSTRESS hostile inputs: examples={STRESS_EXAMPLES} calls={TALLY['calls']} "
          f"refused={TALLY['refused']} (each refusal: named rlbuf error, state unchanged)")


def test_view_refuses_a_name_that_is_not_a_string_by_name() -> None:
    buf = make_rollout("partial")
    with pytest.raises(rlbuf.MissingFieldError, match="fields"):
        buf.view(np.array([]))  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [np.asarray([2**63, 2**63]), np.array([1.0, 2.0], dtype=">f4"),
                                   np.array([1.0, 2.0], dtype=np.longdouble)], ids=["ulonglong", "big-endian", "longdouble"])
def test_numbers_in_every_numpy_spelling_are_converted_or_refused_by_name(value: np.ndarray[Any, Any]) -> None:
    rollout = make_rollout("full")
    replay = make_replay("partial", num_envs=2)
    if value.dtype.itemsize > 8:  # wider than any torch dtype
        with pytest.raises(rlbuf.DtypeError, match="last_value"):
            rollout.compute_returns_and_advantages(value)
        with pytest.raises(rlbuf.DtypeError, match="reward"):
            replay.add(torch.zeros(2, 3), torch.zeros(2), value, torch.zeros(2, 3), torch.zeros(2, dtype=torch.bool),
                       cost=torch.ones(2), truncated=False)
        return
    rollout.compute_returns_and_advantages(value)
    assert rollout.advantages_ready and bool(torch.isfinite(rollout.view("advantage")).all())
    replay.add(torch.zeros(2, 3), torch.zeros(2), value, torch.zeros(2, 3), torch.zeros(2, dtype=torch.bool),
               cost=torch.ones(2), truncated=False)
    assert replay.sample_all().reward[-2:].tolist() == value.astype(np.float32).tolist()


@pytest.mark.parametrize("value", [10**400, True, -1, math.inf])
def test_priority_exponents_beyond_any_float_or_bools_are_refused_by_name(value: Any) -> None:
    buf = make_replay("full", prioritized=True)
    before = snapshot(buf)
    with pytest.raises(rlbuf.ConfigError, match="beta"):
        buf.beta = value
    assert same(before, snapshot(buf))
    with pytest.raises(rlbuf.ConfigError, match="alpha"):
        ReplayBuffer(4, obs_shape=(1,), action_shape=(), prioritized=True, alpha=value)
