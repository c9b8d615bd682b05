"""Compressed frames of the compact layout: one per ring row, in a byte log written in row order.

With ``compression="zstd"`` or ``"lz4"`` the ring's ``obs`` field holds the size in bytes of
each row's compressed frame, and the frames themselves live here, in one numpy byte array
(the *arena*) used as a circular log: an add appends its rows' frames after the newest ones,
and the ring overwrites its oldest rows first, so the bytes of the oldest frame are the next
to be freed. No Python object per frame, no allocator: a row costs its compressed bytes and
16 bytes (offset, size, checksum).

Frames are compressed once at ``add`` and decompressed at ``sample``, bit-exact; each sample
decodes every distinct frame of the batch once. Small frames compress poorly on their own (an
84×84 Atari frame is mostly the same background), so once ``DICTIONARY_AFTER`` frames have
been written a zstd dictionary is trained on the stored ones (zstandard's ``train_dictionary``)
and every frame is compressed with it from then on (the stored ones again, once): on real
Breakout frames this takes a frame from 25× to 65× smaller.

A checkpoint stores the compressed bytes as they are (no decompression at save) with the
dictionary; the row sizes are the ring's ``obs`` column. A load derives every offset from those
sizes and decompresses every frame once, against the checksum of the raw frame taken at ``add``
(see ``FrameLog.loaded``): bytes that decode to anything but the frames added are refused.

Example:
    >>> import numpy as np, torch
    >>> log = FrameLog(4, (2, 3), torch.uint8, Codec("zstd", None))
    >>> frames = np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
    >>> packed = log.compress(frames)
    >>> log.append(0, packed, log.place(packed))
    >>> bool((log.take(np.array([1, 0, 1])) == frames[[1, 0, 1]]).all())
    True
"""

from __future__ import annotations

import math
import sys
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import torch

from rlbuf._codec import DICTIONARY_BYTES, DICTIONARY_MAGIC, Codec, checksums
from rlbuf._convert import numpy_dtype_or_none
from rlbuf._streams import Chain, as_words
from rlbuf.errors import CheckpointError, ConfigError

DICTIONARY_AFTER = 1024
"""Frames written before the dictionary is trained (from the frames then stored)."""
_MIN_ARENA = 1 << 16
_GROWTH = 1.25


class Placement(NamedTuple):
    """Where an add's frames go: at ``at`` of the arena, or of ``arena``, a larger one allocated for them."""

    at: int
    arena: npt.NDArray[np.uint8] | None


class Packed(NamedTuple):
    """Frames compressed for an add: the compressed bytes, each one's size and the checksum of each raw frame."""

    blobs: list[bytes]
    lengths: npt.NDArray[np.int64]
    sums: npt.NDArray[np.uint32]

