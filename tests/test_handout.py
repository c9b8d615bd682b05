"""Writes through ``buffer.torchrl`` (and worker processes given it) go through the fields' readers.

Every refusal names the field and leaves the buffer (rows, counters, pending rows, sampler)
exactly as it was.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from _snapshot import same, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, RandomSampler, RoundRobinWriter
from torchrl.envs import Transform

from rlbuf import (
    BufferFullError,
    ConfigError,
    DtypeError,
    MissingFieldError,
    NonFiniteError,
    PriorityError,
    ReplayBuffer,
    RlbufError,
    RolloutBuffer,
    RolloutIncompleteError,
    ShapeError,
    StoredIndexError,
)

INPUT_KEYS = ["observation", "action", ("next", "observation"), ("next", "reward"),
              ("next", "terminated"), ("next", "truncated")]
NAMES = {"observation": "obs", "action": "action", ("next", "observation"): "next_obs",
         ("next", "reward"): "reward", ("next", "terminated"): "terminated", ("next", "truncated"): "truncated"}


def make(*, prioritized: bool = False, rows: int = 3) -> ReplayBuffer:
    buf = ReplayBuffer(8, obs_shape=(3,), action_shape=(), seed=0, prioritized=prioritized)
    for i in range(rows):
        buf.add(torch.full((3,), float(i)), 0.0, float(i), torch.zeros(3), False, truncated=False)
    return buf


def rows(n: int | None = 2, *, reward: Any = 1.0, terminated: bool = False, truncated: bool = False,
         done: bool | None = None) -> TensorDict:
    lead: tuple[int, ...] = () if n is None else (n,)
    flags = {"terminated": torch.full((*lead, 1), terminated), "truncated": torch.full((*lead, 1), truncated)}
    if done is not None:
        flags["done"] = torch.full((*lead, 1), done)
    reward_tensor = reward if isinstance(reward, torch.Tensor) else torch.full((*lead, 1), reward)
    return TensorDict({"observation": torch.ones(*lead, 3), "action": torch.zeros(lead),
                       "next": {"observation": torch.ones(*lead, 3), "reward": reward_tensor, **flags}}, lead)


def refused(buf: ReplayBuffer, error: type[RlbufError], match: str, call: Callable[[], Any]) -> None:
    """``call`` raises ``error`` (message matching ``match``) and changes nothing in ``buf``."""
    buf.add(torch.zeros(3), 0.0, 5.0, torch.zeros(3), False, truncated=False)  # a pending row: must stay pending, uncommitted or not
    before = snapshot(buf)
    with pytest.raises(error, match=match):
        call()
    assert same(before, snapshot(buf))
    assert buf.check_valid() == (True, "")


# -- __setitem__ -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("index", "value", "error", "match"), [
    (0, rows(None, reward=float("nan")), NonFiniteError, r"^reward: expected finite values"),
    (0, rows(None, reward=torch.tensor([1e300], dtype=torch.float64)), DtypeError, r"^reward: values up to 1e\+300"),
    (0, rows(None, terminated=True, done=False), ConfigError, r"^done: key 'next\.done' differs .*terminated \| truncated"),
    (7, rows(None), StoredIndexError, r"^index: expected positions in \[0, 4\)"),
    (-1, rows(None), StoredIndexError, r"^index: expected positions"),
    (slice(0, 2), rows(2, reward=torch.full((2, 1), 1e300, dtype=torch.float64)), DtypeError, r"^reward:"),
    (slice(0, 2), rows(3), ShapeError, r"^value: expected a TensorDict of batch size \(2,\)"),
    ([0, 1], rows(2).exclude("action"), MissingFieldError, r"^action: key 'action' is missing"),
    ("observation", torch.zeros(4, 3), StoredIndexError, r"^index:"),
    (0, rows(2), ShapeError, r"^data: expected one row"),
])
def test_setitem_reads_every_field_and_only_rewrites_stored_rows(index: Any, value: Any, error: type[RlbufError],
                                                                 match: str) -> None:
    buf = make()
    rb = buf.torchrl

    def write() -> None:
        rb[index] = value

    refused(buf, error, match, write)


def test_setitem_of_valid_rows_stores_them_with_done_derived() -> None:
    buf = make()
    buf.torchrl[1] = rows(None, reward=7.0, truncated=True)
    buf.torchrl[torch.tensor([0, 2])] = rows(2, reward=3.0, terminated=True, done=True)
    batch = buf.sample_all()
    assert batch.reward.tolist() == [3.0, 7.0, 3.0]
    assert batch.done.tolist() == [True, True, True] and batch.truncated.tolist() == [False, True, False]
    assert buf.check_valid() == (True, "")


# -- add / extend ----------------------------------------------------------------------------------
@settings(max_examples=12, deadline=None)
@given(st.sampled_from(INPUT_KEYS), st.booleans())
def test_a_torchrl_write_must_carry_every_input_field(key: Any, batched: bool) -> None:
    buf = make()
    rb = buf.torchrl
    data = rows(2 if batched else None).exclude(key)
    name = NAMES[key]
    refused(buf, MissingFieldError, rf"^{name}: key '{'.'.join(key) if isinstance(key, tuple) else key}' is missing",
            lambda: rb.extend(data) if batched else rb.add(data))


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.booleans()), min_size=1, max_size=4))
def test_a_given_done_must_equal_terminated_or_truncated(flags: list[tuple[bool, bool, bool]]) -> None:
    buf = make()
    n = len(flags)
    data = rows(n)
    terminated, truncated, done = (torch.tensor([[f[i]] for f in flags]) for i in range(3))
    data["next", "terminated"], data["next", "truncated"], data["next", "done"] = terminated, truncated, done
    if bool(((terminated | truncated) == done).all()):
        buf.torchrl.extend(data)
        assert buf.sample_all().done.tolist()[-n:] == (terminated | truncated).reshape(-1).tolist()
        assert buf.check_valid() == (True, "")
    else:
        row = int(((terminated | truncated) != done).reshape(-1).nonzero()[0])
        refused(buf, ConfigError, rf"^done: key 'next\.done' differs .* at row {row} ", lambda: buf.torchrl.extend(data))


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda rb: rb.add(TensorDict({"observation": torch.full((3,), 5.0)}, [])), MissingFieldError, r"^action:"),
    (lambda rb: rb.extend(rows(2, reward=float("nan"))), NonFiniteError, r"^reward:"),
    (lambda rb: rb.extend(rows(2, terminated=True, done=False)), ConfigError, r"^done:"),
    (lambda rb: rb.extend(rows(None)), ShapeError, r"^data: expected a TensorDict with a batch dim"),
    (lambda rb: rb.extend({"observation": torch.zeros(2, 3)}), ShapeError, r"^data: a write through buffer\.torchrl"),
    # A collector's [num_envs, T] batch: TorchRL stored [T] slices as rows and failed part-way, leaving
    # uninitialised rows (helper 42).
    (lambda rb: rb.extend(torch.stack([rows(3), rows(3)])), ShapeError,
     r"^data: expected a TensorDict of rows \(batch size \[n\]\), got batch size \[2, 3\]; give a collector's.*"
     r"replay_buffer=buffer\.torchrl writes such batches: iterate the collector and call buffer\.extend\(td\)"),
])
def test_add_and_extend_refuse_by_field_name(call: Callable[[Any], Any], error: type[RlbufError], match: str) -> None:
    buf = make()
    rb = buf.torchrl
    refused(buf, error, match, lambda: call(rb))


def test_a_priority_carried_by_an_extend_is_checked_before_any_row_is_written() -> None:
    buf = make(prioritized=True)
    data = rows(2)
    data["td_error"] = torch.tensor([1.0, float("nan")])
    refused(buf, PriorityError, r"^priority:", lambda: buf.torchrl.extend(data))
    data["td_error"] = torch.tensor([1.0, 4.0])
    buf.torchrl.extend(data)
    assert buf.check_valid() == (True, "")


def test_a_rollout_buffer_derives_its_advantages_too() -> None:
    buf = RolloutBuffer(4, obs_shape=(3,), action_shape=(), num_envs=1)
    data = TensorDict({"observation": torch.zeros(1, 3), "action": torch.zeros(1), "state_value": torch.zeros(1, 1),
                       "sample_log_prob": torch.zeros(1), "advantage": torch.ones(1, 1),
                       "next": {"reward": torch.zeros(1, 1), "terminated": torch.zeros(1, 1, dtype=torch.bool),
                                "truncated": torch.zeros(1, 1, dtype=torch.bool), "state_value": torch.zeros(1, 1)}}, [1])
    with pytest.raises(ConfigError, match=r"^advantage: key 'advantage' differs"):
        buf.torchrl.extend(data)
    assert len(buf) == 0


# -- priorities ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("index", "priority", "error", "match"), [
    ([5], [3.0], StoredIndexError, r"^index: expected positions in \[0, 4\), got values in \[5, 5\]"),
    ([100], [3.0], StoredIndexError, r"^index:"),
    ([-1], [3.0], StoredIndexError, r"^index:"),
    ([0], [float("nan")], PriorityError, r"^priority:"),
    ([0], [-1.0], PriorityError, r"^priority:"),
    ([0, 1], [1.0], PriorityError, r"^priority: expected 2 values"),
])
def test_update_priority_takes_stored_positions_and_valid_priorities(index: Any, priority: Any,
                                                                     error: type[RlbufError], match: str) -> None:
    buf = make(prioritized=True)
    rb = buf.torchrl
    refused(buf, error, match, lambda: rb.update_priority(torch.tensor(index), torch.tensor(priority)))
    rb.update_priority(torch.tensor([0, 3]), torch.tensor([2.0, 0.5]))
    assert buf.check_valid() == (True, "")


# -- loads and in-place key writes -----------------------------------------------------------------
def test_torchrl_level_loads_and_key_writes_are_refused(tmp_path: Path) -> None:
    buf = make(prioritized=True)
    rb = buf.torchrl
    state = rb.state_dict()
    state["_storage"]["_storage"]["next.reward"].fill_(float("nan"))
    rb.dumps(tmp_path / "dumped")
    refused(buf, ConfigError, r"^torchrl\.load_state_dict: refused .* use buffer\.load_state_dict",
            lambda: rb.load_state_dict(state))
    refused(buf, ConfigError, r"^torchrl\.loads: refused .* ReplayBuffer\.load", lambda: rb.loads(tmp_path / "dumped"))
    refused(buf, ConfigError, r"^torchrl\.load:", lambda: rb.load(tmp_path / "dumped"))
    refused(buf, ConfigError, r"^torchrl\.set_at_:",
            lambda: rb.set_at_(("next", "reward"), torch.full((1, 1), float("nan")), torch.tensor([0])))
    refused(buf, ConfigError, r"^torchrl\.set_:", lambda: rb.set_("action", torch.zeros(4)))
    refused(buf, ConfigError, r"^torchrl\.update_:", lambda: rb.update_({"action": torch.zeros(4)}))
    # Another storage, sampler or writer would drop the rows or the priorities rlbuf holds.
    refused(buf, ConfigError, r"^torchrl\.set_storage: refused", lambda: rb.set_storage(LazyTensorStorage(8)))
    refused(buf, ConfigError, r"^torchrl\.set_sampler: refused", lambda: rb.set_sampler(RandomSampler()))
    refused(buf, ConfigError, r"^torchrl\.set_writer: refused", lambda: rb.set_writer(RoundRobinWriter()))


# -- worker processes ------------------------------------------------------------------------------
def test_the_checks_pickle_with_the_buffer() -> None:
    buf = make()
    checks = pickle.loads(pickle.dumps(buf.torchrl._rlbuf_rows))
    with pytest.raises(NonFiniteError, match=r"^reward:"):
        checks.rows(rows(2, reward=float("nan")), batched=True)
    with pytest.raises(ConfigError, match=r"^done:"):
        checks.rows(rows(2, terminated=True, done=False), batched=True)
    assert checks.rows(rows(2, truncated=True), batched=True)["next", "done"].all()


def _hostile_worker(rb: Any, results: Any) -> None:
    attempts = {
        "nan reward": rows(2, reward=float("nan")),
        "done": rows(2, terminated=True, done=False),
        "missing": TensorDict({"observation": torch.zeros(1, 3)}, [1]),
    }
    for label, data in attempts.items():
        try:
            rb.extend(data)
            results.put((label, "accepted"))
        except RlbufError as error:
            results.put((label, f"{type(error).__name__}: {error}"))
    rb.extend(rows(2, reward=9.0, truncated=True))
    results.put(("valid", "accepted"))


def test_a_worker_process_checks_its_writes_and_the_learners_buffer_stays_valid() -> None:
    buf = make()
    context = mp.get_context("spawn")
    results = context.Queue()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the sharing strategy switch
        worker = context.Process(target=_hostile_worker, args=(buf.torchrl, results))
        worker.start()
    answers = dict(results.get(timeout=120) for _ in range(4))
    worker.join(timeout=120)
    assert worker.exitcode == 0
    assert answers["nan reward"].startswith("NonFiniteError: reward:")
    assert answers["done"].startswith("ConfigError: done:")
    assert answers["missing"].startswith("MissingFieldError: action:")
    assert answers["valid"] == "accepted"
    assert buf.check_valid() == (True, "")
    batch = buf.sample_all()
    assert batch.reward.tolist() == [0.0, 1.0, 2.0, 9.0, 9.0]
    assert batch.done.tolist() == [False, False, False, True, True]


# -- reads hand out copies -------------------------------------------------------------------------
@pytest.mark.parametrize("index", [0, slice(0, 2), slice(None), torch.tensor([1])])
def test_reads_through_torchrl_are_copies_not_views_of_the_storage(index: Any) -> None:
    buf = make()
    buf.torchrl[index]["next", "reward"].fill_(float("nan"))
    buf.torchrl.state_dict()["_storage"]["_storage"]["next.reward"].fill_(float("nan"))
    assert buf.check_valid() == (True, "")
    assert buf.sample_all().reward.tolist() == [0.0, 1.0, 2.0]



def test_mark_update_takes_stored_positions_only() -> None:
    buf = make(prioritized=True)
    refused(buf, StoredIndexError, r"^index: expected positions in \[0, 4\)", lambda: buf.torchrl.mark_update(torch.tensor([6])))
    buf.torchrl.mark_update(torch.tensor([1]))
    assert buf.check_valid() == (True, "")


class _Poison(Transform):
    """A transform whose inverse (applied by TorchRL to what it writes) makes rewards NaN."""

    def _inv_call(self, tensordict: Any) -> Any:
        tensordict.set(("next", "reward"), torch.full_like(tensordict.get(("next", "reward")), float("nan")))
        return tensordict


class _Scale(Transform):
    """A transform of samples only (its inverse leaves rows as they are)."""

    def _call(self, tensordict: Any) -> Any:
        tensordict.set(("next", "reward"), tensordict.get(("next", "reward")) * 2)
        return tensordict


def test_transforms_whose_inverse_would_change_written_rows_are_refused() -> None:
    buf = make()
    rb = buf.torchrl
    rb.append_transform(_Scale())
    rb.extend(rows(2, reward=4.0))
    assert buf.sample_all().reward.tolist()[-2:] == [4.0, 4.0]
    buf = make()
    rb = buf.torchrl
    rb.append_transform(_Poison())
    refused(buf, ConfigError, r"^torchrl: the inverse of the transforms", lambda: rb.extend(rows(2)))
    refused(buf, ConfigError, r"^torchrl: the inverse of the transforms", lambda: rb.add(rows(None)))
    refused(buf, ConfigError, r"^torchrl: the inverse of the transforms", lambda: rb.__setitem__(0, rows(None)))


def test_rows_written_through_torchrl_are_not_taken_for_whole_steps(tmp_path: Path) -> None:
    # 3 rows through buffer.torchrl into a 2-env buffer: its save said each env's rows were 2 apart, which its
    # own load refused; rows in a collector's env-major order gave sequences that crossed envs (helper 43).
    buf = ReplayBuffer(16, obs_shape=(3,), action_shape=(), num_envs=2, seed=0)
    buf.torchrl.extend(rows(3))
    buf.save(tmp_path / "ck")
    assert len(ReplayBuffer.load(tmp_path / "ck")) == 3
    buf.add(torch.zeros(2, 3), torch.zeros(2), torch.ones(2), torch.zeros(2, 3), torch.zeros(2, dtype=torch.bool),
            truncated=False)
    with pytest.raises(ConfigError, match=r"steps of one env are not num_envs rows apart: .* or written through "
                                          r"buffer.torchrl"):
        buf.sample_sequences(2, 2)
    buf.clear()  # whole steps again
    for _ in range(3):
        buf.add(torch.zeros(2, 3), torch.zeros(2), torch.ones(2), torch.zeros(2, 3),
                torch.zeros(2, dtype=torch.bool), truncated=False)
    assert buf.sample_sequences(2, 2).obs.shape[:2] == (2, 2)


# -- a rollout's rows through TorchRL ----------------------------------------------------------------
def rollout(num_steps: int, num_envs: int, *, filled: int) -> RolloutBuffer:
    buf = RolloutBuffer(num_steps, num_envs, obs_shape=(3,), action_shape=(), seed=0)
    for _ in range(filled):
        buf.add(torch.zeros(num_envs, 3), torch.zeros(num_envs), torch.ones(num_envs),
                torch.zeros(num_envs, dtype=torch.bool), torch.zeros(num_envs), torch.zeros(num_envs), truncated=False)
    return buf


def rollout_rows(n: int | None, *, reward: float = 1.0) -> TensorDict:
    lead: tuple[int, ...] = () if n is None else (n,)
    return TensorDict({"observation": torch.full((*lead, 3), 9.0), "action": torch.zeros(lead),
                       "state_value": torch.zeros(*lead, 1), "sample_log_prob": torch.zeros(lead),
                       "next": {"reward": torch.full((*lead, 1), reward), "state_value": torch.zeros(*lead, 1),
                                "terminated": torch.zeros(*lead, 1, dtype=torch.bool),
                                "truncated": torch.zeros(*lead, 1, dtype=torch.bool)}}, lead)


@pytest.mark.parametrize(("filled", "write", "error", "match"), [
    # Past the capacity TorchRL's writer wrapped over step 0 of a full rollout, whose own save then did not load.
    (2, lambda rb: rb.extend(rollout_rows(2)), "full", r"^extend: 1 step\(s\) do not fit; 0 of 2 left"),
    (1, lambda rb: rb.extend(rollout_rows(4)), "full", r"^extend: 2 step\(s\) do not fit; 1 of 2 left"),
    # A part of a step put every later add's rows in another env's place.
    (0, lambda rb: rb.extend(rollout_rows(1)), "part", r"^data: expected whole steps of 2 rows .* got 1 row"),
    (1, lambda rb: rb.extend(rollout_rows(3)), "part", r"^data: expected whole steps of 2 rows .* got 3 row"),
    (0, lambda rb: rb.add(rollout_rows(None)), "part", r"^data: expected whole steps of 2 rows .* got 1 row"),
])
def test_a_rollout_takes_rows_through_torchrl_only_as_whole_steps_that_fit(filled: int, write: Callable[[Any], Any],
                                                                           error: str, match: str) -> None:
    buf = rollout(2, 2, filled=filled)
    before = snapshot(buf)
    with pytest.raises(BufferFullError if error == "full" else ShapeError, match=match):
        write(buf.torchrl)
    assert same(before, snapshot(buf))
    assert buf.check_valid() == (True, "")
    RolloutBuffer(2, 2, obs_shape=(3,), action_shape=()).load_state_dict(buf.state_dict())


def test_whole_steps_through_torchrl_fill_a_rollout_as_adds_do() -> None:
    buf = rollout(3, 2, filled=1)
    buf.torchrl.extend(rollout_rows(2))
    assert buf.steps == 2 and buf.view("obs")[1].eq(9.0).all()
    buf.add(torch.ones(2, 3), torch.zeros(2), torch.ones(2), torch.zeros(2, dtype=torch.bool), torch.zeros(2),
            torch.zeros(2), truncated=False)
    assert buf.view("obs")[2].eq(1.0).all() and buf.check_valid() == (True, "")
    one_env = rollout(2, 1, filled=0)
    one_env.torchrl.add(rollout_rows(None))
    one_env.torchrl.add(rollout_rows(None))
    with pytest.raises(BufferFullError, match=r"^add: 1 step\(s\) do not fit; 0 of 2 left"):
        one_env.torchrl.add(rollout_rows(None))
    assert one_env.is_full and one_env.check_valid() == (True, "")


@pytest.mark.parametrize("write", ["setitem", "setitem_slice", "empty"])
def test_a_write_through_torchrl_makes_the_rollouts_advantages_stale(write: str) -> None:
    # rb[0] = td after compute_returns_and_advantages left advantages_ready True: the row was delivered with
    # the derived advantage 0, every other row with advantages of the old rewards.
    buf = rollout(2, 2, filled=2)
    buf.compute_returns_and_advantages(torch.zeros(2), gamma=0.5, gae_lambda=1.0)
    held = buf.minibatches(batch_size=1, shuffle=False)
    next(held)
    if write == "setitem":
        buf.torchrl[0] = rollout_rows(None, reward=5.0)
    elif write == "setitem_slice":
        buf.torchrl[0:1] = rollout_rows(1, reward=5.0)
    else:
        buf.torchrl.empty()
    assert not buf.advantages_ready
    for call in (lambda: buf.minibatches(batch_size=4), buf.get_all_data, lambda: next(held)):
        with pytest.raises(RolloutIncompleteError):
            call()
    if write != "empty":
        buf.compute_returns_and_advantages(torch.zeros(2), gamma=0.5, gae_lambda=1.0)
        assert buf.advantages_ready
        assert buf.get_all_data().advantage.tolist() == [5.5, 1.5, 1.0, 1.0]


def test_extras_set_beside_current_advantages_leave_them_current_and_stale_ones_stale() -> None:
    buf = rollout(2, 2, filled=2)
    buf.compute_returns_and_advantages(torch.zeros(2))
    buf.set_extras({"old_logits": torch.zeros(2, 2, 4)})
    assert buf.advantages_ready
    buf.torchrl[1] = rollout_rows(None)
    buf.set_extras({"old_logits": torch.ones(2, 2, 4)})
    assert not buf.advantages_ready
    buf.set_extras({"advantage": torch.ones(2, 2), "returns": torch.ones(2, 2)})
    assert buf.advantages_ready


def test_a_save_keeps_no_iterator_that_a_write_through_torchrl_left_without_batches(tmp_path: Path) -> None:
    # helper 66: the iterator was saved, and the checkpoint that replaced a good one did not load.
    rollout = RolloutBuffer(4, 2, obs_shape=(3,), action_shape=(), seed=2)
    for _ in range(4):
        rollout.add(torch.randn(2, 3), torch.zeros(2), torch.ones(2), torch.zeros(2, dtype=torch.bool), torch.zeros(2),
                    torch.zeros(2), truncated=torch.zeros(2, dtype=torch.bool))
    rollout.compute_returns_and_advantages(torch.zeros(2))
    next(iter(rollout.minibatches(batch_size=3, n_epochs=2)))
    rollout.torchrl[0] = rollout.torchrl[0].exclude("advantage", "value_target")  # stale now: batches refused
    rollout.save(tmp_path / "rollout")
    loaded = RolloutBuffer.load(tmp_path / "rollout")
    assert loaded.current_epochs is None and not loaded.advantages_ready
    replay = ReplayBuffer(10, obs_shape=(3,), action_shape=(), seed=1)
    for _ in range(8):
        replay.add(torch.zeros(3), 0.0, 1.0, torch.zeros(3), False, truncated=False)
    next(iter(replay.epochs(batch_size=4, n_epochs=2)))
    replay.torchrl.empty()
    replay.save(tmp_path / "replay")
    assert len(ReplayBuffer.load(tmp_path / "replay")) == 0
