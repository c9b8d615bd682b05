"""The ring of rows every rlbuf buffer stores: pending rows, one commit, gathers (its snapshots: rlbuf._row_sinks).

TorchRL owns the storage, the writer's cursor and the sampler; the ring owns the write
pipeline. Every way rows enter goes the same three steps: the values are read into rows and
checked by each field's [`RowReader`][rlbuf.spec.RowReader] (nothing is written unless every
field passes), the rows are written, then committed under the lock, TorchRL's bookkeeping
(cursor, write count, length, sampler) brought up to date as its own ``extend`` would.

* A small add on a CPU storage is written with one numpy assignment per field (several times
  cheaper than a torch one) straight into the storage at the position after the pending rows;
  the commit of the pending rows is deferred until anything reads the buffer. On a GPU
  storage the rows are staged in numpy blocks that the commit copies to the device.
* Every other write (large adds, tensors off the CPU, ``extend``, ``env_mask``, the compact
  layout) reads its rows as tensors and writes them with one slice assignment per field.
* A rewrite of stored rows (a rollout's advantages) bumps the generation, so a snapshot in
  progress copies every row again.
* Gathers from a CPU storage use numpy ``take`` on its numpy views (0.3-0.9x the time of
  ``index_select``, itself about 4x faster than ``tensor[idx]``, at every batch and row size
  measured); other storages ``index_select`` on cached leaf views.

Example:
    >>> from rlbuf import ReplayBuffer
    >>> buf = ReplayBuffer(4, obs_shape=(2,), action_shape=())
    >>> ring = buf._ring
    >>> ring.add((torch.zeros(2), 0.0, 1.0, torch.ones(2), False, False), 1)
    >>> ring.pending, len(ring), ring.write_count
    (1, 1, 1)
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torchrl.data import TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import Sampler

from rlbuf import _torchrl
from rlbuf._convert import stored_positions
from rlbuf._delivery import gather_rows, rows_at
from rlbuf._derive import derive_rows
from rlbuf._device_checks import check_finite_together
from rlbuf._handout import FlushingReplayBuffer
from rlbuf._one_row import reading_all, writing_row
from rlbuf._torchrl_rows import TorchRLRows
from rlbuf.errors import BatchSizeError, EmptyBufferError, MissingFieldError
from rlbuf.spec import FieldSpec, NotStaged, RowReader, positive_int
from rlbuf.storage import BuiltStorage, check_batch_memory, remove_when_collected, row_bytes

_BLOCK_ROWS = 256
# Batches above this size are checked against the memory free now: one that cannot fit would only
# fail later, inside torch (or get the process killed).
_CPU = torch.device("cpu")
_FLAGS = ("terminated", "truncated")


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    """A plain-tensor view of a storage leaf (memmap subclasses add per-call overhead)."""
    return tensor.as_subclass(torch.Tensor) if type(tensor) is not torch.Tensor else tensor


def _writes_through(storing_device: torch.device) -> bool:
    """Whether adds are written straight into the storage (CPU memory) rather than staged for one device copy."""
    return storing_device.type == "cpu"


class RowRing:
    """A ring of ``capacity`` rows of ``specs`` in a TorchRL buffer, with cheap small adds (see the module).

    Args:
        specs: the stored fields, in order.
        built: the initialised TorchRL storage (see ``rlbuf.storage.build_storage``).
        sampler: the TorchRL sampler.
        rows_per_add: rows each add carries (``num_envs``).
        storing_device: where the storage lives.
        generator: the buffer's random generator (TorchRL's ``set_rng``).
        derived: fields computed from the others when rows are committed (e.g. ``done``
            from ``terminated | truncated``), never passed in by callers.
        whole_steps: rows come ``rows_per_add`` at a time and never wrap (a rollout): so must rows
            written through ``buffer.torchrl``.
    """

    def __init__(
        self,
        specs: Sequence[FieldSpec],
        built: BuiltStorage,
        sampler: Sampler,
        *,
        rows_per_add: int,
        storing_device: torch.device,
        generator: torch.Generator,
        derived: Mapping[str, Callable[[Mapping[str, torch.Tensor]], torch.Tensor]] | None = None,
        whole_steps: bool = False,
    ) -> None:
        self.specs = tuple(specs)
        self.derived = dict(derived or {})
        self.input_specs = tuple(s for s in self.specs if s.name not in self.derived)
        self.by_name = {spec.name: spec for spec in self.specs}
        self.row_bytes = row_bytes(self.specs)
        self.storing_device = storing_device
        self.generator = generator
        rb = FlushingReplayBuffer(storage=built.storage, sampler=sampler, batch_size=None, generator=generator)
        rb._flush_owner = weakref.ref(self)
        rb.set_rng(generator)
        self.rb = rb
        # TorchRL's own re-entrant buffer lock guards rlbuf's pending rows too, so adds, extends
        # and samples from several threads (rlbuf's or TorchRL's API) never interleave a row.
        self.lock = _torchrl.replay_lock(rb)
        self.capacity = int(built.storage.max_size)
        self.scratch_dir = built.scratch_dir
        # Tied to the TorchRL buffer: someone may keep `buffer.torchrl` after dropping the facade.
        self._remove_scratch = (remove_when_collected(rb, built.scratch_dir)
                                if built.owns_scratch_dir and built.scratch_dir is not None else None)
        leaves = _torchrl.storage_leaves(built.storage)
        # Leaves viewed in user shape: a reward leaf of TorchRL shape [C, 1] is used as [C].
        self.leaves = {s.name: _plain(leaves.get(s.key)).view(self.capacity, *s.shape) for s in self.specs}
        self.write_through = _writes_through(storing_device)
        # Set once the TorchRL buffer is handed out: every add is then committed at once, so its
        # storage and writer (read directly, not only through the buffer's methods) are current.
        self.handed_out = False
        if self.write_through:
            self.pending_limit = self.capacity
        else:
            self.pending_limit = min(_BLOCK_ROWS, self.capacity) if rows_per_add <= _BLOCK_ROWS else 0
        self.accepted_devices = (storing_device,) if storing_device.type == "cpu" else (storing_device, _CPU)
        # Writes through TorchRL (here or in a worker process) are read by the same readers.
        rb._rlbuf_rows = TorchRLRows(self.specs, self.derived, self.accepted_devices,
                                     whole_steps=(rows_per_add, self.capacity) if whole_steps else None)
        self.rows_per_add = rows_per_add
        self._readers: dict[tuple[FieldSpec, int], RowReader] = {}
        # Each input field's reader of one add's rows, in field order, and all of them in one call.
        self._reads = tuple(self.reader(s, rows_per_add).read for s in self.input_specs)
        self._read_all = reading_all(self._reads)
        if not self.write_through:
            self._set_targets({s.name: np.empty((self.pending_limit, *s.shape), s.np_dtype) for s in self.input_specs})
        self._derive_numpy_views()
        # The writer of an add, chosen once: staged (numpy rows written into the storage, or its
        # staging block) where adds fit the stage, else the tensor way.
        self.add: Callable[[Sequence[Any], int], None] = (
            self._add_one_row if rows_per_add == 1 and self.pending_limit
            else self._add_rows if self.pending_limit else self.add_unstaged)
        self.pending = 0
        self.moves = 0  # odd while rows move from ``pending`` to TorchRL's counters (``_with_pending``)
        # The rows of the last add, as their readers returned them, in input field order (the buffer reads a
        # step's flags there once it is stored: a Python bool for one row); of a larger write, only the flags.
        self.last_read: Sequence[Any] = ()
        self._pending_start = 0
        self._staged_on: tuple[int, int] | None = None  # TorchRL's (write count, size) under the staged rows: counts
        self._derived_rows = 0  # pending rows whose derived fields are computed already (``settle``)
        self.generation = 0  # bumped when rows change without a write: clear, load, rewrites, TorchRL's __setitem__

    def __del__(self) -> None:
        # Someone may keep `buffer.torchrl` after dropping the facade: commit what it accepted.
        # Not at interpreter exit: nobody reads any more, and torch 2.13 aborts (exit status
        # 134, THPVariable_clear) when tensors are made while modules are torn down.
        if getattr(self, "pending", 0) and not sys.is_finalizing():
            with contextlib.suppress(Exception):  # nothing may be raised from a finalizer
                self.flush()

    # -- state -----------------------------------------------------------------------------
    def __len__(self) -> int:
        moves = self.moves  # ``_with_pending`` inline: len() is read on every sample
        size = _torchrl.size(self.rb) + self.pending
        if moves & 1 or moves != self.moves:
            size = self._with_pending(_torchrl.size)
        return min(size, self.capacity)

    @property
    def cursor(self) -> int:
        """Storage position the next row goes to (pending rows included)."""
        return self._with_pending(_torchrl.cursor) % self.capacity

    @property
    def write_count(self) -> int:
        """Rows ever written (pending rows included)."""
        return self._with_pending(_torchrl.write_count)

    def counts(self) -> tuple[int, int]:
        """``(write_count, len(self))``, under the lock. TorchRL's counters stand still while rows are staged (a write
        through TorchRL commits them first): read once per stage, not per add; forgotten at its commit and at clear."""
        pending, staged_on = self.pending, self._staged_on
        if not pending or staged_on is None:
            staged_on = (_torchrl.write_count(self.rb), _torchrl.size(self.rb))
            self._staged_on = staged_on if pending else None
        return staged_on[0] + pending, min(staged_on[1] + pending, self.capacity)

    def _with_pending(self, committed: Callable[[TensorDictReplayBuffer], int]) -> int:
        """``committed(rb) + pending``, read without the lock unless a commit moved rows between the two.

        A commit zeroes ``pending`` and then raises TorchRL's counters: a read between the two would
        miss the rows (a thread's own add not counted). Commits make ``moves`` odd while they run, so
        a read that saw one start or end is taken again under the lock (a lock per read would add
        about a fifth to ``len()``).
        """
        moves = self.moves
        value = committed(self.rb) + self.pending
        if moves & 1 or moves != self.moves:
            with self.lock:
                return committed(self.rb) + self.pending
        return value

    def close(self) -> None:
        """Remove the scratch directory rlbuf created, if any."""
        if self._remove_scratch is not None:
            self._remove_scratch()

    def share_storage(self) -> None:
        """Place a RAM storage in shared memory and mark the buffer shared across processes.

        Moving memory invalidates numpy views of it, so they are derived again.
        """
        storage = _torchrl.storage_leaves(self.rb.storage)
        if self.storing_device.type == "cpu" and not storage.is_memmap() and not storage.is_shared():
            storage.share_memory_()
        if not getattr(self.rb, "shared", False):
            self.rb.share()
        self._derive_numpy_views()

    def _set_targets(self, targets: dict[str, np.ndarray]) -> None:
        """Where staged rows go: ``targets`` by name, and in field order."""
        self.targets = targets
        self._target_list = tuple(targets[s.name] for s in self.input_specs)
        self._write_row = writing_row(self._target_list)

    def _derive_numpy_views(self) -> None:
        # Every leaf of a CPU storage as numpy: staged rows are written there, a few rows' derived
        # fields are computed there, and batches are gathered from there.
        self._arrays = {name: leaf.numpy() for name, leaf in self.leaves.items()} if self.write_through else {}
        if self.write_through:
            self._set_targets({s.name: self._arrays[s.name] for s in self.input_specs})

    def clear(self) -> None:
        """Drop every row, pending or stored."""
        with self.lock:
            self.moves += 1
            try:
                self.pending, self._derived_rows, self._staged_on = 0, 0, None
                self.rb.empty()
            finally:
                self.moves += 1

    def counters(self) -> tuple[int, int, int]:
        """``(size, cursor, write_count)`` of the committed rows; call with the locks held."""
        rb = self.rb
        return min(_torchrl.size(rb), self.capacity), _torchrl.cursor(rb), _torchrl.write_count(rb)

    # -- writing ---------------------------------------------------------------------------
    def reader(self, spec: FieldSpec, rows: int) -> RowReader:
        """The [`RowReader`][rlbuf.spec.RowReader] of ``rows`` rows of ``spec`` (made once, then kept)."""
        key = (spec, rows)
        reader = self._readers.get(key)
        if reader is None:
            reader = self._readers[key] = RowReader(spec, rows, self.accepted_devices)
        return reader

    def read_tensors(self, specs: Sequence[FieldSpec], values: Sequence[Any], rows: int) -> dict[str, torch.Tensor]:
        """``rows`` rows of each field as tensors, read and checked by its reader, by name (the
        finiteness of device tensors checked together, with one wait for the device)."""
        later: list[tuple[FieldSpec, torch.Tensor]] = []
        read = {spec.name: self.reader(spec, rows).tensor(value, later) for spec, value in zip(specs, values, strict=True)}
        check_finite_together(later)
        return read

    def _add_one_row(self, values: Sequence[Any], rows: int) -> None:
        """``add`` of one row per add, staged: read every field, then one numpy assignment per field."""
        if len(values) != len(self._reads):
            raise AssertionError(f"expected {len(self._reads)} values, one per input field, got {len(values)}")
        lock = self.lock
        lock.acquire()  # not ``with``: 0.07 us of a 3.5 us add
        try:
            if self.rb.shared:
                return self.add_unstaged(values, rows)
            try:
                read = self._read_all(values)
            except NotStaged:
                return self.add_unstaged(values, rows)
            self._write_one(read)
        finally:
            lock.release()
        return None

    def _write_one(self, read: Sequence[Any]) -> None:
        """Write one row of every input field as its one-row readers returned it (``_read_all``), after the pending
        rows; call with the lock held."""
        pending = self.pending
        if 0 < pending < self.pending_limit and self.write_through:
            position = (self._pending_start + pending) % self.capacity
        else:
            position = self._claim(1)
        self._write_row(position, read)
        self.pending += 1
        self.last_read = read
        if self.handed_out:
            self.flush()  # TorchRL's storage and writer are read directly: keep them current

    def _add_rows(self, values: Sequence[Any], rows: int) -> None:
        """``add`` of several rows per add, staged when they fit the stage, else the tensor way."""
        with self.lock:
            arrays = self.read_staged(values, rows)
            if arrays is None:
                return self.add_unstaged(values, rows)
            self.write_staged(arrays, rows)
        return None

    def read_staged(self, values: Sequence[Any], rows: int) -> list[Any] | None:
        """Every input field of an add of ``rows`` rows read by its staged reader (numpy rows,
        checked), in field order; ``None`` where the add cannot be staged (read it as tensors)."""
        if rows != self.rows_per_add or rows > self.pending_limit or self.rb.shared:
            return None
        if len(values) != len(self._reads):
            raise AssertionError(f"expected {len(self._reads)} values, one per input field, got {len(values)}")
        try:
            return self._read_all(values)
        except NotStaged:
            return None

    def write_staged(self, arrays: Sequence[Any], rows: int) -> None:
        """Write rows that ``read_staged`` returned, after the pending ones (with the lock held)."""
        with self.lock:
            position = self._claim(rows)
            if position + rows <= self.capacity:
                for target, array in zip(self._target_list, arrays, strict=True):
                    target[position:position + rows] = array
            else:
                first = self.capacity - position
                for target, array in zip(self._target_list, arrays, strict=True):
                    target[position:] = array[:first]
                    target[:rows - first] = array[first:]
            self.pending += rows
            self.last_read = arrays
            if self.handed_out:
                self.flush()
        return None

    def add_unstaged(self, values: Sequence[Any], rows: int) -> None:
        """The tensor way of ``add``: every field read as a tensor by its reader, then written at once."""
        self.write_checked(self.read_tensors(self.input_specs, values, rows), rows)

    def _claim(self, rows: int) -> int:
        """Where the next ``rows`` staged rows go (committing the pending ones when the stage is full).

        Call with the lock held, once the rows are validated; the caller adds ``rows`` to ``pending``.
        """
        pending = self.pending
        if pending + rows > self.pending_limit:
            self.flush()
            pending = 0
        if not self.write_through:
            return pending
        if pending == 0:
            self._pending_start = _torchrl.cursor(self.rb)
        return (self._pending_start + pending) % self.capacity

    def hand_out(self) -> TensorDictReplayBuffer:
        """The TorchRL buffer, current now and after every later add (see ``handed_out``)."""
        with self.lock:
            self.handed_out = True
            self.flush()
        return self.rb

    def flush(self) -> None:
        """Commit the pending rows: TorchRL's bookkeeping (and, on a GPU storage, the copy)."""
        if not self.pending:
            return
        with self.lock:
            self.moves += 1
            try:
                n, self.pending, self._staged_on = self.pending, 0, None
                derived, self._derived_rows = self._derived_rows, 0
                if self.write_through:
                    with _torchrl.write_lock(self.rb):  # not re-entrant when the buffer is shared across processes
                        self._commit(n, derived=derived)
                else:
                    self.write({name: torch.from_numpy(target[:n]) for name, target in self.targets.items()}, n)
            finally:
                self.moves += 1

    def settle(self) -> None:
        """Make the pending rows readable by rlbuf's own gathers, leaving TorchRL's bookkeeping for ``flush``.

        On a CPU storage the rows are in place already: only their derived fields are computed
        (``done``), so a loop that adds one row and samples every step does not pay TorchRL's
        commit every step. Reads through TorchRL, the sum tree, snapshots and epochs ``flush``.
        """
        if not self.pending:
            return
        with self.lock:
            if not self.write_through:
                self.flush()
            elif self.derived and self._derived_rows < self.pending:
                derive_rows(self._arrays or self.leaves, self.derived,
                            (self._pending_start + self._derived_rows) % self.capacity,
                            self.pending - self._derived_rows, capacity=self.capacity)
                self._derived_rows = self.pending

    def write_tensors(self, values: Mapping[str, Any], rows: int) -> None:
        """Read ``rows`` rows of every input field (tensors, arrays ...) with its reader, then write them now."""
        self.write_checked(self.read_tensors(self.input_specs, [values[s.name] for s in self.input_specs], rows), rows)

    def prepared(self, values: Sequence[Any], rows: int, *, given: str = "add") -> Callable[[], None]:
        """A write in two steps, for a layout that checks more between them (the compact layout's streams): ``rows``
        rows of every input field (``values``, in field order) read and checked by their readers now, nothing
        written; the call returned writes them. ``given``: ``"add"``, an add's values (staged where they fit the
        stage, as ``add`` stages them, else the tensor way); ``"read"``, rows its readers read already (some of an
        add's rows, kept by ``env_mask``: staged as they are where they are numpy rows that fit); ``"extend"``, the
        tensor way.

        Raises:
            ShapeError, DtypeError, DeviceError, NonFiniteError, MissingFieldError: a reader refused a value.
        """
        arrays: Sequence[Any] | None = None
        if given == "add":
            arrays = self.read_staged(values, rows)
        elif given == "read" and 0 < rows <= self.pending_limit and not self.rb.shared and not any(
                isinstance(array, torch.Tensor) for array in values):
            arrays = values
        if arrays is None:
            columns = self.read_tensors(self.input_specs, values, rows)
            return lambda: self.write_checked(columns, rows)
        staged = arrays
        if given == "add" and rows == 1:  # as its readers read it: one assignment per field (Python numbers)
            return lambda: self._write_one(staged)
        return lambda: self.write_staged(staged, rows)

    def write_checked(self, columns: Mapping[str, torch.Tensor], rows: int) -> None:
        """Write ``rows`` rows that their readers returned (``read_tensors``) now, after the pending ones."""
        with self.lock:
            self.flush()
            self.write(columns, rows)
            # Only the flags: a large write (an extend) is not kept alive by the ring.
            self.last_read = [columns.get(spec.name) if spec.name in _FLAGS else None for spec in self.input_specs]

    @contextlib.contextmanager
    def rewriting(self, call: str) -> Iterator[None]:
        """Hold the lock while the public ``call`` changes stored rows in place (a rollout's advantages and
        returns); ``ReadOnlyError`` first on a read-only buffer.

        The pending rows are committed first, and the generation is bumped, so a snapshot in
        progress copies every row again rather than mixing old and new values.
        """
        self.rb._rlbuf_require_writable(call)
        with self.lock:
            self.flush()
            self.generation += 1
            yield

    def mark_truncated(self, positions: np.ndarray[Any, Any]) -> None:
        """Set ``truncated`` of the stored rows at ``positions`` and derive their computed fields again;
        call inside [`rewriting`][rlbuf._ring.RowRing.rewriting]."""
        leaves = self._arrays or self.leaves
        for position in positions.tolist():
            leaves["truncated"][position] = True
            if self.derived:
                derive_rows(leaves, self.derived, position, 1, capacity=self.capacity)

    def write(self, columns: Mapping[str, torch.Tensor], n: int) -> None:
        """Write ``n`` validated rows of the input fields at the cursor, oldest overwritten first.

        Keeps TorchRL's writer, storage and sampler bookkeeping exactly as its own
        ``extend`` would leave it.
        """
        rb = self.rb
        capacity = self.capacity
        with _torchrl.replay_lock(rb), _torchrl.write_lock(rb):
            if n > capacity:
                # Only the newest `capacity` rows survive; writing them in order keeps the cursor right.
                skipped = n - capacity
                _torchrl.skip_rows(rb, skipped, capacity)
                columns = {name: column[skipped:] for name, column in columns.items()}
                n = capacity
            cursor = _torchrl.cursor(rb)
            first = min(n, capacity - cursor)
            arrays = self._arrays
            for name, column in columns.items():
                if arrays and column.is_cpu:
                    # A CPU storage through numpy: torch splits a copy of a few frames over its intra-op
                    # threads, which stall whenever the other core of a small machine is busy.
                    target, rows = arrays[name], column.numpy()
                    target[cursor:cursor + first] = rows[:first]
                    if first < n:
                        target[:n - first] = rows[first:]
                else:
                    leaf = self.leaves[name]
                    leaf[cursor:cursor + first].copy_(column[:first], non_blocking=True)
                    if first < n:
                        leaf[:n - first].copy_(column[first:], non_blocking=True)
            self._commit(n)

    def _commit(self, n: int, *, derived: int = 0) -> None:
        """Derive computed fields over the ``n`` rows after the cursor (but the first ``derived``, done
        already) and advance TorchRL's state."""
        if n == 0:  # an empty extend: TorchRL's bookkeeping of no positions (a float index) is refused by PER
            return
        rb, capacity = self.rb, self.capacity
        cursor = _torchrl.cursor(rb)
        if self.derived and n > derived:
            derive_rows(self._arrays or self.leaves, self.derived, (cursor + derived) % capacity, n - derived,
                        capacity=capacity)
        # On the CPU whatever the storing device: TorchRL reads the last position with .item() and
        # the sum tree works in numpy, so a CUDA index would cost a sync and copies per commit.
        _torchrl.commit_rows(rb, cursor, n, capacity)

    # -- reading ---------------------------------------------------------------------------
    def require_rows(self, batch_size: int, *, without_replacement: bool) -> int:
        """Check that ``batch_size`` rows can be drawn and return it as an int; flushes nothing.

        A batch that could not fit in this machine's memory is refused before anything is drawn.
        """
        batch_size = positive_int("batch_size", batch_size, BatchSizeError)
        size = len(self)
        if size == 0:
            raise EmptyBufferError("cannot sample from an empty buffer: add transitions first")
        if without_replacement and batch_size > size:
            raise BatchSizeError(f"batch_size: expected at most {size} (the rows stored), got {batch_size}")
        check_batch_memory(batch_size, self.row_bytes)
        return batch_size

    def as_index(self, index: Any) -> torch.Tensor:
        """Validate stored-row positions (see [`stored_positions`][rlbuf._convert.stored_positions])."""
        return stored_positions(index, len(self), self.storing_device)

    def chronological_index(self) -> torch.Tensor:
        """Storage positions of every stored row, oldest first."""
        self.flush()
        size = len(self)
        positions = torch.arange(size, device=self.storing_device)
        if size == self.capacity:
            positions = (positions + _torchrl.cursor(self.rb)) % self.capacity
        return positions

    def gather(self, index: torch.Tensor, names: Sequence[str] | None = None, *,
               pinned: bool = False) -> dict[str, torch.Tensor]:
        """The rows at ``index`` (storage positions) of the named fields; with ``pinned``, gathered
        straight into page-locked memory (CPU storage only), ready for a non-blocking copy to CUDA."""
        with self.lock:
            self.settle()
            # Writer processes of a shared buffer hold this lock while they write a row.
            with _torchrl.write_lock(self.rb):
                if pinned:
                    return {name: gather_rows(self.leaves[name], self._arrays.get(name), index, pin_memory=True)
                            for name in (names or self.leaves)}
                return self._select(index, names)

    @contextlib.contextmanager
    def reading_arrays(self) -> Iterator[Mapping[str, np.ndarray[Any, Any]] | None]:
        """The stored fields as numpy arrays by name, for a compiled reader, readable (pending rows
        settled) and held against writers (threads, and writer processes of a shared buffer) while the
        block runs; ``None`` on a storage that is not in CPU memory. Call nothing that locks the ring
        inside it (``gather``): a shared buffer's write lock is not re-entrant.

        Example:
            >>> from rlbuf import ReplayBuffer
            >>> ring = ReplayBuffer(4, obs_shape=(2,), action_shape=())._ring
            >>> with ring.reading_arrays() as arrays:
            ...     arrays["obs"].shape
            (4, 2)
        """
        with self.lock:
            self.settle()
            with _torchrl.write_lock(self.rb):
                yield self._arrays or None

    def _select(self, index: torch.Tensor, names: Sequence[str] | None) -> dict[str, torch.Tensor]:
        arrays = self._arrays
        if not arrays:
            return {name: rows_at(self.leaves[name], index) for name in (names or self.leaves)}
        # A CPU storage: numpy's take beats index_select at every batch and row size measured (0.3-0.9x its time).
        positions = index.numpy()
        return {name: torch.from_numpy(arrays[name].take(positions, axis=0)) for name in (names or arrays)}

    def check_field_names(self, names: Sequence[str]) -> None:
        """Raise [`MissingFieldError`][rlbuf.errors.MissingFieldError] for names that are not stored fields."""
        check_field_names(names, self.by_name, "stored fields")


def check_field_names(names: Sequence[str], known: Collection[str], kind: str) -> None:
    """Raise [`MissingFieldError`][rlbuf.errors.MissingFieldError] unless ``names`` is a collection of ``known``
    names (``kind`` says what they are in the message).

    Example:
        >>> check_field_names(["obs"], {"obs", "action"}, "fields")
        >>> check_field_names("obs", {"obs"}, "fields")
        Traceback (most recent call last):
        rlbuf.errors.MissingFieldError: fields: expected a list of field names, got 'obs'
    """
    if isinstance(names, (str, bytes)) or not isinstance(names, (Sequence, set, frozenset)):
        raise MissingFieldError(f"fields: expected a list of field names, got {names!r}")
    unknown = [name for name in names if not isinstance(name, str) or name not in known]
    if unknown:
        raise MissingFieldError(f"fields: unknown {unknown}; {kind} are {list(known)}")
