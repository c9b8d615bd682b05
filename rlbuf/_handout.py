"""The hand-out to TorchRL: ``buffer.torchrl``, and sending a buffer to worker processes.

[`FlushingReplayBuffer`][rlbuf._handout.FlushingReplayBuffer] is the TorchRL
``TensorDictReplayBuffer`` a ring hands out: every read or write through TorchRL's API first
commits the ring's pending rows, under the one lock every write takes. Every write through it
(``add``, ``extend``, ``rb[index] = td``, ``update_priority``, ``mark_update``) is read by the
fields' readers first ([`TorchRLRows`][rlbuf._torchrl_rows.TorchRLRows]: every input field
required, ``done`` derived, stored positions only, valid priorities, a rollout's new rows whole
steps that fit, checked once its pending rows are committed); TorchRL-level loads and
in-place key writes are refused, and reads hand out copies. Pickled for a worker process, it
keeps those checks, moves RAM storage into shared memory and unlinks those shared-memory files
once the learner's buffer is collected.

Example:
    >>> import torch
    >>> from rlbuf import ReplayBuffer
    >>> buf = ReplayBuffer(8, obs_shape=(2,), action_shape=())
    >>> buf.add(torch.zeros(2), 0.0, 1.0, torch.ones(2), False, truncated=False)
    >>> rb = buf.torchrl
    >>> type(rb).__name__, len(rb)
    ('FlushingReplayBuffer', 1)
"""

from __future__ import annotations

import contextlib
import os
import warnings
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.multiprocessing
from tensordict import is_tensor_collection
from torchrl.data import TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import PrioritizedSampler

from rlbuf import _torchrl
from rlbuf._convert import stored_positions
from rlbuf._priorities import priorities
from rlbuf._torchrl_rows import TorchRLRows, positions
from rlbuf.errors import ConfigError, ReadOnlyError, ShapeError

if TYPE_CHECKING:
    from rlbuf._ring import RowRing

_SHARED_MEMORY_DIR = "/dev/shm"  # where torch's file_system sharing strategy keeps its files on Linux


