"""RingBuffer: what ReplayBuffer and DistillationBuffer share (sizes, devices, reads, epochs).

A subclass builds its field specs and sampler, calls :meth:`RingBuffer._setup`, and turns
gathered columns into its typed batch in :meth:`RingBuffer._make_batch`.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar, overload

import torch
from torchrl.data import TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import Sampler

from rlbuf._core import RowRing, deliver
from rlbuf.epochs import EpochIterator, batch_bounds
from rlbuf.errors import ConfigError, EmptyBufferError
from rlbuf.spec import FieldSpec
from rlbuf.storage import DeviceLike, StorageKind, build_storage, resolve_device

BatchT = TypeVar("BatchT")


def positive_int(name: str, value: object) -> int:
    """``value`` if it is a positive int, else :class:`ConfigError` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name}: expected a positive int, got {value!r}")
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


class RingBuffer(Generic[BatchT]):
    """Shared machinery of the ring buffers; not used directly."""

    _kind: ClassVar[str]
    _ring: RowRing

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
        """Remove every row (and priorities); capacity and options stay."""
        self._ring.clear()

    def close(self) -> None:
        """Release the storage's scratch directory if rlbuf created it (memmap)."""
        self._ring.close()

    def __enter__(self) -> RingBuffer[BatchT]:
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
        """
        self._ring.flush()
        return EpochIterator(lambda: len(self._ring), self._batch, batch_size=batch_size, n_epochs=n_epochs,
                             drop_last=drop_last, shuffle=shuffle, generator=self._iterator_generator(self._storing_device))

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
