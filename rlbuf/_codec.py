"""Frame codecs of the compressed compact layout: the options, one frame's compression, checksums.

``compression="zstd"`` (zstandard) or ``"lz4"`` (python-lz4's block format), both primed with a
dictionary once one is trained (``Codec.train``: zstandard's ``train_dictionary``), and an
xxHash checksum of every raw frame, kept beside it, with which a load proves that each stored
frame decompresses to the frame that was added.

Example:
    >>> codec = Codec("zstd", 3)
    >>> frame = bytes(range(256)) * 4
    >>> codec.decompress(codec.compress(frame), len(frame)) == frame
    True
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from rlbuf.errors import ConfigError

CODECS = ("zstd", "lz4")
"""The ``compression`` options of the compact layout (``None``: frames stored as they are)."""
DICTIONARY_BYTES = 16 * 1024
_LEVELS = {"zstd": (1, 22), "lz4": (1, 12)}
_DEFAULT_ZSTD_LEVEL = 3
DICTIONARY_MAGIC = b"\x37\xa4\x30\xec"
"""How every dictionary zstd trains begins (``ZSTD_MAGIC_DICTIONARY``, little-endian)."""


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
    if not isinstance(compression, str) or compression not in CODECS:
        raise ConfigError(f"compression: expected one of {list(CODECS)} or None, got {compression!r}")
    if level is not None:
        low, high = _LEVELS[compression]
        if isinstance(level, bool) or not isinstance(level, int) or not low <= level <= high:
            raise ConfigError(f"compression_level: expected an int in [{low}, {high}] for {compression}, got {level!r}")
    _libraries()
    if compression == "zstd" and level is None:
        level = _DEFAULT_ZSTD_LEVEL
    return compression, level


def frame_codec(compression: Any, level: Any, *, compact: bool, hindsight: bool = False) -> Codec | None:
    """The codec of a replay buffer's ``compression`` options, or ``None`` without compression.

    Raises:
        ConfigError: invalid options, or compression without the compact layout (which a
            ``hindsight`` buffer never has).

    Example:
        >>> frame_codec("lz4", None, compact=False)
        Traceback (most recent call last):
        ...
        rlbuf.errors.ConfigError: compression: compresses the frames of the compact layout; add frame_stack=k, n_step=n or compact=True, got compression='lz4' with compact=False
    """
    name, level = compression_options(compression, level)
    if name is None:
        return None
    if hindsight:
        raise ConfigError(f"compression: compresses the frames of the compact layout, which a hindsight buffer does not "
                          f"use (it relabels whole transitions); got compression={compression!r} (leave it out)")
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
        self._strict: Callable[[Any, int], bytes]
        lz4_block, zstandard = _libraries()
        self._errors: tuple[type[Exception], ...] = (zstandard.ZstdError, lz4_block.LZ4BlockError, ValueError)
        self._reader: Callable[..., Any] | None = None
        if name == "zstd":
            data = zstandard.ZstdCompressionDict(dictionary) if dictionary else None
            # No frame header fields: the size is known, and the checkpoint has its own checksums.
            compressor = zstandard.ZstdCompressor(level=level or _DEFAULT_ZSTD_LEVEL, dict_data=data,
                                                  write_content_size=False, write_checksum=False, write_dict_id=False)
            self._decompressor = decompressor = zstandard.ZstdDecompressor(dict_data=data)
            self._checked_readers: dict[int, Callable[..., Any]] = {}
            self.compress = compressor.compress
            self._reader = decompressor.stream_reader
            content_size, decompress = zstandard.frame_content_size, decompressor.decompress

            def strict(blob: Any, size: int) -> bytes:
                # python-zstandard allocates the content size a header gives, whatever the bound: refused first.
                if content_size(blob) not in (-1, size):
                    raise ValueError(f"its header gives {content_size(blob)} bytes")
                # A frame followed by other bytes is no frame rlbuf wrote (zstd ignores them by default).
                frame: bytes = decompress(blob, size, allow_extra_data=False)
                return frame

            self._strict = strict
        else:
            options: dict[str, Any] = {"store_size": False, "dict": dictionary} if dictionary else {"store_size": False}
            if level is not None:
                options.update(mode="high_compression", compression=level)
            self.compress = functools.partial(lz4_block.compress, **options)
            self._unpack = unpack = lz4_block.decompress
            self._strict = lambda blob, size: unpack(blob, size, False, dictionary)

    def decode_rows(self, arena: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64],
                    out: memoryview, rows: npt.NDArray[np.int64], size: int) -> None:
        """Decode the frames at ``arena[starts[i]:starts[i] + lengths[i]]`` straight into rows ``rows`` of ``out``
        (rows of ``size`` bytes; ``rows`` ascending), unchecked beyond the bytes written: frames this codec
        wrote or ``decompress`` checked.

        zstd decodes a run of consecutive rows in one call: the frames gathered one after another
        (``rlbuf._frames_numba.gather_runs``) through one stream reader, into the rows themselves (no
        frame-sized object, no second copy); lz4 one frame a call, from the arena. Not thread-safe: call
        with the buffer's lock held.

        Raises:
            ValueError: frames the codec cannot decode, or that decode to more or fewer than ``len(rows) * size``
                bytes (a frame of another size that others make up for is not seen: frames are trusted here).

        Example:
            >>> codec = Codec("zstd", None)
            >>> blobs = [codec.compress(b"abcd"), codec.compress(b"wxyz")]
            >>> arena = np.frombuffer(b"".join(blobs), np.uint8)
            >>> out = bytearray(12)
            >>> codec.decode_rows(arena, np.array([0, len(blobs[0])]), np.array([len(b) for b in blobs]),
            ...                   memoryview(out), np.array([0, 2]), 4)
            >>> bytes(out)
            b'abcd\\x00\\x00\\x00\\x00wxyz'
        """
        if not len(starts) == len(lengths) == len(rows):
            raise ValueError(f"{len(starts)} starts and {len(lengths)} lengths of frames for {len(rows)} rows")
        try:
            if self._reader is not None:
                # numba is imported with the compact layout (whose frames these are), not with rlbuf
                from rlbuf._frames_numba import gather_runs

                # One compiled call for the bytes and the runs: numpy's calls cost 5-40 µs each with cold caches
                # (a DQN loop's sample(32), between two network steps).
                data, runs = gather_runs(arena, starts, lengths, rows, size)
                self._read_runs(data, runs, out)
                return
            unpack, dictionary, frames = self._unpack, self.dictionary, arena.data
            for row, start, length in zip(rows.tolist(), starts.tolist(), lengths.tolist(), strict=True):
                out[row * size:(row + 1) * size] = unpack(frames[start:start + length], size, False, dictionary)
        except self._errors as error:
            raise ValueError(f"{len(rows)} {self.name} frames that do not decode to frames of {size} bytes "
                             f"({error})") from None

    def decompress_rows(self, arena: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64],
                        lengths: npt.NDArray[np.int64], out: memoryview, rows: npt.NDArray[np.int64], size: int) -> None:
        """``decode_rows``, checked frame by frame: frames from elsewhere (a shard's reply), each of which must
        decompress to exactly ``size`` bytes, with no more memory than ``out`` (a header's content size is not
        trusted).

        zstd decodes each frame straight into its row through one stream reader (the frames one after
        another, gathered first where they are not), the reader's window limited to what a frame of
        ``size`` bytes needs; a frame of another size, or bytes after the last, are refused (and ``out``
        may then hold anything). lz4: one ``decompress`` a frame.

        Raises:
            ValueError: a frame outside ``arena``, or one that is not a frame of ``size`` bytes (named).

        Example:
            >>> codec = Codec("zstd", None)
            >>> arena = np.frombuffer(codec.compress(b"abcd") + b"junk", np.uint8)
            >>> out = bytearray(8)
            >>> codec.decompress_rows(arena, np.array([0]), np.array([len(arena) - 4]), memoryview(out), np.array([1]), 4)
            >>> bytes(out)
            b'\\x00\\x00\\x00\\x00abcd'
            >>> codec.decompress_rows(arena, np.array([0]), np.array([len(arena) - 4]), memoryview(out), np.array([0]), 5)
            Traceback (most recent call last):
            ...
            ValueError: zstd frames that do not decompress to frames of 5 bytes (frame 0 decompresses to 4 bytes)
        """
        count = len(rows)
        if not len(starts) == len(lengths) == count:
            raise ValueError(f"{len(starts)} starts and {len(lengths)} lengths of frames for {count} rows")
        if not count:
            return
        ends = starts + lengths
        outside = (lengths < 1) | (lengths > len(arena)) | (starts < 0) | (ends > len(arena))  # ends may wrap
        if outside.any():
            at = int(np.argmax(outside))
            raise ValueError(f"frame {at}: {int(lengths[at])} bytes at {int(starts[at])}, outside the "
                             f"{len(arena)} bytes received")
        if int(rows.min()) < 0 or (int(rows.max()) + 1) * size > len(out):
            raise ValueError(f"rows {int(rows.min())} to {int(rows.max())} of frames of {size} bytes: outside the "
                             f"{len(out)} bytes to fill")
        if self._reader is None:
            frames = arena.data
            for row, start, end in zip(rows.tolist(), starts.tolist(), ends.tolist(), strict=True):
                out[row * size:(row + 1) * size] = self.decompress(frames[start:end], size)
            return
        if np.array_equal(starts[1:], ends[:-1]):  # the frames one after another, as a shard sends them
            data = arena[int(starts[0]):int(ends[-1])]
        else:
            from rlbuf._frames_numba import gather_bytes

            data = np.empty(int(lengths.sum()), np.uint8)
            gather_bytes(arena, starts, lengths, data)
        try:
            self._read_frames(data, out, rows, size)
        except self._errors as error:
            raise ValueError(f"zstd frames that do not decompress to frames of {size} bytes ({error})") from None

    def _read_frames(self, data: npt.NDArray[np.uint8], out: memoryview, rows: npt.NDArray[np.int64],
                     size: int) -> None:
        """zstd's ``decompress_rows``: the frames of ``data``, one after another, each into its row, checked.

        One stream reader that stops at each frame's end reads each frame into its row with a byte of room past
        it: a read of exactly ``size`` bytes is a whole frame of ``size`` bytes (a longer one fills the byte, a
        shorter one ends early), and after the last no byte is left. Its window is limited to what a frame of
        ``size`` bytes compressed with this dictionary needs, so a forged header allocates no more.
        """
        reader = self._checked_readers.get(size)
        if reader is None:
            _, zstandard = _libraries()
            window = 1 << max(10, (size + len(self.dictionary) - 1).bit_length())
            data_dict = zstandard.ZstdCompressionDict(self.dictionary) if self.dictionary else None
            reader = zstandard.ZstdDecompressor(dict_data=data_dict, max_window_size=window).stream_reader
            self._checked_readers[size] = reader
        last_row = memoryview(bytearray(size + 1))  # the room past the last row of ``out``, which has none
        with reader(data, read_across_frames=False) as frames:
            readinto = frames.readinto
            for frame, low in enumerate((rows * size).tolist()):
                if low + size < len(out):
                    got = readinto(out[low:low + size + 1])
                else:
                    got = readinto(last_row)
                    out[low:low + size] = last_row[:size]
                if got != size:
                    raise ValueError(f"frame {frame} decompresses to {got if got <= size else 'more'} bytes")
            if frames.read(1):
                raise ValueError(f"bytes after frame {len(rows) - 1}")

    def _read_runs(self, data: npt.NDArray[np.uint8], runs: npt.NDArray[np.int64], out: memoryview) -> None:
        """zstd's ``decode_rows``: the frames of ``data``, one after another, into each byte range ``runs[i]`` of
        ``out`` (``rlbuf._frames_numba.gather_runs``)."""
        assert self._reader is not None
        if not len(runs):
            return
        with self._reader(data, read_across_frames=True) as reader:
            readinto = reader.readinto
            for low, high in runs.tolist():
                if readinto(out[low:high]) != high - low:
                    raise ValueError("fewer bytes")
            if reader.read(1):
                raise ValueError("more bytes")

    def decompress(self, blob: Any, size: int) -> bytes:
        """The ``size`` bytes ``blob`` was compressed from.

        Raises:
            ValueError: ``blob`` is not a compressed frame of ``size`` bytes (with this dictionary).
        """
        try:
            frame = self._strict(blob, size)
        except self._errors as error:
            raise ValueError(f"not a {self.name} frame of {size} bytes ({error})") from None
        if len(frame) != size:
            raise ValueError(f"a {self.name} frame of {len(frame)} bytes, expected {size}")
        return frame

    def with_dictionary(self, dictionary: bytes) -> Codec:
        """A new codec of the same kind and level primed with ``dictionary`` (its own (de)compressor:
        they are not thread-safe).

        Raises:
            ValueError: ``dictionary`` is none the codec takes (it is tried on one frame).
        """
        try:
            codec = Codec(self.name, self.level, dictionary)
            codec.decompress(codec.compress(bytes(64)), 64)
        except self._errors as error:
            raise ValueError(f"not a {self.name} dictionary ({error})") from None
        return codec

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


def checksums(rows: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint32]:
    """The checksum of each raw frame of ``rows`` (``[n, bytes]``): the low 32 bits of its XXH3-64.

    Example:
        >>> checksums(np.zeros((2, 4), np.uint8)).tolist() == [checksums(np.zeros((1, 4), np.uint8))[0]] * 2
        True
    """
    digest = xxhash.xxh3_64_intdigest
    return np.fromiter((digest(row) & 0xFFFFFFFF for row in rows), np.uint32, len(rows))