class FlushingReplayBuffer(TensorDictReplayBuffer):  # type: ignore[misc]
    """TorchRL's ``TensorDictReplayBuffer`` that first commits rlbuf's pending rows.

    Every public read or write of TorchRL's API takes the buffer's lock, commits the owner's
    pending rows and runs TorchRL's own method, all under that one lock: a collector or loss
    holding ``buffer.torchrl`` sees exactly what the rlbuf facade holds, and its writes never
    interleave with rlbuf's (one commit protocol for both). A rewrite of stored rows bumps the
    owner's generation, so a snapshot in progress copies every row again.
    """

    # A weak reference: a reference cycle would leave tensors to the garbage collector, and
    # torch 2.13 aborts (THPVariable_clear) when it clears some of them.
    _flush_owner: weakref.ReferenceType[RowRing] | None = None
    # The checks of rows written through TorchRL; kept when pickled, so worker processes check too.
    _rlbuf_rows: TorchRLRows | None = None
    # The owner's ``read_only`` (set through the rlbuf buffer): every write refused.
    _rlbuf_read_only: bool = False

    def _owner(self) -> RowRing | None:
        return self._flush_owner() if self._flush_owner is not None else None

    def _locked(self, method: Callable[..., Any], *args: Any, rewrites: bool = False, **kwargs: Any) -> Any:
        with _torchrl.replay_lock(self):
            owner = self._owner()
            if owner is not None:
                owner.flush()
                if rewrites:
                    owner.generation += 1
            return method(*args, **kwargs)

    def __len__(self) -> int:
        return int(self._locked(super().__len__))

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        return self._locked(super().sample, *args, **kwargs)

    def extend(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        self._rlbuf_require_writable("extend")
        checked = self._checked(data, batched=True)
        with _torchrl.replay_lock(self):
            self._require_room("extend", checked)
            return self._locked(super().extend, checked, *args, **kwargs)

    def add(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        self._rlbuf_require_writable("add")
        checked = self._checked(data, batched=False)
        with _torchrl.replay_lock(self):
            self._require_room("add", checked)
            return self._locked(super().add, checked, *args, **kwargs)

    def _require_room(self, call: str, checked: Any) -> None:
        """Refuse new rows a rollout has no room for, or that are no whole steps (``TorchRLRows.require_room``),
        against the rows stored once the owner's pending ones are committed; call with the lock held."""
        rows = self._rlbuf_rows
        if rows is None or rows.whole_steps is None:
            return
        owner = self._owner()
        if owner is not None:
            owner.flush()
        rows.require_room(call, int(checked.batch_size.numel()), _torchrl.size(self))

    def _rlbuf_require_writable(self, call: str) -> None:
        """Raise ``ReadOnlyError`` for a write ``call`` while the buffer is read-only (nothing changed yet)."""
        if self._rlbuf_read_only:
            raise ReadOnlyError(f"{call}: this buffer is read-only (read_only=True: a dataset, or the offline buffer "
                                f"of a MixedReplay); write to another buffer, or set buffer.read_only = False first")

    def _checked(self, data: Any, *, batched: bool) -> Any:
        """``data`` as the stored keys only, every input field read and checked by its reader, the
        derived ones computed (a given ``done`` must match), and a priority checked as
        ``update_priority`` checks it. Nothing is written when one check fails."""
        rows = self._rlbuf_rows
        if rows is None:
            return data
        checked = self._untransformed(rows.rows(data, batched=batched))
        priority = data.get(self.priority_key, None) if isinstance(self._sampler, PrioritizedSampler) else None
        if priority is not None:
            checked.set(self.priority_key, priorities(priority, priority.numel()).to(torch.float32).reshape(
                priority.shape) if isinstance(priority, torch.Tensor) else priority)
        return checked

    def _untransformed(self, checked: Any) -> Any:
        """``checked``, once the inverse of the transforms attached to this buffer (``append_transform``),
        which TorchRL applies to what it writes, is seen to leave it unchanged (else what is stored
        would not be what the readers checked)."""
        transform = self._transform
        if transform is None or not len(transform):
            return checked
        inverted = transform.inv(checked.clone())
        keys = set(checked.keys(include_nested=True, leaves_only=True))
        if inverted is None or set(inverted.keys(include_nested=True, leaves_only=True)) != keys or not all(
                torch.equal(inverted.get(key), checked.get(key)) for key in keys):
            raise ConfigError("torchrl: the inverse of the transforms attached to buffer.torchrl changes the rows "
                              "written, past rlbuf's checks; apply them before writing, or attach transforms "
                              "that only act on samples")
        return checked

    def __getitem__(self, index: Any) -> Any:
        # A copy: TorchRL hands out views of the storage for ints and slices, which would let a
        # caller change stored rows in place, past every check.
        return _copied(self._locked(super().__getitem__, index))

    def __setitem__(self, index: Any, value: Any) -> None:
        self._rlbuf_require_writable("__setitem__")
        with _torchrl.replay_lock(self):
            owner = self._owner()
            if owner is not None:
                owner.flush()
            if self._rlbuf_rows is not None:
                index, rows = positions(index, _torchrl.size(self), self._rlbuf_device())
                if rows is not None and (not is_tensor_collection(value) or tuple(value.batch_size) != (rows,)):
                    got = tuple(value.batch_size) if is_tensor_collection(value) else type(value).__name__
                    raise ShapeError(f"value: expected a TensorDict of batch size ({rows},), one row per "
                                     f"position, got {got}")
                value = self._untransformed(self._rlbuf_rows.rows(value, batched=rows is not None))
            self._locked(super().__setitem__, index, value, rewrites=True)

    def update_priority(self, index: Any, priority: Any, *args: Any, **kwargs: Any) -> Any:
        with _torchrl.replay_lock(self):
            owner = self._owner()
            if owner is not None:
                owner.flush()
            if self._rlbuf_rows is not None:
                index = stored_positions(index, _torchrl.size(self), self._rlbuf_device())
                priority = priorities(priority, index.numel())
            return self._locked(super().update_priority, index, priority, *args, **kwargs)

    def mark_update(self, index: Any) -> None:
        # A prioritized sampler gives the positions the default priority: stored positions only.
        with _torchrl.replay_lock(self):
            owner = self._owner()
            if owner is not None:
                owner.flush()
            if self._rlbuf_rows is not None:
                index = stored_positions(index, _torchrl.size(self), self._rlbuf_device())
            self._locked(super().mark_update, index)

    def empty(self, *args: Any, **kwargs: Any) -> Any:
        self._rlbuf_require_writable("empty")
        return self._locked(super().empty, *args, rewrites=True, **kwargs)

    def state_dict(self) -> Any:
        # A copy, as rlbuf's own state_dict: TorchRL's holds the storage's tensors themselves.
        return _copied(self._locked(super().state_dict))

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        self._refuse("load_state_dict", "buffer.load_state_dict(state)")

    def dumps(self, path: Any) -> Any:
        return self._locked(super().dumps, path)

    def loads(self, path: Any) -> Any:
        self._refuse("loads", "ReplayBuffer.load(path) (or RolloutBuffer.load, DistillationBuffer.load)")

    def load(self, *args: Any, **kwargs: Any) -> Any:
        self._refuse("load", "ReplayBuffer.load(path) (or RolloutBuffer.load, DistillationBuffer.load)")

    def set_at_(self, *args: Any, **kwargs: Any) -> Any:
        self._refuse("set_at_", "rb[index] = td, with every input field")

    def set_(self, *args: Any, **kwargs: Any) -> Any:
        self._refuse("set_", "rb[index] = td, with every input field")

    def update_(self, *args: Any, **kwargs: Any) -> Any:
        self._refuse("update_", "rb[index] = td, with every input field")

    def update_if_present(self, *args: Any, **kwargs: Any) -> Any:
        self._refuse("update_if_present", "rb[index] = td, with every input field")

    def submit_update_if_present(self, *args: Any, **kwargs: Any) -> Any:
        self._refuse("submit_update_if_present", "rb[index] = td, with every input field")

    def set_storage(self, *args: Any, **kwargs: Any) -> Any:
        self._refuse("set_storage", "a new rlbuf buffer (storage=, capacity)")

    def set_sampler(self, *args: Any, **kwargs: Any) -> Any:
        self._refuse("set_sampler", "a new rlbuf buffer (prioritized=, alpha=, beta=)")

    def set_writer(self, *args: Any, **kwargs: Any) -> Any:
        self._refuse("set_writer", "rlbuf's own writes (add, extend)")

    def _refuse(self, method: str, instead: str) -> None:
        """Refuse a TorchRL method that would install rows or state rlbuf's checks never see.

        A TorchRL state (``load_state_dict``, ``loads``) carries only TorchRL's part of a buffer:
        rlbuf's own state (episode statistics, stream tables, a rollout's progress) would no longer
        match the rows, so loads go through rlbuf's one load check instead. In-place writes of
        single keys (``set_at_`` ...) would skip the derived fields and the readers; another
        storage, sampler or writer (``set_storage`` ...) would drop the rows or priorities rlbuf holds.
        """
        if self._rlbuf_rows is None:
            raise ConfigError(f"torchrl.{method}: not available on this buffer")
        raise ConfigError(f"torchrl.{method}: refused on rlbuf's buffer.torchrl, whose rows and state rlbuf "
                          f"checks; use {instead}")

    def _rlbuf_device(self) -> torch.device:
        rows = self._rlbuf_rows
        return rows.devices[0] if rows is not None else torch.device("cpu")

    def __getstate__(self) -> dict[str, Any]:
        # Pickled for a worker process: commit pending rows, put RAM storage in shared memory
        # (so workers write where the learner reads) and let the owner re-derive its numpy views
        # of the moved memory. The worker gets no owner: it writes through TorchRL directly, its
        # rows checked by the same readers (``_rlbuf_rows`` travels with the buffer).
        # The sharing strategy is set first, so memory moves into shared memory once, not twice.
        prepare_process_sharing()
        spawning = _torchrl.spawning_process()
        owner = self._owner()
        if owner is not None and spawning:
            owner.flush()
            owner.share_storage()
        state = dict(super().__getstate__())
        if spawning:
            _unlink_shared_files_with(self, state)
        # The learner's own: its owner, and the shared files it unlinks when collected.
        for name in ("_flush_owner", "_rlbuf_shared_files", "_rlbuf_unlink_shared_files"):
            state.pop(name, None)
        return state


def _copied(value: Any) -> Any:
    """``value`` with every tensor and TensorDict in it cloned (mappings, lists and tuples walked)."""
    if isinstance(value, torch.Tensor) or is_tensor_collection(value):
        return value.clone()
    if isinstance(value, dict):
        copied = {key: _copied(item) for key, item in value.items()}
        return copied if type(value) is dict else type(value)(copied)
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_copied(item) for item in value)
    return value


def _unlink_shared_files_with(rb: FlushingReplayBuffer, state: Mapping[str, Any]) -> None:
    """Unlink the ``/dev/shm`` files of the tensors ``state`` sends to a worker when ``rb`` is collected.

    torch frees such a file when the last process holding it frees the tensor, but worker
    processes seldom free what they received before they exit, so the files would stay until
    the learner exits. Removing a name keeps every mapping valid: workers still running keep
    writing where the learner reads; only new workers could no longer receive the buffer.
    Each file is held once more here (see ``_torchrl.hold_shared_file``), so torch never
    unlinks it itself (it aborts when the name is already gone).
    """
    files: set[str] = rb.__dict__.setdefault("_rlbuf_shared_files", set())
    for tensor in _torchrl.pickled_cpu_tensors(state):
        _torchrl.hold_shared_file(tensor, files)
    if files and "_rlbuf_unlink_shared_files" not in rb.__dict__:
        rb.__dict__["_rlbuf_unlink_shared_files"] = weakref.finalize(rb, _unlink_shared_files, files)


def _unlink_shared_files(files: set[str]) -> None:
    for name in files:
        with contextlib.suppress(OSError):  # already gone: torch's manager removes them when the learner exits
            os.unlink(_SHARED_MEMORY_DIR + name)


def _rebuild_generator(device: str, state: bytes) -> torch.Generator:
    generator = torch.Generator(device=device)
    generator.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))
    return generator


