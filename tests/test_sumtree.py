"""Tests of rlbuf._sumtree.SumTreeSampler: tree invariants, sampling law, weights, default priority,
randomness, state and validation. Through TorchRL's replay buffer and rlbuf's ``ReplayBuffer``:
``tests/test_sumtree_torchrl.py``.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from _sumtree import assert_tree_consistent, filled_storage, leaf_sums, make_buffer, transitions
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage

from rlbuf._sumtree import SumTreeSampler
from rlbuf._sumtree_arrays import new_tree, smallest_where, write_leaves
from rlbuf.errors import (
    BatchSizeError,
    CheckpointError,
    ConfigError,
    EmptyBufferError,
    NonFiniteError,
    PriorityError,
    StoredIndexError,
)

# -- tree invariant -----------------------------------------------------------------------------

updates = st.lists(
    st.lists(
        st.tuples(st.integers(0, 1_000), st.floats(0, 1e6, allow_nan=False)),
        min_size=1,
        max_size=20,
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(1, 70), batches=updates, alpha=st.sampled_from([0.0, 0.6, 1.0]))
def test_tree_invariant_after_random_updates(
    capacity: int, batches: list[list[tuple[int, float]]], alpha: float
) -> None:
    sampler = SumTreeSampler(capacity, alpha=alpha, beta=0.4)
    expected = np.zeros(capacity)
    for batch in batches:
        index = [i % capacity for i, _ in batch]
        priority = [p for _, p in batch]
        sampler.update_priority(torch.tensor(index), torch.tensor(priority, dtype=torch.float64))
        for i, p in zip(index, priority, strict=True):  # last write wins
            expected[i] = (p + 1e-8) ** alpha
        assert_tree_consistent(sampler)
    np.testing.assert_allclose(leaf_sums(sampler).numpy(), expected, rtol=1e-12)
    assert sampler._tree[0, 1].item() == pytest.approx(math.fsum(expected), rel=1e-12)
    written = expected > 0
    assert sampler._tree[1, 1].item() == pytest.approx(expected[written].min(), rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(1, 70), size=st.integers(1, 70), values=st.lists(st.floats(0, 1e6), min_size=70,
                                                                             max_size=70),
       refused=st.sets(st.integers(0, 69)), ties=st.booleans())
def test_smallest_where_is_the_smallest_admitted_stored_leaf(
    capacity: int, size: int, values: list[float], refused: set[int], ties: bool
) -> None:
    size = min(size, capacity)
    tree = new_tree(capacity, torch.float64)
    tree[0], tree[1] = 0.0, float("inf")
    leaves = np.array([round(v, -5) if ties else v for v in values[:capacity]])  # leaves past size: stale rows
    write_leaves(tree, np.arange(capacity), leaves)
    asked: list[int] = []

    def accept(leaf: int) -> bool:
        asked.append(leaf)
        return leaf not in refused

    admitted = [leaves[i] for i in range(size) if i not in refused]
    assert smallest_where(tree, size, accept) == (min(admitted) if admitted else math.inf)
    assert all(0 <= leaf < size for leaf in asked) and len(asked) == len(set(asked))


def test_large_batch_rebuild_gives_the_same_tree_as_walking_up() -> None:
    priority = torch.rand(64, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    at_once = SumTreeSampler(64, alpha=0.6, beta=0.4)
    at_once.update_priority(torch.arange(64), priority)  # 64 leaves * 6 levels > 2 * 64: rebuild
    in_chunks = SumTreeSampler(64, alpha=0.6, beta=0.4)
    for chunk in torch.arange(64).split(8):
        in_chunks.update_priority(chunk, priority[chunk])
    assert torch.equal(at_once._tree, in_chunks._tree)


def test_duplicate_indices_last_write_wins() -> None:
    sampler = SumTreeSampler(4, alpha=1.0, beta=0.4, eps=0.0)
    sampler.update_priority(torch.tensor([2, 0, 2, 2]), torch.tensor([5.0, 1.0, 7.0, 3.0]))
    assert leaf_sums(sampler).tolist() == [1.0, 0.0, 3.0, 0.0]
    assert sampler._tree[0, 1].item() == 4.0
    # Like TorchRL, the max priority counts every value given, overwritten ones included.
    assert sampler.default_priority == 7.0


def test_negative_indices_are_skipped() -> None:
    sampler = SumTreeSampler(4, alpha=1.0, beta=0.4, eps=0.0)
    sampler.update_priority(torch.tensor([-1, 1, -1]), torch.tensor([9.0, 2.0, 9.0]))
    assert leaf_sums(sampler).tolist() == [0.0, 2.0, 0.0, 0.0]
    assert sampler.default_priority == 2.0


# -- sampling law and weights -------------------------------------------------------------------


def test_sampling_frequencies_follow_priority_to_the_alpha() -> None:
    priority = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    sampler = SumTreeSampler(8, alpha=0.6, beta=0.4)
    sampler.update_priority(torch.arange(8), priority)
    sampler._rng = torch.Generator().manual_seed(1234)
    draws = 100_000
    index, _ = sampler.sample(filled_storage(8), draws)
    observed = torch.bincount(index, minlength=8).double().numpy()
    q = (priority.double().numpy() + 1e-8) ** 0.6
    expected = draws * q / q.sum()
    chi_square = ((observed - expected) ** 2 / expected).sum()
    assert chi_square < 24.3  # 7 degrees of freedom, p = 0.001
    np.testing.assert_allclose(observed / draws, q / q.sum(), atol=0.005)


def test_sampling_stays_within_storage_length() -> None:
    sampler = SumTreeSampler(16, alpha=1.0, beta=0.4)
    # Priorities written beyond the stored items must not be drawn.
    sampler.update_priority(torch.arange(16), torch.tensor([1.0] * 5 + [1000.0] * 11))
    sampler._rng = torch.Generator().manual_seed(0)
    index, info = sampler.sample(filled_storage(5, capacity=16), 2_000)
    assert int(index.max()) < 5
    assert set(index.tolist()) == set(range(5))
    torch.testing.assert_close(info["priority_weight"], torch.ones(2_000))


@pytest.mark.parametrize(
    ("capacity", "size", "index", "priority", "allowed"),
    [
        (3, 3, [0, 1, 2], [1.0, 2.0, 1.0], {2}),  # lands on the padding leaf past the capacity
        (4, 4, [0, 1], [1.0, 1.0], {1}),  # lands on never-written items at the end
        (8, 5, list(range(8)), [1.0] * 8, {4}),  # lands past len(storage)
    ],
)
def test_round_off_at_the_total_never_returns_an_empty_or_unstored_item(
    monkeypatch: pytest.MonkeyPatch,
    capacity: int,
    size: int,
    index: list[int],
    priority: list[float],
    allowed: set[int],
) -> None:
    sampler = SumTreeSampler(capacity, alpha=1.0, beta=0.4, eps=0.0)
    sampler.update_priority(torch.tensor(index), torch.tensor(priority))
    # A uniform draw of exactly 1.0 puts the mass at the total: the worst round-off case.
    monkeypatch.setattr(torch, "rand", lambda n, **kwargs: torch.ones(n, dtype=torch.float64))
    sampled, info = sampler.sample(filled_storage(size, capacity=capacity), 4)
    assert set(sampled.tolist()) == allowed
    assert bool((info["priority_weight"] > 0).all())


def test_importance_weights_match_the_formula() -> None:
    priority = torch.tensor([0.5, 1.0, 4.0, 0.1, 2.0, 3.0])
    alpha, beta, eps = 0.7, 0.5, 1e-8
    sampler = SumTreeSampler(10, alpha=alpha, beta=beta, eps=eps)
    sampler.update_priority(torch.arange(6), priority)
    sampler._rng = torch.Generator().manual_seed(0)
    index, info = sampler.sample(filled_storage(6, capacity=10), 500)

    q = (priority.double() + eps) ** alpha
    probability = q / q.sum()
    n = 6
    weight = (n * probability) ** -beta
    expected = weight / weight.max()
    assert info["priority_weight"].dtype == torch.float32
    torch.testing.assert_close(info["priority_weight"].double(), expected[index], rtol=1e-6, atol=0)


def test_alpha_zero_samples_uniformly_with_unit_weights() -> None:
    sampler = SumTreeSampler(4, alpha=0.0, beta=0.4)
    sampler.update_priority(torch.arange(4), torch.tensor([0.0, 1.0, 10.0, 100.0]))
    sampler._rng = torch.Generator().manual_seed(0)
    index, info = sampler.sample(filled_storage(4), 40_000)
    np.testing.assert_allclose(torch.bincount(index).numpy() / 40_000, 0.25, atol=0.01)
    torch.testing.assert_close(info["priority_weight"], torch.ones(40_000))


def test_setting_alpha_retransforms_the_leaves() -> None:
    sampler = SumTreeSampler(4, alpha=0.5, beta=0.4, eps=0.0)
    sampler.update_priority(torch.tensor([0, 2]), torch.tensor([4.0, 9.0]))
    sampler.alpha = 1.0
    torch.testing.assert_close(
        leaf_sums(sampler), torch.tensor([4.0, 0.0, 9.0, 0.0], dtype=torch.float64)
    )
    assert_tree_consistent(sampler)


# -- default priority ---------------------------------------------------------------------------


def test_new_items_get_the_max_priority_seen() -> None:
    rb = make_buffer(8, alpha=1.0, eps=0.0)
    index = rb.extend(transitions(4))
    assert leaf_sums(rb.sampler)[:4].tolist() == [1.0] * 4  # before any update: 1.0
    rb.update_priority(index, torch.tensor([1.0, 5.0, 2.0, 3.0]))
    rb.extend(transitions(2))
    assert leaf_sums(rb.sampler)[4:6].tolist() == [5.0, 5.0]
    # Default: the max since construction, even after the max item's priority drops.
    rb.update_priority(torch.tensor([1]), torch.tensor([0.5]))
    assert rb.sampler.default_priority == 5.0
    rb.add(TensorDict(obs=torch.tensor(0.0), batch_size=[]))
    assert leaf_sums(rb.sampler)[6].item() == 5.0


def test_max_priority_within_buffer_follows_the_stored_items() -> None:
    sampler = SumTreeSampler(4, alpha=0.5, beta=0.4, eps=0.0, max_priority_within_buffer=True)
    sampler.update_priority(torch.arange(3), torch.tensor([1.0, 9.0, 4.0]))
    assert sampler.default_priority == 9.0
    sampler.update_priority(torch.tensor([1]), torch.tensor([0.25]))
    assert sampler.default_priority == pytest.approx(4.0)
    sampler.extend(torch.tensor([2, 3]))  # the max item is overwritten
    assert sampler.default_priority == 1.0


# -- randomness ---------------------------------------------------------------------------------


def test_seeded_generators_give_identical_samples_and_leave_global_rng_alone() -> None:
    storage = filled_storage(50)
    samplers = [SumTreeSampler(50, alpha=0.6, beta=0.4) for _ in range(2)]
    for sampler in samplers:
        sampler.update_priority(torch.arange(50), torch.linspace(0.1, 5.0, 50))
        sampler._rng = torch.Generator().manual_seed(7)
    torch_state, numpy_state = torch.get_rng_state(), np.random.get_state()
    first = [samplers[0].sample(storage, 32)[0] for _ in range(3)]
    second = [samplers[1].sample(storage, 32)[0] for _ in range(3)]
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert np.random.get_state()[1].tolist() == numpy_state[1].tolist()
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(first[0], first[1])


def test_without_a_generator_the_global_torch_rng_is_used() -> None:
    sampler = SumTreeSampler(10, alpha=0.6, beta=0.4)
    sampler.update_priority(torch.arange(10), torch.rand(10))
    storage = filled_storage(10)
    torch.manual_seed(3)
    first = sampler.sample(storage, 20)[0]
    torch.manual_seed(3)
    assert torch.equal(sampler.sample(storage, 20)[0], first)


# -- state --------------------------------------------------------------------------------------


def trained_sampler() -> SumTreeSampler:
    sampler = SumTreeSampler(20, alpha=0.6, beta=0.4)
    sampler.update_priority(torch.arange(15), torch.linspace(0.0, 3.0, 15))
    sampler.update_priority(torch.tensor([3, 4]), torch.tensor([7.0, 0.5]))
    return sampler


def assert_same_future(original: SumTreeSampler, restored: SumTreeSampler) -> None:
    storage = filled_storage(15, capacity=20)
    original._rng = torch.Generator().manual_seed(11)
    restored._rng = torch.Generator().manual_seed(11)
    for step in range(3):
        index_a, info_a = original.sample(storage, 64)
        index_b, info_b = restored.sample(storage, 64)
        assert torch.equal(index_a, index_b)
        assert torch.equal(info_a["priority_weight"], info_b["priority_weight"])
        priority = torch.rand(64, generator=torch.Generator().manual_seed(step))
        original.update_priority(index_a, priority)
        restored.update_priority(index_b, priority)
        original.mark_update(torch.tensor([15 + step]))
        restored.mark_update(torch.tensor([15 + step]))
    assert torch.equal(original._tree, restored._tree)
    assert original.default_priority == restored.default_priority


def test_state_dict_round_trip_continues_identically() -> None:
    original = trained_sampler()
    state = original.state_dict()
    assert all(isinstance(v, int | float | torch.Tensor) for v in state.values())
    restored = SumTreeSampler(20, alpha=0.1, beta=0.9)
    restored.load_state_dict(copy.deepcopy(state))
    assert (restored.alpha, restored.beta) == (0.6, 0.4)
    assert torch.equal(restored._tree, original._tree)
    assert_same_future(original, restored)


def test_state_dict_of_another_capacity_is_refused() -> None:
    with pytest.raises(CheckpointError, match=r"expected shape \(30,\), got \(20,\)"):
        SumTreeSampler(30, alpha=0.6, beta=0.4).load_state_dict(trained_sampler().state_dict())


def test_dumps_loads_round_trip_without_pickle(tmp_path: Path) -> None:
    path = tmp_path / "sampler"
    original = trained_sampler()
    original.dumps(path)
    assert sorted(p.name for p in path.iterdir()) == [
        "min_leaves.npy",
        "sampler_metadata.json",
        "sum_leaves.npy",
    ]
    np.load(path / "sum_leaves.npy", allow_pickle=False)
    assert json.loads((path / "sampler_metadata.json").read_text())["max_capacity"] == 20
    restored = SumTreeSampler(20, alpha=0.6, beta=0.4)
    restored.loads(path)
    assert_same_future(original, restored)
    with pytest.raises(CheckpointError, match="expected max_capacity 21, got 20"):
        SumTreeSampler(21, alpha=0.6, beta=0.4).loads(path)


def test_deepcopy_is_independent() -> None:
    original = trained_sampler()
    clone = copy.deepcopy(original)
    clone.update_priority(torch.tensor([0]), torch.tensor([100.0]))
    assert leaf_sums(original)[0].item() == pytest.approx((0.0 + 1e-8) ** 0.6)
    assert_tree_consistent(clone)


def test_empty_forgets_everything() -> None:
    sampler = trained_sampler()
    sampler._empty()
    assert sampler.default_priority == 1.0
    assert sampler._tree[0].abs().sum().item() == 0.0


# -- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("index", "priority", "error", "message"),
    [
        (torch.arange(32), torch.ones(31), PriorityError, "expected 32 values (one per index), got 31"),
        (torch.arange(3), torch.tensor([1.0, -0.5, 2.0]), PriorityError, "expected values >= 0, got -0.5 at position 1"),
        (torch.arange(3), torch.tensor([1.0, 2.0, math.nan]), NonFiniteError, "expected finite values, got nan at position 2"),
        (torch.arange(3), torch.tensor([math.inf, 1.0, 1.0]), PriorityError, "expected finite values, got inf at position 0"),
        (torch.tensor([0, 64]), torch.ones(2), StoredIndexError, "expected values in [0, 40) (or negative to skip), got 64"),
        (torch.tensor([0.0, 1.0]), torch.ones(2), StoredIndexError, "expected integers, got dtype torch.float32"),
        (torch.arange(2), torch.tensor([1e300, 1.0], dtype=torch.float64), PriorityError, "to fit in float64"),
    ],
)  # fmt: skip
def test_bad_updates_raise_and_leave_the_tree_unchanged(
    index: torch.Tensor, priority: torch.Tensor, error: type[Exception], message: str
) -> None:
    sampler = SumTreeSampler(40, alpha=2.0, beta=0.4)
    sampler.update_priority(torch.arange(40), torch.linspace(0.1, 4.0, 40))
    tree, default = sampler._tree.clone(), sampler.default_priority
    with pytest.raises(error) as raised:
        sampler.update_priority(index, priority)
    assert message in str(raised.value)
    assert torch.equal(sampler._tree, tree)
    assert sampler.default_priority == default


def test_a_priority_that_underflows_to_zero_is_refused_and_leaves_the_tree_unchanged() -> None:
    """(0 + eps) ** 50 is 0.0 in float64: that row could never be drawn (a zero priority with eps=0 is meant so)."""
    sampler = SumTreeSampler(4, alpha=50.0, beta=0.4)
    sampler.update_priority(torch.arange(4), torch.ones(4))
    tree = sampler._tree.clone()
    with pytest.raises(PriorityError, match=r"expected \(p \+ eps\) \*\* alpha > 0 in float64 for p \+ eps > 0 .* got "
                                            r"p=0.0 at position 1 \(alpha=50.0, eps=1e-08\); raise eps or lower alpha"):
        sampler.update_priority(torch.tensor([0, 1]), torch.tensor([1.0, 0.0]))
    assert torch.equal(sampler._tree, tree)

def test_non_finite_priority_is_also_a_priority_error() -> None:
    sampler = SumTreeSampler(2, alpha=0.6, beta=0.4)
    with pytest.raises(PriorityError):
        sampler.update_priority(torch.tensor([0]), torch.tensor([math.nan]))


def test_sampling_an_empty_storage_raises() -> None:
    sampler = SumTreeSampler(4, alpha=0.6, beta=0.4)
    with pytest.raises(EmptyBufferError, match="holds 0 items"):
        sampler.sample(LazyTensorStorage(4), 2)


def test_sampling_without_priorities_or_with_zero_priority_raises() -> None:
    storage = filled_storage(3)
    sampler = SumTreeSampler(3, alpha=1.0, beta=0.4, eps=0.0)
    with pytest.raises(PriorityError, match="expected a positive total"):
        sampler.sample(storage, 2)
    sampler.update_priority(torch.arange(3), torch.tensor([1.0, 0.0, 1.0]))
    with pytest.raises(PriorityError, match="importance weights are undefined"):
        sampler.sample(storage, 2)


@pytest.mark.parametrize("batch_size", [0, -3])
def test_non_positive_batch_size_raises(batch_size: int) -> None:
    sampler = SumTreeSampler(4, alpha=0.6, beta=0.4)
    sampler.update_priority(torch.arange(4), torch.ones(4))
    with pytest.raises(BatchSizeError, match=f"expected a positive integer, got {batch_size}"):
        sampler.sample(filled_storage(4), batch_size)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_capacity": 0}, "max_capacity: expected a positive integer, got 0"),
        ({"alpha": -0.1}, "alpha: expected a finite number >= 0, got -0.1"),
        ({"beta": math.nan}, "beta: expected a finite number >= 0, got nan"),
        ({"eps": -1.0}, "eps: expected a value >= 0, got -1.0"),
        ({"dtype": torch.float16}, "dtype: expected torch.float32 or torch.float64, got torch.float16"),
    ],
)  # fmt: skip
def test_bad_configuration_raises(kwargs: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {"max_capacity": 4, "alpha": 0.6, "beta": 0.4, **kwargs}
    with pytest.raises(ConfigError) as raised:
        SumTreeSampler(**arguments)  # type: ignore[arg-type]
    assert str(raised.value) == message


def test_float32_tree() -> None:
    sampler = SumTreeSampler(5, alpha=1.0, beta=1.0, eps=0.0, dtype=torch.float32)
    sampler.update_priority(torch.arange(5), torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]))
    assert sampler._tree.dtype == torch.float32
    assert sampler._tree[0, 1].item() == 15.0
    sampler._rng = torch.Generator().manual_seed(0)
    index, info = sampler.sample(filled_storage(5), 10)
    torch.testing.assert_close(info["priority_weight"], 1.0 / (index.float() + 1.0))
