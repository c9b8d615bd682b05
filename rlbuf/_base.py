"""RingBuffer: what ReplayBuffer and DistillationBuffer share (sizes, devices, reads, epochs).

A subclass builds its field specs and sampler, calls ``RingBuffer._setup``, and turns
gathered columns into its typed batch in ``RingBuffer._make_batch``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import math
import secrets
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, Self, TypeVar, cast

import numpy as np
import torch
from torchrl.data import TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import Sampler

from rlbuf import _torchrl
from rlbuf._delivery import deliver
from rlbuf._ring import RowCopies, RowRing, RowSink
from rlbuf.checkpoint import load_state, save_state
from rlbuf.epochs import EpochIterator, batch_bounds, check_epoch_options
from rlbuf.errors import CheckpointError, ConfigError, EmptyBufferError
from rlbuf.spec import FieldSpec, as_flag, as_int, positive_int
from rlbuf.stats import EpisodeStats
from rlbuf.storage import DeviceLike, StorageKind, build_storage, resolve_device

BatchT = TypeVar("BatchT")
BufferT = TypeVar("BufferT", bound="RingBuffer[Any]")
_NOT_OPTIONS = ("self", "__class__", "stats", "scratch_dir", "observation_space", "action_space", "foreign")
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
    """A shape option as a tuple of non-negative ints (an int means a 1-D shape).

    Raises:
        ConfigError: anything else (``(3.5,)``, ``True``, ``"84"``, a negative size).

    Example:
        >>> as_shape(4, "obs_shape"), as_shape([84, 84], "obs_shape")
        ((4,), (84, 84))
    """
    if not isinstance(shape, (str, bytes, Mapping)):
        if isinstance(shape, (Sequence, torch.Size)) or (isinstance(shape, np.ndarray) and shape.ndim == 1):
            with contextlib.suppress(ConfigError):
                return tuple(as_int(name, d, minimum=0) for d in shape)
        else:
            with contextlib.suppress(ConfigError):
                return (as_int(name, shape, minimum=0),)
    raise ConfigError(f"{name}: expected a tuple of non-negative ints, got {shape!r}")


# Names every batch uses for its own attributes, and TorchRL's private keys ("_weight", "_data").
BATCH_NAMES = {"index": "an attribute of every batch", "weight": "an attribute of every batch",
                "extras": "an attribute of every batch"}


# Constructor keywords users bring from SB3, cpprb or TorchRL, and what rlbuf takes instead.
FOREIGN_OPTIONS = {
    "buffer_size": "rlbuf's name is capacity (RolloutBuffer: num_steps, per env)",
    "max_size": "rlbuf's name is capacity",
    "size": "rlbuf's name is capacity",
    "n_envs": "rlbuf's name is num_envs",
    "n_steps": "rlbuf's name is num_steps",
    "handle_timeout_termination": "always on in rlbuf: pass truncated= to add() and the timeout bootstraps",
    "optimize_memory_usage": "rlbuf's ReplayBuffer takes compact=True (next_obs stored once; see frame_stack)",
    "gamma": "pass gamma to compute_returns_and_advantages() (ReplayBuffer: gamma goes with n_step)",
    "gae_lambda": "pass gae_lambda to compute_returns_and_advantages()",
    "env_dict": "declare obs_shape=/action_shape= (or observation_space=/action_space=) and extra_fields=",
    "storage_device": "rlbuf's name is storing_device",
}
"""Foreign constructor keyword -> what to pass instead."""


def refuse_foreign_options(owner: Callable[..., Any], given: Mapping[str, Any]) -> None:
    """Raise [`ConfigError`][rlbuf.ConfigError] for keywords ``owner`` does not take, with the rlbuf name.

    Example:
        >>> def build(capacity: int, **foreign: object) -> None:
        ...     refuse_foreign_options(build, foreign)
        >>> build(10, buffer_size=10)
        Traceback (most recent call last):
        ...
        rlbuf.errors.ConfigError: buffer_size: not an option of build; rlbuf's name is capacity (RolloutBuffer: num_steps, per env)
    """
    for name in given:
        if name in FOREIGN_OPTIONS:
            raise ConfigError(f"{name}: not an option of {owner.__qualname__.split('.')[0]}; {FOREIGN_OPTIONS[name]}")
    if given:
        known = [p for p in inspect.signature(owner).parameters if p not in ("self", "foreign")]
        raise ConfigError(f"{', '.join(given)}: not options of {owner.__qualname__.split('.')[0]}; it takes {known}")


def extra_specs(extra_fields: Mapping[str, tuple[Sequence[int] | int, torch.dtype]] | None,
                builtin: Sequence[FieldSpec], reserved: Mapping[str, str] | None = None) -> list[FieldSpec]:
    """Field specs for user-declared extra fields, stored at their own top-level key.

    A name may not alias a built-in field: neither its rlbuf name nor the top-level part of its
    TorchRL key (``"state_value"``, ``"next"`` ...), derived from ``builtin`` itself.

    Args:
        extra_fields: ``{"name": (shape, dtype)}`` as the user passed it.
        builtin: the buffer's own fields.
        reserved: further names this buffer refuses, with the reason shown in the error.

    Raises:
        ConfigError: a malformed declaration, or a name that is reserved or not an identifier.

    Example:
        >>> fixed = [FieldSpec("value", "state_value", (), torch.float32)]
        >>> extra_specs({"state_value": ((), torch.float32)}, fixed)
        Traceback (most recent call last):
        ...
        rlbuf.errors.ConfigError: extra_fields: 'state_value' is reserved: the TorchRL key of the built-in field 'value'; choose another name
    """
    taken = dict(BATCH_NAMES)
    for spec in builtin:
        top = spec.key if isinstance(spec.key, str) else spec.key[0]
        taken.setdefault(top, f"the TorchRL key of the built-in field {spec.name!r}")
        taken[spec.name] = "a built-in field"
    taken.update(reserved or {})
    if extra_fields is None:
        return []
    if not isinstance(extra_fields, Mapping):
        raise ConfigError(f"extra_fields: expected a dict {{name: (shape, dtype)}}, got {type(extra_fields).__name__}")
    specs = []
    for name, declared in extra_fields.items():
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
            raise ConfigError(f"extra_fields: {name!r} is not a public identifier (letters, digits, '_'; "
                              f"not starting with '_')")
        if name in taken:
            raise ConfigError(f"extra_fields: {name!r} is reserved: {taken[name]}; choose another name")
        if not isinstance(declared, (tuple, list)) or len(declared) != 2:
            raise ConfigError(f"extra_fields[{name!r}]: expected (shape, dtype), got {declared!r}")
        shape, dtype = declared
        specs.append(FieldSpec(name, name, as_shape(shape, f"extra_fields[{name!r}]"), dtype))
    return specs


def done_of(columns: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``terminated | truncated``: the derived ``done`` column of every buffer that stores both."""
    return columns["terminated"].to(torch.bool) | columns["truncated"].to(torch.bool)


