"""Hostile input through entry paths ``test_attack_inputs.py`` and ``test_attack_layouts.py`` leave out.

The methods of a prioritized compact buffer (frame stacks and n-step returns: its stream tables and
sum tree), a rollout's ``metrics=`` and hidden states, a distillation buffer's ``extend``, and an
epoch iterator running while hostile calls are refused. A refused call must raise an rlbuf error
naming the argument and leave the full state (rows, cursor, write count, stream tables, priorities,
random generators, iterator position, statistics) exactly as it was; an iterator then goes on as
that of a twin buffer that never saw the refused calls.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from _snapshot import _frozen, same, snapshot
from hypothesis import given
from hypothesis import strategies as st
from tensordict import TensorDict
from test_attack_inputs import (
    _DTYPES,
    _FILLS,
    FUZZ,
    FUZZ_TD,
    Case,
    _tensor,
    arrays,
    attack,
    attempt,
    lists,
    make_distill,
    scalars,
    tensors,
)

from rlbuf import (
    DtypeError,
    EpisodeStats,
    MissingFieldError,
    ReplayBuffer,
    RlbufError,
    RolloutBuffer,
    Transition,
)

# -- a prioritized compact buffer ----------------------------------------------------------
FRAME = (4,)


def _frame(t: int, env: int) -> torch.Tensor:
    return torch.full(FRAME, (3 * t + env) % 250, dtype=torch.uint8)


def make_compact(steps: int) -> ReplayBuffer:
    """Two envs, frame_stack=2, n_step=2, capacity 6: ``steps`` adds (9 wrap the ring), priorities set on
    complete and incomplete rows."""
    buf = ReplayBuffer(6, obs_shape=(2, *FRAME), action_shape=(), obs_dtype=torch.uint8, num_envs=2, frame_stack=2,
                       n_step=2, prioritized=True, seed=4, stats=EpisodeStats(2))
    start = [0, 0]
    for t in range(steps):
        ended = torch.tensor([t % 4 == 3, False])
        obs = torch.stack([torch.stack([_frame(max(t - 1, start[e]), e), _frame(t, e)]) for e in range(2)])
        next_obs = torch.stack([torch.stack([_frame(t, e), _frame(t + 1, e)]) for e in range(2)])
        buf.add(obs, torch.zeros(2), torch.full((2,), float(t)), next_obs, ended, torch.zeros(2, dtype=torch.bool))
        start = [t + 1 if bool(ended[e]) else start[e] for e in range(2)]
    if steps:
        buf.update_priority(list(range(len(buf))), [0.25 + i for i in range(len(buf))])
    return buf


def method_cases(buf: ReplayBuffer) -> dict[str, Case]:
    """Calls of a replay buffer's methods (``epochs`` only where the layout has them: not a compact one)."""
    def beta(v: Any) -> None:
        buf.beta = v

    cases = {
        "update_priority.index": Case(lambda v: buf.update_priority(v, [1.0]), ("index", "priority")),
        "update_priority.priority": Case(lambda v: buf.update_priority([0], v), ("priority", "index")),
        "update_priority.both": Case(lambda v: buf.update_priority(v, v), ("index", "priority")),
        "sample": Case(lambda v: buf.sample(v), ("batch_size",)),
        "sample_by_index.index": Case(lambda v: buf.sample_by_index(v), ("index",)),
        "sample_by_index.fields": Case(lambda v: buf.sample_by_index(0, fields=v), ("fields", "index")),
        "truncate_episodes": Case(lambda v: buf.truncate_episodes(v), ("env_mask",)),
        "beta": Case(beta, ("beta",)),
    }
    if buf.compact:
        return cases
    return cases | {
        "epochs.batch_size": Case(lambda v: buf.epochs(batch_size=v), ("batch_size",)),
        "epochs.n_epochs": Case(lambda v: buf.epochs(batch_size=1, n_epochs=v), ("n_epochs",)),
        "num_batches": Case(lambda v: buf.num_batches(v), ("batch_size",)),
    }


@pytest.mark.parametrize("steps", [0, 2, 9])
@FUZZ
@given(data=st.data())
def test_a_compact_prioritized_buffer_refuses_hostile_input_without_change(steps: int, data: st.DataObject) -> None:
    buf = make_compact(steps)
    attack(data, buf, method_cases(buf))


@pytest.mark.parametrize("fields", [False, 3, torch.tensor(0.0), "obs", b"obs", {"obs": 1}, [["obs"]], [torch.ones(2)]])
def test_a_compact_buffer_refuses_fields_that_are_no_list_of_names_by_name(fields: Any) -> None:
    """``sample_by_index(0, fields=False)`` raised Python's "'bool' object is not iterable" (``tensor(0.)``:
    "iteration over a 0-d tensor") from the compact layout, where other layouts name the argument."""
    buf = make_compact(9)
    before = snapshot(buf)
    complete = buf.sample_all().index
    with pytest.raises(MissingFieldError, match=r"^fields: "):
        buf.sample_by_index(complete[0], fields=fields)
    assert same(before, snapshot(buf))
    assert torch.equal(buf.sample_by_index(complete, fields=["reward"]).reward, buf.sample_all().reward)


