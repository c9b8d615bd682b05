"""Compressed frames of the compact layout: one per ring row, in a byte log written in row order.

With ``compression="zstd"`` or ``"lz4"`` the ring's ``obs`` field holds the size in bytes of
each row's compressed frame, and the frames themselves live here, in one numpy byte array
(the *arena*) used as a circular log: an add appends its rows' frames after the newest ones,
and the ring overwrites its oldest rows first, so the bytes of the oldest frame are the next
to be freed. No Python object per frame, no allocator: a row costs its compressed bytes and
12 bytes of offsets.

Frames are compressed once at ``add`` and decompressed at ``sample``, bit-exact; each sample
decodes every distinct frame of the batch once. Small frames compress poorly on their own (an
84×84 Atari frame is mostly the same background), so once ``DICTIONARY_AFTER`` frames have
been written a zstd dictionary is trained on the stored ones (zstandard's ``train_dictionary``)
and every frame is compressed with it from then on (the stored ones again, once): on real
Breakout frames this takes a frame from 25× to 65× smaller.

A checkpoint stores the compressed bytes as they are (no decompression at save) with the
dictionary; the row sizes are the ring's ``obs`` column. A load derives every offset from those
sizes and decompresses every frame once to check it (see ``FrameLog.loaded``).

Example:
    >>> import numpy as np, torch
    >>> log = FrameLog(4, (2, 3), torch.uint8, Codec("zstd", None))
    >>> frames = np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
    >>> blobs = log.compress(frames)
    >>> log.append(0, blobs, log.place(blobs))
    >>> bool((log.take(np.array([1, 0, 1])) == frames[[1, 0, 1]]).all())
    True
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from rlbuf._convert import numpy_dtype_or_none
from rlbuf.errors import CheckpointError, ConfigError

CODECS = ("zstd", "lz4")
"""The ``compression`` options of the compact layout (``None``: frames stored as they are)."""
DICTIONARY_AFTER = 1024
"""Frames written before the dictionary is trained (from the frames then stored)."""
DICTIONARY_BYTES = 16 * 1024
_LEVELS = {"zstd": (1, 22), "lz4": (1, 12)}
_DEFAULT_ZSTD_LEVEL = 3
_MIN_ARENA = 1 << 16
_GROWTH = 1.25
_MAX_DICTIONARY = 1 << 20


def compression_options(compression: Any, level: Any) -> tuple[str | None, int | None]:
    """Check the ``compression`` and ``compression_level`` options: ``(codec, level)``.

    Raises:
        ConfigError: an unknown codec, a level outside its range, a level without a codec, or
            the codec's library missing.

    Example:
        >>> compression_options("zstd", None), compression_options(None, None)
        (('zstd', 3), (None, None))
        >>> compression_options("zstd", 30)
        Traceback (most recent call last):
        ...
        rlbuf.errors.ConfigError: compression_level: expected an int in [1, 22] for zstd, got 30
    """
    if compression is None:
        if level is not None:
            raise ConfigError(f"compression_level: only used with compression='zstd' or 'lz4', got "
                              f"compression_level={level!r} without compression")
        return None, None
    if compression not in CODECS:
        raise ConfigError(f"compression: expected one of {list(CODECS)} or None, got {compression!r}")
    if level is not None:
        low, high = _LEVELS[compression]
        if isinstance(level, bool) or not isinstance(level, int) or not low <= level <= high:
            raise ConfigError(f"compression_level: expected an int in [{low}, {high}] for {compression}, got {level!r}")
    _libraries()
    if compression == "zstd" and level is None:
        level = _DEFAULT_ZSTD_LEVEL
    return compression, level


def frame_codec(compression: Any, level: Any, *, compact: bool) -> Codec | None:
    """The codec of a replay buffer's ``compression`` options, or ``None`` without compression.

    Raises:
        ConfigError: invalid options, or compression without the compact layout.

    Example:
        >>> frame_codec("lz4", None, compact=False)
        Traceback (most recent call last):
        ...
        rlbuf.errors.ConfigError: compression: compresses the frames of the compact layout; add frame_stack=k, n_step=n or compact=True, got compression='lz4' with compact=False
    """
    name, level = compression_options(compression, level)
    if name is None:
        return None
    if not compact:
        raise ConfigError(f"compression: compresses the frames of the compact layout; add frame_stack=k, n_step=n "
                          f"or compact=True, got compression={compression!r} with compact=False")
    return Codec(name, level)


def _libraries() -> tuple[Any, Any]:
    """``(lz4.block, zstandard)``; both are needed (the dictionary is trained by zstandard)."""
    try:
        import lz4.block
        import zstandard
    except ImportError as error:
        raise ConfigError(f"compression: needs the lz4 and zstandard packages ({error}); install them with "
                          f"pip install 'rlbuf[compression]'") from None
    return lz4.block, zstandard


class Codec:
    """One frame's compression and decompression, with an optional dictionary.

    Args:
        name: ``"zstd"`` or ``"lz4"``.
        level: zstd's level (1-22), or lz4's high-compression level (1-12; ``None``: lz4's fast mode).
        dictionary: bytes that both sides prime their history with (``b""``: none).

    Example:
        >>> codec = Codec("lz4", None)
        >>> codec.decompress(codec.compress(bytes(100)), 100) == bytes(100)
        True
    """

    def __init__(self, name: str, level: int | None, dictionary: bytes = b"") -> None:
        self.name, self.level, self.dictionary = name, level, dictionary
        self.compress: Callable[[Any], bytes]
        self._decoder: Callable[[int], Callable[[Any], bytes]]
        lz4_block, zstandard = _libraries()
        self._errors: tuple[type[Exception], ...] = (zstandard.ZstdError, lz4_block.LZ4BlockError, ValueError)
        if name == "zstd":
            data = zstandard.ZstdCompressionDict(dictionary) if dictionary else None
            # No frame header fields: the size is known, and the checkpoint has its own checksums.
            compressor = zstandard.ZstdCompressor(level=level or _DEFAULT_ZSTD_LEVEL, dict_data=data,
                                                  write_content_size=False, write_checksum=False, write_dict_id=False)
            decompressor = zstandard.ZstdDecompressor(dict_data=data)
            self.compress = compressor.compress
            self._decoder = lambda size: functools.partial(decompressor.decompress, max_output_size=size)
        else:
            options: dict[str, Any] = {"store_size": False, "dict": dictionary} if dictionary else {"store_size": False}
            if level is not None:
                options.update(mode="high_compression", compression=level)
            self.compress = functools.partial(lz4_block.compress, **options)
            primed = {"dict": dictionary} if dictionary else {}
            self._decoder = lambda size: functools.partial(lz4_block.decompress, uncompressed_size=size, **primed)

    def decoder(self, size: int) -> Callable[[Any], bytes]:
        """``decode(blob) -> bytes`` of frames of ``size`` bytes, unchecked (a C call: frames this log wrote,
        or checked by ``decompress`` at load)."""
        decode: Callable[[Any], bytes] = self._decoder(size)
        return decode

    def decompress(self, blob: Any, size: int) -> bytes:
        """The ``size`` bytes ``blob`` was compressed from.

        Raises:
            ValueError: ``blob`` is not a compressed frame of ``size`` bytes (with this dictionary).
        """
        try:
            frame: bytes = self._decoder(size)(blob)
        except self._errors as error:
            raise ValueError(f"not a {self.name} frame of {size} bytes ({error})") from None
        if len(frame) != size:
            raise ValueError(f"a {self.name} frame of {len(frame)} bytes, expected {size}")
        return frame

    def with_dictionary(self, dictionary: bytes) -> Codec:
        """The same codec primed with ``dictionary``."""
        return Codec(self.name, self.level, dictionary)

    def train(self, frames: Sequence[bytes]) -> bytes:
        """A dictionary trained on ``frames`` (``b""`` when zstd cannot train one from them)."""
        _, zstandard = _libraries()
        try:
            # Fixed COVER parameters: deterministic, and 50 ms rather than 0.2 s on 1,024 Atari frames.
            trained = zstandard.train_dictionary(DICTIONARY_BYTES, list(frames), k=1024, d=8, steps=4)
        except zstandard.ZstdError:
            return b""
        dictionary: bytes = trained.as_bytes()
        return dictionary


class FrameLog:
    """The compressed frames of a ring of ``capacity`` rows (see the module docstring).

    Writing is two steps, so that nothing can fail once the ring holds the rows: ``place``
    (room for the add's frames; grows the arena, changing no frame) before the ring is written,
    ``append`` after.

    Args:
        capacity: rows in the ring.
        frame_shape: one stored frame.
        dtype: the stored frame dtype.
        codec: how frames are compressed.
    """

    def __init__(self, capacity: int, frame_shape: tuple[int, ...], dtype: torch.dtype, codec: Codec) -> None:
        np_dtype = numpy_dtype_or_none(dtype)
        if np_dtype is None:
            raise ConfigError(f"compression: frames of dtype {dtype} have no numpy dtype to compress; store them "
                              f"as uint8, an integer or a float dtype")
        self.capacity = capacity
        self.frame_shape = tuple(frame_shape)
        self.dtype = dtype
        self.np_dtype = np_dtype
        self.frame_bytes = math.prod(frame_shape) * np_dtype.itemsize
        self.codec = codec
        self.arena = np.empty(0, np.uint8)
        self.start = np.zeros(capacity, np.int64)
        self.length = np.zeros(capacity, np.int32)
        self.head = 0  # where the newest frame ends
        self.wrap_end = 0  # where the frames before the arena's wrap end (when the log wraps)
        self.count = 0  # frames ever appended (the ring's write count)

    # -- writing -----------------------------------------------------------------------------
    def compress(self, frames: npt.NDArray[Any]) -> list[bytes]:
        """Each of ``frames`` (``[rows, *frame]``, the stored dtype) compressed; changes nothing."""
        compress = self.codec.compress
        rows = np.ascontiguousarray(frames, self.np_dtype).reshape(len(frames), -1).view(np.uint8)
        return [compress(row) for row in rows]

    def place(self, blobs: Sequence[bytes]) -> int:
        """Where ``blobs`` will go: room after the newest frame, the arena grown if needed (the frames
        this add overwrites are kept until ``append``)."""
        needed = sum(map(len, blobs))
        at = self._free_offset(needed)
        if at is None:
            self._grow(needed)
            at = self.head
        return at

    def append(self, first_serial: int, blobs: Sequence[bytes], at: int) -> None:
        """Store ``blobs`` as the frames of serials ``first_serial, ...`` at ``at`` (from ``place``)."""
        if first_serial != self.count:
            raise AssertionError(f"frames appended at serial {first_serial}, the log holds {self.count}")
        if at < self.head:
            self.wrap_end = self.head
        lengths = np.fromiter(map(len, blobs), np.int64, len(blobs))
        starts = at + np.cumsum(lengths) - lengths
        self.arena[at:at + int(lengths.sum())] = np.frombuffer(b"".join(blobs), np.uint8)
        positions = (first_serial + np.arange(len(blobs))) % self.capacity
        self.start[positions], self.length[positions] = starts, lengths
        self.head = at + int(lengths.sum())
        self.count += len(blobs)

    def _free_offset(self, needed: int) -> int | None:
        """Where ``needed`` bytes fit after the newest frame without touching a stored one, or None."""
        size = len(self.arena)
        if self._stored() == 0:
            self.head = self.wrap_end = 0
            return 0 if needed <= size else None
        tail = int(self.start[self._oldest() % self.capacity])
        if self.head > tail:  # not wrapped: room after the head, then before the tail
            if self.head + needed <= size:
                return self.head
            return 0 if needed <= tail else None
        return self.head if self.head + needed <= tail else None

    def _grow(self, needed: int) -> None:
        """A larger arena with the stored frames in order from offset 0 (same frames, new offsets)."""
        live = self._segments()
        used = sum(high - low for low, high in live)
        arena = np.empty(max(_MIN_ARENA, int((used + needed) * _GROWTH), int(len(self.arena) * _GROWTH)), np.uint8)
        positions = self._stored_positions()
        offset = 0
        starts = self.start[positions]
        for low, high in live:
            arena[offset:offset + high - low] = self.arena[low:high]
            inside = (starts >= low) & (starts < high) if high > low else np.zeros(len(starts), np.bool_)
            self.start[positions[inside]] = starts[inside] - low + offset
            offset += high - low
        self.arena, self.head, self.wrap_end = arena, offset, 0

    def _segments(self) -> list[tuple[int, int]]:
        """The arena ranges holding stored frames, oldest first."""
        if self._stored() == 0:
            return []
        tail = int(self.start[self._oldest() % self.capacity])
        if self.head > tail:
            return [(tail, self.head)]
        return [(tail, self.wrap_end), (0, self.head)]

    def _oldest(self) -> int:
        return self.count - self._stored()

    def _stored(self) -> int:
        return min(self.count, self.capacity)

    def _stored_positions(self) -> npt.NDArray[np.int64]:
        """Ring positions of the stored frames, oldest first."""
        return (self._oldest() + np.arange(self._stored(), dtype=np.int64)) % self.capacity

    def training_due(self, appended: int) -> bool:
        """Whether the last append of ``appended`` frames reached ``DICTIONARY_AFTER`` (``train`` then)."""
        return self.count >= DICTIONARY_AFTER > self.count - appended and not self.codec.dictionary

    def train(self) -> npt.NDArray[np.int64] | None:
        """Train the dictionary on the stored frames and compress them again with it: the positions
        whose compressed sizes changed (``length``), or None where zstd trained no dictionary."""
        positions = self._stored_positions()
        frames = [self._frame(int(p)) for p in positions]
        dictionary = self.codec.train(frames)
        if not dictionary:
            return None
        codec = self.codec.with_dictionary(dictionary)
        blobs = [codec.compress(frame) for frame in frames]
        lengths = np.fromiter(map(len, blobs), np.int64, len(blobs))
        arena = np.empty(max(_MIN_ARENA, int(lengths.sum() * _GROWTH)), np.uint8)
        arena[:int(lengths.sum())] = np.frombuffer(b"".join(blobs), np.uint8)
        self.start[positions], self.length[positions] = np.cumsum(lengths) - lengths, lengths
        self.arena, self.codec, self.head, self.wrap_end = arena, codec, int(lengths.sum()), 0
        return positions

    # -- reading -----------------------------------------------------------------------------
    def _frame(self, position: int) -> bytes:
        start = int(self.start[position])
        return self.codec.decompress(self.arena.data[start:start + int(self.length[position])],
                                     self.frame_bytes)

    def take(self, positions: npt.NDArray[np.int64]) -> npt.NDArray[Any]:
        """The frames at ring ``positions`` ``[len(positions), *frame]``, each distinct one decoded once.

        Decoded straight into the result through a byte view (a numpy assignment from bytes costs
        five times more), into the first row that asks for it; the other rows copy it.
        """
        unique, first, inverse = np.unique(positions, return_index=True, return_inverse=True)
        size = self.frame_bytes
        result = np.empty((len(positions), size), np.uint8)
        out, arena, decode = result.data.cast("B"), self.arena.data, self.codec.decoder(size)
        for row, start, length in zip(first.tolist(), self.start[unique].tolist(), self.length[unique].tolist(),
                                      strict=True):
            out[row * size:(row + 1) * size] = decode(arena[start:start + length])
        source = first[inverse.reshape(-1)]
        again = np.flatnonzero(source != np.arange(len(positions)))
        if again.size:
            result[again] = result[source[again]]
        frames: npt.NDArray[Any] = result.view(self.np_dtype).reshape(len(positions), *self.frame_shape)
        return frames

    @property
    def nbytes(self) -> int:
        """Bytes allocated: the arena (stored frames and free room) and the offsets."""
        return self.arena.nbytes + self.start.nbytes + self.length.nbytes

    @property
    def stored_bytes(self) -> int:
        """Bytes of the stored compressed frames (the arena may hold more, free)."""
        return sum(high - low for low, high in self._segments())

    # -- state -------------------------------------------------------------------------------
    def clear(self) -> None:
        """Forget every frame and the dictionary (trained again after ``DICTIONARY_AFTER`` frames)."""
        self.head = self.wrap_end = self.count = 0
        self.start.fill(0)
        self.length.fill(0)
        if self.codec.dictionary:
            self.codec = self.codec.with_dictionary(b"")

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The stored compressed bytes, oldest frame first, and the dictionary (copies)."""
        segments = self._segments()
        data = np.concatenate([self.arena[low:high] for low, high in segments]) if segments else np.empty(0, np.uint8)
        return {"bytes": torch.from_numpy(data.copy()),
                "dictionary": torch.frombuffer(bytearray(self.codec.dictionary), dtype=torch.uint8)
                if self.codec.dictionary else torch.zeros(0, dtype=torch.uint8)}

    def loaded(self, state: Any, sizes: torch.Tensor, *, write_count: int) -> FrameLog:
        """A new log holding a ``state_dict``, every frame decompressed once to check it.

        Args:
            state: the saved ``{"bytes", "dictionary"}``.
            sizes: the ring's ``obs`` column: each stored row's compressed size ``[size]`` (positions).
            write_count: rows written (the newest row's serial + 1).

        Raises:
            CheckpointError: sizes that do not add up to the bytes, or a frame that is not one.
        """
        if not isinstance(state, dict) or set(state) != {"bytes", "dictionary"}:
            found = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise CheckpointError(f"compressed frames must hold 'bytes' and 'dictionary', found {found}")
        for name in ("bytes", "dictionary"):
            value = state[name]
            if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8 or value.dim() != 1:
                raise CheckpointError(f"compressed frames {name!r} must be a 1-D uint8 tensor")
        dictionary = bytes(state["dictionary"].numpy())
        if len(dictionary) > _MAX_DICTIONARY:
            raise CheckpointError(f"a compression dictionary of {len(dictionary)} bytes, at most "
                                  f"{_MAX_DICTIONARY} are written")
        if dictionary and write_count < DICTIONARY_AFTER:
            raise CheckpointError(f"a compression dictionary after {write_count} frames; rlbuf trains one after "
                                  f"{DICTIONARY_AFTER}")
        log = FrameLog(self.capacity, self.frame_shape, self.dtype, self.codec.with_dictionary(dictionary)
                       if dictionary != self.codec.dictionary else self.codec)
        size = int(sizes.shape[0])
        log.count = write_count
        positions = log._stored_positions()
        lengths = sizes.cpu().numpy().astype(np.int64)[positions] if size else np.zeros(0, np.int64)
        data = state["bytes"].numpy()
        bound = self.frame_bytes + self.frame_bytes // 255 + 128
        if size and (lengths.min() < 1 or lengths.max() > bound):
            row = int(positions[np.argmax((lengths < 1) | (lengths > bound))])
            raise CheckpointError(f"row {row} holds a compressed frame of {int(sizes[row])} bytes, expected "
                                  f"1 to {bound} (frames of {self.frame_bytes} bytes)")
        if int(lengths.sum()) != len(data):
            raise CheckpointError(f"the rows' compressed frames add up to {int(lengths.sum())} bytes, the "
                                  f"checkpoint holds {len(data)}")
        log.arena = np.array(data, np.uint8, copy=True) if len(data) else np.empty(_MIN_ARENA, np.uint8)
        log.start[positions], log.length[positions] = np.cumsum(lengths) - lengths, lengths
        log.head = len(data)
        for position in positions.tolist():
            try:
                log._frame(position)
            except ValueError as error:
                raise CheckpointError(f"row {position}'s compressed frame does not decompress: {error}") from None
        return log

    def adopt(self, other: FrameLog) -> None:
        """Hold ``other``'s frames (a log from ``loaded``)."""
        self.arena, self.start, self.length = other.arena, other.start, other.length
        self.head, self.wrap_end, self.count, self.codec = other.head, other.wrap_end, other.count, other.codec


class CompressedFinals:
    """The final observations of a compressed compact layout: ``FinalFrames``' slots, each frame
    compressed with the log's codec (episode ends are a few percent of the rows, but raw they would
    take more memory than every other frame compressed).

    Args:
        log: the layout's frame log (its codec and frame; the dictionary it trains applies here too).

    Example:
        >>> log = FrameLog(4, (2,), torch.uint8, Codec("zstd", None))
        >>> finals = CompressedFinals(log)
        >>> slots = finals.put(torch.tensor([[1, 2], [3, 4]], dtype=torch.uint8))
        >>> finals.take(slots[::-1]).tolist()
        [[3, 4], [1, 2]]
    """

    def __init__(self, log: FrameLog) -> None:
        self.log = log
        self.blobs: list[bytes] = []
        self.free: list[int] = []

    def put(self, values: torch.Tensor) -> npt.NDArray[np.int64]:
        """Store ``values`` (one frame per row) and return their slots."""
        blobs = self.log.compress(values.cpu().numpy())
        slots = []
        for blob in blobs:
            slot = self.free.pop() if self.free else len(self.blobs)
            if slot == len(self.blobs):
                self.blobs.append(blob)
            else:
                self.blobs[slot] = blob
            slots.append(slot)
        return np.array(slots, np.int64)

    def release(self, slots: npt.NDArray[np.int64]) -> None:
        """Free ``slots`` for reuse (their rows were overwritten)."""
        for slot in slots.tolist():
            self.blobs[slot] = b""
            self.free.append(slot)

    def take(self, slots: npt.NDArray[np.int64]) -> torch.Tensor:
        """The frames in ``slots``, on the CPU."""
        log = self.log
        size, decode = log.frame_bytes, log.codec.decoder(log.frame_bytes)
        result = np.empty((len(slots), size), np.uint8)
        out = result.data.cast("B")
        for row, slot in enumerate(slots.tolist()):
            out[row * size:(row + 1) * size] = decode(self.blobs[slot])
        return torch.from_numpy(result.view(log.np_dtype).reshape(len(slots), *log.frame_shape))

    def recompress(self, old: Codec) -> None:
        """Compress the kept frames again with the log's codec (it has trained a dictionary; they were ``old``'s)."""
        size, new = self.log.frame_bytes, self.log.codec.compress
        self.blobs = [new(old.decompress(blob, size)) if blob else blob for blob in self.blobs]

    def clear(self) -> None:
        """Forget every frame."""
        self.blobs, self.free = [], []

    @property
    def stored_bytes(self) -> int:
        """Bytes of the kept compressed frames."""
        return sum(len(blob) for blob in self.blobs)

    @property
    def nbytes(self) -> int:
        """Bytes held: the compressed frames and a Python object each."""
        return sum(len(blob) for blob in self.blobs) + len(self.blobs) * (sys.getsizeof(b"") + 8)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The slots' compressed bytes (a free slot holds none), their sizes and the free list."""
        data = b"".join(self.blobs)
        return {"bytes": torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8),
                "sizes": torch.tensor([len(blob) for blob in self.blobs], dtype=torch.int64),
                "free": torch.tensor(self.free, dtype=torch.int64)}

    def structure_problem(self, state: Any) -> str:
        """``""`` when ``state`` has the form of a ``state_dict`` (its frames are checked by ``frames_problem``)."""
        if not isinstance(state, dict) or set(state) != {"bytes", "sizes", "free"}:
            return "stream table finals must hold 'bytes', 'sizes' and 'free' (compressed final observations)"
        for name, dtype in (("bytes", torch.uint8), ("sizes", torch.int64), ("free", torch.int64)):
            value = state[name]
            if not isinstance(value, torch.Tensor) or value.dtype != dtype or value.dim() != 1:
                return f"compressed final observations {name!r} must be a 1-D {dtype} tensor"
        return ""

    @staticmethod
    def slots(state: dict[str, torch.Tensor]) -> int:
        """Slots kept in a ``state_dict`` (used or free)."""
        return int(state["sizes"].shape[0])

    def frames_problem(self, state: dict[str, torch.Tensor], used: npt.NDArray[np.int64], codec: Codec) -> str:
        """``""`` when the ``used`` slots of ``state`` hold frames ``codec`` decompresses and free ones none."""
        sizes = state["sizes"].numpy()
        if (sizes < 0).any() or int(sizes.sum()) != int(state["bytes"].shape[0]):
            return "compressed final observations: the slots' sizes do not add up to the bytes kept"
        in_use = np.zeros(len(sizes), np.bool_)
        in_use[used] = True
        if (sizes[~in_use] != 0).any() or (sizes[in_use] == 0).any():
            return "compressed final observations: a free slot holds bytes, or a used one none"
        data, ends = state["bytes"].numpy(), np.cumsum(sizes)
        for slot in np.flatnonzero(in_use).tolist():
            try:
                codec.decompress(data[ends[slot] - sizes[slot]:ends[slot]].tobytes(), self.log.frame_bytes)
            except ValueError as error:
                return f"compressed final observation slot {slot} does not decompress: {error}"
        return ""

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore a ``state_dict`` checked by ``structure_problem`` and ``frames_problem``."""
        data, ends = bytes(state["bytes"].numpy()), np.cumsum(state["sizes"].numpy()).tolist()
        self.blobs = [data[start:end] for start, end in zip([0, *ends][:len(ends)], ends, strict=True)]
        self.free = [int(slot) for slot in state["free"].tolist()]
