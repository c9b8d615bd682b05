"""Python's protocols on every buffer and batch: what works (``len``, ``bool``, identity ``==`` and ``hash`` of a
buffer; rows, ``to``, content ``==`` and copies of a batch) and what is refused with the call to use instead
(``buffer[0]``, ``for row in buffer``, ``x in buffer``, ``batch[0]``, ``obs, action, *rest = batch``), a refused
call changing nothing."""

from __future__ import annotations

import copy
import io
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from _snapshot import same, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st

from rlbuf import (
    ConfigError,
    DistillationBuffer,
    MixedReplay,
    NotPicklableError,
    ReplayBuffer,
    RolloutBuffer,
    StoredIndexError,
    UnsupportedOperationError,
)


def replay(rows: int = 6) -> ReplayBuffer:
    buf = ReplayBuffer(8, obs_shape=(2,), action_shape=(), seed=0, extra_fields={"cost": ((), torch.float32)})
    for r in range(rows):
        buf.add(torch.full((2,), float(r)), 0.0, float(r), torch.full((2,), r + 1.0), r % 4 == 3, truncated=False,
                cost=-float(r))
    return buf


def rollout() -> RolloutBuffer:
    buf = RolloutBuffer(3, 2, obs_shape=(2,), action_shape=(), seed=0)
    for t in range(3):
        buf.add(torch.full((2, 2), float(t)), torch.zeros(2), torch.tensor([t, 10.0 + t]),
                torch.tensor([t == 1, False]), torch.zeros(2), torch.zeros(2), truncated=False)
    buf.compute_returns_and_advantages(torch.zeros(2))
    return buf


def distill() -> DistillationBuffer:
    buf = DistillationBuffer(8, obs_shape=(2,), action_shape=(), seed=0)
    for r in range(5):
        buf.add(torch.full((2,), float(r)), float(r))
    return buf


BUFFERS = {"ReplayBuffer": replay, "RolloutBuffer": rollout, "DistillationBuffer": distill}
ALL_ROWS = {"ReplayBuffer": "buffer.sample_all()", "RolloutBuffer": "buffer.get_all_data()",
            "DistillationBuffer": "buffer.sample_all()"}


@pytest.mark.parametrize(("call", "message"), [
    (lambda buf: buf[0], r"\[0\]: a buffer is not indexed by position \(once the ring wraps"),
    (lambda buf: buf[-1], r"\[-1\]: a buffer is not indexed by position"),
    (lambda buf: buf[1:3], r"\[1:3\]: a buffer is not indexed by position"),
    (lambda buf: buf[torch.tensor([0, 1])], r"\[tensor\(\[0, 1\]\)\]: a buffer is not indexed by position"),
    (lambda buf: [row for row in buf], r"^iter\(\w+\): a buffer hands out rows in batches, not one by one"),
    (list, r"^iter\(\w+\): a buffer hands out rows in batches"),
    (lambda buf: reversed(buf), r"^reversed\(\w+\): .*\[-10:\] holds the newest rows$"),
    (next, r"^next\(\w+\): a buffer is no iterator; .*it = buffer\.(epochs|minibatches)\(batch_size=\.\.\.\) is one: "
           r"next\(it\) is its next batch$"),
    (lambda buf: 0 in buf, r"^`in` \w+: a buffer is not searched by value; 0 <= i < len\(buffer\)"),
    (np.asarray, r"^np\.asarray\(\w+\): a buffer is no array; convert a field of its rows"),
    (lambda buf: buf.__setitem__(0, None), r"\[0\] = \.\.\.: (rows|steps) are written by add\(\) or extend\(td\)"),
    (lambda buf: buf.__delitem__(slice(0, 2)), r"^del \w+\[0:2\]: rows are not deleted one by one; clear\(\)"),
])
@pytest.mark.parametrize("kind", BUFFERS)
def test_a_buffer_refuses_sequence_protocols_naming_the_call_to_use_and_changes_nothing(
        kind: str, call: Callable[[Any], Any], message: str) -> None:
    buf = BUFFERS[kind]()
    before = snapshot(buf)
    with pytest.raises(UnsupportedOperationError, match=message) as error:
        call(buf)
    assert isinstance(error.value, TypeError)  # as Python's "not subscriptable", "not iterable"
    assert same(snapshot(buf), before)
    if "a buffer is not indexed" in message or "iter(" in message:
        assert "sample_by_index(i)" in str(error.value) and ALL_ROWS[kind] in str(error.value)