@FUZZ
@given(index=st.lists(st.integers(-8, 8), min_size=1, max_size=6), priority=st.floats(-1.0, 5.0))
def test_compact_priorities_are_set_for_stored_rows_only_and_keep_the_weights_finite(index: list[int],
                                                                                     priority: float) -> None:
    """Positions of rows that are stored but incomplete take a priority; positions past the stored rows, or
    negative ones, and negative priorities are refused, the sum tree unchanged."""
    buf = make_compact(9)
    before = snapshot(buf)
    try:
        buf.update_priority(index, [priority] * len(index))
    except RlbufError as error:
        assert same(before, snapshot(buf)), error
        assert min(index) < 0 or max(index) >= len(buf) or priority < 0
        return
    assert min(index) >= 0 and max(index) < len(buf) and priority >= 0
    weight = buf.sample(16).weight
    assert bool(torch.isfinite(weight).all()) and float(weight.max()) <= 1.0


# -- a rollout's metrics and hidden states -------------------------------------------------
def make_rollout(steps: int) -> RolloutBuffer:
    buf = RolloutBuffer(3, 2, obs_shape=(3,), action_shape=(), seed=2, hidden_state_shape=(1, 2),
                        stats=EpisodeStats(2, metrics={"cost": "sum"}))
    for t in range(steps):
        buf.add(**_rollout_step(t), metrics={"cost": torch.ones(2)})
    return buf


def _rollout_step(t: int) -> dict[str, Any]:
    return dict(obs=torch.full((2, 3), float(t)), action=torch.zeros(2), reward=torch.ones(2),
                terminated=torch.tensor([t == 1, False]), value=torch.zeros(2), log_prob=torch.zeros(2),
                truncated=torch.zeros(2, dtype=torch.bool), hidden_state=torch.zeros(2, 1, 2))


def rollout_cases(buf: RolloutBuffer) -> dict[str, Case]:
    good, metrics = _rollout_step(buf.steps), {"cost": torch.ones(2)}
    return {
        "add.metrics.value": Case(lambda v: buf.add(**good, metrics={"cost": v}), ("cost", "metrics")),
        "add.metrics": Case(lambda v: buf.add(**good, metrics=v), ("metrics",)),
        "add.hidden_state": Case(lambda v: buf.add(**{**good, "hidden_state": v}, metrics=metrics), ("hidden_state",)),
        "add.env_mask": Case(lambda v: buf.add(**good, env_mask=v, metrics=metrics), ("env_mask",)),
    }


@pytest.mark.parametrize("steps", [0, 2])
@FUZZ
@given(data=st.data())
def test_a_rollouts_metrics_and_hidden_states_refuse_hostile_input_without_change(steps: int,
                                                                                  data: st.DataObject) -> None:
    buf = make_rollout(steps)
    attack(data, buf, rollout_cases(buf))


@pytest.mark.parametrize("metrics", [torch.zeros(2), np.zeros(2), b"ab", "cost", [1.0, 2.0], [], 3.0])
def test_metrics_that_are_no_mapping_are_refused_by_name_everywhere(metrics: Any) -> None:
    """``metrics=tensor`` raised torch's "Boolean value of Tensor ... is ambiguous", a list "'list' object has no
    attribute 'items'" (an empty one was taken for no metrics), from the rollout's, the replay buffer's and
    ``EpisodeStats.update``'s checks alike."""
    rollout, stats = make_rollout(1), EpisodeStats(2, metrics={"cost": "sum"})
    replay = ReplayBuffer(4, obs_shape=(3,), action_shape=(), num_envs=2, stats=EpisodeStats(2))
    step = dict(obs=torch.zeros(2, 3), action=torch.zeros(2), reward=torch.ones(2), next_obs=torch.zeros(2, 3),
                terminated=torch.zeros(2, dtype=torch.bool), truncated=torch.zeros(2, dtype=torch.bool))
    calls = [(rollout, lambda: rollout.add(**_rollout_step(1), metrics=metrics)),
             (replay, lambda: replay.add(**step, metrics=metrics)),
             (stats, lambda: stats.update(torch.ones(2), torch.tensor([True, False]), metrics=metrics))]
    for target, call in calls:
        before = snapshot(target)
        with pytest.raises(DtypeError, match=r"^metrics: expected a mapping name -> \[num_envs\] values"):
            call()
        assert same(before, snapshot(target))


# -- a distillation buffer's extend --------------------------------------------------------
_DISTILL_KEYS = {"obs": "observation", "expert_action": "expert_action", "expert_value": "expert_value"}


