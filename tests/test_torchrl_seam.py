"""What rlbuf assumes of TorchRL's internals (rlbuf/_torchrl.py), pinned against the installed TorchRL.

Each test names the assumption in its failure message: when a TorchRL release changes one,
``nox -s compat`` fails here first, and the fix belongs in ``rlbuf/_torchrl.py`` alone.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import PrioritizedSampler, RandomSampler

from rlbuf import _torchrl
from rlbuf._sumtree import SumTreeSampler

CHANGED = "TorchRL changed what rlbuf._torchrl.{} relies on: {}"


def _rows(start: int, n: int) -> TensorDict:
    return TensorDict({"obs": torch.arange(start, start + n, dtype=torch.float32).unsqueeze(-1)}, batch_size=[n])


def _buffer(capacity: int = 4, sampler: object | None = None) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler or RandomSampler())
    rb.set_rng(torch.Generator().manual_seed(0))
    return rb


def test_counters_follow_torchrl_extend() -> None:
    rb = _buffer(4)
    rb.extend(_rows(0, 3))
    assert (_torchrl.size(rb), _torchrl.cursor(rb), _torchrl.write_count(rb)) == (3, 3, 3), CHANGED.format(
        "size/cursor/write_count", "storage._len, writer._cursor, writer._write_count count rows written by extend")
    rb.extend(_rows(3, 3))
    got = (_torchrl.size(rb), _torchrl.cursor(rb), _torchrl.write_count(rb))
    assert got == (4, 2, 6), CHANGED.format(
        "size/cursor/write_count", f"a round-robin writer past capacity 4 gives (4, 2, 6), got {got}")
    assert got[2] == rb.write_count and got[0] == len(rb), CHANGED.format(
        "size/write_count", "the private counters are the ones len(rb) and rb.write_count report")


def test_set_counts_is_what_torchrl_reads_back() -> None:
    rb = _buffer(4)
    rb.extend(_rows(0, 4))
    _torchrl.set_counts(rb, cursor=1, write_count=9, size=2)
    assert (len(rb), rb.write_count) == (2, 9), CHANGED.format(
        "set_counts", "assigning storage._len and writer._write_count sets len(rb) and rb.write_count")
    assert rb.writer.state_dict()["_cursor"] == 1, CHANGED.format(
        "set_counts", "assigning writer._cursor sets the cursor the writer saves")
    rb.extend(_rows(10, 1))
    assert float(_torchrl.storage_leaves(rb.storage)["obs"][1, 0]) == 10.0, CHANGED.format(
        "set_counts", "the writer's next write goes at the cursor that was set")


def test_skip_rows_moves_cursor_and_write_count_only() -> None:
    rb = _buffer(4)
    rb.extend(_rows(0, 2))
    _torchrl.skip_rows(rb, 7, 4)
    got = (_torchrl.size(rb), _torchrl.cursor(rb), _torchrl.write_count(rb))
    assert got == (2, 1, 9), CHANGED.format("skip_rows", f"expected (size, cursor, write_count) (2, 1, 9), got {got}")


@pytest.mark.parametrize("kind", ["random", "prioritized"])
@pytest.mark.parametrize("stored", [3, 1], ids=["wrapping", "in-one-span"])
def test_commit_rows_leaves_the_state_torchrl_extend_leaves(kind: str, stored: int) -> None:
    """Rows copied into the leaves, then committed, leave what TorchRL's extend of them leaves: a span
    that wraps (an index tensor) and one that does not (a ``range`` as the storage's cursor)."""
    def sampler() -> RandomSampler | SumTreeSampler:
        return RandomSampler() if kind == "random" else SumTreeSampler(4, alpha=0.6, beta=0.4)

    theirs, ours = _buffer(4, sampler()), _buffer(4, sampler())
    for rb in (theirs, ours):
        rb.extend(_rows(0, stored))
    theirs.extend(_rows(stored, 3))
    leaves = _torchrl.storage_leaves(ours.storage)
    for k, position in enumerate(range(stored, stored + 3)):
        leaves["obs"][position % 4] = float(stored + k)
    before = ours.storage._mutation_revision
    with _torchrl.replay_lock(ours), _torchrl.write_lock(ours):
        _torchrl.commit_rows(ours, stored, 3, 4)
    assert ours.writer.state_dict() == theirs.writer.state_dict(), CHANGED.format(
        "commit_rows", f"writer state after extend is {theirs.writer.state_dict()}, ours {ours.writer.state_dict()}")
    assert len(ours) == len(theirs) and ours.storage._last_cursor_index == theirs.storage._last_cursor_index, \
        CHANGED.format("commit_rows", "storage length and last cursor (a range or an index tensor) as extend "
                       "leaves them")
    assert ours.storage._mutation_revision == before + 1 == theirs.storage._mutation_revision, CHANGED.format(
        "commit_rows", "storage._bump_mutation_revision() counts one more write in storage._mutation_revision, "
        "as each extend does")
    mine, reference = ours.sampler.state_dict(), theirs.sampler.state_dict()
    assert mine.keys() == reference.keys() and all(
        torch.equal(torch.as_tensor(mine[k]), torch.as_tensor(reference[k])) for k in mine), CHANGED.format(
        "commit_rows", "Sampler.extend(index) gives the sampler the state extend gives it")
    assert torch.equal(_torchrl.storage_leaves(ours.storage)["obs"], _torchrl.storage_leaves(theirs.storage)["obs"]), \
        CHANGED.format("storage_leaves", "writes into the leaves are the stored rows")


def test_locks_are_the_ones_torchrl_takes() -> None:
    rb = _buffer(4)
    lock = _torchrl.replay_lock(rb)
    assert isinstance(lock, type(threading.RLock())), CHANGED.format(
        "replay_lock", f"_replay_lock is a re-entrant threading lock, got {type(lock).__name__}")
    with lock, lock:  # rlbuf re-enters it (a flush inside TorchRL's own sample)
        rb.extend(_rows(0, 1))
    assert isinstance(_torchrl.write_lock(rb), contextlib.nullcontext), CHANGED.format(
        "write_lock", "an unshared buffer's _write_lock is a no-op context manager")
    rb.share()
    shared = _torchrl.write_lock(rb)
    assert hasattr(shared, "acquire") and shared.acquire(block=False), CHANGED.format(
        "write_lock", "share() makes _write_lock a multiprocessing lock")
    shared.release()


@pytest.mark.parametrize("storage", ["memory", "memmap"])
def test_initialise_allocates_every_leaf(storage: str, tmp_path: Path) -> None:
    made = LazyTensorStorage(5) if storage == "memory" else LazyMemmapStorage(5, scratch_dir=str(tmp_path))
    row = TensorDict({"obs": torch.zeros(3), ("next", "reward"): torch.zeros(1)}, batch_size=[])
    _torchrl.initialise(made, row)
    leaves = _torchrl.storage_leaves(made)
    assert leaves["obs"].shape == (5, 3) and leaves["next", "reward"].shape == (5, 1), CHANGED.format(
        "initialise", "Storage._init(row) allocates max_size rows of every key of row")
    assert len(made) == 0, CHANGED.format("initialise", "an initialised storage holds no rows yet")
    if storage == "memmap":
        assert leaves.is_memmap() and any(tmp_path.rglob("*.memmap")), CHANGED.format(
            "initialise", "LazyMemmapStorage._init writes its leaves as .memmap files in scratch_dir")


def test_keep_keys_drops_undeclared_entries() -> None:
    storage = LazyTensorStorage(4)
    _torchrl.initialise(storage, TensorDict({"obs": torch.zeros(1)}, batch_size=[]))
    _torchrl.keep_keys(storage, ["obs"])
    assert _torchrl.storage_keys(storage) == ["obs"], CHANGED.format("storage_keys", "_storage_keys reads back")
    rb = TensorDictReplayBuffer(storage=storage)
    rb.extend(TensorDict({"obs": torch.ones(2, 1), "collector": torch.ones(2)}, batch_size=[2]))
    assert "collector" not in _torchrl.storage_leaves(storage) and len(rb) == 2, CHANGED.format(
        "keep_keys", "a storage writes only _storage_keys and drops other entries")


def test_set_rng_reaches_the_sampler() -> None:
    sampler = SumTreeSampler(4, alpha=1.0, beta=1.0)
    rb = _buffer(4, sampler)
    generator = torch.Generator().manual_seed(3)
    rb.set_rng(generator)
    assert _torchrl.sampler_generator(rb.sampler) is generator, CHANGED.format(
        "sampler_generator", "ReplayBuffer.set_rng stores the generator as the sampler's _rng")
    index = rb.extend(_rows(0, 3))
    rb.update_priority(index, torch.tensor([1.0, 2.0, 5.0]))
    loose = SumTreeSampler(4, alpha=1.0, beta=1.0)
    loose.update_priority(index, torch.tensor([1.0, 2.0, 5.0]))
    _torchrl.set_sampler_generator(loose, torch.Generator().manual_seed(3))
    rb.set_rng(torch.Generator().manual_seed(3))
    drawn = [sampler.sample(rb.storage, 16)[0].tolist() for sampler in (rb.sampler, loose)]
    assert drawn[0] == drawn[1] and len(set(drawn[0])) > 1, CHANGED.format(
        "set_sampler_generator", f"a sampler given a generator draws what set_rng's does, got {drawn}")


def test_sum_tree_passes_for_torchrl_prioritized_sampler() -> None:
    rb = _buffer(4, SumTreeSampler(4, alpha=1.0, beta=1.0))
    assert isinstance(rb.sampler, PrioritizedSampler)
    index = rb.extend(_rows(0, 2))
    rb.update_priority(index, torch.tensor([1.0, 3.0]))
    assert rb.sampler.state_dict()["sum_leaves"][:2].tolist() == pytest.approx([1.0, 3.0]), CHANGED.format(
        "commit_rows", "TensorDictReplayBuffer.update_priority routes to the sampler's update_priority")
    rb.empty()
    assert float(rb.sampler.state_dict()["sum_leaves"].sum()) == 0.0, CHANGED.format(
        "commit_rows", "ReplayBuffer.empty() calls the sampler's _empty() hook, which SumTreeSampler implements")


@pytest.mark.parametrize("storage", ["memory", "memmap"])
def test_pickled_cpu_tensors_finds_every_leaf_a_shared_buffer_sends(storage: str, tmp_path: Path) -> None:
    made = LazyTensorStorage(4) if storage == "memory" else LazyMemmapStorage(4, scratch_dir=str(tmp_path))
    rb = TensorDictReplayBuffer(storage=made)
    rb.extend(TensorDict({"obs": torch.ones(2, 3), ("next", "reward"): torch.ones(2, 1)}, batch_size=[2]))
    rb.share()
    found = {t.untyped_storage().data_ptr() for t in _torchrl.pickled_cpu_tensors(rb.__getstate__())}
    leaves = {leaf.untyped_storage().data_ptr() for leaf in _torchrl.storage_leaves(made).values(True, True)}
    if storage == "memory":
        assert leaves <= found, CHANGED.format(
            "pickled_cpu_tensors", "a buffer's __getstate__ carries its storage's leaves in _storage._storage")
    else:
        assert not leaves & found, CHANGED.format(
            "pickled_cpu_tensors", "memmap leaves are MemoryMappedTensors backed by files")


# -- torch and multiprocessing privates of the hand-out to worker processes -------------------
TORCH_CHANGED = "torch or multiprocessing changed what rlbuf._torchrl.{} relies on: {}"


def test_spawning_process_is_what_multiprocessing_sets_while_it_starts_a_process() -> None:
    assert _torchrl.spawning_process() is False, TORCH_CHANGED.format(
        "spawning_process", "get_spawning_popen() is None outside a process start")
    from multiprocessing import context

    context.set_spawning_popen(object())
    try:
        assert _torchrl.spawning_process() is True, TORCH_CHANGED.format(
            "spawning_process", "set_spawning_popen() is what get_spawning_popen() reads back")
    finally:
        context.set_spawning_popen(None)


class Token:
    """A type pickled only through the reducer a test registers."""


def test_register_reducer_makes_forking_pickler_use_it_once() -> None:
    from multiprocessing.reduction import ForkingPickler

    calls: list[int] = []

    def reduce(token: Token) -> tuple[type, tuple[()]]:
        calls.append(1)
        return Token, ()

    _torchrl.register_reducer(Token, reduce)
    _torchrl.register_reducer(Token, lambda token: (int, (7,)))  # a second registration is ignored
    assert ForkingPickler._extra_reducers[Token] is reduce, TORCH_CHANGED.format(  # type: ignore[attr-defined]
        "register_reducer", "ForkingPickler.register stores the reducer in the class's _extra_reducers")
    assert isinstance(ForkingPickler.loads(ForkingPickler.dumps(Token())), Token) and calls == [1], TORCH_CHANGED.format(
        "register_reducer", "ForkingPickler pickles a registered type with its reducer")
    del ForkingPickler._extra_reducers[Token]  # type: ignore[attr-defined]


def test_hold_shared_file_names_the_dev_shm_file_and_keeps_it_from_torch() -> None:
    strategy = torch.multiprocessing.get_sharing_strategy()  # type: ignore[no-untyped-call]
    torch.multiprocessing.set_sharing_strategy("file_system")  # type: ignore[no-untyped-call]
    try:
        tensor = torch.arange(4.0)
        files: set[str] = set()
        _torchrl.hold_shared_file(tensor, files)
        _torchrl.hold_shared_file(tensor, files)  # held once: the same file
        assert tensor.is_shared() and len(files) == 1, TORCH_CHANGED.format(
            "hold_shared_file", "share_memory_() and _share_filename_cpu_() give one file per storage")
        (name,) = files
        assert Path("/dev/shm" + name).exists(), TORCH_CHANGED.format(
            "hold_shared_file", f"_share_filename_cpu_()[1] names a file under /dev/shm, got {name!r}")
        del tensor  # torch's own reference goes; the one held keeps the file
        assert Path("/dev/shm" + name).exists(), TORCH_CHANGED.format(
            "hold_shared_file", "_shared_incref() keeps the file when the tensor is freed")
        Path("/dev/shm" + name).unlink()
    finally:
        torch.multiprocessing.set_sharing_strategy(strategy)  # type: ignore[no-untyped-call]