@pytest.mark.parametrize(("kind", "fix"), [("ReplayBuffer", "buffer.sample_all().obs holds every stored row's"),
                                           ("RolloutBuffer", "buffer.view('obs') is its [num_steps, num_envs, ...]")])
def test_a_buffer_read_by_key_names_the_field_read(kind: str, fix: str) -> None:
    with pytest.raises(UnsupportedOperationError, match=rf"^{kind}\['obs'\]: a buffer is not read by key; "
                                                        + fix.replace("(", r"\(").replace(")", r"\)")
                                                        .replace(".", r"\.").replace("[", r"\[").replace("]", r"\]")):
        BUFFERS[kind]()["obs"]


def test_the_fixes_named_read_what_a_user_asked_for() -> None:
    buf = replay(rows=11)  # wrapped: storage position 0 holds the 9th row added
    assert buf.sample_by_index(0).reward.tolist() == [8.0]
    assert buf.sample_all()[-1:].reward.tolist() == [10.0]  # the newest
    assert buf.sample_all()[:1].reward.tolist() == [3.0]  # the oldest
    assert [len(b) for b in buf.epochs(batch_size=3)] == [3, 3, 2]
    assert np.asarray(buf.sample_all().obs).shape == (8, 2)


@pytest.mark.parametrize("kind", BUFFERS)
def test_len_bool_identity_equality_and_hash_of_a_buffer(kind: str) -> None:
    buf, twin = BUFFERS[kind](), BUFFERS[kind]()
    assert len(buf) == len(twin) > 0 and bool(buf)
    assert buf == buf and buf != twin  # a buffer is a resource, like an nn.Module: equal only to itself
    assert {buf: 1, twin: 2}[buf] == 1 and hash(buf) == hash(buf)
    buf.clear()
    assert len(buf) == 0 and not buf
    held = np.array([buf, twin], dtype=object)  # an object array holds buffers as objects
    assert held[0] is buf


@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy, pickle.dumps, lambda buf: torch.save(buf, io.BytesIO())],
                         ids=["copy", "deepcopy", "pickle", "torch.save"])
@pytest.mark.parametrize("kind", BUFFERS)
def test_copies_of_a_buffer_are_refused_and_change_nothing(kind: str, copier: Callable[[Any], Any]) -> None:
    buf = BUFFERS[kind]()
    before = snapshot(buf)
    with pytest.raises(NotPicklableError, match=r"cannot be pickled or copied .*buffer\.save\(path\)"):
        copier(buf)
    assert same(snapshot(buf), before)


def test_a_mixed_replay_refuses_the_same_protocols_naming_its_own_calls() -> None:
    mixed = MixedReplay(replay(), replay(), seed=0)
    with pytest.raises(UnsupportedOperationError, match=r"^MixedReplay\[0\]: .*mixed\.offline\.sample_all\(\) and "
                                                        r"mixed\.online\.sample_all\(\)"):
        mixed[0]
    with pytest.raises(UnsupportedOperationError, match=r"mixed\.sample\(batch_size\) draws a mixed batch"):
        iter(mixed)
    with pytest.raises(UnsupportedOperationError, match=r"^MixedReplay\['reward'\]: .*mixed\.sample\(batch_size\)"):
        mixed["reward"]


def _mixed_state(mixed: MixedReplay) -> Any:
    return snapshot(mixed.offline), snapshot(mixed.online), mixed._generator.get_state()


def test_a_mixed_replay_has_no_len_is_true_and_names_each_buffers_len() -> None:
    mixed = MixedReplay(replay(), replay(rows=0), seed=0)
    with pytest.raises(UnsupportedOperationError, match=r"^len\(MixedReplay\): a mixer holds no rows of its own; "
                                                        r"len\(mixed\.offline\) and len\(mixed\.online\)"):
        len(mixed)
    assert bool(mixed) and len(mixed.offline) == 6 and len(mixed.online) == 0  # it draws offline rows already
    assert len(mixed.sample(4)) == 4


