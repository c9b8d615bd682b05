"""Building TorchRL storages and samplers from rlbuf's simple options, and resolving devices.

``storage="memory"`` gives a ``torchrl.data.LazyTensorStorage`` on the storing device,
``storage="memmap"`` a ``torchrl.data.LazyMemmapStorage`` in a scratch directory (a
temporary one by default, removed when the buffer is closed or collected). The storage is
initialised eagerly from the buffer's field specs, so every leaf tensor exists up front.

Example:
    >>> import torch
    >>> from rlbuf.spec import FieldSpec, positive_int
    >>> specs = (FieldSpec("obs", "observation", (3,), torch.float32),)
    >>> built = build_storage("memory", 8, specs, storing_device=torch.device("cpu"))
    >>> from rlbuf._torchrl import storage_leaves
    >>> storage_leaves(built.storage)["observation"].shape
    torch.Size([8, 3])
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeAlias

import torch
from tensordict import TensorDict
from torchrl.data import LazyMemmapStorage, LazyTensorStorage
from torchrl.data.replay_buffers.storages import TensorStorage

from rlbuf import _sizing, _torchrl
from rlbuf.errors import BatchSizeError, ConfigError
from rlbuf.spec import FieldSpec, positive_int

StorageKind: TypeAlias = Literal["memory", "memmap"]
DeviceLike: TypeAlias = torch.device | str | int


def resolve_device(device: DeviceLike | None, *, name: str, default: torch.device | None = None) -> torch.device:
    """Turn a device option into a ``torch.device``, checking that it exists here.

    Raises:
        ConfigError: the device is malformed, or its type (``cuda``, ``mps``, ``xpu`` ...) is not
            available on this machine: refused here rather than at the first sample.

    Example:
        >>> resolve_device("cpu", name="device")
        device(type='cpu')
        >>> resolve_device("mps", name="device") if not torch.backends.mps.is_available() else None
        Traceback (most recent call last):
        ...
        rlbuf.errors.ConfigError: device: mps was asked for, but this machine has no mps device
    """
    if device is None:
        if default is None:
            raise ConfigError(f"{name}: a device is required")
        return default
    if device == "auto":  # SB3's default
        raise ConfigError(f"{name}: 'auto' is SB3's word, not a torch device; pass "
                          f"'cuda' if torch.cuda.is_available() else 'cpu'")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ConfigError(f"{name}: not a device: {device!r} ({error})") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{name}: {resolved} was asked for, but CUDA is not available on this machine")
        if resolved.index is None:
            resolved = torch.device("cuda", torch.cuda.current_device())
    elif resolved.type != "cpu" and not _available(resolved.type):
        raise ConfigError(f"{name}: {resolved} was asked for, but this machine has no {resolved.type} device")
    return resolved


def _available(device_type: str) -> bool:
    """Whether torch has a backend module for ``device_type`` that reports a device (``meta``: none)."""
    if device_type == "mps":
        return bool(torch.backends.mps.is_available())
    is_available = getattr(getattr(torch, device_type, None), "is_available", None)
    return callable(is_available) and bool(is_available())


@dataclass
class BuiltStorage:
    """A TorchRL storage and the scratch directory rlbuf created for it (if any)."""

    storage: TensorStorage
    scratch_dir: Path | None
    owns_scratch_dir: bool


def template(specs: Sequence[FieldSpec]) -> TensorDict:
    """One zero row of every field, in TorchRL layout (batch size ``[]``).

    Example:
        >>> row = template((FieldSpec("reward", ("next", "reward"), (), torch.float32, trailing_one=True),))
        >>> row["next", "reward"].shape
        torch.Size([1])
    """
    row = TensorDict({}, batch_size=[])
    for spec in specs:
        row.set(spec.key, torch.zeros(spec.td_shape, dtype=spec.dtype))
    return row


def build_storage(
    kind: StorageKind,
    capacity: int,
    specs: Sequence[FieldSpec],
    *,
    storing_device: torch.device,
    scratch_dir: str | Path | None = None,
) -> BuiltStorage:
    """Create and initialise the TorchRL storage for ``capacity`` rows of ``specs``.

    Args:
        kind: ``"memory"`` (RAM or GPU) or ``"memmap"`` (files on disk, CPU only).
        capacity: number of rows.
        specs: the fields to store.
        storing_device: where the data lives.
        scratch_dir: where to put the memmap files: a fresh subdirectory of it (a fresh
            temporary directory when ``None``), removed when the buffer is closed or collected.

    Raises:
        ConfigError: an unknown kind, a memmap storage on a non-CPU device, or a
            non-positive capacity.
    """
    capacity = positive_int("capacity", capacity)
    if kind in ("memory", "memmap"):
        check_room(kind, capacity, specs, storing_device=storing_device, scratch_dir=scratch_dir)
    storage: TensorStorage
    owns = False
    directory: Path | None = None
    if kind == "memory":
        if scratch_dir is not None:
            raise ConfigError("scratch_dir: only used with storage='memmap'")
        storage = LazyTensorStorage(capacity, device=storing_device)
    elif kind == "memmap":
        if storing_device.type != "cpu":
            raise ConfigError(f"storing_device: storage='memmap' keeps data in files on the CPU, got {storing_device}")
        if scratch_dir is not None:
            Path(scratch_dir).mkdir(parents=True, exist_ok=True)
        # A fresh directory per buffer (inside scratch_dir when given): two buffers never share files.
        directory = Path(tempfile.mkdtemp(prefix="rlbuf-", dir=scratch_dir))
        owns = True
        storage = LazyMemmapStorage(capacity, scratch_dir=str(directory), device="cpu", existsok=True)
    else:
        raise ConfigError(f"storage: expected 'memory' or 'memmap', got {kind!r}")
    with _quiet_torchrl_logger():
        _torchrl.initialise(storage, template(specs))
    # TorchRL writes only these keys when something (a collector's `replay_buffer=`) extends the
    # storage with a richer tensordict: collector metadata, root-level flags and so on are dropped.
    _torchrl.keep_keys(storage, [spec.key for spec in specs])
    return BuiltStorage(storage, directory, owns)


def row_bytes(specs: Sequence[FieldSpec]) -> int:
    """Bytes one stored row takes: its fields alone (``rlbuf._sizing.row_bytes``, nothing added).

    Example:
        >>> row_bytes((FieldSpec("obs", "observation", (3,), torch.float32),))
        12
    """
    return int(_sizing.row_bytes([(spec.shape, spec.dtype.itemsize) for spec in specs], prioritized=False,
                                 compact=False, frame_stack=1))


def available_ram() -> int:
    """Bytes of memory the kernel can give now without swapping (``MemAvailable``), else the free pages.

    Example:
        >>> available_ram() > 0
        True
    """
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo", encoding="ascii") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


_SMALL_BATCH_BYTES = 64 * 2**20  # a batch this small is never refused for memory


def check_batch_memory(batch_size: int, row_bytes: int) -> None:
    """Refuse a batch of ``batch_size`` rows of ``row_bytes`` that could not fit in the memory free now: the
    batch, its index and a copy on the way.

    Raises:
        BatchSizeError: naming the bytes needed and free.

    Example:
        >>> check_batch_memory(32, 1024)                      # small: never refused
        >>> check_batch_memory(10**13, 1024)
        Traceback (most recent call last):
        ...
        rlbuf.errors.BatchSizeError: batch_size: 10000000000000 rows need about 20640000000000000 bytes, more than the ... bytes of memory free now
    """
    if batch_size * row_bytes > _SMALL_BATCH_BYTES:
        needed, available = batch_size * (row_bytes + 8) * 2, available_ram()
        if needed > available:
            raise BatchSizeError(f"batch_size: {batch_size} rows need about {needed} bytes, more than the "
                                 f"{available} bytes of memory free now")


def check_room(kind: StorageKind, capacity: int, specs: Sequence[FieldSpec], *, storing_device: torch.device,
               scratch_dir: str | Path | None = None) -> None:
    """Refuse a storage the machine cannot hold, before anything is allocated.

    RAM (available memory) for ``memory`` on the CPU, GPU memory for ``memory`` on CUDA, free
    disk of the scratch directory for ``memmap``.

    Raises:
        ConfigError: naming the bytes needed and the bytes available.

    Example:
        >>> specs = (FieldSpec("obs", "observation", (1024,), torch.float32),)
        >>> check_room("memory", 10**12, specs, storing_device=torch.device("cpu"))
        Traceback (most recent call last):
        ...
        rlbuf.errors.ConfigError: capacity: 1000000000000 rows of 4096 bytes need 4096000000000000 bytes, ...
    """
    per_row = row_bytes(specs)
    needed = capacity * per_row
    if kind == "memmap":
        directory = Path(scratch_dir) if scratch_dir is not None else Path(tempfile.gettempdir())
        while not directory.exists() and directory != directory.parent:
            directory = directory.parent
        available, where = shutil.disk_usage(directory).free, f"free on the disk of {directory}"
    elif storing_device.type == "cuda":
        available, where = torch.cuda.mem_get_info(storing_device)[0], f"free on {storing_device}"
    elif storing_device.type == "cpu":
        available, where = available_ram(), "of RAM available"
    else:
        return
    if needed > available:
        raise ConfigError(f"capacity: {capacity} rows of {per_row} bytes need {needed} bytes, but only "
                          f"{available} bytes are {where}; lower capacity"
                          + (" or use storage='memmap'" if kind == "memory" and storing_device.type == "cpu" else ""))


@contextlib.contextmanager
def _quiet_torchrl_logger() -> Iterator[None]:
    """Silence TorchRL's INFO line about initialising a storage: rlbuf builds one per buffer."""
    logger = logging.getLogger("torchrl")
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(level)


def remove_when_collected(owner: Any, directory: Path) -> weakref.finalize:  # type: ignore[type-arg]
    """Remove ``directory`` when ``owner`` is garbage-collected, or when the finalizer is called.

    Example:
        >>> import tempfile
        >>> class Owner: ...
        >>> owner, path = Owner(), Path(tempfile.mkdtemp())
        >>> remove = remove_when_collected(owner, path)
        >>> remove(); path.exists()
        False
    """
    return weakref.finalize(owner, shutil.rmtree, str(directory), ignore_errors=True)