class RingBuffer(Generic[BatchT]):
    """Shared machinery of the ring buffers; not used directly."""

    _ring: RowRing
    _options: dict[str, Any]
    _batch_type: type[BatchT]
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
        # The epoch generator is seeded with seed + 1: both seeds must be valid torch seeds.
        checked_seed = None if seed is None else as_int("seed", seed, minimum=0, maximum=2**63 - 2)
        if positive_int("capacity", capacity) < num_envs:
            raise ConfigError(f"capacity: expected at least num_envs={num_envs} rows (one add), got {capacity}")
        self._storage_kind = storage
        self._storing_device = resolve_device(storing_device, name="storing_device")
        self._device = resolve_device(device, name="device", default=self._storing_device)
        # CPU rows for a CUDA learner are gathered into page-locked memory: one host copy, not two.
        self._pinned_delivery = self._storing_device.type == "cpu" and self._device.type == "cuda"
        built = build_storage(storage, capacity, specs, storing_device=self._storing_device, scratch_dir=scratch_dir)
        self._seed = secrets.randbits(62) if checked_seed is None else checked_seed
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

        It sees every row added through rlbuf, and what it writes rlbuf sees. Once handed out,
        every later add is committed at once, so its ``storage`` and ``writer`` are current too
        when read directly (e.g. by a TorchRL buffer built over the same storage).

        Example:
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=())
            >>> buf.add(torch.zeros(1), 0.0, 1.0, torch.zeros(1), False)
            >>> len(buf.torchrl), buf.torchrl[0]["next", "reward"].tolist()
            (1, [1.0])
        """
        return self._ring.hand_out()

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

    def _gather(self, index: torch.Tensor, names: Sequence[str] | None = None, *,
                pinned: bool = False) -> dict[str, torch.Tensor]:
        """The columns at storage positions ``index`` (a buffer that rebuilds fields overrides it);
        with ``pinned``, gathered into page-locked memory where the layout allows."""
        if names is not None:
            self._ring.check_field_names(names)
        return self._ring.gather(index, names, pinned=pinned)

    def _readable_index(self) -> torch.Tensor:
        """Positions ``sample_all`` returns, oldest first: every stored row unless overridden."""
        return self._ring.chronological_index()

    def _batch(self, index: torch.Tensor, weight: torch.Tensor | None = None) -> BatchT:
        columns = self._gather(index, pinned=self._pinned_delivery)
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
        return self._batch(self._readable_index())

    def sample_by_index(self, index: Any, fields: Sequence[str] | None = None) -> BatchT:
        """The rows at storage positions ``index`` (e.g. ``batch.index``), as the buffer's typed batch.

        Args:
            index: positions in ``[0, len(buffer))``: an int, a sequence or a tensor.
            fields: gather only these stored fields. The batch then holds only them: other
                attributes are absent (reading one raises ``AttributeError``), stored fields
                that are not batch attributes (``done``, ``bootstrap_value``) are in ``extras``,
                and ``len()`` needs ``obs``.

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
            >>> only = buf.sample_by_index(2, fields=["reward"])
            >>> type(only).__name__, only.reward.tolist(), hasattr(only, "obs")
            ('ReplayBatch', [2.0], False)
        """
        positions = self._ring.as_index(index)
        if fields is None:
            return self._batch(positions)
        columns = deliver(self._gather(positions, fields), self._device)
        batch_type = self._batch_type
        batch = object.__new__(batch_type)
        attributes = {item.name for item in dataclasses.fields(cast(Any, batch_type))} - {"extras"}
        for name in attributes & set(columns):
            object.__setattr__(batch, name, columns[name])  # a frozen dataclass: built field by field
        object.__setattr__(batch, "extras", {name: column for name, column in columns.items() if name not in attributes})
        return batch

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
        # Validate before the epoch generator draws the iterator's seed: a refused call changes nothing.
        options = check_epoch_options(len(self._ring), batch_size=batch_size, n_epochs=n_epochs,
                                      drop_last=drop_last, shuffle=shuffle)
        self._ring.require_rows(options["batch_size"], without_replacement=False)
        iterator = EpochIterator(lambda: len(self._ring), self._batch, **options,
                                 generator=self._iterator_generator(self._storing_device))
        options.pop("num_batches")
        return self._track_epochs(iterator, "epochs", **options)

    def _track_epochs(self, iterator: EpochIterator[BatchT], method: str, **arguments: Any) -> EpochIterator[BatchT]:
        self._current_epochs = iterator
        self._current_epochs_call = (method, arguments)
        return iterator

    @property
    def current_epochs(self) -> EpochIterator[BatchT] | None:
        """The iterator made by the last ``epochs()``/``minibatches()`` call, saved with checkpoints.

        After ``load`` it is the restored iterator, resuming at the batch after the
        one the original had reached when it was saved.

        Example:
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=())
            >>> buf.add(torch.zeros(1), 0.0, 1.0, torch.zeros(1), False)
            >>> buf.current_epochs is None, buf.epochs(1) is buf.current_epochs
            (True, True)
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
        return len(batch_bounds(len(self._ring), batch_size=batch_size, drop_last=as_flag("drop_last", drop_last)))

    # -- state and checkpoints -------------------------------------------------------------
    def _extra_state(self) -> dict[str, Any]:
        return {"stats": None if self._stats is None else self._stats.state_dict()}

    def _check_extra_state(self, state: Mapping[str, Any]) -> None:
        """Raise ``CheckpointError`` unless ``_load_extra_state`` would succeed with ``state``; change nothing."""
        saved = state.get("stats")
        if self._stats is None or saved is None:
            return
        trial = copy.deepcopy(self._stats)
        _refusing("stats state", trial.load_state_dict, saved)
        reason = _stats_problem(trial.state_dict())
        if reason:
            raise CheckpointError(f"stats state: {reason}")

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        if self._stats is not None and state.get("stats") is not None:
            self._stats.load_state_dict(state["stats"])

    def _snapshot(self, sink: RowSink | None, *, data: bool) -> dict[str, Any]:
        """The state of one write count (see [`RowRing.snapshot`][rlbuf._core.RowRing.snapshot]): rows into ``sink``."""
        ring = self._ring

        def capture() -> dict[str, Any]:
            iterator = None
            if data and self._current_epochs is not None and self._current_epochs_call is not None:
                method, arguments = self._current_epochs_call
                iterator = {"method": method, "arguments": dict(arguments), "state": self._current_epochs.state_dict()}
            return copy.deepcopy({
                "rng": {"sample": ring.generator.get_state(), "epochs": self._epoch_generator.get_state()},
                "sampler": ring.rb.sampler.state_dict() if data else {},
                "iterator": iterator,
                "extra": self._extra_state() if data else {},
            })

        snapshot = ring.snapshot(sink if data else None, capture)
        return {
            "kind": type(self).__name__,
            "options": self._options,
            "capacity": self.capacity,
            "sampler_kind": type(ring.rb.sampler).__name__,
            "spec": [spec.to_json() for spec in ring.specs],
            "data": data,
            "size": snapshot.size,
            "cursor": snapshot.cursor,
            "write_count": snapshot.write_count,
            "fields": dict(snapshot.rows),
            **snapshot.captured,
        }

    def state_dict(self, *, data: bool = True) -> dict[str, Any]:
        """Everything needed to continue exactly: options, data, cursor, RNG, sampler, iterator.

        A consistent snapshot of one write count, also while other threads or worker
        processes write: field tensors are copies (rows written during the call are copied
        again under the buffer's lock). Values are JSON types or tensors.

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
        return self._snapshot(RowCopies(), data=data)

    def check_valid(self) -> tuple[bool, str]:
        """Check this buffer's invariants: ``(True, "")``, or ``(False, reason)``.

        Counts fit the capacity, must-be-finite fields are finite, derived fields (``done``)
        equal what they derive from, priorities are finite and non-negative, episode
        statistics are consistent. Checked after every load and in the tests.

        Example:
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=())
            >>> buf.add(torch.zeros(1), 0.0, 1.0, torch.zeros(1), False)
            >>> buf.check_valid()
            (True, '')
        """
        ring = self._ring
        with ring.lock:
            ring.flush()
            with _torchrl.write_lock(ring.rb):
                size, cursor, count = ring.counters()
                reason = _counts_problem(size, cursor, count, self.capacity)
                reason = reason or _rows_problem(ring, {name: leaf[:size] for name, leaf in ring.leaves.items()})
                reason = reason or _sampler_problem(ring.rb.sampler.state_dict())
        if not reason and self._stats is not None:
            reason = _stats_problem(self._stats.state_dict())
        return not reason, reason

    def _validated(self, state: Mapping[str, Any]) -> tuple[int, int, int]:
        """Check every part of a ``state_dict`` against this buffer; change nothing.

        Returns:
            ``(size, cursor, write_count)``.
        """
        ring = self._ring
        if not isinstance(state, Mapping):
            raise CheckpointError(f"state: expected a mapping, got {type(state).__name__}")
        if state.get("kind") != type(self).__name__:
            raise CheckpointError(f"state: holds a {state.get('kind')}, not a {type(self).__name__}")
        mine = [spec.to_json() for spec in ring.specs]
        if state.get("spec") != mine:
            raise CheckpointError(f"state: fields {state.get('spec')} differ from this buffer's {mine}")
        if state.get("capacity") != self.capacity:
            raise CheckpointError(f"state: capacity {state.get('capacity')}, this buffer's is {self.capacity}")
        sampler = type(ring.rb.sampler).__name__
        if state.get("sampler_kind") != sampler:
            raise CheckpointError(f"state: sampled by a {state.get('sampler_kind')}, this buffer by a {sampler}")
        size, cursor, count = (_saved_count(state, key) for key in ("size", "cursor", "write_count"))
        reason = _counts_problem(size, cursor, count, self.capacity)
        if reason:
            raise CheckpointError(f"state: {reason}")
        if state.get("data", True) is not True:
            if state.get("data") is not False:
                raise CheckpointError(f"state: data must be true or false, got {state.get('data')!r}")
            return size, cursor, count
        fields = state.get("fields")
        if not isinstance(fields, Mapping) or set(fields) != set(ring.leaves):
            names = sorted(fields) if isinstance(fields, Mapping) else fields
            raise CheckpointError(f"state: fields {names}, expected {sorted(ring.leaves)}")
        for name in ring.leaves:
            spec, value = ring.by_name[name], fields[name]
            expected = (size, *spec.shape)
            if not isinstance(value, torch.Tensor) or value.dtype != spec.dtype or tuple(value.shape) != expected:
                got = (value.dtype, tuple(value.shape)) if isinstance(value, torch.Tensor) else type(value).__name__
                raise CheckpointError(f"state: field {name!r} is {got}, expected {spec.dtype} of shape {expected}")
        reason = _rows_problem(ring, fields)
        if reason:
            raise CheckpointError(f"state: {reason}")
        trial = copy.deepcopy(ring.rb.sampler)
        _refusing("sampler state", trial.load_state_dict, state.get("sampler"))
        reason = _sampler_problem(trial.state_dict())
        if reason:
            raise CheckpointError(f"sampler state: {reason}")
        extra = state.get("extra")
        if not isinstance(extra, Mapping):
            raise CheckpointError(f"state: extra must be a mapping, got {type(extra).__name__}")
        self._check_extra_state(extra)
        self._check_iterator(state.get("iterator"), size, state["fields"])
        rng = state.get("rng")
        if not isinstance(rng, Mapping) or not all(_is_generator_state(rng.get(k)) for k in ("sample", "epochs")):
            raise CheckpointError("state: rng must hold 'sample' and 'epochs' generator states (uint8 tensors)")
        return size, cursor, count

    def _iterator_rows(self, method: str, arguments: Mapping[str, Any], size: int,
                       fields: Mapping[str, torch.Tensor]) -> int:
        """Rows a saved iterator runs over (``fields``: the state's validated columns)."""
        return size if method == "epochs" else self.capacity

    def _check_iterator(self, iterator: Any, size: int, fields: Mapping[str, torch.Tensor]) -> None:
        """Build the saved iterator on the side (a throwaway generator) to check its state."""
        if iterator is None:
            return
        if not isinstance(iterator, Mapping) or iterator.get("method") not in _ITERATOR_METHODS:
            method = iterator.get("method") if isinstance(iterator, Mapping) else iterator
            raise CheckpointError(f"state: unknown iterator method {method!r}")
        arguments, saved = iterator.get("arguments"), iterator.get("state")
        if not isinstance(arguments, Mapping) or not isinstance(saved, Mapping):
            raise CheckpointError("state: the iterator needs 'arguments' and 'state' tables")
        known = set(inspect.signature(getattr(self, iterator["method"])).parameters)
        if set(arguments) - known:
            raise CheckpointError(f"state: iterator arguments {sorted(set(arguments) - known)} are not arguments of "
                                  f"{iterator['method']}()")
        split = {("num_batches" if key == "num_minibatches" else key): value for key, value in arguments.items()
                 if key != "sequences"}
        rows = self._iterator_rows(iterator["method"], arguments, size, fields)
        device = self._storing_device if iterator["method"] == "epochs" else self._device
        # epochs() runs over the rows stored when each epoch starts: a saved epoch may hold fewer.
        trial = _refusing("iterator state", EpochIterator, (lambda: rows) if iterator["method"] == "epochs" else rows,
                          lambda index: index, **split,
                          generator=torch.Generator(device=device))
        saved = dict(saved)
        own = trial.state_dict()["generator"]
        if isinstance(saved.get("generator"), torch.Tensor) and saved["generator"].numel() != own.numel():
            saved["generator"] = own  # saved on another device type: load_state_dict warns and reseeds
        _refusing("iterator state", trial.load_state_dict, saved)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a ``state_dict`` taken from a buffer with the same fields and capacity.

        Every part is checked first (counts, field dtypes and shapes, finite values, derived
        fields, sampler, statistics, iterator, generator states): a refused state leaves the
        buffer exactly as it was.

        Raises:
            CheckpointError: another kind of buffer, other fields, or inconsistent values.

        Example:
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=(), seed=0)
            >>> buf.add(torch.zeros(1), 0.0, 1.0, torch.zeros(1), False)
            >>> copy = ReplayBuffer(10, obs_shape=(1,), action_shape=())
            >>> copy.load_state_dict(buf.state_dict())
            >>> len(copy), copy.sample_all().reward.tolist()
            (1, [1.0])
        """
        size, cursor, count = self._validated(state)
        ring = self._ring
        if state.get("data") is False:
            self.clear()
            return
        with ring.lock:
            self.clear()
            fields = state["fields"]
            for name, leaf in ring.leaves.items():
                leaf[:size].copy_(fields[name])
            rb = ring.rb
            with _torchrl.write_lock(rb):
                _torchrl.set_counts(rb, cursor=cursor, write_count=count, size=size)
            rb.sampler.load_state_dict(state["sampler"])
            ring.generation += 1
        self._load_extra_state(dict(state["extra"]))
        rng_moved = False
        iterator = state.get("iterator")
        if iterator is not None:
            made = getattr(self, iterator["method"])(**iterator["arguments"])
            saved, own = dict(iterator["state"]), made.state_dict()["generator"]
            # A generator state saved on another device type (CUDA vs CPU) has another size.
            rng_moved = saved["generator"].numel() != own.numel()
            made.load_state_dict({**saved, "generator": own} if rng_moved else saved)
        try:
            self._epoch_generator.set_state(state["rng"]["epochs"])
            ring.generator.set_state(state["rng"]["sample"])
        except RuntimeError:
            rng_moved = True
        if rng_moved:
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
        save_state(lambda files: self._snapshot(files, data=data), path)

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
        try:
            buffer = cls._load(path, device=device, storing_device=storing_device)
        except CheckpointError:
            raise
        except Exception as error:  # a damaged checkpoint may fail anywhere; only CheckpointError escapes
            raise CheckpointError(f"{path}: cannot load: {type(error).__name__}: {error}") from error
        valid, reason = buffer.check_valid()
        if not valid:
            raise CheckpointError(f"{path}: the loaded buffer is inconsistent: {reason}")
        return buffer

    @classmethod
    def _load(cls: type[BufferT], path: str | Path, *, device: DeviceLike | None,
              storing_device: DeviceLike | None) -> BufferT:
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
        except (TypeError, ValueError, ConfigError) as error:
            raise CheckpointError(f"{path}: cannot rebuild the buffer from its options: {error}") from error
        buffer.load_state_dict(state)
        if not state.get("data", True):
            warnings.warn(f"{path}: saved with data=False (options and counters only): the loaded buffer is empty; "
                          f"the original held {state['size']} rows", MetadataOnlyWarning, stacklevel=3)
        return buffer


def _refusing(what: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)``, any failure turned into a ``CheckpointError`` about ``what``."""
    try:
        return function(*args, **kwargs)
    except CheckpointError as error:
        raise CheckpointError(f"{what}: {error}") from error
    except Exception as error:  # a damaged state may fail anywhere; only CheckpointError may escape
        raise CheckpointError(f"{what}: {type(error).__name__}: {error}") from error