@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy, pickle.dumps, lambda buf: torch.save(buf, io.BytesIO())],
                         ids=["copy", "deepcopy", "pickle", "torch.save"])
def test_copies_of_a_mixed_replay_are_refused_naming_its_own_save(copier: Callable[[Any], Any]) -> None:
    """Before, ``copy.copy`` made a mixer sharing its generator and buffers, and the others named a ReplayBuffer."""
    mixed = MixedReplay(replay(), replay(), seed=0)
    before = _mixed_state(mixed)
    with pytest.raises(NotPicklableError, match=r"^MixedReplay: cannot be pickled or copied .*mixed\.save\(path\) and "
                                                r"MixedReplay\.load\(path\).*send mixed\.online\.torchrl"):
        copier(mixed)
    assert all(same(now, then) for now, then in zip(_mixed_state(mixed)[:2], before[:2], strict=True))
    assert torch.equal(mixed._generator.get_state(), before[2])


@pytest.mark.parametrize(("call", "message"), [
    (next, r"^next\(MixedReplay\): a buffer is no iterator; mixed\.sample\(batch_size\) draws a mixed batch$"),
    (lambda mixed: mixed.__setitem__(0, None), r"written to the online buffer by mixed\.online\.add\(\)"),
    (lambda mixed: mixed.__delitem__(0), r"mixed\.online\.clear\(\) empties the online buffer"),
    (lambda mixed: 0 in mixed, r"^`in` MixedReplay: a buffer is not searched by value; \(mixed\.online\.sample_all"),
    (np.asarray, r"np\.asarray\(mixed\.online\.sample_all\(\)\.obs\)$"),
])
def test_a_mixed_replay_refuses_next_and_writes_naming_the_online_buffer(call: Callable[[Any], Any],
                                                                          message: str) -> None:
    mixed = MixedReplay(replay(), replay(), seed=0)
    before = _mixed_state(mixed)
    with pytest.raises(UnsupportedOperationError, match=message):
        call(mixed)
    assert all(same(now, then) for now, then in zip(_mixed_state(mixed)[:2], before[:2], strict=True))


class _Client:
    """What a remote handle calls: the actor's ``__len__`` only (the refusals never call it)."""

    calls = 0

    def __len__(self) -> int:
        _Client.calls += 1
        return 3


def test_a_remote_handle_refuses_as_a_buffer_naming_its_own_calls() -> None:
    pytest.importorskip("ray")
    from rlbuf.ray import RemoteReplayBufferHandle

    handle, calls = RemoteReplayBufferHandle(_Client()), _Client.calls
    for call in (lambda h: h[0], iter, next, reversed, lambda h: 0 in h, np.asarray, lambda h: h["obs"]):
        with pytest.raises(UnsupportedOperationError, match=r"^\S*( |\()?RemoteReplayBufferHandle") as error:
            call(handle)
        assert "sample_by_index" not in str(error.value) and "epochs" not in str(error.value)  # it has neither
    assert _Client.calls == calls  # refused without a round trip
    with pytest.raises(UnsupportedOperationError, match=r"^next\(\w+\): a buffer is no iterator; buffer\.sample"):
        next(handle)
    assert len(handle) == 3 and bool(handle) and pickle.loads(pickle.dumps(handle)).device == torch.device("cpu")
    assert handle.size == 3  # an int, as a local buffer's; SB3's size() names the fix (was "'int' is not callable")
    with pytest.raises(UnsupportedOperationError, match=r"^buffer\.size\(\): size is a property"):
        handle.size()