class FrameLog:
    """The compressed frames of a ring of ``capacity`` rows (see the module docstring).

    Writing is two steps, so that nothing can fail once the ring holds the rows: ``place``
    (room for the add's frames, or a larger arena allocated for them; changes nothing) before
    the ring is written, ``append`` after.

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
        if not self.frame_bytes:
            raise ConfigError(f"compression: frames of shape {self.frame_shape} hold no bytes to compress")
        self.codec = codec
        self.arena = np.empty(0, np.uint8)
        self.start = np.zeros(capacity, np.int64)
        self.length = np.zeros(capacity, np.int32)
        self.sums = np.zeros(capacity, np.uint32)  # of the raw frames, checked at load
        self.head = 0  # where the newest frame ends
        self.wrap_end = 0  # where the frames before the arena's wrap end (when the log wraps)
        self.count = 0  # frames ever appended (the ring's write count)

    # -- writing -----------------------------------------------------------------------------
    def compress(self, frames: npt.NDArray[Any]) -> Packed:
        """Each of ``frames`` (``[rows, *frame]``, the stored dtype) compressed, and its checksum; changes nothing."""
        compress = self.codec.compress
        rows = np.ascontiguousarray(frames, self.np_dtype).reshape(len(frames), math.prod(self.frame_shape)).view(
            np.uint8)
        blobs = [compress(row) for row in rows]
        return Packed(blobs, np.fromiter(map(len, blobs), np.int64, len(blobs)), checksums(rows))

    def place(self, packed: Packed) -> Placement:
        """Where ``packed`` will go, changing nothing: room after the newest frame (the frames this add
        overwrites are kept until ``append``), or, allocated now, a larger arena the stored frames move
        to at ``append`` (so an add refused after ``place`` leaves the log as it was)."""
        needed = sum(map(len, packed.blobs))  # Python's sum: a numpy reduction costs 20 µs with cold caches
        at = self._free_offset(needed)
        if at is not None:
            return Placement(at, None)
        used = self.stored_bytes
        size = max(_MIN_ARENA, int((used + needed) * _GROWTH), int(len(self.arena) * _GROWTH))
        return Placement(used, np.empty(size, np.uint8))

    def append(self, first_serial: int, packed: Packed, placement: Placement) -> None:
        """Store ``packed`` as the frames of serials ``first_serial, ...`` where ``place`` said."""
        blobs = packed.blobs
        if first_serial != self.count:
            raise AssertionError(f"frames appended at serial {first_serial}, the log holds {self.count}")
        if placement.arena is not None:
            self._move_to(placement.arena)
        at = placement.at
        if self._stored() == 0:
            self.head = self.wrap_end = 0
        elif at < self.head:
            self.wrap_end = self.head
        # numba is imported with the compact layout (whose frames these are), not with rlbuf
        from rlbuf._frames_numba import append_frames

        # One compiled call for the bytes and the offsets: numpy's calls cost 5-40 µs each with cold caches.
        self.head = append_frames(self.arena, self.start, self.length, self.sums,
                                  np.frombuffer(b"".join(blobs), np.uint8), packed.lengths, packed.sums, at,
                                  first_serial)
        self.count += len(blobs)

    def _free_offset(self, needed: int) -> int | None:
        """Where ``needed`` bytes fit after the newest frame without touching a stored one, or None."""
        size = len(self.arena)
        if self._stored() == 0:
            return 0 if needed <= size else None
        tail = int(self.start[self._oldest() % self.capacity])
        if self.head > tail:  # not wrapped: room after the head, then before the tail
            if self.head + needed <= size:
                return self.head
            return 0 if needed <= tail else None
        return self.head if self.head + needed <= tail else None

    def _move_to(self, arena: npt.NDArray[np.uint8]) -> None:
        """Move the stored frames, in order from offset 0, to ``arena`` (same frames, new offsets)."""
        live = self._segments()
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
        """Train the dictionary on the newest ``DICTIONARY_AFTER`` stored frames and compress every stored
        frame again with it, one at a time (an ``extend`` of a whole dataset never holds its frames raw):
        the positions whose compressed sizes changed (``length``), or None where zstd trained none."""
        positions = self._stored_positions()
        dictionary = self.codec.train([self._frame(int(p)) for p in positions[-DICTIONARY_AFTER:]])
        if not dictionary:
            return None
        try:
            codec = self.codec.with_dictionary(dictionary)
        except ValueError:  # a dictionary zstd trained but cannot use: go on without one
            return None
        blobs = [codec.compress(self._frame(int(p))) for p in positions]
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

        Decoded straight into the result (``Codec.decode_rows``), into the first row that asks for it; the
        other rows copy it (``copy_repeated``).
        """
        size = self.frame_bytes
        result = np.empty((len(positions), size), np.uint8)
        if not len(positions):
            empty: npt.NDArray[Any] = result.view(self.np_dtype).reshape(0, *self.frame_shape)
            return empty
        _, first, inverse = np.unique(positions, return_index=True, return_inverse=True)
        rows = np.sort(first)  # in row order: a stack's frames are consecutive rows, decoded in one call
        distinct = positions[rows]
        self.codec.decode_rows(self.arena, self.start[distinct], self.length[distinct].astype(np.int64),
                               result.data.cast("B"), rows, size)
        source = first[inverse.reshape(-1)]
        again = np.flatnonzero(source != np.arange(len(positions)))
        if again.size:
            copy_repeated(result, again, source[again])
        frames: npt.NDArray[Any] = result.view(self.np_dtype).reshape(len(positions), *self.frame_shape)
        return frames

    def stacks(self, chain: Chain, finals: CompressedFinals, frame_stack: int,
               zero_pad: bool) -> torch.Tensor:
        """``obs`` and ``next_obs`` of the complete transitions walked as ``chain``, as ``Streams.stacks`` rebuilds
        them from raw frames (``zero_pad``: ``padding_type="zero"``), in one CPU tensor ``[2, B, ...]``.

        One compiled call plans the batch (``rlbuf._frames_numba.plan_stacks``): each distinct frame is
        decoded once, straight into the first place of the stacks that holds it (a stack's frames are
        consecutive places: decoded in one call), each final observation into its place, and the other
        places copy those (``copy_repeated``; zeros before an episode start): no frame decoded that is
        not returned, none copied twice.

        Example:
            >>> log = FrameLog(4, (2,), torch.uint8, Codec("zstd", None))
            >>> packed = log.compress(np.arange(6, dtype=np.uint8).reshape(3, 2))
            >>> log.append(0, packed, log.place(packed))
            >>> no = np.zeros(1, np.bool_)  # one transition of rows 0, 1 (its stack of 2) and 2 (one step later)
            >>> chain = Chain(~no, np.array([[0, 1, 2]]), np.zeros((1, 3), np.bool_), np.ones(1, np.int64), no, no,
            ...               np.full(1, -1))
            >>> log.stacks(chain, CompressedFinals(log), 2, False).tolist()  # obs, then next_obs
            [[[[0, 1], [2, 3]]], [[[2, 3], [4, 5]]]]
        """
        # numba is imported with the compact layout (whose frames these are), not with rlbuf
        from rlbuf._frames_numba import plan_stacks

        count, size, ended = len(chain.steps), self.frame_bytes, chain.ended
        result = np.empty((2 * count * frame_stack, size), np.uint8)
        decode, positions, destinations, sources, places = plan_stacks(chain.rows, chain.padded, chain.steps, ended,
                                                                       frame_stack, zero_pad)
        out = result.reshape(-1).data  # flat bytes (a cast refuses the shape of an empty batch)
        self.codec.decode_rows(self.arena, self.start[positions], self.length[positions].astype(np.int64), out, decode,
                               size)
        if len(places):
            finals.decode_into(chain.final_slot[ended], out, places)
        if len(destinations):  # after the decodes: the places they copy
            copy_repeated(result, destinations, sources)
        return torch.from_numpy(result.view(self.np_dtype).reshape(
            2, count, *((frame_stack,) if frame_stack > 1 else ()), *self.frame_shape))

    def blobs(self, positions: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
        """The compressed frames at ring ``positions`` as stored, one after another, and each one's size
        (what a learner decodes with this log's codec: see [`rlbuf._compact_wire`][rlbuf._compact_wire]).

        Example:
            >>> log = FrameLog(4, (8,), torch.uint8, Codec("lz4", None))
            >>> packed = log.compress(np.zeros((2, 8), np.uint8))
            >>> log.append(0, packed, log.place(packed))
            >>> data, lengths = log.blobs(np.array([1, 0]))
            >>> len(data) == int(lengths.sum()) and log.codec.decompress(data[:lengths[0]], 8) == bytes(8)
            True
        """
        # numba is imported with the compact layout (whose frames these are), not with rlbuf
        from rlbuf._frames_numba import gather_bytes

        lengths = self.length[positions].astype(np.int64)
        data = np.empty(int(lengths.sum()), np.uint8)
        gather_bytes(self.arena, self.start[positions], lengths, data)
        return data, lengths

    @property
    def nbytes(self) -> int:
        """Bytes allocated: the arena (stored frames and free room), the offsets and the dictionary."""
        return (self.arena.nbytes + self.start.nbytes + self.length.nbytes + self.sums.nbytes
                + len(self.codec.dictionary))

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
        """The stored compressed bytes and their frames' checksums, oldest frame first, and the dictionary (copies)."""
        segments = self._segments()
        data = np.concatenate([self.arena[low:high] for low, high in segments]) if segments else np.empty(0, np.uint8)
        return {"bytes": torch.from_numpy(data.copy()),
                "checksums": torch.from_numpy(self.sums[self._stored_positions()].astype(np.int64)),
                "dictionary": torch.frombuffer(bytearray(self.codec.dictionary), dtype=torch.uint8)
                if self.codec.dictionary else torch.zeros(0, dtype=torch.uint8)}

    def loaded(self, state: Any, sizes: torch.Tensor, *, write_count: int, verify: bool = True) -> FrameLog:
        """A new log holding a ``state_dict``, every frame decompressed once to check it (with its own codec:
        a check may run while the buffer samples).

        Args:
            state: the saved ``{"bytes", "checksums", "dictionary"}``.
            sizes: the ring's ``obs`` column: each stored row's compressed size ``[size]`` (positions).
            write_count: rows written (the newest row's serial + 1).
            verify: decompress every frame against its checksum (``False``: a state this check passed).

        Raises:
            CheckpointError: sizes that do not add up to the bytes, or a frame that does not
                decompress to a frame with its checksum.
        """
        if not isinstance(state, dict) or set(state) != {"bytes", "checksums", "dictionary"}:
            found = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise CheckpointError(f"compressed frames must hold 'bytes', 'checksums' and 'dictionary', found {found}")
        for name, dtype in (("bytes", torch.uint8), ("checksums", torch.int64), ("dictionary", torch.uint8)):
            value = state[name]
            if not isinstance(value, torch.Tensor) or value.dtype != dtype or value.dim() != 1:
                raise CheckpointError(f"compressed frames {name!r} must be a 1-D {dtype} tensor")
        sums = state["checksums"].numpy()
        if len(sums) != int(sizes.shape[0]) or ((sums < 0) | (sums > 0xFFFFFFFF)).any():
            raise CheckpointError(f"compressed frames: {len(sums)} checksums of 32 bits expected one per stored "
                                  f"row ({int(sizes.shape[0])})")
        dictionary = bytes(state["dictionary"].numpy())
        if dictionary and (len(dictionary) > DICTIONARY_BYTES or not dictionary.startswith(DICTIONARY_MAGIC)):
            raise CheckpointError(f"a compression dictionary of {len(dictionary)} bytes starting "
                                  f"{dictionary[:4].hex()}; rlbuf writes the ones zstd trains: at most "
                                  f"{DICTIONARY_BYTES} bytes, starting {DICTIONARY_MAGIC.hex()}")
        if dictionary and write_count < DICTIONARY_AFTER:
            raise CheckpointError(f"a compression dictionary after {write_count} frames; rlbuf trains one after "
                                  f"{DICTIONARY_AFTER}")
        try:
            codec = self.codec.with_dictionary(dictionary)
        except ValueError as error:
            raise CheckpointError(f"compressed frames: {error}") from None
        log = FrameLog(self.capacity, self.frame_shape, self.dtype, codec)
        size = int(sizes.shape[0])
        if size != min(write_count, self.capacity):
            raise CheckpointError(f"compressed frames: {size} rows after {write_count} writes, expected "
                                  f"{min(write_count, self.capacity)}")
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
        log.sums[positions] = sums.astype(np.uint32)
        log.head = len(data)
        for position in positions.tolist() if verify else ():
            try:
                frame = log._frame(position)
            except ValueError as error:
                raise CheckpointError(f"row {position}'s compressed frame does not decompress: {error}") from None
            if checksums(np.frombuffer(frame, np.uint8)[None])[0] != log.sums[position]:
                raise CheckpointError(f"row {position}'s compressed frame decompresses to another frame than the "
                                      f"one added (its checksum differs)")
        return log

    def adopt(self, other: FrameLog) -> None:
        """Hold ``other``'s frames (a log from ``loaded``)."""
        self.arena, self.start, self.length, self.sums = other.arena, other.start, other.length, other.sums
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
        >>> slots = finals.put(np.array([[1, 2], [3, 4]], np.uint8))
        >>> finals.take(slots[::-1]).tolist()
        [[3, 4], [1, 2]]
    """

    def __init__(self, log: FrameLog) -> None:
        self.log = log
        self.blobs: list[bytes] = []
        self.sums: list[int] = []  # of the raw frames, checked at load (0: a free slot)
        self.free: list[int] = []

    def put(self, values: np.ndarray[Any, Any]) -> npt.NDArray[np.int64]:
        """Store ``values`` (numpy, one frame per row) and return their slots."""
        packed = self.log.compress(values)
        slots = []
        # Copied: a compressor's bytes object may hold the whole buffer it was made in (a frame's size).
        for blob, checksum in zip(map(_exact, packed.blobs), packed.sums.tolist(), strict=True):
            slot = self.free.pop() if self.free else len(self.blobs)
            if slot == len(self.blobs):
                self.blobs.append(blob)
                self.sums.append(checksum)
            else:
                self.blobs[slot], self.sums[slot] = blob, checksum
            slots.append(slot)
        return np.array(slots, np.int64)

    def release(self, slots: npt.NDArray[np.int64]) -> None:
        """Free ``slots`` for reuse (their rows were overwritten)."""
        for slot in slots.tolist():
            self.blobs[slot], self.sums[slot] = b"", 0
            self.free.append(slot)

    def take(self, slots: npt.NDArray[np.int64]) -> torch.Tensor:
        """The frames in ``slots``, on the CPU."""
        log = self.log
        result = np.empty((len(slots), log.frame_bytes), np.uint8)
        self.decode_into(slots, result.data.cast("B"), np.arange(len(slots)))
        return torch.from_numpy(result.view(log.np_dtype).reshape(len(slots), *log.frame_shape))

    def decode_into(self, slots: npt.NDArray[np.int64], out: memoryview, rows: npt.NDArray[np.int64]) -> None:
        """Decode the frames in ``slots`` straight into rows ``rows`` (ascending) of ``out`` (rows of a frame's
        bytes)."""
        data, lengths = self.blobs_at(slots)
        self.log.codec.decode_rows(data, np.cumsum(lengths) - lengths, lengths, out, rows, self.log.frame_bytes)

    def blobs_at(self, slots: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
        """The compressed frames in ``slots``, one after another, and each one's size (see ``FrameLog.blobs``)."""
        blobs = [self.blobs[slot] for slot in slots.tolist()]
        return (np.frombuffer(b"".join(blobs), np.uint8),
                np.fromiter(map(len, blobs), np.int64, len(blobs)))

    def recompress(self, old: Codec) -> None:
        """Compress the kept frames again with the log's codec (it has trained a dictionary; they were ``old``'s)."""
        size, new = self.log.frame_bytes, self.log.codec.compress
        self.blobs = [_exact(new(old.decompress(blob, size))) if blob else blob for blob in self.blobs]

    def clear(self) -> None:
        """Forget every frame."""
        self.blobs, self.sums, self.free = [], [], []

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
                "checksums": torch.tensor(self.sums, dtype=torch.int64),
                "free": torch.tensor(self.free, dtype=torch.int64)}

    def structure_problem(self, state: Any) -> str:
        """``""`` when ``state`` has the form of a ``state_dict`` (its frames are checked by ``frames_problem``)."""
        if not isinstance(state, dict) or set(state) != {"bytes", "sizes", "checksums", "free"}:
            return ("stream table finals must hold 'bytes', 'sizes', 'checksums' and 'free' (compressed final "
                    "observations)")
        for name, dtype in (("bytes", torch.uint8), ("sizes", torch.int64), ("checksums", torch.int64),
                            ("free", torch.int64)):
            value = state[name]
            if not isinstance(value, torch.Tensor) or value.dtype != dtype or value.dim() != 1:
                return f"compressed final observations {name!r} must be a 1-D {dtype} tensor"
        if state["checksums"].shape != state["sizes"].shape:
            return "compressed final observations: one checksum per slot expected"
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
        data, ends, sums = state["bytes"].numpy(), np.cumsum(sizes), state["checksums"].numpy()
        if (sums[~in_use] != 0).any():
            return "compressed final observations: a free slot holds a checksum"
        for slot in np.flatnonzero(in_use).tolist():
            try:
                frame = codec.decompress(data[ends[slot] - sizes[slot]:ends[slot]].tobytes(), self.log.frame_bytes)
            except ValueError as error:
                return f"compressed final observation slot {slot} does not decompress: {error}"
            if int(checksums(np.frombuffer(frame, np.uint8)[None])[0]) != int(sums[slot]):
                return f"compressed final observation slot {slot} decompresses to another frame than the one kept"
        return ""

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore a ``state_dict`` checked by ``structure_problem`` and ``frames_problem``."""
        data, ends = bytes(state["bytes"].numpy()), np.cumsum(state["sizes"].numpy()).tolist()
        self.blobs = [data[start:end] for start, end in zip([0, *ends][:len(ends)], ends, strict=True)]
        self.sums = [int(checksum) for checksum in state["checksums"].tolist()]
        self.free = [int(slot) for slot in state["free"].tolist()]


def copy_repeated(rows: npt.NDArray[np.uint8], destinations: npt.NDArray[np.int64],
                  sources: npt.NDArray[np.int64]) -> None:
    """``rows[destinations] = rows[sources]`` (zeros where a source is negative) for C-contiguous frames of bytes
    ``[n, frame_bytes]``: the frames a decoded batch asks for again, copied by a compiled loop
    (``rlbuf._streams_numba.copy_rows``), where a numpy fancy assignment would make a temporary (about 3 MB,
    new memory at every batch of 256) and copy twice.

    Example:
        >>> rows = np.arange(6, dtype=np.uint8).reshape(3, 2)
        >>> copy_repeated(rows, np.array([2, 1]), np.array([0, -1]))
        >>> rows.tolist()
        [[0, 1], [0, 0], [0, 1]]
    """
    # numba is imported with the compact layout (whose frames these are), not with rlbuf
    from rlbuf._streams_numba import copy_rows

    copy_rows(as_words(rows, 0), destinations, sources)


def _exact(blob: bytes) -> bytes:
    """A copy of ``blob`` holding its own bytes only.

    Example:
        >>> _exact(b"abc")
        b'abc'
    """
    return bytes(memoryview(blob))
