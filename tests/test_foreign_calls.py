"""Other libraries' calls and attributes on a buffer, as their users write them (SB3's ``rb.size()``, ``rb.pos``,
``rb.buffer_size``; TorchRL's ``rb.sample()`` without a size, ``rb.storage``, a collector's batch with ``done``
only): each answered with rlbuf's equivalent, never a bare ``TypeError`` or ``AttributeError``, and changing
nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from _snapshot import same, snapshot
from tensordict import TensorDict

from rlbuf import (
    DistillationBuffer,
    MissingFieldError,
    ReplayBuffer,
    RolloutBuffer,
    UnsupportedOperationError,
)

F = torch.zeros(2, dtype=torch.bool)


def replay() -> ReplayBuffer:
    buf = ReplayBuffer(8, obs_shape=(3,), action_shape=(), num_envs=2, seed=0)
    buf.add(torch.zeros(2, 3), torch.zeros(2), torch.ones(2), torch.ones(2, 3), F, truncated=F)
    return buf


def rollout() -> RolloutBuffer:
    buf = RolloutBuffer(2, 2, obs_shape=(3,), action_shape=(), seed=0)
    buf.add(torch.zeros(2, 3), torch.zeros(2), torch.ones(2), F, torch.zeros(2), torch.zeros(2), truncated=F)
    return buf


def distill() -> DistillationBuffer:
    buf = DistillationBuffer(8, obs_shape=(3,), action_shape=(), num_envs=2, seed=0)
    buf.add(torch.zeros(2, 3), torch.zeros(2))
    return buf


@pytest.mark.parametrize("make", [replay, rollout, distill])
def test_sb3s_size_call_is_refused_with_what_it_counted(make: Callable[[], Any]) -> None:
    buf = make()
    assert buf.size == len(buf) == 2 and isinstance(buf.size, int) and buf.size + 1 == 3
    with pytest.raises(UnsupportedOperationError, match=r"^buffer\.size\(\): size is a property, the rows stored "
                                                        r"\(len\(buffer\)\), not a method; SB3's size\(\) counted "
                                                        r"steps per env: len\(buffer\) // buffer\.num_envs$"):
        buf.size()
    assert len(buf) // buf.num_envs == 1  # SB3's size() of this buffer


@pytest.mark.parametrize(("make", "name", "message"), [
    (replay, "pos", r"; rlbuf keeps its write position to itself: len\(buffer\) rows are stored, and buffer\.is_full .*SB3's pos"),
    (replay, "buffer_size", r"; buffer\.capacity, in rows \(SB3's buffer_size counts steps per env: capacity = "
                            r"buffer_size \* n_envs\)$"),
    (replay, "n_envs", r"; buffer\.num_envs$"),
    (replay, "observations", r"; buffer\.sample_all\(\)\.obs holds every stored row's, oldest first \(SB3's "
                             r"observations array\)$"),
    (replay, "dones", r"; buffer\.sample_all\(\)\.done holds"),
    (replay, "batch_size", r"; sample\(batch_size\) takes it with each call"),
    (replay, "storage", r"; storage is TorchRL's ReplayBuffer's; rlbuf's buffer wraps one: buffer\.torchrl is the "
                        r"TensorDictReplayBuffer over the same storage$"),
    (replay, "append_transform", r"; append_transform is TorchRL's ReplayBuffer's; .*buffer\.torchrl"),
    (replay, "update_tensordict_priority", r"; .*buffer\.torchrl"),
    (rollout, "pos", r"; buffer\.steps counts the steps stored \(SB3's pos\)"),
    (rollout, "buffer_size", r"; buffer\.num_steps \(steps per env, SB3's buffer_size\)"),
    (rollout, "generator_ready", r"; minibatches\(batch_size=\.\.\.\) needs no flag"),
    (rollout, "observations", r"; buffer\.view\('obs'\) is the \[num_steps, num_envs, \.\.\.\] tensor"),
    (distill, "actions", r"; buffer\.sample_all\(\)\.expert_action holds every stored row's"),
    (distill, "rewards", r"; a DistillationBuffer stores obs and expert_action only"),
])
def test_another_librarys_attribute_names_rlbufs(make: Callable[[], Any], name: str, message: str) -> None:
    buf = make()
    with pytest.raises(AttributeError, match=rf"^'{type(buf).__name__}' object has no attribute '{name}'{message}"):
        getattr(buf, name)
    assert not hasattr(buf, "_private_name_no_library_has")


def test_the_attributes_named_exist() -> None:
    buf, steps = replay(), rollout()
    assert buf.capacity == 8 and buf.num_envs == 2 and not buf.is_full and buf.sample_all().done.shape == (2,)
    assert steps.steps == 1 and steps.num_steps == 2 and buf.torchrl.storage is not None


@pytest.mark.parametrize(("call", "message"), [
    (lambda buf: buf.sample(), r"^sample: batch_size required: sample\(batch_size\) draws batch_size rows \(TorchRL's "
                               r"buffers take batch_size when built, and sample\(\) then draws that many\)$"),
    (lambda buf: buf.sample_sequences(2), r"^sample_sequences: length required: sample_sequences\(batch_size, length\)$"),
    (lambda buf: buf.sample_sequences(), r"^sample_sequences: batch_size, length required"),
    (lambda buf: buf.epochs(), r"^epochs: batch_size required: epochs\(batch_size=\.\.\.\) for batches"),
    (lambda buf: buf.epochs(n_epochs=2), r"^epochs: batch_size required"),
])
def test_a_call_without_its_size_names_it_and_changes_nothing(call: Callable[[Any], Any], message: str) -> None:
    buf = replay()
    before = snapshot(buf)
    with pytest.raises(MissingFieldError, match=message) as error:
        call(buf)
    assert isinstance(error.value, TypeError)  # as Python's "missing 1 required positional argument"
    assert same(snapshot(buf), before)
    assert len(buf.sample(batch_size=3)) == 3  # by keyword too


def test_compute_returns_without_last_value_names_it() -> None:
    buf = rollout()
    buf.add(torch.zeros(2, 3), torch.zeros(2), torch.ones(2), F, torch.zeros(2), torch.zeros(2), truncated=F)
    before = snapshot(buf)
    with pytest.raises(MissingFieldError, match=r"^compute_returns_and_advantages: last_value required: last_value is "
                                                r"V of the observation after the last step, \[num_envs\] \(SB3's "
                                                r"last_values; CleanRL's next_value\)$"):
        buf.compute_returns_and_advantages(gamma=0.9)
    assert same(snapshot(buf), before)


def _collector_batch(**flags: torch.Tensor) -> TensorDict:
    return TensorDict({"observation": torch.zeros(3, 3), "action": torch.zeros(3),
                       ("next", "observation"): torch.ones(3, 3), ("next", "reward"): torch.ones(3, 1),
                       **{("next", name): value.view(3, 1) for name, value in flags.items()}}, batch_size=[3])


def test_a_collector_batch_with_done_alone_is_refused_with_why() -> None:
    buf = replay()
    before = snapshot(buf)
    with pytest.raises(MissingFieldError, match=r"^terminated: key \('next', 'terminated'\) not found .*\('next', "
                                                r"'done'\) alone does not tell a time limit from a termination"):
        buf.extend(_collector_batch(done=torch.tensor([True, False, False])))
    assert same(snapshot(buf), before)


def test_a_collector_batch_without_truncated_takes_done_and_not_terminated_as_truncated() -> None:
    buf = ReplayBuffer(8, obs_shape=(3,), action_shape=(), seed=0)
    buf.extend(_collector_batch(done=torch.tensor([True, False, True]), terminated=torch.tensor([False, False, True])))
    batch = buf.sample_all()
    assert batch.truncated.tolist() == [True, False, False] and batch.terminated.tolist() == [False, False, True]