def test_a_replay_service_refuses_as_a_buffer_naming_its_own_calls() -> None:
    """Before, each was Python's bare ``TypeError`` and ``np.asarray(service)`` a silent 0-d object array."""
    pytest.importorskip("ray")
    from rlbuf.ray import ReplayService

    service = object.__new__(ReplayService)  # no shards: a refusal reads none
    for call, message in [
        (lambda s: s[0], r"^ReplayService\[0\]: .*service\.sample_all\(\) holds every row, .*service\.sample\("),
        (lambda s: s["obs"], r"^ReplayService\['obs'\]: a buffer is not read by key; service\.sample_all\(\)\.obs"),
        (iter, r"^iter\(ReplayService\): a buffer hands out rows in batches"),
        (next, r"^next\(ReplayService\): a buffer is no iterator; service\.sample\(batch_size\) draws a batch$"),
        (reversed, r"^reversed\(ReplayService\): .*service\.sample_all\(\)\[-10:\] holds the newest rows$"),
        (lambda s: 0 in s, r"^`in` ReplayService: a buffer is not searched by value; \(service\.sample_all"),
        (np.asarray, r"np\.asarray\(service\.sample_all\(\)\.obs\)$"),
        (lambda s: s.__setitem__(0, None), r"service\.extend\(td\) or a writer's add\(\) \(service\.writer\(\)\)"),
    ]:
        with pytest.raises(UnsupportedOperationError, match=message) as error:
            call(service)
        assert "sample_by_index" not in str(error.value) and "epochs" not in str(error.value)  # it has neither
    assert np.array([service], dtype=object)[0] is service


# -- batches ------------------------------------------------------------------------------------


def _sequences() -> Any:
    return next(iter(rollout().minibatches(num_minibatches=1, sequences=True, shuffle=False)))


BATCHES: dict[str, Callable[[], Any]] = {
    "ReplayBatch": lambda: replay().sample_all(),
    "RolloutBatch": lambda: rollout().get_all_data(),
    "DistillationBatch": lambda: distill().sample_all(),
    "MixedBatch": lambda: MixedReplay(replay(), replay(), seed=0).sample(6),
    "ReplaySequenceBatch": lambda: replay().sample_sequences(4, 2),
    "SequenceBatch": _sequences,
}


def _rows_on_dim(batch: Any, name: str) -> int:
    return 1 if name in type(batch)._time_first else 0


@pytest.mark.parametrize("key", [slice(1, 3), slice(None, 8), slice(-2, None), slice(None, None, 2), [2, 0, 2],
                                 [-1], torch.tensor([1, 0]), np.array([0, 1]), []], ids=repr)
@pytest.mark.parametrize("kind", BATCHES)
def test_a_batch_indexed_by_rows_is_a_batch_of_those_rows(kind: str, key: Any) -> None:
    batch = BATCHES[kind]()
    rows = batch[key]
    assert type(rows) is type(batch)
    expected = torch.arange(len(batch))[key if not isinstance(key, list) else torch.tensor(key, dtype=torch.int64)]
    assert len(rows) == expected.numel()
    for item in type(batch).__dataclass_fields__.values():
        value, selected = getattr(batch, item.name), getattr(rows, item.name)
        if isinstance(value, dict):
            assert value.keys() == selected.keys()
            value, selected = (next(iter(v.values()), None) for v in (value, selected))
        if not isinstance(value, torch.Tensor):
            assert selected is value or selected == value  # None, burn_in
            continue
        axis = _rows_on_dim(batch, item.name)
        assert torch.equal(selected, value.index_select(axis, expected)), item.name


def test_rows_of_a_replay_batch_are_the_rows_sample_by_index_reads() -> None:
    buf = replay()
    batch = buf.sample(16)
    assert batch[3:9] == buf.sample_by_index(batch.index[3:9])
    assert batch[batch.reward > 2] == buf.sample_by_index(batch.index[batch.reward > 2])
    part = buf.sample_by_index([4, 1, 2], fields=["reward", "cost"])  # a batch of some fields only
    assert part[1:].reward.tolist() == [1.0, 2.0] and part[[0]].extras["cost"].tolist() == [-4.0]


