"""Helper 45's attack on rollout extras, GAE normalisation, statistics resets and saved iterators: each hole
found, refused now, the state unchanged by the refusal."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from _snapshot import same, snapshot

from rlbuf import CheckpointError, EpisodeStats, MissingFieldError, NonFiniteError, RolloutBuffer
from rlbuf.errors import DtypeError, OutOfRangeError, ShapeError

T, N = 3, 2


def _rollout(reward: float = 1.0) -> RolloutBuffer:
    buf = RolloutBuffer(T, N, obs_shape=(2,), action_shape=(), seed=0)
    for t in range(T):
        buf.add(torch.full((N, 2), float(t)), torch.zeros(N), torch.full((N,), reward), torch.tensor([t == 1, False]),
                torch.zeros(N), torch.zeros(N), truncated=False)
    return buf


def test_set_extras_stores_values_not_a_node_of_the_callers_graph() -> None:
    # The stored advantage joined the caller's graph: every later minibatch carried grad into its network.
    weight = torch.ones((), requires_grad=True)
    buf = _rollout()
    buf.set_extras({"advantage": torch.ones(T, N) * weight, "returns": torch.ones(T, N),
                    "old_logits": torch.ones(T, N, 3) * weight})
    batch = next(iter(buf.minibatches(batch_size=4)))
    assert not batch.advantage.requires_grad and not batch.old_logits.requires_grad
    assert not buf.view("advantage").requires_grad


@pytest.mark.parametrize("name", ["mask", "hidden_state", "env", "start", "privileged_obs"])
def test_set_extras_refuses_a_name_a_batch_attribute_would_hide(name: str) -> None:
    buf = _rollout()
    before = snapshot(buf)
    with pytest.raises(MissingFieldError, match=rf"set_extras: '{name}' is not a usable name"):
        buf.set_extras({name: torch.zeros(T, N)})
    assert same(snapshot(buf), before)


def test_normalizing_by_a_spread_beyond_float32_is_refused_not_zeros() -> None:
    buf = RolloutBuffer(1, 2, obs_shape=(1,), action_shape=())
    buf.add(torch.zeros(2, 1), torch.zeros(2), torch.tensor([3e38, -3e38]), torch.tensor([True, True]),
            torch.zeros(2), torch.zeros(2), truncated=False)
    with pytest.raises(NonFiniteError, match="advantage: normalizing gave NaN or inf"):
        buf.compute_returns_and_advantages(torch.zeros(2), gamma=0.0, normalize_advantages=True)
    assert not buf.advantages_ready


@pytest.mark.parametrize(("envs", "error", "message"), [
    ([3], OutOfRangeError, r"envs: expected env numbers in \[0, 3\), got 3"),
    ([-1], OutOfRangeError, r"got -1"),
    ([1.7], DtypeError, r"envs: expected env numbers \(ints, one dim\) or a \[3\] bool mask"),
    ([True], ShapeError, r"envs: a mask must hold one bool per env, shape \(3,\)"),
    ("1", DtypeError, r"envs:"),
])
def test_episode_stats_reset_refuses_what_is_no_env(envs: Any, error: type[Exception], message: str) -> None:
    # A done mask read as numbers reset envs 0 and 1 for [True, False, False]; -1 reset the last env.
    stats = EpisodeStats(3)
    stats.update(np.ones(3), np.zeros(3, bool))
    before = snapshot(stats)
    with pytest.raises(error, match=message):
        stats.reset(envs)
    assert same(snapshot(stats), before)
    stats.reset(torch.tensor([True, False, False]))  # a mask: env 0 only
    stats.update(np.ones(3), np.ones(3, bool))
    assert stats.recent_returns() == [1.0, 2.0, 2.0]
    stats.reset([])


@pytest.mark.parametrize(("change", "message"), [
    (lambda it: it["arguments"].__setitem__("sequences", 1), "iterator argument sequences=1, not True or False"),
    (lambda it: it["arguments"].__setitem__("batch_size", 10**13), "BatchSizeError: batch_size: 10000000000000 rows"),
])
def test_a_saved_iterator_its_method_would_refuse_is_refused_before_the_rows_load(change: Any, message: str) -> None:
    # The load copied the rows, then failed remaking the iterator: the buffer held the checkpoint's rows.
    source = _rollout()
    source.compute_returns_and_advantages(torch.zeros(N))
    source.minibatches(batch_size=4, n_epochs=0)
    state = source.state_dict()
    change(state["iterator"])
    target = _rollout(reward=5.0)
    before = snapshot(target)
    with pytest.raises(CheckpointError, match=message):
        target.load_state_dict(state)
    assert same(snapshot(target), before)


@pytest.mark.parametrize("forge", [lambda t: t.to(torch.bfloat16), lambda t: t.clone().requires_grad_(True)])
def test_attached_extras_set_extras_would_refuse_are_refused_in_a_checkpoint(forge: Any) -> None:
    # Loaded, a bfloat16 extra went into every batch, and one requiring grad made state_dict() fail after.
    source = _rollout()
    source.set_extras({"old_logits": torch.zeros(T, N, 3)})
    state = source.state_dict()
    state["extra"]["attached"]["old_logits"] = forge(state["extra"]["attached"]["old_logits"])
    target = _rollout(reward=5.0)
    before = snapshot(target)
    with pytest.raises(CheckpointError, match=r"attached extra 'old_logits' is .*, not stored values"):
        target.load_state_dict(state)
    assert same(snapshot(target), before)


def test_an_unshuffled_iterator_saved_with_a_shuffled_order_is_refused() -> None:
    # epochs(shuffle=False) only ever saves the storage order: another one loaded and was followed (helper 45).
    from rlbuf import DistillationBuffer

    source = DistillationBuffer(10, obs_shape=(2,), action_shape=(), action_dtype=torch.int64, seed=0)
    source.add(torch.zeros(7, 2), torch.arange(7))
    iterator = source.epochs(batch_size=3, n_epochs=2, shuffle=False)
    next(iterator)
    state = source.state_dict()
    assert torch.equal(state["iterator"]["state"]["permutation"], torch.arange(7))
    state["iterator"]["state"]["permutation"] = torch.tensor([6, 5, 4, 3, 2, 1, 0])
    with pytest.raises(CheckpointError, match="permutation: an iterator without shuffle runs in storage order"):
        DistillationBuffer(10, obs_shape=(2,), action_shape=(), action_dtype=torch.int64).load_state_dict(state)


def test_set_extras_takes_a_tensordict_as_it_takes_a_dict() -> None:
    """A TorchRL user's ``set_extras(td)`` (a TensorDict is a Mapping, iterated along its batch dim): Python's
    bare "unhashable type: 'TensorDict'". Its keys are the names, as a dict's."""
    from tensordict import TensorDict

    by_td, by_dict = _rollout(), _rollout()
    values = {"advantage": torch.ones(T, N), "returns": torch.full((T, N), 2.0), "old_logits": torch.rand(T, N, 3)}
    by_td.set_extras(TensorDict(values, batch_size=[T, N]))
    by_dict.set_extras(values)
    td_batch, dict_batch = by_td.get_all_data(), by_dict.get_all_data()
    for name in ("advantage", "returns", "old_logits"):
        assert torch.equal(getattr(td_batch, name), getattr(dict_batch, name)), name
    nested = TensorDict({"aux": {"logits": torch.zeros(T, N, 3)}}, batch_size=[T, N])
    before = snapshot(by_td)
    with pytest.raises(ShapeError, match=r"^aux: expected a tensor, got TensorDict"):
        by_td.set_extras(nested)
    assert same(before, snapshot(by_td))
