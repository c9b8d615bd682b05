"""The one seam to TorchRL's private attributes: every read or write of one goes through here.

rlbuf's fast paths write rows straight into a TorchRL storage and then bring TorchRL's own
bookkeeping up to date (the writer's cursor and write count, the storage's length, the
sampler), so TorchRL code holding ``buffer.torchrl`` sees every row. TorchRL exposes no public
API for that, so these small functions name each private attribute rlbuf relies on and say
what TorchRL behaviour it stands for. ``tests/test_torchrl_seam.py`` pins every one of them
against the installed TorchRL: a TorchRL release that changes one fails there first, with a
message naming the assumption (``nox -s compat`` runs the suite against the nightlies).

Checked against torchrl 0.14.1 and tensordict 0.14.3.

Example:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4))
    >>> _ = rb.extend(TensorDict(obs=torch.arange(5.0), batch_size=[5]))
    >>> size(rb), cursor(rb), write_count(rb)
    (4, 1, 5)
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from multiprocessing.context import get_spawning_popen
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
from tensordict import MemoryMappedTensor, TensorDict, TensorDictBase, is_tensor_collection
from torchrl.data import ReplayBuffer
from torchrl.data.replay_buffers.samplers import Sampler
from torchrl.data.replay_buffers.storages import Storage, TensorStorage
from torchrl.data.replay_buffers.writers import Writer

# -- storage ---------------------------------------------------------------------------------

def initialise(storage: TensorStorage, row: TensorDict) -> None:
    """Allocate every leaf of a lazy storage now, from one template row (``Storage._init``).

    TorchRL allocates a ``LazyTensorStorage``/``LazyMemmapStorage`` on its first write;
    ``_init(row)`` does it eagerly with ``max_size`` rows of ``row``'s keys, shapes and dtypes.
    """
    storage._init(row)


def storage_leaves(storage: TensorStorage) -> TensorDictBase:
    """The storage's tensors, ``max_size`` rows each (``TensorStorage._storage``).

    Writing into these tensors writes the stored rows: TorchRL reads them back as they are.
    """
    leaves: TensorDictBase = storage._storage
    return leaves


def storage_keys(storage: TensorStorage) -> list[Any] | None:
    """The keys a TorchRL write stores, ``None`` before the storage is initialised (``_storage_keys``)."""
    keys: list[Any] | None = storage._storage_keys
    return keys


def keep_keys(storage: TensorStorage, keys: list[Any]) -> None:
    """Make TorchRL's writes store only ``keys`` and drop any other entry (``_storage_keys``).

    A collector extending ``buffer.torchrl`` with a richer tensordict (collector metadata,
    root-level flags) then writes only the fields rlbuf declared.
    """
    storage._storage_keys = keys


# -- locks -----------------------------------------------------------------------------------

def replay_lock(rb: ReplayBuffer) -> threading.RLock:
    """The re-entrant lock TorchRL's buffer takes around its own reads and writes (``_replay_lock``)."""
    lock: threading.RLock = rb._replay_lock
    return lock


def write_lock(rb: ReplayBuffer) -> AbstractContextManager[Any]:
    """The lock writer processes of a shared buffer hold while they write (``_write_lock``).

    A ``multiprocessing.Lock`` once ``rb.share()`` ran, a no-op context manager before; not
    re-entrant.
    """
    lock: AbstractContextManager[Any] = rb._write_lock
    return lock


# -- counters --------------------------------------------------------------------------------

def size(rb: ReplayBuffer) -> int:
    """Rows the storage holds (``storage._len``, shared across processes), without a flush."""
    return int(rb._storage._len)


def cursor(rb: ReplayBuffer) -> int:
    """Storage position TorchRL's round-robin writer writes next (``writer._cursor``)."""
    return int(rb._writer._cursor)


def write_count(rb: ReplayBuffer) -> int:
    """Rows ever written through TorchRL's writer (``writer._write_count``)."""
    return int(rb._writer._write_count)


def set_counts(rb: ReplayBuffer, *, cursor: int, write_count: int, size: int) -> None:
    """Set the writer's cursor and write count and the storage's length, as a load does.

    Call with [`write_lock`][rlbuf._torchrl.write_lock] held. The sampler is loaded separately.
    """
    rb._writer._cursor = cursor
    rb._writer._write_count = write_count
    rb._storage._len = size


def skip_rows(rb: ReplayBuffer, n: int, capacity: int) -> None:
    """Advance the cursor and write count past ``n`` rows that were never stored.

    A write of more than ``capacity`` rows keeps only the newest ones; skipping the others
    first leaves the counters where TorchRL's ``extend`` of all of them would.
    """
    writer = rb._writer
    writer._cursor = (int(writer._cursor) + n) % capacity
    writer._write_count = int(writer._write_count) + n