@pytest.mark.parametrize(("key", "error", "message"), [
    (0, UnsupportedOperationError, r"\[0\]: an int index would drop the batch dim .*batch\[0:1\] is a batch of that "
                                   r"one row, batch\.obs\[0\] one field of it$"),
    (-1, UnsupportedOperationError, r"\[-1\]: an int index would drop .*batch\[-1:\] is a batch of that one row"),
    (np.int64(2), UnsupportedOperationError, r"batch\[2:3\]"),
    (torch.tensor(1), UnsupportedOperationError, r"batch\[1:2\]"),
    (slice(None, None, -1), UnsupportedOperationError, r"\[::-1\]: a slice's step must be a positive int"),
    (True, UnsupportedOperationError, r"rows are selected by a slice, integer positions or a bool mask$"),
    (None, UnsupportedOperationError, r"rows are selected by a slice"),
    ([0.5], UnsupportedOperationError, r"a 1-d tensor of integer positions or a bool mask; got dtype torch\.float64"),
    (torch.zeros(2, 2, dtype=torch.int64), UnsupportedOperationError, r"got dtype torch\.int64, shape \(2, 2\)"),
    ([0, 99], StoredIndexError, r"row 99 is outside the batch's \d+ rows$"),
    ([-99], StoredIndexError, r"row -99 is outside the batch's \d+ rows$"),
    (torch.tensor([True]), StoredIndexError, r"a mask of 1 values for a batch of \d+ rows$"),
    ("obs", UnsupportedOperationError, r"\['obs'\]: a batch is read by attribute, not by key: batch\.obs"),
    (("next", "reward"), UnsupportedOperationError, r"batch is read by attribute"),
], ids=repr)
@pytest.mark.parametrize("kind", BATCHES)
def test_a_batch_refuses_an_index_it_cannot_read_as_rows(kind: str, key: Any, error: type[Exception],
                                                         message: str) -> None:
    batch = BATCHES[kind]()
    if isinstance(key, tuple) and kind in ("DistillationBatch", "RolloutBatch", "SequenceBatch"):
        key = "obs"
    with pytest.raises(error, match=message) as caught:
        batch[key]
    assert isinstance(caught.value, (TypeError, IndexError))


@pytest.mark.parametrize("kind", [kind for kind in BATCHES if kind != "DistillationBatch"])
def test_a_batch_is_not_unpacked_or_iterated_as_sb3s_named_tuples_are(kind: str) -> None:
    batch = BATCHES[kind]()
    with pytest.raises(UnsupportedOperationError, match=rf"^iter\({kind}\): a batch is read by attribute .*SB3's "
                                                        r"samples are NamedTuples unpacked in their own order"):
        _obs, _action, *_rest = batch
    with pytest.raises(UnsupportedOperationError, match=rf"^iter\({kind}\)"):
        for _ in batch:
            pass
    with pytest.raises(UnsupportedOperationError, match=rf"^reversed\({kind}\)"):
        reversed(batch)


@pytest.mark.parametrize("kind", BATCHES)
def test_a_batch_refuses_next_writes_and_numpy_as_a_protocol_not_a_missing_key(kind: str) -> None:
    """Before, ``np.asarray(batch)`` and ``batch["obs"]`` raised ``MissingFieldError``, a ``KeyError`` that a dict
    habit's ``except KeyError`` fallback took for an absent field, and ``next(batch)``, ``batch[0] = x`` and
    ``del batch[0]`` Python's bare ``TypeError``, where a buffer raised ``UnsupportedOperationError``."""
    batch = BATCHES[kind]()
    twin = copy.deepcopy(batch)
    unpacks = "obs, expert_action = batch unpacks it; " if kind == "DistillationBatch" else ""
    for call, message in [
        (next, rf"^next\({kind}\): a batch is no iterator; it is read by attribute .*; {unpacks}the next batch comes "
               r"from an iterator of batches: it = buffer\.epochs\(batch_size=\.\.\.\)"),
        (np.asarray, rf"^np\.asarray\({kind}\): a batch is no array .*np\.asarray\(batch\.obs\.cpu\(\)\) \.\.\., "
                     r"or all of them: batch\.to_tensordict\(\)\.cpu\(\)\.numpy\(\)"),
        (lambda b: b["obs"], rf"^{kind}\['obs'\]: a batch is read by attribute, not by key: batch\.obs"),
        (lambda b: b.__setitem__(slice(0, 1), b), rf"^{kind}\[0:1\] = \.\.\.: a batch's fields are fixed; write "
                                                  r"into a field's tensor"),
        (lambda b: b.__delitem__(0), rf"^del {kind}\[0\]: a batch's rows are not deleted; batch\[mask\]"),
    ]:
        with pytest.raises(UnsupportedOperationError, match=message) as error:
            call(batch)
        assert not isinstance(error.value, KeyError)
    assert batch == twin
    assert np.asarray(batch.obs.cpu()).shape == tuple(batch.obs.shape)  # the fixes named work
    assert set(batch.to_tensordict().cpu().numpy()) >= {"observation"}


