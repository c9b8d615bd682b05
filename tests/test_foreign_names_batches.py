"""Batches and ``Transition`` read or built with other libraries' habits (TorchRL's and ObjectRL's
``batch["obs"]``, SB3's field names, d3rlpy's ``state``, numpy conversion), each answered with rlbuf's own
names and fix.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from _foreign import F, Z, _mixed, _with_advantages, distill, filled, replay

from rlbuf import (
    MissingFieldError,
    Transition,
    UnsupportedOperationError,
)


def _sequence_batch() -> Any:
    buf = _with_advantages()
    return next(iter(buf.minibatches(num_minibatches=1, sequences=True, shuffle=False)))


def _distill_batch() -> Any:
    return filled(distill).sample(2)


BATCHES: list[tuple[Callable[[], Any], str]] = [
    (lambda: filled(replay).sample(2), "ReplayBatch"),
    (lambda: filled(replay).sample_sequences(2, 1), "ReplaySequenceBatch"),
    (lambda: _mixed().sample(2), "MixedBatch"),
    (lambda: _with_advantages().get_all_data(), "RolloutBatch"),
    (_sequence_batch, "SequenceBatch"),
    (_distill_batch, "DistillationBatch"),
]


@pytest.mark.parametrize(("make", "kind"), BATCHES, ids=[kind for _, kind in BATCHES])
def test_a_batch_read_by_key_names_the_attribute_and_torchrls_key(make: Callable[[], Any], kind: str) -> None:
    """TorchRL's and ObjectRL's ``batch["obs"]``: Python's bare "'RolloutBatch' object is not subscriptable", and
    ``mb.keys()`` an unrelated message about sample_by_index (helper 75). Also a ``TypeError``, as Python's."""
    batch = make()
    assert type(batch).__name__ == kind
    with pytest.raises(UnsupportedOperationError, match=rf"^{kind}\['obs'\]: a batch is read by attribute, not by "
                                                        r"key: batch\.obs \(TorchRL's keys: "
                                                        r"batch\.to_tensordict\(\)\['observation'\]\)$"):
        batch["obs"]
    with pytest.raises(TypeError, match=r"^\w+\['observation'\]: .*: batch\.obs "):
        batch["observation"]
    with pytest.raises(TypeError, match=r"\[0\]: an int index would drop the batch dim .*batch\[0:1\] is a batch "
                                        r"of that one row, batch\.obs\[0\] one field of it$"):
        batch[0]  # an UnsupportedOperationError, a TypeError as Python's; rows: batch[0:1] (tests/test_protocols.py)
    with pytest.raises(AttributeError, match=rf"^{kind} has no keys\(\): .*batch\.to_tensordict\(\)\.keys\(\)"):
        batch.keys()
    if kind == "DistillationBatch":
        obs, _ = batch  # unpacks as before
        assert obs is batch.obs
    else:
        with pytest.raises(TypeError, match=r"^iter\(\w+\): a batch is read by attribute"):  # not by __getitem__
            iter(batch)
    assert set(batch.to_tensordict().keys(True, True)) >= {"observation"}


@pytest.mark.parametrize(("make", "key", "message"), [
    (lambda: _with_advantages().get_all_data(), "logprobs", r"batch\.log_prob \(TorchRL's keys: batch\.to_tensordict"
                                                            r"\(\)\['sample_log_prob'\]\)$"),
    (lambda: _with_advantages().get_all_data(), "advantages", r"batch\.advantage \(.*\['advantage'\]\)$"),
    (lambda: _with_advantages().get_all_data(), "returns", r"batch\.returns \(.*\['value_target'\]\)$"),
    (lambda: _with_advantages().get_all_data(), "done", r"batch\.terminated \| batch\.truncated \(.*\('next', 'done'\)"),
    (lambda: filled(replay).sample(2), ("next", "reward"), r"batch\.reward \(.*\[\('next', 'reward'\)\]\)$"),
    (lambda: filled(replay).sample(2), "dones", r"batch\.terminated \(the bootstrap mask.*\('next', 'terminated'\)"),
    (lambda: filled(replay).sample(2), "action", r"batch\.action \(TorchRL's keys: batch\.to_tensordict\(\)\['action'\]"),
    (_distill_batch, "actions", r"batch\.expert_action \(.*\['expert_action'\]\)$"),
])
def test_a_foreign_or_torchrl_key_names_rlbufs_attribute(make: Callable[[], Any], key: Any, message: str) -> None:
    with pytest.raises(UnsupportedOperationError, match=message):
        make()[key]


@pytest.mark.parametrize(("make", "kind"), BATCHES, ids=[kind for _, kind in BATCHES])
def test_the_torchrl_keys_a_refusal_names_are_the_keys_to_tensordict_writes(make: Callable[[], Any], kind: str) -> None:
    """``batch[key]``'s hint table (``rlbuf.batches._TORCHRL_KEYS``) repeats the keys each ``to_tensordict`` writes
    inline: every field a batch holds that the table names must be at that key."""
    from rlbuf.batches import _TORCHRL_KEYS

    batch = make()
    keys = set(batch.to_tensordict().keys(True, True))
    held = [name for name in _TORCHRL_KEYS if getattr(batch, name, None) is not None
            and name in type(batch).__dataclass_fields__]
    assert held, kind
    assert {name: _TORCHRL_KEYS[name] for name in held if _TORCHRL_KEYS[name] not in keys} == {}


