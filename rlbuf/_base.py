"""RingBuffer: what ReplayBuffer and DistillationBuffer share (sizes, devices, reads, epochs).

A subclass builds its field specs and sampler, calls ``RingBuffer._setup``, and turns
gathered columns into its typed batch in ``RingBuffer._make_batch``.
"""

from __future__ import annotations

import inspect
import secrets
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, Self, TypeVar, overload

import torch
from torchrl.data import TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import Sampler

from rlbuf._core import RowRing, deliver
from rlbuf.checkpoint import load_state, save_state
from rlbuf.epochs import EpochIterator, batch_bounds
from rlbuf.errors import CheckpointError, ConfigError, EmptyBufferError
from rlbuf.spec import FieldSpec, positive_int
from rlbuf.stats import EpisodeStats
from rlbuf.storage import DeviceLike, StorageKind, build_storage, resolve_device

BatchT = TypeVar("BatchT")
BufferT = TypeVar("BufferT", bound="RingBuffer[Any]")
_NOT_OPTIONS = ("self", "__class__", "stats", "scratch_dir")
_ITERATOR_METHODS = ("epochs", "minibatches")


class MetadataOnlyWarning(UserWarning):
    """A checkpoint saved with ``data=False`` was loaded: the buffer is empty."""


def _option_to_json(value: Any) -> Any:
    if isinstance(value, torch.dtype):
        return "dtype:" + str(value).removeprefix("torch.")
    if isinstance(value, torch.device):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _option_to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_option_to_json(v) for v in value]
    return value


def _option_from_json(value: Any) -> Any:
    if isinstance(value, str) and value.startswith("dtype:"):
        dtype = getattr(torch, value.removeprefix("dtype:"), None)
        if not isinstance(dtype, torch.dtype):
            raise CheckpointError(f"options: unknown dtype {value!r}")
        return dtype
    if isinstance(value, dict):
        return {k: _option_from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_option_from_json(v) for v in value]
    return value


def as_shape(shape: Sequence[int] | int, name: str) -> tuple[int, ...]:
    """A shape option as a tuple of ints (an int means a 1-D shape).

    Example:
        >>> as_shape(4, "obs_shape"), as_shape([84, 84], "obs_shape")
        ((4,), (84, 84))
    """
    if isinstance(shape, int):
        return (shape,)
    try:
        return tuple(int(d) for d in shape)
    except TypeError:
        raise ConfigError(f"{name}: expected a tuple of ints, got {shape!r}") from None


def extra_specs(extra_fields: Mapping[str, tuple[Sequence[int] | int, torch.dtype]] | None,
                reserved: set[str]) -> list[FieldSpec]:
    """Field specs for user-declared extra fields, stored at their own top-level key.

    Raises:
        ConfigError: a name that is reserved or not an identifier.
    """
    specs = []
    for name, (shape, dtype) in (extra_fields or {}).items():
        if name in reserved or not name.isidentifier():
            raise ConfigError(f"extra_fields: {name!r} is reserved or not an identifier")
        specs.append(FieldSpec(name, name, as_shape(shape, f"extra_fields[{name!r}]"), dtype))
    return specs


