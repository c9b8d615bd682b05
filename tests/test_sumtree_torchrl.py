"""rlbuf._sumtree.SumTreeSampler as TorchRL's prioritized sampler (through ``TensorDictReplayBuffer``,
on 2-d storages and the storage's device) and under rlbuf's ``ReplayBuffer`` (the largest priority kept
exactly, ``nbytes``), and why it exists: TorchRL's C++ sum trees do not load.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from _sumtree import leaf_sums, make_buffer, transitions
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import PrioritizedSampler, Sampler

from rlbuf import ReplayBuffer
from rlbuf._sumtree import SumTreeSampler
from rlbuf.errors import EmptyBufferError

# -- TorchRL integration ------------------------------------------------------------------------


def test_is_a_torchrl_prioritized_sampler() -> None:
    sampler = SumTreeSampler(4, alpha=0.6, beta=0.4)
    assert isinstance(sampler, Sampler)
    assert isinstance(sampler, PrioritizedSampler)
    assert "alpha=0.6" in repr(sampler)
    assert "default_priority=1.0" in repr(sampler)


def test_works_through_a_tensordict_replay_buffer() -> None:
    rb = make_buffer(32, alpha=1.0, beta=1.0, eps=0.0)
    index = rb.extend(transitions(10, td_error=torch.arange(1.0, 11.0)))
    torch.testing.assert_close(leaf_sums(rb.sampler)[:10].float(), torch.arange(1.0, 11.0))

    batch = rb.sample()
    assert batch.batch_size == torch.Size([16])
    assert batch["index"].dtype == torch.int64
    assert int(batch["index"].max()) < 10
    torch.testing.assert_close(batch["obs"], batch["index"].float())
    expected = (leaf_sums(rb.sampler)[batch["index"]] / 1.0) ** -1.0
    torch.testing.assert_close(batch["priority_weight"], expected.float())

    rb.update_priority(index, torch.full((10,), 1e-12))
    rb.update_priority(torch.tensor([4]), torch.tensor([3.0]))
    assert set(rb.sample()["index"].tolist()) == {4}

    batch["td_error"] = torch.full((16,), 2.0)
    rb.update_tensordict_priority(batch)
    assert leaf_sums(rb.sampler)[batch["index"]].tolist() == [2.0] * 16

    _, info = rb.sample(return_info=True)
    assert set(info) == {"priority_weight", "index"}


def test_buffer_state_dict_and_empty_go_through_the_sampler() -> None:
    rb = make_buffer(16)
    rb.extend(transitions(8, td_error=torch.linspace(0.5, 4.0, 8)))
    state = rb.state_dict()
    restored = make_buffer(16)
    restored.load_state_dict(state)
    assert torch.equal(restored.sampler._tree, rb.sampler._tree)
    assert torch.equal(restored.sample()["index"], rb.sample()["index"])
    rb.empty()
    with pytest.raises(EmptyBufferError, match="holds 0 items"):
        rb.sample()


def test_buffer_over_prefilled_storage_gives_existing_items_the_default_priority() -> None:
    storage = LazyTensorStorage(8)
    storage.set(torch.arange(5), transitions(5))
    rb = TensorDictReplayBuffer(storage=storage, sampler=SumTreeSampler(8, alpha=0.6, beta=0.4))
    assert int(rb.sample(64)["index"].max()) < 5
    assert leaf_sums(rb.sampler)[:5].tolist() == pytest.approx([1.0] * 5)


def test_two_dimensional_storage() -> None:
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(8, ndim=2),
        sampler=SumTreeSampler(8, alpha=1.0, beta=1.0, eps=0.0),
        batch_size=6,
    )
    rb.extend(TensorDict(obs=torch.arange(8.0).reshape(2, 4), batch_size=[2, 4]))
    batch = rb.sample()
    assert batch["index"].shape == (6, 2)
    every = torch.cartesian_prod(torch.arange(4), torch.arange(2))  # all 8 positions of the [4, 2] storage
    rb.update_priority(every, torch.full((8,), 1e-9))  # the row given 50 below then holds all but 1e-10 of the mass
    rb.update_priority(batch["index"][:1], torch.tensor([50.0]))
    assert leaf_sums(rb.sampler).max().item() == 50.0
    assert torch.equal(rb.sample()["index"], batch["index"][:1].expand(6, 2))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_index_lives_on_the_storage_device() -> None:
    storage = LazyTensorStorage(4, device="cuda")
    storage.set(torch.arange(4), torch.zeros(4, device="cuda"))
    sampler = SumTreeSampler(4, alpha=0.6, beta=0.4)
    sampler.update_priority(torch.arange(4, device="cuda"), torch.ones(4, device="cuda"))
    index, info = sampler.sample(storage, 8)
    assert index.device.type == "cuda"
    assert info["priority_weight"].device.type == "cuda"


def test_torchrl_c_plus_plus_sum_trees_still_fail_to_load() -> None:
    """The reason ``rlbuf._sumtree`` exists: torchrl 0.14.1's C++ segment trees do not load against torch 2.13.

    The day this fails, TorchRL's own ``PrioritizedSampler`` works here: ``_sumtree.py`` (and
    ``_sumtree_arrays.py``) can go, and ``ReplayBuffer(prioritized=True)`` can use TorchRL's sampler.
    """
    gone = "TorchRL's C++ sum trees load again: rlbuf._sumtree (SumTreeSampler) can be replaced by TorchRL's own"
    try:
        from torchrl._torchrl import SumSegmentTreeFp32

        SumSegmentTreeFp32(8)
    except (ImportError, RuntimeError, AttributeError):
        pass
    else:
        pytest.fail(gone)
    try:
        PrioritizedSampler(8, 0.6, 0.4)
    except RuntimeError as error:
        assert "SumSegmentTreeFp32 is not available" in str(error)
    else:
        pytest.fail(gone)


@pytest.mark.parametrize("largest", [1e39, 1e100, 1 + 2**-40])
def test_new_rows_get_the_largest_priority_exactly_even_past_float32(largest: float, tmp_path: Path) -> None:
    # The default priority went through a float32 tensor: 1e39 became inf, the next sample raised with the
    # row committed, that row was never drawn again, and the buffer's own checkpoint did not load.
    from rlbuf import ReplayBuffer

    buf = ReplayBuffer(8, obs_shape=(1,), action_shape=(), prioritized=True, alpha=1.0, seed=0)
    for _ in range(3):
        buf.add(torch.zeros(1), 0.0, 0.0, torch.zeros(1), False, truncated=False)
    buf.update_priority([0], [largest])
    buf.add(torch.zeros(1), 0.0, 0.0, torch.zeros(1), False, truncated=False)
    leaves = buf.state_dict()["sampler"]["sum_leaves"]
    assert leaves[3].item() == leaves[0].item() and math.isfinite(leaves[3].item())   # float64, not rounded
    drawn = set(buf.sample(256).index.tolist())
    assert drawn >= {3} and drawn <= {0, 1, 2, 3}
    buf.save(tmp_path / "ckpt")
    assert torch.equal(ReplayBuffer.load(tmp_path / "ckpt").state_dict()["sampler"]["sum_leaves"], leaves)


@pytest.mark.parametrize("capacity", [64, 1000])
@pytest.mark.parametrize("compact", [False, True])
def test_a_prioritized_buffers_nbytes_counts_its_sum_tree(capacity: int, compact: bool) -> None:
    """The tree holds a sum and a minimum (float64) over each node of a tree of the next power of two leaves."""
    options: dict[str, Any] = dict(obs_shape=(4, 6, 5), obs_dtype=torch.uint8, frame_stack=4,
                                   compression="zstd") if compact else dict(obs_shape=(4,))
    uniform, prioritized = (ReplayBuffer(capacity, action_shape=(), prioritized=p, **options) for p in (False, True))
    leaves = 1 << (capacity - 1).bit_length()
    assert prioritized.nbytes - uniform.nbytes == 2 * (2 * leaves) * 8