@pytest.mark.parametrize("state", ["empty", "full"])
@FUZZ_TD
@given(data=st.data())
def test_distillation_extend_refuses_hostile_tensordicts_without_change(state: str, data: st.DataObject) -> None:
    buf = make_distill(state)
    field = data.draw(st.sampled_from(sorted(_DISTILL_KEYS)), label="field")
    shape = data.draw(st.sampled_from([(2,), (2, 1), (2, 2), (2, 3), (2, 3, 1)]), label="shape")
    value = _tensor(shape, data.draw(st.sampled_from(_DTYPES)), data.draw(st.sampled_from(_FILLS)),
                    data.draw(st.sampled_from(["cpu", "cpu", "meta"])))
    td = TensorDict({"observation": torch.zeros(2, 3), "expert_action": torch.zeros(2, 2),
                     "expert_value": torch.zeros(2)}, batch_size=[2])
    td.set(_DISTILL_KEYS[field], value)
    attempt(buf, Case(buf.extend, (field, _DISTILL_KEYS[field], "td")), td)


# -- an epoch iterator while hostile calls are refused -------------------------------------
REUSABLE = st.one_of(tensors, arrays, scalars, lists)  # no generator: a value is given to the twin again


def _state(buf: ReplayBuffer) -> Any:
    return _frozen(buf.state_dict())


@FUZZ
@given(data=st.data())
def test_an_epoch_goes_on_after_refused_calls_as_the_twins_that_saw_none(data: st.DataObject) -> None:
    buf, twin = _plain(), _plain()
    iterators = [b.epochs(batch_size=2, n_epochs=2) for b in (buf, twin)]
    for _ in range(data.draw(st.integers(1, 6), label="rounds")):
        name = data.draw(st.sampled_from(["next", *sorted(method_cases(buf))]), label="call")
        if name == "next":
            batches = [next(it, None) for it in iterators]
            if batches[0] is None or batches[1] is None:
                assert batches[0] is batches[1]
                break
            assert torch.equal(batches[0].index, batches[1].index)
            assert torch.equal(batches[0].obs, batches[1].obs)
            continue
        value = data.draw(REUSABLE, label="value")
        try:
            method_cases(buf)[name].call(value)
        except RlbufError:
            assert same(_state(buf), _state(twin))
            continue
        method_cases(twin)[name].call(value)  # accepted: the twin makes the same call
        if name.startswith("epochs"):
            iterators = [buf.current_epochs, twin.current_epochs]
        assert same(_state(buf), _state(twin))


def _plain() -> ReplayBuffer:
    buf = ReplayBuffer(6, obs_shape=(3,), action_shape=(), num_envs=2, prioritized=True, seed=4,
                       stats=EpisodeStats(2))
    for t in range(5):
        buf.add(torch.full((2, 3), float(t)), torch.zeros(2), torch.ones(2), torch.zeros(2, 3),
                torch.tensor([t == 3, False]), torch.zeros(2, dtype=torch.bool))
    return buf


@pytest.mark.parametrize("extras", [[1, 2], torch.zeros(2), "cost", 3.0])
def test_a_transition_whose_extras_are_no_mapping_is_refused_by_name(extras: Any) -> None:
    """``add(Transition(..., extras=tensor))`` raised torch's "Boolean value of Tensor ... is ambiguous" (a list:
    "cannot convert dictionary update sequence element") from inside ``add``."""
    with pytest.raises(MissingFieldError, match=r"^extras: expected a mapping name -> values .*got "):
        Transition(torch.zeros(2, 3), torch.zeros(2), torch.zeros(2), torch.zeros(2, 3), torch.zeros(2, dtype=torch.bool),
                   torch.zeros(2, dtype=torch.bool), extras)


def test_a_transition_takes_a_tensordict_of_extras_as_a_dict() -> None:
    """A TensorDict (a Mapping that refuses ``bool()``) raised "Converting a tensordict to boolean value is not
    permitted" from inside ``add``; its keys are the extra fields, as a dict's."""
    bufs = [ReplayBuffer(4, obs_shape=(3,), action_shape=(), num_envs=2, extra_fields={"cost": ((), torch.float32)},
                         seed=0) for _ in range(2)]
    step = (torch.zeros(2, 3), torch.zeros(2), torch.ones(2), torch.ones(2, 3), torch.zeros(2, dtype=torch.bool),
            torch.zeros(2, dtype=torch.bool))
    cost = torch.tensor([0.5, 2.0])
    bufs[0].add(Transition(*step, TensorDict({"cost": cost}, batch_size=[2])))
    bufs[1].add(Transition(*step, {"cost": cost}))
    assert torch.equal(bufs[0].sample_all().cost, bufs[1].sample_all().cost)
    assert torch.equal(bufs[0].sample_all().cost, cost)