def _saved_count(state: Mapping[str, Any], key: str) -> int:
    value = state.get(key)
    if type(value) is not int or value < 0:
        raise CheckpointError(f"state: {key} must be an int >= 0, got {value!r}")
    return value


def _counts_problem(size: int, cursor: int, count: int, capacity: int) -> str:
    if 0 <= size <= capacity and 0 <= cursor < capacity and count >= size and (
            size == capacity or cursor == size % capacity):
        return ""
    return f"size {size}, cursor {cursor}, write count {count} do not fit capacity {capacity}"


def _rows_problem(ring: RowRing, fields: Mapping[str, torch.Tensor]) -> str:
    """Non-finite values in must-be-finite fields, or a ``done`` that is not ``terminated | truncated``."""
    for spec in ring.specs:
        column = fields[spec.name]
        if spec.finite and column.is_floating_point() and not bool(torch.isfinite(column).all()):
            return f"field {spec.name!r} holds non-finite values"
    # Other derived columns (a rollout's advantage) start as zeros and are computed later.
    if ring.derived.get("done") is done_of and not torch.equal(done_of(fields), fields["done"].to(torch.bool)):
        return "field 'done' differs from terminated | truncated"
    return ""


def _sampler_problem(state: Mapping[str, Any]) -> str:
    """NaN or negative priorities (``inf`` only marks never-written items of a minimum tree)."""
    for key, value in state.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            if bool(torch.isnan(value).any()) or bool((value < 0).any()):
                return f"{key} holds NaN or negative values"
            if key == "sum_leaves" and not bool(torch.isfinite(value).all()):
                return f"{key} holds infinite values"
        elif isinstance(value, float) and not math.isfinite(value):
            return f"{key} is {value}"
    return ""


def _stats_problem(state: Mapping[str, Any]) -> str:
    lengths = [*state["running_length"].tolist(), *state["lengths"]]
    if any(type(n) is not int or n < 0 for n in lengths):
        return "episode lengths must be ints >= 0"
    returns = [*state["running_return"].tolist(), *state["returns"]]
    if not all(isinstance(r, (int, float)) and math.isfinite(r) for r in returns):
        return "episode returns must be finite"
    if type(state["episodes_finished"]) is not int or state["episodes_finished"] < len(state["lengths"]):
        return "episodes_finished must be an int >= the episodes kept"
    return ""


def _is_generator_state(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.dim() == 1
