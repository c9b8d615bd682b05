"""``sample_by_index`` gives a prioritized buffer's rows the importance weights ``sample`` gives them
(Tianshou's ``PrioritizedReplayBuffer`` does the same); a uniform buffer's weights stay all ones."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlbuf import ReplayBuffer
from rlbuf.errors import StoredIndexError


def _filled(capacity: int, adds: int, *, alpha: float, beta: float, compact: bool = False) -> ReplayBuffer:
    buf = ReplayBuffer(capacity, obs_shape=(2,), action_shape=(), prioritized=True, alpha=alpha, beta=beta, seed=0,
                       compact=compact)
    for i in range(adds):
        buf.add(torch.full((2,), float(i)), 0.0, float(i), torch.full((2,), float(i + 1)), False, False)
    return buf


def _reference(priorities: dict[int, float], index: list[int], *, alpha: float, beta: float, eps: float) -> list[float]:
    """Plain ``(q_i / min_j q_j) ** -beta`` with ``q = (p + eps) ** alpha`` over the stored rows."""
    q = {row: (p + eps) ** alpha for row, p in priorities.items()}
    smallest = min(q.values())
    return [(q[i] / smallest) ** -beta for i in index]


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 12),
    extra=st.integers(0, 15),
    alpha=st.sampled_from([0.0, 0.5, 0.6, 1.0, 1.7]),
    beta=st.sampled_from([0.0, 0.4, 1.0, 2.5]),
    updates=st.lists(st.tuples(st.integers(0, 26), st.floats(0.0, 1e3)), max_size=20),
    picks=st.lists(st.integers(0, 26), min_size=1, max_size=10),
)
def test_the_weights_equal_a_plain_reference_and_those_sample_gives(
    capacity: int, extra: int, alpha: float, beta: float, updates: list[tuple[int, float]], picks: list[int]
) -> None:
    adds = capacity + extra if extra % 2 else min(capacity, 1 + extra)  # full and wrapped, or partly filled
    buf = _filled(capacity, adds, alpha=alpha, beta=beta)
    size = len(buf)
    eps = float(buf.torchrl.sampler.state_dict()["eps"])
    priorities = dict.fromkeys(range(size), 1.0)  # the default of new rows before any update
    for row, priority in updates:
        if row < size:
            buf.update_priority([row], [priority])
            priorities[row] = priority
    index = [row % size for row in picks]
    weight = buf.sample_by_index(index).weight
    assert weight.dtype == torch.float32 and weight.shape == (len(index),)
    expected = _reference(priorities, index, alpha=alpha, beta=beta, eps=eps)
    # float32 weights: below its smallest normal number (a row 1e16 times likelier than the least likely one,
    # beta 2.5) a weight keeps only a few bits, so those agree to within that number.
    tiny = float(torch.finfo(torch.float32).tiny)
    assert all(math.isclose(w, e, rel_tol=1e-5, abs_tol=tiny) for w, e in zip(weight.tolist(), expected, strict=True))
    batch = buf.sample(16)
    assert torch.equal(buf.sample_by_index(batch.index).weight, batch.weight)  # bit for bit


def test_the_weights_follow_beta_as_it_is_annealed() -> None:
    buf = _filled(8, 8, alpha=1.0, beta=0.5)
    buf.update_priority([0, 1], [3.0, 0.5])
    before = buf.sample_by_index([0, 1, 2]).weight
    buf.beta = 1.0
    after = buf.sample_by_index([0, 1, 2]).weight
    assert torch.allclose(after, before**2)  # (q_i / q_min) ** -beta at twice the beta
    assert float(after[1]) == 1.0  # the least likely row


def test_a_compact_prioritized_buffer_gives_the_weights_of_sample() -> None:
    buf = _filled(16, 20, alpha=0.6, beta=0.4, compact=True)
    buf.update_priority([3, 4, 5], [10.0, 0.01, 2.0])
    batch = buf.sample(32)
    assert torch.equal(buf.sample_by_index(batch.index).weight, batch.weight)
    assert not bool((batch.weight == 1.0).all())


def test_a_uniform_buffer_gives_all_ones() -> None:
    buf = ReplayBuffer(8, obs_shape=(2,), action_shape=())
    for i in range(5):
        buf.add(torch.zeros(2), 0.0, float(i), torch.zeros(2), False, False)
    assert buf.sample_by_index([4, 0, 2]).weight.tolist() == [1.0, 1.0, 1.0]


def test_an_index_outside_what_is_stored_is_refused_before_any_weight() -> None:
    buf = _filled(8, 3, alpha=0.6, beta=0.4)
    with pytest.raises(StoredIndexError):
        buf.sample_by_index([1, 3])