def test_a_distillation_batch_unpacks_as_documented() -> None:
    batch = distill().sample_all()
    obs, expert_action, *rest = batch
    assert obs is batch.obs and expert_action is batch.expert_action and rest == []


@pytest.mark.parametrize("kind", BATCHES)
def test_in_and_hash_of_a_batch_are_refused_with_what_to_use(kind: str) -> None:
    batch = BATCHES[kind]()
    with pytest.raises(UnsupportedOperationError, match=r"^`in` \w+: a batch is not searched; hasattr\(batch, name\)"):
        "obs" in batch  # noqa: B015
    with pytest.raises(UnsupportedOperationError, match=r"^hash\(\w+\): a batch compares by contents, .*id\(batch\)$"):
        hash(batch)
    assert len(batch) > 0 and bool(batch)


@pytest.mark.parametrize("kind", BATCHES)
def test_batches_compare_by_contents_and_survive_copies(kind: str) -> None:
    batch = BATCHES[kind]()
    for twin in (copy.copy(batch), copy.deepcopy(batch), pickle.loads(pickle.dumps(batch)), batch.to("cpu"),
                 batch[:]):
        assert twin == batch and (twin != batch) is False
    saved = io.BytesIO()
    torch.save(batch, saved)
    saved.seek(0)
    assert torch.load(saved, weights_only=False) == batch
    assert batch[:1] != batch and batch[[0, 0]] == batch[[0]][[0, 0]]
    assert batch != BATCHES["DistillationBatch" if kind != "DistillationBatch" else "ReplayBatch"]()
    assert batch != batch.to_tensordict()  # another type: not equal, never an error


def test_equality_compares_dtype_and_every_field_not_only_the_first() -> None:
    batch = replay().sample_all()
    assert batch == batch.to("cpu")
    changed = copy.deepcopy(batch)
    changed.extras["cost"][0] += 1  # a field deep in extras
    assert changed != batch
    retyped = copy.deepcopy(batch)
    object.__setattr__(retyped, "reward", batch.reward.double())
    assert retyped != batch


@pytest.mark.parametrize("kind", BATCHES)
def test_batch_to_moves_every_field_and_refuses_what_is_no_device(kind: str) -> None:
    batch = BATCHES[kind]()
    moved = batch.to(torch.device("cpu"), non_blocking=True)
    assert type(moved) is type(batch) and moved == batch
    with pytest.raises(ConfigError, match=r"^device: not a device: torch\.float16"):
        batch.to(torch.float16)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"^device: cuda was asked for, but CUDA is not available"):
            batch.to("cuda")
    with pytest.raises(AttributeError, match=r"has no cpu\(\); batch\.to\('cpu'\) moves every field$"):
        batch.cpu()
    with pytest.raises(AttributeError, match=r"has no _asdict\(\); dataclasses\.asdict\(batch\)$"):
        batch._asdict()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kind", BATCHES)
def test_batch_to_cuda_moves_every_tensor_and_back(kind: str) -> None:
    batch = BATCHES[kind]()
    on_gpu = batch.to("cuda")
    for name, value in vars_of(on_gpu).items():
        if isinstance(value, torch.Tensor):
            assert value.is_cuda, name
    assert on_gpu != batch and on_gpu.to("cpu") == batch
    assert on_gpu[[1, 0]].to("cpu") == batch[[1, 0]]


def vars_of(batch: Any) -> dict[str, Any]:
    return {name: getattr(batch, name) for name in type(batch).__dataclass_fields__}


@settings(max_examples=40, deadline=None)
@given(start=st.integers(-8, 8), stop=st.integers(-8, 8), step=st.integers(1, 3),
       picks=st.lists(st.integers(-6, 5), max_size=8))
def test_rows_of_a_batch_are_the_rows_of_each_field(start: int, stop: int, step: int, picks: list[int]) -> None:
    batch = replay().sample_all()  # 6 rows
    for key, expected in ((slice(start, stop, step), torch.arange(6)[start:stop:step]),
                          (picks, torch.tensor(picks, dtype=torch.int64) % 6)):
        rows = batch[key]
        assert rows.reward.tolist() == batch.reward[expected].tolist()
        assert rows.index.tolist() == batch.index[expected].tolist()
        assert rows.extras["cost"].tolist() == (-batch.reward[expected]).tolist()
        assert rows[:] == rows