def done_of(columns: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``terminated | truncated``: the derived ``done`` column of every buffer that stores both."""
    return columns["terminated"].to(torch.bool) | columns["truncated"].to(torch.bool)


class RingBuffer(Generic[BatchT]):
    """Shared machinery of the ring buffers; not used directly."""

    _ring: RowRing
    _options: dict[str, Any]
    _stats: EpisodeStats | None = None
    _current_epochs: EpochIterator[BatchT] | None = None
    _current_epochs_call: tuple[str, dict[str, Any]] | None = None

    def _attach_stats(self, stats: EpisodeStats | None, num_envs: int) -> None:
        if stats is not None and stats.num_envs != num_envs:
            raise ConfigError(f"stats: built for {stats.num_envs} envs, this buffer has num_envs={num_envs}")
        self._stats = stats

    @property
    def stats(self) -> EpisodeStats | None:
        """The episode statistics this buffer feeds with every step added, if any."""
        return self._stats

    def _feed_stats_from_rollout(self, reward: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor) -> None:
        """Feed ``[num_envs, T]`` (time last) tensors to the stats, one step at a time."""
        if self._stats is None:
            return
        for t in range(reward.shape[1]):
            self._stats.update(reward[:, t], terminated[:, t], truncated[:, t])

    @classmethod
    def _options_from_checkpoint(cls, options: dict[str, Any]) -> dict[str, Any]:
        """The saved constructor options as this version takes them (older checkpoints may differ)."""
        return options

    def _record_options(self, arguments: Mapping[str, Any]) -> None:
        """Keep the constructor arguments (JSON form) so a checkpoint can rebuild this buffer."""
        self._options = {k: _option_to_json(v) for k, v in arguments.items() if k not in _NOT_OPTIONS}

    def _setup(
        self,
        specs: Sequence[FieldSpec],
        capacity: int,
        sampler: Sampler,
        *,
        num_envs: int,
        storage: StorageKind,
        scratch_dir: str | Path | None,
        storing_device: DeviceLike,
        device: DeviceLike | None,
        seed: int | None,
        derived: Mapping[str, Callable[[Mapping[str, torch.Tensor]], torch.Tensor]] | None = None,
    ) -> None:
        self._num_envs = positive_int("num_envs", num_envs)
        if positive_int("capacity", capacity) < num_envs:
            raise ConfigError(f"capacity: expected at least num_envs={num_envs} rows (one add), got {capacity}")
        self._storage_kind = storage
        self._storing_device = resolve_device(storing_device, name="storing_device")
        self._device = resolve_device(device, name="device", default=self._storing_device)
        built = build_storage(storage, capacity, specs, storing_device=self._storing_device, scratch_dir=scratch_dir)
        self._seed = secrets.randbits(63) if seed is None else int(seed)
        generator = torch.Generator(device=self._storing_device).manual_seed(self._seed)
        self._ring = RowRing(specs, built, sampler, rows_per_add=num_envs, storing_device=self._storing_device,
                             generator=generator, derived=derived)
        self._epoch_generator = torch.Generator().manual_seed(self._seed + 1)

    # -- sizes and devices -----------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._ring)

    @property
    def size(self) -> int:
        """Rows stored now (same as ``len(buffer)``)."""
        return len(self._ring)

    @property
    def capacity(self) -> int:
        """Rows the buffer holds at most; the oldest are overwritten first."""
        return self._ring.capacity

    @property
    def is_full(self) -> bool:
        """Whether the next add overwrites the oldest row."""
        return len(self._ring) == self._ring.capacity

    @property
    def num_envs(self) -> int:
        """Rows per ``add``."""
        return self._num_envs

    @property
    def storing_device(self) -> torch.device:
        """Where rows are stored."""
        return self._storing_device

    @property
    def device(self) -> torch.device:
        """Where batches are delivered."""
        return self._device

    @property
    def fields(self) -> tuple[FieldSpec, ...]:
        """The stored fields (name, TorchRL key, shape, dtype)."""
        return self._ring.specs

    @property
    def torchrl(self) -> TensorDictReplayBuffer:
        """The underlying TorchRL ``TensorDictReplayBuffer`` (for collectors, losses, Ray).

        It sees every row added through rlbuf, and what it writes rlbuf sees.
        """
        return self._ring.rb

    def _repr_options(self) -> str:
        return ""

    def __repr__(self) -> str:
        fields = ", ".join(s.describe() for s in self._ring.specs)
        return (f"{type(self).__name__}(size={len(self)}/{self.capacity}, storage={self._storage_kind}, "
                f"storing_device={self._storing_device}, device={self._device}{self._repr_options()}, "
                f"fields=[{fields}])")

    # -- lifecycle -------------------------------------------------------------------------
    def clear(self) -> None:
        """Remove every row (and priorities); capacity and options stay.

        An iterator from ``epochs()``/``minibatches()`` is forgotten (it is not checkpointed).

        Example:
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=())
            >>> buf.add(torch.zeros(1), 0.0, 1.0, torch.zeros(1), False)
            >>> buf.clear()
            >>> len(buf), buf.capacity
            (0, 10)
        """
        self._ring.clear()
        self._current_epochs = self._current_epochs_call = None

    def close(self) -> None:
        """Release the storage's scratch directory if rlbuf created it (memmap)."""
        self._ring.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading ---------------------------------------------------------------------------
    def _make_batch(self, columns: dict[str, torch.Tensor]) -> BatchT:
        raise NotImplementedError

    def _batch(self, index: torch.Tensor, weight: torch.Tensor | None = None) -> BatchT:
        columns = self._ring.gather(index)
        columns["index"] = index
        if weight is not None:
            columns["weight"] = weight
        return self._make_batch(deliver(columns, self._device))

    def sample_all(self) -> BatchT:
        """Every stored row, oldest first.

        Raises:
            EmptyBufferError: nothing is stored.

        Example:
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(3, obs_shape=(1,), action_shape=())
            >>> for r in range(5):
            ...     buf.add(torch.zeros(1), 0.0, float(r), torch.zeros(1), False)
            >>> buf.sample_all().reward.tolist()
            [2.0, 3.0, 4.0]
        """
        if len(self._ring) == 0:
            raise EmptyBufferError("sample_all: the buffer is empty; add data first")
        return self._batch(self._ring.chronological_index())

    @overload
    def sample_by_index(self, index: Any, fields: None = None) -> BatchT: ...

    @overload
    def sample_by_index(self, index: Any, fields: Sequence[str]) -> dict[str, torch.Tensor]: ...

    def sample_by_index(self, index: Any, fields: Sequence[str] | None = None) -> BatchT | dict[str, torch.Tensor]:
        """The rows at storage positions ``index`` (e.g. ``batch.index``).

        Args:
            index: positions in ``[0, len(buffer))``: an int, a sequence or a tensor.
            fields: return only these fields, as a dict of tensors.

        Raises:
            StoredIndexError: a position outside what is stored.
            MissingFieldError: an unknown field name.

        Example:
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=())
            >>> for r in range(4):
            ...     buf.add(torch.zeros(1), 0.0, float(r), torch.zeros(1), False)
            >>> buf.sample_by_index([3, 1]).reward.tolist()
            [3.0, 1.0]
            >>> buf.sample_by_index(2, fields=["reward"])["reward"].tolist()
            [2.0]
        """
        positions = self._ring.as_index(index)
        if fields is None:
            return self._batch(positions)
        self._ring.check_field_names(fields)
        return deliver(self._ring.gather(positions, fields), self._device)

    def epochs(self, batch_size: int, n_epochs: int = 1, *, drop_last: bool = False,
               shuffle: bool = True) -> EpochIterator[BatchT]:
        """Minibatches that visit every stored row once per epoch, delivered on ``device``.

        Each epoch covers the rows stored when it starts (rows added during an epoch join
        the next one; in a full ring they may replace a row of the running epoch at the
        same position). ``n_epochs=0`` draws random batches with replacement, forever.

        Raises:
            BatchSizeError: ``batch_size`` ≤ 0 or larger than what is stored.
            EmptyBufferError: nothing is stored.

        Example:
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=(), seed=0)
            >>> for _ in range(5):
            ...     buf.add(torch.zeros(1), 0.0, 0.0, torch.zeros(1), False)
            >>> [len(batch) for batch in buf.epochs(2, n_epochs=2)]
            [2, 2, 1, 2, 2, 1]
        """
        self._ring.flush()
        iterator = EpochIterator(lambda: len(self._ring), self._batch, batch_size=batch_size, n_epochs=n_epochs,
                                 drop_last=drop_last, shuffle=shuffle,
                                 generator=self._iterator_generator(self._storing_device))
        return self._track_epochs(iterator, "epochs", batch_size=batch_size, n_epochs=n_epochs,
                                  drop_last=drop_last, shuffle=shuffle)

    def _track_epochs(self, iterator: EpochIterator[BatchT], method: str, **arguments: Any) -> EpochIterator[BatchT]:
        self._current_epochs = iterator
        self._current_epochs_call = (method, arguments)
        return iterator

    @property
    def current_epochs(self) -> EpochIterator[BatchT] | None:
        """The iterator made by the last ``epochs()``/``minibatches()`` call, saved with checkpoints.

        After ``load`` it is the restored iterator, resuming at the batch after the
        one the original had reached when it was saved.
        """
        return self._current_epochs

    def _iterator_generator(self, device: torch.device) -> torch.Generator:
        """A fresh generator on ``device`` for one iterator, seeded from the buffer's epoch generator."""
        seed = int(torch.randint(0, 2**62, (1,), generator=self._epoch_generator))
        return torch.Generator(device=device).manual_seed(seed)

    def num_batches(self, batch_size: int, drop_last: bool = False) -> int:
        """Batches per epoch over what is stored now.

        Example:
            >>> import torch
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=())
            >>> for _ in range(5):
            ...     buf.add(torch.zeros(1), 0.0, 0.0, torch.zeros(1), False)
            >>> buf.num_batches(2), buf.num_batches(2, drop_last=True)
            (3, 2)
        """
        return len(batch_bounds(len(self._ring), batch_size=batch_size, drop_last=drop_last))

    # -- state and checkpoints -------------------------------------------------------------
    def _extra_state(self) -> dict[str, Any]:
        return {"stats": None if self._stats is None else self._stats.state_dict()}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        if self._stats is not None and state.get("stats") is not None:
            self._stats.load_state_dict(state["stats"])

    def state_dict(self, *, data: bool = True) -> dict[str, Any]:
        """Everything needed to continue exactly: options, data, cursor, RNG, sampler, iterator.

        Field tensors are views of the storage (no copy). Values are JSON types or tensors.

        Args:
            data: include the stored rows (``False``: options and counters only).

        Example:
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=())
            >>> buf.add(torch.zeros(1), 0.0, 1.0, torch.zeros(1), False)
            >>> state = buf.state_dict()
            >>> state["kind"], state["size"], state["fields"]["reward"].tolist()
            ('ReplayBuffer', 1, [1.0])
            >>> buf.state_dict(data=False)["fields"]
            {}
        """
        ring = self._ring
        ring.flush()
        size = len(ring)
        iterator = None
        if self._current_epochs is not None and self._current_epochs_call is not None:
            method, arguments = self._current_epochs_call
            iterator = {"method": method, "arguments": arguments, "state": self._current_epochs.state_dict()}
        return {
            "kind": type(self).__name__,
            "options": self._options,
            "capacity": self.capacity,
            "sampler_kind": type(ring.rb._sampler).__name__,
            "spec": [spec.to_json() for spec in ring.specs],
            "data": data,
            "size": size,
            "cursor": int(ring.rb._writer._cursor),
            "write_count": int(ring.rb._writer._write_count),
            "fields": {name: leaf[:size] for name, leaf in ring.leaves.items()} if data else {},
            "rng": {"sample": ring.generator.get_state(), "epochs": self._epoch_generator.get_state()},
            "sampler": ring.rb._sampler.state_dict() if data else {},
            "iterator": iterator if data else None,
            "extra": self._extra_state() if data else {},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a ``state_dict`` taken from a buffer with the same fields and capacity.

        Raises:
            CheckpointError: another kind of buffer, other fields, or inconsistent counts.

        Example:
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=(), seed=0)
            >>> buf.add(torch.zeros(1), 0.0, 1.0, torch.zeros(1), False)
            >>> copy = ReplayBuffer(10, obs_shape=(1,), action_shape=())
            >>> copy.load_state_dict(buf.state_dict())
            >>> len(copy), copy.sample_all().reward.tolist()
            (1, [1.0])
        """
        ring = self._ring
        if state.get("kind") != type(self).__name__:
            raise CheckpointError(f"state: holds a {state.get('kind')}, not a {type(self).__name__}")
        mine = [spec.to_json() for spec in ring.specs]
        if state.get("spec") != mine:
            raise CheckpointError(f"state: fields {state.get('spec')} differ from this buffer's {mine}")
        if state.get("capacity") != self.capacity:
            raise CheckpointError(f"state: capacity {state.get('capacity')}, this buffer's is {self.capacity}")
        sampler = type(ring.rb._sampler).__name__
        if state.get("sampler_kind") != sampler:
            raise CheckpointError(f"state: sampled by a {state.get('sampler_kind')}, this buffer by a {sampler}")
        iterator = state.get("iterator")
        if iterator is not None and iterator.get("method") not in _ITERATOR_METHODS:
            raise CheckpointError(f"state: unknown iterator method {iterator.get('method')!r}")
        size, cursor, count = int(state["size"]), int(state["cursor"]), int(state["write_count"])
        if not (0 <= size <= self.capacity and 0 <= cursor < self.capacity and count >= size
                and (size == self.capacity or cursor == size % self.capacity)):
            raise CheckpointError(f"state: size {size}, cursor {cursor}, write count {count} do not fit capacity "
                                  f"{self.capacity}")
        if not state.get("data", True):
            self.clear()
            return
        fields = state["fields"]
        for name in ring.leaves:
            if name not in fields or tuple(fields[name].shape) != (size, *ring.by_name[name].shape):
                shape = None if name not in fields else tuple(fields[name].shape)
                raise CheckpointError(f"state: field {name!r} has shape {shape}, expected "
                                      f"{(size, *ring.by_name[name].shape)}")
        self.clear()
        for name, leaf in ring.leaves.items():
            leaf[:size].copy_(fields[name])
        rb = ring.rb
        rb._writer._cursor = cursor
        rb._writer._write_count = count
        rb._storage._len = size
        rb._sampler.load_state_dict(state["sampler"])
        self._load_extra_state(state["extra"])
        if iterator is not None:
            made = getattr(self, iterator["method"])(**iterator["arguments"])
            made.load_state_dict(iterator["state"])
        try:
            ring.generator.set_state(state["rng"]["sample"])
            self._epoch_generator.set_state(state["rng"]["epochs"])
        except RuntimeError:
            warnings.warn("state: the random generators were saved on another device type; sampling goes on "
                          "from this buffer's own seed, so it will not repeat the original's draws",
                          RuntimeWarning, stacklevel=2)

    def save(self, path: str | Path, *, data: bool = True) -> None:
        """Write a checkpoint directory at ``path`` (atomically; see [`rlbuf.checkpoint`][rlbuf.checkpoint]).

        Args:
            path: the checkpoint directory (replaced whole if it already is one).
            data: include the stored rows; ``False`` saves the options (and, for
                ``rlbuf inspect``, the counts) only: loading it gives an empty buffer.

        Raises:
            CheckpointError: the disk is full, or ``path`` is something else than a checkpoint.

        Example:
            >>> import os, tempfile
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=())
            >>> buf.add(torch.zeros(1), 0.0, 1.0, torch.zeros(1), False)
            >>> path = os.path.join(tempfile.mkdtemp(), "ckpt")
            >>> buf.save(path)
            >>> os.path.isdir(path)
            True
        """
        save_state(self.state_dict(data=data), path)

    @classmethod
    def load(cls: type[BufferT], path: str | Path, *, device: DeviceLike | None = None,
             storing_device: DeviceLike | None = None) -> BufferT:
        """Rebuild a buffer from a checkpoint; the next samples and batches equal the original's.

        Args:
            path: a directory written by ``save``.
            device: training device to use instead of the saved one.
            storing_device: storing device to use instead of the saved one.

        Raises:
            CheckpointError: a missing, truncated, corrupted, wrong-version or wrong-kind
                checkpoint (checked before any tensor is read).

        Example:
            >>> import os, tempfile
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=(), seed=0)
            >>> buf.add(torch.zeros(1), 0.0, 1.0, torch.zeros(1), False)
            >>> path = os.path.join(tempfile.mkdtemp(), "ckpt")
            >>> buf.save(path)
            >>> restored = ReplayBuffer.load(path)
            >>> len(restored), torch.equal(restored.sample(4).index, buf.sample(4).index)
            (1, True)
        """
        state = load_state(path, kind=cls.__name__)
        options = _option_from_json(state["options"])
        accepted = set(inspect.signature(cls.__init__).parameters) - {"self", *_NOT_OPTIONS}
        if not isinstance(options, dict) or set(options) - accepted:
            unknown = sorted(set(options) - accepted) if isinstance(options, dict) else options
            raise CheckpointError(f"{path}: options {unknown} are not options of {cls.__name__}")
        options = cls._options_from_checkpoint(options)
        if device is not None:
            options["device"] = device
        if storing_device is not None:
            options["storing_device"] = storing_device
        saved_stats = state.get("extra", {}).get("stats")
        if saved_stats is not None:
            options["stats"] = EpisodeStats(int(saved_stats["num_envs"]), window=int(saved_stats["window"]))
        try:
            buffer = cls(**options)
        except (TypeError, ValueError) as error:
            raise CheckpointError(f"{path}: cannot rebuild the buffer from its options: {error}") from error
        buffer.load_state_dict(state)
        if not state.get("data", True):
            warnings.warn(f"{path}: saved with data=False (options and counters only): the loaded buffer is empty; "
                          f"the original held {state['size']} rows", MetadataOnlyWarning, stacklevel=2)
        return buffer
