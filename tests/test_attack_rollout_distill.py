"""Helper 102's attack on RolloutBuffer and DistillationBuffer: forged states that rlbuf would not have written,
and every way rows enter a distillation ring against a plain reference."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _snapshot import same, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from rlbuf import CheckpointError, DistillationBuffer, RolloutBuffer

T, N = 3, 2


def _rollout(reward: float = 1.0) -> RolloutBuffer:
    buffer = RolloutBuffer(T, N, obs_shape=(2,), action_shape=(), seed=0)
    for t in range(T):
        buffer.add(torch.full((N, 2), float(t)), torch.zeros(N), torch.full((N,), reward), torch.tensor([t == 1, False]),
                   torch.zeros(N), torch.zeros(N), truncated=False)
    buffer.compute_returns_and_advantages(torch.zeros(N))
    return buffer


def _sampled_state() -> dict[str, Any]:
    """A rollout whose TorchRL sampler (``buffer.torchrl.sample``) is part-way through an epoch: its genuine state."""
    source = _rollout()
    source.torchrl.sample(2)
    return source.state_dict()


# -- the TorchRL sampler's state in a rollout's checkpoint -----------------------------------------
@pytest.mark.parametrize(("sampler", "match"), [
    ({"_sample_list": torch.tensor([99, 1000, 5, 3])}, r"_sample_list: expected distinct rows in \[0, 6\)"),
    ({"_sample_list": torch.tensor([-5, 2])}, r"_sample_list: expected distinct rows in \[0, 6\)"),
    ({"_sample_list": torch.tensor([0, 0, 0, 0])}, r"_sample_list: expected distinct rows in \[0, 6\)"),
    ({"_sample_list": torch.tensor([1.5, 2.0])}, r"_sample_list: expected distinct rows in \[0, 6\)"),
    ({"_sample_list": torch.tensor([[1, 2]])}, r"_sample_list: expected distinct rows in \[0, 6\)"),
    ({"_sample_list": [1, 2]}, r"_sample_list: expected distinct rows in \[0, 6\)"),
    ({"len_storage": 99}, r"len_storage: expected an int in \[0, 6\] \(the rows stored\), got 99"),
    ({"len_storage": -1}, r"len_storage: expected an int in \[0, 6\]"),
    ({"len_storage": 6.0}, r"len_storage: expected an int in \[0, 6\]"),
    ({"len_storage": 0}, r"_sample_list: expected distinct rows in \[0, 0\)"),
    ({"drop_last": "x"}, "drop_last is 'x', this buffer's is False"),
    ({"drop_last": True}, "drop_last is True, this buffer's is False"),
    ({"_ran_out": 7}, "_ran_out: expected True or False, got 7"),
])
def test_a_forged_torchrl_sampler_state_in_a_rollout_is_refused(sampler: dict[str, Any], match: str) -> None:
    # It loaded: buffer.torchrl.sample then raised IndexError (row 99), handed row -5 (row 1 by negative indexing)
    # or one row four times in an epoch "without replacement".
    state = _sampled_state()
    state["sampler"] = {**state["sampler"], **sampler}
    target = _rollout(reward=7.0)
    before = snapshot(target)
    with pytest.raises(CheckpointError, match=f"sampler state: {match}"):
        target.load_state_dict(state)
    assert same(snapshot(target), before)


def test_every_sampler_state_a_rollout_writes_loads_and_samples_on_exactly() -> None:
    # Pins down what the check above must keep taking: each state of the sampler across two epochs, a partial
    # rollout's (a list of the rows stored then) and a cleared one's.
    source = _rollout()
    states = [source.state_dict()]
    for _ in range(4):
        source.torchrl.sample(4)
        states.append(source.state_dict())
    partial = RolloutBuffer(T, N, obs_shape=(2,), action_shape=(), seed=0)
    partial.add(torch.zeros(N, 2), torch.zeros(N), torch.ones(N), torch.tensor([False, False]), torch.zeros(N),
                torch.zeros(N), truncated=False)
    partial.torchrl.sample(1)
    states.append(partial.state_dict())
    source.clear()
    states.append(source.state_dict())
    for state in states:
        target = _rollout(reward=7.0)
        target.load_state_dict(state)
        assert target.state_dict()["sampler"]["len_storage"] == state["sampler"]["len_storage"]
        if len(target):
            reference = RolloutBuffer(T, N, obs_shape=(2,), action_shape=(), seed=0)
            reference.load_state_dict(state)
            assert torch.equal(target.torchrl.sample(1)["observation"], reference.torchrl.sample(1)["observation"])


@pytest.mark.parametrize("sampler", [3, [1], None, "x"])
def test_a_sampler_state_that_is_no_table_is_refused(sampler: Any) -> None:
    # TorchRL's RandomSampler loads any value, holding nothing: a DistillationBuffer's checkpoint with sampler 3
    # loaded, a state rlbuf never writes.
    source = DistillationBuffer(8, obs_shape=(2,), action_shape=(), seed=0)
    source.add(torch.zeros(3, 2), torch.zeros(3))
    state = {**source.state_dict(), "sampler": sampler}
    target = DistillationBuffer(8, obs_shape=(2,), action_shape=(), seed=0)
    target.add(torch.ones(5, 2), torch.ones(5))
    before = snapshot(target)
    with pytest.raises(CheckpointError, match="sampler state: expected the table a sampler writes"):
        target.load_state_dict(state)
    assert same(snapshot(target), before)


# -- DistillationBuffer: every way in, against a plain list -----------------------------------------
@settings(max_examples=25, deadline=None, derandomize=True)
@given(capacity=st.integers(1, 9), envs=st.integers(1, 9), data=st.data())
def test_distillation_rows_of_every_way_in_keep_the_newest_capacity_rows_in_order(capacity: int, envs: int,
                                                                                 data: st.DataObject) -> None:
    # Pins down the ring against a list: adds of num_envs rows (the staged path), of other sizes, of one row
    # without a batch dim, of none, and extends, each larger than the ring too, keep exactly the newest rows.
    envs = min(envs, capacity)
    buffer = DistillationBuffer(capacity, obs_shape=(2,), action_shape=(), action_dtype=torch.int64, num_envs=envs,
                                seed=0, extra_fields={"logit": ((), torch.float32)})
    reference: list[int] = []
    counter = 0
    for how, rows in data.draw(st.lists(st.tuples(st.sampled_from(["add", "extend", "one"]), st.sampled_from(
            [0, 1, envs, capacity, capacity + 1, 2 * capacity + 3])), min_size=1, max_size=6)):
        values = torch.arange(counter, counter + rows)
        counter += rows
        obs = torch.stack([values, -values], dim=1).float()
        if how == "add":
            buffer.add(obs, values, logit=values.float())
        elif how == "extend":
            buffer.extend(TensorDict({"observation": obs, "expert_action": values, "logit": values.float()},
                                     batch_size=[rows]))
        else:
            for value in values.tolist():
                buffer.add(torch.tensor([value, -value]).float(), value, logit=float(value))
        reference = (reference + values.tolist())[-capacity:]
    ring = buffer._ring
    rows_now = ring.gather(ring.chronological_index())
    assert rows_now["expert_action"].tolist() == reference
    assert rows_now["obs"].tolist() == [[float(v), -float(v)] for v in reference]
    assert rows_now["logit"].tolist() == [float(v) for v in reference]
    assert ring.write_count == counter and ring.cursor == counter % capacity


@pytest.mark.parametrize(("path", "value", "match"), [
    (("spec", 0, "finite"), torch.zeros(3), "differ from this buffer's"),
    (("spec", 0, "finite"), 0, "differ from this buffer's"),
    (("spec", 2, "finite"), 1, "differ from this buffer's"),
    (("capacity",), torch.zeros(3), "capacity tensor"),
    (("capacity",), 6.0, "capacity 6.0, this buffer's is 6"),
])
def test_spec_and_capacity_are_compared_value_and_type_as_rlbuf_writes_them(path: tuple[Any, ...], value: Any,
                                                                             match: str) -> None:
    # A tensor there raised torch's "Boolean value of Tensor with more than one value is ambiguous" out of
    # load_state_dict (no CheckpointError); finite 0 and 1 loaded for False and True, 6.0 for the capacity 6.
    state = _rollout().state_dict()
    part = state
    for key in path[:-1]:
        part = part[key]
    part[path[-1]] = value
    target = _rollout(reward=7.0)
    before = snapshot(target)
    with pytest.raises(CheckpointError, match=match):
        target.load_state_dict(state)
    assert same(snapshot(target), before)
