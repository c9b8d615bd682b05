"""Storages, TorchRL buffers and tree checks shared by ``tests/test_sumtree*.py``."""

from __future__ import annotations

import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

from rlbuf._sumtree import SumTreeSampler


def filled_storage(size: int, capacity: int | None = None) -> LazyTensorStorage:
    storage = LazyTensorStorage(capacity or size)
    storage.set(torch.arange(size), torch.zeros(size))
    return storage


def leaf_sums(sampler: SumTreeSampler) -> torch.Tensor:
    start = sampler._num_leaves
    return sampler._tree[0, start : start + sampler.max_size]


def assert_tree_consistent(sampler: SumTreeSampler) -> None:
    sums, mins = sampler._tree[0], sampler._tree[1]
    inner = torch.arange(1, sampler._num_leaves)
    torch.testing.assert_close(sums[inner], sums[2 * inner] + sums[2 * inner + 1], rtol=0, atol=0)
    torch.testing.assert_close(
        mins[inner], torch.minimum(mins[2 * inner], mins[2 * inner + 1]), rtol=0, atol=0
    )


def make_buffer(capacity: int, seed: int = 0, **sampler_kwargs: float) -> TensorDictReplayBuffer:
    kwargs = {"alpha": 0.6, "beta": 0.4, **sampler_kwargs}
    return TensorDictReplayBuffer(
        storage=LazyTensorStorage(capacity),
        sampler=SumTreeSampler(capacity, **kwargs),
        batch_size=16,
        generator=torch.Generator().manual_seed(seed),
    )


def transitions(n: int, **extra: torch.Tensor) -> TensorDict:
    return TensorDict(obs=torch.arange(n, dtype=torch.float32), **extra, batch_size=[n])