def commit_rows(rb: ReplayBuffer, start: int, n: int, capacity: int) -> None:
    """Record ``n`` rows already copied into the storage from position ``start`` (after the cursor,
    wrapping at ``capacity``).

    Leaves the storage, writer and sampler exactly as TorchRL's ``extend`` of those rows
    would: the storage's last cursor, length and mutation revision, the writer's cursor and
    write count, the entities attached to the storage, and the sampler (``Sampler.extend``).
    A span that does not wrap goes to the storage as a ``range`` (which TorchRL's storages take
    as a cursor too), and a sampler that keeps nothing per row (TorchRL's base ``extend`` and
    ``mark_update`` do nothing) gets no index: every torch call here costs 0.1-0.3 ms when a
    network's step has evicted the caches, and a DQN loop commits before each sample.
    Call with [`replay_lock`][rlbuf._torchrl.replay_lock] and
    [`write_lock`][rlbuf._torchrl.write_lock] held.

    Example:
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4))
        >>> _ = rb.extend(TensorDict(obs=torch.arange(2.0), batch_size=[2]))   # rows 0 and 1
        >>> rb._storage._storage["obs"][2:4] = torch.tensor([7.0, 8.0])       # rows 2 and 3, copied in
        >>> commit_rows(rb, 2, 2, 4)
        >>> size(rb), cursor(rb), write_count(rb), rb[3]["obs"].item()
        (4, 0, 4, 8.0)
    """
    writer, storage, sampler = rb._writer, rb._storage, rb._sampler
    positions: range | torch.Tensor = range(start, start + n)
    if start + n > capacity:
        positions = torch.arange(start, start + n) % capacity
    storage._set_last_cursor(positions)
    storage._len = min(int(storage._len) + n, capacity)
    storage._bump_mutation_revision()
    writer._cursor = (int(writer._cursor) + n) % capacity
    writer._write_count = int(writer._write_count) + n
    # The writer's _mark_update_entities, less its dynamo wrapper; the buffer's own entry as TorchRL's
    # ReplayBuffer.mark_update runs it (rlbuf's hand-out would check the ring's own positions again).
    others = [entity for entity in storage._attached_entities_iter() if entity is not rb]
    keeps_rows = type(sampler).extend is not Sampler.extend or type(sampler).mark_update is not Sampler.mark_update
    if others or keeps_rows:  # an index tensor only where something reads one
        index = torch.as_tensor(positions)
        for entity in others:
            entity.mark_update(index)
        if keeps_rows:
            sampler.mark_update(index, storage=storage)
            sampler.extend(index)


# -- samplers --------------------------------------------------------------------------------

def sampler_generator(sampler: Sampler) -> torch.Generator | None:
    """The generator ``ReplayBuffer.set_rng`` gave the sampler (``Sampler._rng``), if any."""
    return getattr(sampler, "_rng", None)


def set_sampler_generator(sampler: Sampler, generator: torch.Generator | None) -> None:
    """Give a sampler used outside a buffer the generator ``ReplayBuffer.set_rng`` would give it."""
    sampler._rng = generator


# -- sending to worker processes -----------------------------------------------------------------

def pickled_cpu_tensors(state: Mapping[str, Any]) -> list[torch.Tensor]:
    """The CPU tensors in RAM that ``state`` (a buffer's ``__getstate__``) sends to a worker process.

    The storage's leaves and the bookkeeping tensors TorchRL keeps in the attributes of its
    storage, sampler and writer; memory-mapped leaves (files already) are left out.
    """
    found: list[torch.Tensor] = []
    _cpu_tensors(state, found, depth=0)
    return found


def _cpu_tensors(value: Any, found: list[torch.Tensor], depth: int) -> None:
    if isinstance(value, torch.Tensor):
        if value.device.type == "cpu" and not _is_memmap(value):
            found.append(value)
    elif is_tensor_collection(value):
        for leaf in value.values(include_nested=True, leaves_only=True):
            _cpu_tensors(leaf, found, depth)
    elif depth < 4 and isinstance(value, Mapping):
        for item in value.values():
            _cpu_tensors(item, found, depth + 1)
    elif depth < 4 and isinstance(value, (Sampler, Storage, Writer)):
        _cpu_tensors(vars(value), found, depth + 1)


def _is_memmap(tensor: torch.Tensor) -> bool:
    return isinstance(tensor, MemoryMappedTensor) or tensor.untyped_storage().filename is not None


def spawning_process() -> bool:
    """Whether this pickling is for a process being started (``multiprocessing``'s spawning popen)."""
    return get_spawning_popen() is not None


def register_reducer(kind: type, reducer: Callable[[Any], Any]) -> None:
    """Make ``multiprocessing`` pickle ``kind`` with ``reducer``, once (``ForkingPickler._extra_reducers``)."""
    if kind not in ForkingPickler._extra_reducers:  # type: ignore[attr-defined]
        ForkingPickler.register(kind, reducer)


def hold_shared_file(tensor: torch.Tensor, files: set[str]) -> None:
    """Put ``tensor`` in a shared-memory file, as pickling it for a process does, and hold that file once.

    Adds the file's name (under ``/dev/shm``) to ``files`` and takes one reference to it
    (``_share_filename_cpu_``, ``_shared_incref``) the first time it is seen, so torch's own
    count never drops to zero here and torch never unlinks it itself. A storage torch cannot
    share by file name is left alone.
    """
    with contextlib.suppress(RuntimeError):
        tensor.share_memory_()  # type: ignore[no-untyped-call]  # what pickling does next; no-op when shared
        storage = tensor.untyped_storage()
        name = os.fsdecode(storage._share_filename_cpu_()[1])
        if name not in files:
            storage._shared_incref()  # type: ignore[no-untyped-call]
            files.add(name)