@pytest.mark.parametrize(("keywords", "message"), [
    ({"state": Z, "next_state": Z}, r"^Transition: got state=, which it does not take; rlbuf's name is obs"),
    ({"observation": Z, "next_observation": Z}, r"^Transition: got observation=, .*rlbuf's name is obs"),
    ({"obs": Z, "next_state": Z}, r"^Transition: got next_state=, .*rlbuf's name is next_obs"),
    ({"obs": Z, "next_obs": Z, "done": F}, r"^Transition: got done=, .*pass terminated= and truncated= instead"),
    ({"obs": Z, "next_obs": Z, "dones": F}, r"^Transition: got dones=, .*pass terminated= and truncated= instead"),
    ({"obs": Z, "next_obs": Z, "terminated": F, "infos": {}}, r"^Transition: got infos=, .*rlbuf\.gym\.Recorder"),
    ({"obs": Z, "next_obs": Z, "terminated": F, "cost": Z},
     r"^Transition: got cost=, which it does not take; its fields are obs, action, reward, next_obs, terminated, "
     r"truncated, extras \(an extra field goes in extras=\{'cost': \.\.\.\}\)$"),
])
def test_a_transition_built_with_another_librarys_names_gets_rlbufs(keywords: dict[str, Any], message: str) -> None:
    """d3rlpy's/CleanRL's ``state``/``next_state``/``done`` (or an extra field by keyword): Python's bare
    "__new__() got an unexpected keyword argument" named no fix. Also a ``TypeError``, as Python's."""
    given = {"action": torch.zeros(2), "reward": torch.zeros(2), "terminated": F, **keywords}
    with pytest.raises(MissingFieldError, match=message):
        Transition(**given)
    with pytest.raises(TypeError, match=message):
        Transition(**given)


def test_a_transition_built_with_rlbufs_names_works_as_a_named_tuple() -> None:
    step = Transition(obs=Z, action=torch.zeros(2), reward=torch.zeros(2), next_obs=Z, terminated=F, truncated=F)
    assert step._fields == ("obs", "action", "reward", "next_obs", "terminated", "truncated", "extras")
    assert step.extras is None and step._replace(truncated=None).truncated is None
    assert pickle.loads(pickle.dumps(step))._asdict().keys() == step._asdict().keys()
    buf = replay()
    buf.add(step)
    assert len(buf) == 2


def test_a_transition_shows_its_fields_signature_at_run_time() -> None:
    """The keyword check (``Transition.__new__(*args, **kwargs)``) left ``inspect.signature``, hence ``help()`` and
    a notebook's call hints, showing ``(*args, **kwargs)``; they show the fields, with their defaults."""
    import inspect

    parameters = inspect.signature(Transition).parameters
    assert list(parameters) == ["obs", "action", "reward", "next_obs", "terminated", "truncated", "extras"]
    assert parameters["truncated"].default is None and parameters["extras"].default is None
    assert parameters["obs"].default is inspect.Parameter.empty


@pytest.mark.parametrize(("make", "keywords", "message"), [
    (lambda: filled(replay).sample(2), {"observations": Z}, r"^ReplayBatch: got observations=, .*rlbuf's name is obs"),
    (lambda: filled(replay).sample(2), {"dones": F}, r"^ReplayBatch: got dones=, .*rlbuf's name is terminated"),
    (lambda: filled(replay).sample(2), {"weights": F}, r"^ReplayBatch: got weights=, .*rlbuf's name is weight$"),
    (lambda: filled(replay).sample(2), {"cost": F}, r"^ReplayBatch: got cost=, which it does not take; its fields "
                                                    r"are obs, action, reward, .*, index, weight, discount, extras"),
    (lambda: _with_advantages().get_all_data(), {"old_log_prob": Z}, r"^RolloutBatch: got old_log_prob=, .*log_prob"),
    (_distill_batch, {"actions": Z}, r"^DistillationBatch: got actions=, .*rlbuf's name is expert_action"),
])
def test_a_batch_built_with_another_librarys_names_gets_rlbufs(make: Callable[[], Any], keywords: dict[str, Any],
                                                                 message: str) -> None:
    """SB3's ``ReplayBufferSamples(observations=...)`` habit on rlbuf's batch classes (e.g. a test's own batch)."""
    batch = make()
    with pytest.raises(MissingFieldError, match=message):
        type(batch)(**keywords)
    fields = {name: getattr(batch, name) for name in batch.__dataclass_fields__}
    assert type(batch)(**fields).obs is batch.obs  # rlbuf's names build it as before


@pytest.mark.parametrize(("make", "kind"), BATCHES, ids=[kind for _, kind in BATCHES])
def test_numpy_holds_batches_as_objects_and_refuses_to_read_one_as_an_array(make: Callable[[], Any], kind: str) -> None:
    """A batch has ``__len__`` and ``__getitem__``, so numpy took it for a sequence: ``np.asarray(batch)`` raised
    "Could not convert object to sequence" (a DistillationBatch, which unpacks: "inhomogeneous shape"), and
    ``np.array([batch, batch], dtype=object)`` (a list of batches kept by a logger) raised too."""
    batch = make()
    message = rf"^np\.asarray\({kind}\): a batch is no array .*: np\.asarray\(batch\.obs\.cpu\(\)\) .*batch\.to_tensordict\(\)"
    for convert in (np.asarray, np.array, lambda b: np.array([b, b]), lambda b: np.asarray(b, dtype=np.float32)):
        with pytest.raises(UnsupportedOperationError, match=message):
            convert(batch)
    with pytest.raises(TypeError, match=message):
        np.asarray(batch)
    held = np.array([batch, batch], dtype=object)
    assert held.shape == (2,) and held[0] is batch and held[1] is batch
    one = np.asarray(batch, dtype=object)
    assert one.shape == () and one[()] is batch
    assert np.asarray(batch.obs).shape == tuple(batch.obs.shape)  # the fix the message names