PROTOCOLS: dict[str, Callable[[Any], Any]] = {
    "len": len, "bool": bool, "iter": iter, "next": next, "[0]": lambda o: o[0], "['obs']": lambda o: o["obs"],
    "in": lambda o: 0 in o, "reversed": reversed, "np.asarray": np.asarray, "copy": copy.copy,
    "pickle": pickle.dumps,
}
OWNERS: dict[str, Callable[[], Any]] = {**BUFFERS, "MixedReplay": lambda: MixedReplay(replay(), replay(), seed=0),
                                        **BATCHES}


@pytest.mark.parametrize("kind", OWNERS)
def test_every_protocol_works_or_is_refused_by_rlbuf_never_by_a_bare_python_error(kind: str) -> None:
    """The inventory of Python's protocols: what works, and what raises rlbuf's refusal naming the call to use."""
    refused = {"iter", "next", "[0]", "['obs']", "in", "reversed", "np.asarray"}
    if kind == "DistillationBatch":
        refused.remove("iter")  # obs, expert_action = batch
    if kind == "MixedReplay":
        refused.add("len")
    copies_refused = kind.endswith(("Buffer", "Replay"))
    for name, call in PROTOCOLS.items():
        owner = OWNERS[kind]()
        if name in refused or (copies_refused and name in ("copy", "pickle")):
            expected = NotPicklableError if name in ("copy", "pickle") else UnsupportedOperationError
            with pytest.raises(expected, match=rf"{kind}\b"):
                call(owner)
        else:
            call(owner)


@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy, pickle.dumps, lambda it: torch.save(it, io.BytesIO())],
                         ids=["copy", "deepcopy", "pickle", "torch.save"])
def test_copies_of_an_epoch_iterator_are_refused_naming_its_state_dict(copier: Callable[[Any], Any]) -> None:
    """Before, ``copy.copy`` made an iterator drawing from its original's generator, ``copy.deepcopy`` raised
    "cannot pickle '_thread.RLock' object" and ``pickle`` an ``AttributeError`` about a local lambda."""
    buf = replay()
    it = buf.epochs(batch_size=2)
    first = next(it)
    before = snapshot(buf)
    with pytest.raises(NotPicklableError, match=r"^EpochIterator: cannot be pickled or copied .*it\.state_dict\(\) "
                                                r"holds its place .*it\.load_state_dict\(state\)"):
        copier(it)
    assert same(snapshot(buf), before) and len(first) == 2 and len(it) == 2
    resumed = buf.epochs(batch_size=2)  # the way the message names
    resumed.load_state_dict(it.state_dict())
    assert [b.index.tolist() for b in resumed] == [b.index.tolist() for b in it]


@pytest.mark.parametrize("kind", BATCHES)
def test_a_batch_prints_each_field_shape_and_dtype_never_its_values(kind: str) -> None:
    batch = BATCHES[kind]()
    shown = repr(batch)
    assert shown.startswith(f"{type(batch).__name__}(device=cpu, obs=[") and "tensor(" not in shown
    for name, value in vars_of(batch).items():
        if isinstance(value, torch.Tensor) and name != "extras":
            assert f"{name}={list(value.shape)} {str(value.dtype).removeprefix('torch.')}" in shown


def test_a_batch_of_some_fields_has_a_len_a_truth_and_a_repr() -> None:
    """``sample_by_index(..., fields=[...])`` without ``obs``: ``len``, ``bool`` and ``repr`` read the fields it
    holds (each raised ``AttributeError`` for ``obs`` before, so printing one crashed)."""
    buf = replay()
    only = buf.sample_by_index([3, 1, 3], fields=["reward", "cost"])
    assert (len(only), bool(only)) == (3, True)
    assert repr(only) == "ReplayBatch(device=cpu, reward=[3] float32, extras.cost=[3] float32)"
    assert len(buf.sample_by_index([2], fields=["cost"])) == 1
    assert only[[2, 0]].reward.tolist() == [3.0, 3.0] and len(only[only.reward > 2]) == 2  # rows, checked by len
    with pytest.raises(StoredIndexError, match=r"row 3 is outside the batch's 3 rows"):
        only[[0, 3]]