def _reduce_generator(generator: torch.Generator) -> tuple[Any, tuple[str, bytes]]:
    # The state travels as bytes: sharing it as a tensor fails in spawned processes under torch 2.13.
    return _rebuild_generator, (str(generator.device), generator.get_state().numpy().tobytes())


def prepare_process_sharing() -> None:
    """Make a buffer sendable to worker processes under torch 2.13.

    Generators go by value (torch cannot send one to a spawned process, and TorchRL's storage,
    writer and sampler all hold the buffer's generator), and tensors go through the
    ``file_system`` sharing strategy (the default ``file_descriptor`` one fails to rebuild some
    of TorchRL's small bookkeeping tensors in the child).
    """
    _torchrl.register_reducer(torch.Generator, _reduce_generator)
    if torch.multiprocessing.get_sharing_strategy() != "file_system":  # type: ignore[no-untyped-call]
        warnings.warn("rlbuf: switching torch.multiprocessing's sharing strategy to 'file_system' so this "
                      "buffer can be sent to worker processes (torch 2.13's 'file_descriptor' strategy fails "
                      "on TorchRL's storage bookkeeping)", RuntimeWarning, stacklevel=3)
        torch.multiprocessing.set_sharing_strategy("file_system")  # type: ignore[no-untyped-call]
