"""A compact buffer's sampled batch on the wire: each distinct frame once, the stacks rebuilt where it arrives.

A batch of 256 Atari transitions holds two stacks of four 84×84 frames each: 14.4 MB, of which
a compact buffer stores only the 7 distinct frames a transition spans (its stack, then the
``n_step`` frames after it), compressed to about 100 bytes each with zstd and a dictionary.
[`sample_wire`][rlbuf._compact_wire.sample_wire] draws a batch as
[`ReplayBuffer.sample`][rlbuf.ReplayBuffer.sample] does (same generator, same draws, every
other field built by the same code), but instead of the stacks it returns a
[`FramePayload`][rlbuf._compact_wire.FramePayload]: each distinct frame of the batch once (the
compressed bytes as stored, or the raw frame), and for every stack slot of ``obs`` and
``next_obs`` the frame it holds (a stored row's, a kept final observation, or zeros where a
``padding_type="zero"`` stack starts before its episode). [`rebuild`][rlbuf._compact_wire.rebuild]
turns payloads (of one or several shards) back into the stacks, bit for bit those the buffer
would have built; a dictionary travels once, then is cached by its id
([`FrameDecoders`][rlbuf._compact_wire.FrameDecoders]).

Example:
    >>> import torch
    >>> from rlbuf import ReplayBuffer
    >>> def make():
    ...     buf = ReplayBuffer(8, obs_shape=(2, 1), obs_dtype=torch.uint8, action_shape=(), frame_stack=2, seed=0)
    ...     for t in range(5):
    ...         buf.add(torch.tensor([[max(t - 1, 0)], [t]]), 0.0, 1.0, torch.tensor([[t], [t + 1]]), False,
    ...                 truncated=t == 4)
    ...     return buf
    >>> batch, payload = sample_wire(make(), 3, known=())
    >>> obs, next_obs = rebuild([payload], FrameDecoders())
    >>> expected = make().sample(3)
    >>> torch.equal(obs, expected.obs), torch.equal(next_obs, expected.next_obs), batch.obs.shape
    (True, True, torch.Size([3, 0]))
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch
import xxhash

from rlbuf._codec import CODECS, Codec
from rlbuf._convert import numpy_dtype, numpy_dtype_or_none
from rlbuf._frames import copy_repeated
from rlbuf._streams import Chain
from rlbuf.batches import ReplayBatch
from rlbuf.errors import ConfigError, ReplyError

if TYPE_CHECKING:
    from rlbuf._compact import CompactLayout
    from rlbuf.replay import ReplayBuffer

ZERO = -1
"""A stack slot's source that is a frame of zeros (``padding_type="zero"`` before an episode start)."""
_KEPT_DICTIONARIES = 64  # dictionaries a learner caches (each shard trains one, again after a clear or a load)
# The most bytes one compressed byte can decode to: a zstd block of 4 bytes (a header and one repeated byte)
# holds at most 128 KB; lz4 reaches about 255. A frame claimed larger is forged, and its stacks are not allocated.
_MOST_EXPANDED = 1 << 15


@dataclass(frozen=True, slots=True)
class FramePayload:
    """The frames of a sampled batch, each distinct one once, and where each goes.

    Attributes:
        path: the followed key of a dict observation (``()``: the observation is one tensor).
        frame_shape: one stored frame.
        dtype: the frame dtype (numpy's name).
        stacked: whether observations are stacks (``frame_stack > 1``: ``[B, k, *frame]``) or frames.
        sources: ``[2, B, k]`` int32: for each slot of ``obs`` (``[0]``) and ``next_obs`` (``[1]``),
            the index of its frame among the distinct ones, or ``ZERO``.
        frames: the distinct frames raw ``[U, frame_bytes]`` uint8 (an uncompressed buffer), or ``None``.
        blobs: their compressed bytes as stored, one after another (a compressed buffer), or ``None``.
        lengths: the size of each compressed frame ``[U]`` (int64), or ``None``.
        codec: ``(name, level)`` of the compression, or ``None``.
        dictionary_id: the id of the codec's dictionary (``""``: none).
        dictionary: its bytes, sent only when the receiver did not say it holds it, else ``None``.
    """

    path: tuple[str, ...]
    frame_shape: tuple[int, ...]
    dtype: str
    stacked: bool
    sources: npt.NDArray[np.int32]
    frames: npt.NDArray[np.uint8] | None
    blobs: npt.NDArray[np.uint8] | None
    lengths: npt.NDArray[np.int64] | None
    codec: tuple[str, int | None] | None
    dictionary_id: str
    dictionary: bytes | None

    @property
    def batch_size(self) -> int:
        """Transitions the payload holds the frames of."""
        return int(self.sources.shape[1])


def dictionary_id(dictionary: bytes) -> str:
    """The id a dictionary is cached under: its XXH3-64 digest (``""`` for no dictionary).

    Example:
        >>> dictionary_id(b""), len(dictionary_id(b"abc"))
        ('', 16)
    """
    return xxhash.xxh3_64_hexdigest(dictionary) if dictionary else ""


def sends_frames(buffer: ReplayBuffer) -> bool:
    """Whether ``sample_wire`` serves ``buffer``: a compact one whose frames numpy holds (not bfloat16).

    Example:
        >>> from rlbuf import ReplayBuffer
        >>> sends_frames(ReplayBuffer(8, obs_shape=(4, 2, 2), action_shape=(), frame_stack=4))
        True
    """
    layout = buffer._compact
    return layout is not None and numpy_dtype_or_none(layout.obs_spec.dtype) is not None


FrameGeometry = tuple[tuple[str, ...], tuple[int, ...], str, int]
"""``(path, frame_shape, dtype, frame_stack)`` of the frames a compact buffer sends (see ``frame_geometry``)."""


def frame_geometry(buffer: ReplayBuffer) -> FrameGeometry | None:
    """What every payload of ``buffer`` is made of: its followed key, frame shape, dtype (numpy's name) and
    ``frame_stack``; ``None`` when ``sample_wire`` does not serve it. A receiver told it (``FrameDecoders``)
    refuses payloads of other frames before it allocates their stacks.

    Example:
        >>> from rlbuf import ReplayBuffer
        >>> frame_geometry(ReplayBuffer(8, obs_shape=(4, 2, 3), obs_dtype=torch.uint8, action_shape=(), frame_stack=4))
        ((), (2, 3), 'uint8', 4)
    """
    layout = buffer._compact
    if layout is None or not sends_frames(buffer):
        return None
    return (tuple(layout.path), tuple(layout.frame_shape), str(numpy_dtype(layout.obs_spec.dtype)), layout.frame_stack)


def sample_wire(buffer: ReplayBuffer, batch_size: int, *, known: Collection[str]) -> tuple[ReplayBatch, FramePayload]:
    """``buffer.sample(batch_size)`` of a compact buffer, with the frames apart: the batch (its ``obs``
    and ``next_obs`` leaves of the followed key ``[B, 0]``) and the payload ``rebuild`` makes them from.

    Draws exactly what ``sample`` draws (the same generator and redraws), under the buffer's lock.

    Args:
        buffer: a compact [`ReplayBuffer`][rlbuf.ReplayBuffer] (``frame_stack``, ``n_step`` or ``compact=True``).
        batch_size: transitions to draw.
        known: ids of the dictionaries the receiver holds (the payload then carries none of them).

    Raises:
        ConfigError: the buffer is not compact.
        BatchSizeError, EmptyBufferError, PriorityError: as ``sample``.
    """
    layout = buffer._compact
    if layout is None:
        raise ConfigError("sample_wire: expected a compact buffer (frame_stack, n_step or compact=True), got one "
                          "that stores next_obs with each row; call sample")
    ring = buffer._ring
    with ring.lock:  # as sample: the draws, the streams and the frames from one state
        batch_size = ring.require_rows(batch_size, without_replacement=False)
        ring.flush()
        index, weight = layout.draw(batch_size, buffer._draw)
        chain = layout.chain_of(index)
        columns = layout.columns_but_frames(index, chain)
        payload = _payload(layout, chain, known)
        empty = torch.empty((len(index), 0), dtype=layout.obs_spec.dtype, device=index.device)
        columns[layout.field] = columns[layout.next_field] = empty
        return buffer._delivered(columns, index, weight), payload


def frame_sources(layout: CompactLayout, chain: Chain) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int64],
                                                                 npt.NDArray[np.int64]]:
    """Where each stack slot of a walk's transitions gets its frame, as ``Streams.stacks`` rebuilds them:
    ``(sources [2, B, k], rows, finals)``, ``sources`` indexing the stored frames at ring positions ``rows``
    and then the kept final observations in slots ``finals`` (``ZERO``: zeros).

    ``obs`` slot ``j`` is the frame of ``chain.rows[:, j]``; ``next_obs`` slot ``j`` that of
    ``chain.rows[:, steps + j]``, its newest slot the kept final observation where the episode
    ended; with ``padding_type="zero"`` a padded slot is zeros.

    Example:
        >>> from rlbuf import ReplayBuffer
        >>> buf = ReplayBuffer(8, obs_shape=(2, 1), action_shape=(), frame_stack=2, padding_type="zero")
        >>> buf.add(torch.tensor([[0.0], [1.0]]), 0.0, 0.0, torch.tensor([[1.0], [2.0]]), True, truncated=False)
        >>> chain = buf._compact.walk(np.array([0]))
        >>> sources, rows, finals = frame_sources(buf._compact, chain)
        >>> sources.tolist(), rows.tolist(), finals.tolist()     # obs [0, row 0]; next_obs [row 0, final 0]
        ([[[-1, 0]], [[0, 1]]], [0], [0])
    """
    stack = layout.frame_stack
    count = len(chain.steps)
    at = np.empty((2, count, stack), np.int64)
    at[0] = chain.rows[:, :stack]
    offsets = chain.steps[:, None] + np.arange(stack)
    at[1] = np.take_along_axis(chain.rows, offsets, axis=1)
    zero = np.zeros((2, count, stack), np.bool_)
    if layout.streams.padding_type == "zero" and stack > 1:
        zero[0] = chain.padded[:, :stack]
        zero[1] = np.take_along_axis(chain.padded, offsets, axis=1)
    final = np.zeros((2, count, stack), np.bool_)
    final[1, :, -1] = chain.ended
    zero &= ~final  # the kept final observation is the newest frame, never padding (as build_stacks copies it)
    stored = ~(zero | final)
    rows, row_source = np.unique(at[stored], return_inverse=True)
    finals, final_source = np.unique(chain.final_slot[chain.ended], return_inverse=True)
    sources = np.full((2, count, stack), ZERO, np.int32)
    sources[stored] = row_source.reshape(-1)
    sources[final] = len(rows) + final_source.reshape(-1)
    return sources, rows, finals


def _payload(layout: CompactLayout, chain: Chain, known: Collection[str]) -> FramePayload:
    """The frames of a walk's transitions, each distinct one once (call with the ring's lock held)."""
    sources, rows, finals = frame_sources(layout, chain)
    log, streams = layout.log, layout.streams
    frame_shape, dtype = tuple(layout.frame_shape), layout.obs_spec.dtype
    frame_bytes = math.prod(frame_shape) * dtype.itemsize
    common = partial(FramePayload, path=layout.path, frame_shape=frame_shape, stacked=layout.frame_stack > 1,
                     sources=sources)
    if log is not None:
        stored, stored_lengths = log.blobs(rows)
        kept, kept_lengths = streams.finals.blobs_at(finals)
        dictionary = log.codec.dictionary
        did = dictionary_id(dictionary)
        return common(dtype=str(log.np_dtype), frames=None, blobs=np.concatenate((stored, kept)),
                            lengths=np.concatenate((stored_lengths, kept_lengths)),
                            codec=(log.codec.name, log.codec.level), dictionary_id=did,
                            dictionary=None if did in known else dictionary)
    frames = np.empty((len(rows) + len(finals), frame_bytes), np.uint8)
    with layout.ring.reading_arrays() as arrays:
        if arrays is not None:  # a CPU storage: numpy's take straight into the payload
            stored_frames = arrays[layout.field]
            np.take(_as_bytes(stored_frames), rows, axis=0, out=frames[:len(rows)], mode="clip")
    if arrays is None:
        gathered = layout.ring.gather(torch.from_numpy(rows).to(layout.ring.storing_device), [layout.field])
        frames[:len(rows)] = _as_bytes(gathered[layout.field].cpu().numpy())
    if len(finals):
        frames[len(rows):] = _as_bytes(streams.finals.take(finals).cpu().numpy())
    return common(dtype=str(numpy_dtype(dtype)), frames=frames, blobs=None, lengths=None, codec=None,
                        dictionary_id="", dictionary=None)


def _as_bytes(frames: np.ndarray[Any, Any]) -> npt.NDArray[np.uint8]:
    """C-contiguous ``[n, *frame]`` as ``[n, frame_bytes]`` bytes (no copy)."""
    flat: npt.NDArray[np.uint8] = frames.reshape(len(frames), -1).view(np.uint8)
    return flat


class FrameDecoders:
    """The receiver's codecs, by the id of their dictionary: what it tells shards it holds (``known``).

    Args:
        expected: the frames the senders' payloads hold (``frame_geometry`` of their buffers); ``None``:
            the first payload of each batch sets them.

    Example:
        >>> decoders = FrameDecoders()
        >>> decoders.known
        []
    """

    def __init__(self, expected: FrameGeometry | None = None) -> None:
        self._codecs: dict[tuple[str, int | None, str], Codec] = {}
        self.expected = None if expected is None else (tuple(expected[0]), tuple(expected[1]), *expected[2:])

    @property
    def known(self) -> list[str]:
        """Ids of the dictionaries held (a shard sends only a dictionary not among them)."""
        return sorted({did for _, _, did in self._codecs if did})

    def codec(self, payload: FramePayload) -> Codec:
        """The codec that decodes ``payload``'s frames (built from its dictionary, and kept, when new).

        Raises:
            ConfigError: a dictionary id the payload does not carry and this receiver never received.
            ReplyError: a codec rlbuf does not use, or a dictionary that is not the one its id names or
                that the codec cannot take.
        """
        assert payload.codec is not None
        name, level = payload.codec
        key = (name, level, payload.dictionary_id)
        codec = self._codecs.get(key)
        if codec is not None:
            return codec
        if payload.dictionary_id and payload.dictionary is None:
            raise ConfigError(f"frames: compressed with dictionary {payload.dictionary_id}, which this learner does "
                              "not hold and the shard did not send; sample again (the learner's cache was cleared)")
        if name not in CODECS or not (level is None or type(level) is int):
            raise ReplyError(f"frames: compressed with {name!r} at level {level!r}, expected one of {list(CODECS)}")
        dictionary = payload.dictionary or b""
        if dictionary_id(dictionary) != payload.dictionary_id:
            raise ReplyError(f"frames: a dictionary whose digest is {dictionary_id(dictionary)!r}, sent as "
                             f"{payload.dictionary_id!r}")
        try:
            codec = Codec(name, level).with_dictionary(dictionary) if dictionary else Codec(name, level)
        except ValueError as error:
            raise ReplyError(f"frames: {error}") from None
        if len(self._codecs) >= _KEPT_DICTIONARIES:
            self._codecs.pop(next(iter(self._codecs)))
        self._codecs[key] = codec
        return codec


def rebuild(payloads: Sequence[FramePayload], decoders: FrameDecoders,
            batch_sizes: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``obs`` and ``next_obs`` of the followed key of the payloads' batches, one after another (the order
    of a merged batch), bit for bit the stacks the buffers would have built; two views of one tensor.
    ``batch_sizes``: the transitions each payload must hold (the rows of the batch it came with).

    Compressed frames are decoded straight into the first slot that holds them (checked frame by frame:
    ``Codec.decompress_rows``); the other slots copy it.

    Raises:
        ReplyError: a payload no rlbuf shard sends (corrupted or forged): not a ``FramePayload``, a part of another
            type, dtype or shape than a shard sends, parts that disagree (with each other, ``batch_sizes`` or
            ``decoders.expected``), a slot naming a frame it does not hold, or a frame that does not decode to one
            of ``frame_shape`` (also when the receiver was told no geometry).
    """
    for payload in payloads:
        _check_parts(payload)
    first = payloads[0]
    if batch_sizes is not None and [_rows(payload) for payload in payloads] != list(batch_sizes):
        raise ReplyError(f"frames: payloads of {[_rows(payload) for payload in payloads]} transitions for batches of "
                         f"{list(batch_sizes)}")
    geometry = (first.path, first.frame_shape, first.dtype, _rows(first, axis=2))
    if decoders.expected is not None and geometry != decoders.expected:
        raise ReplyError(f"frames: (key, frame shape, dtype, frame_stack) {geometry}, expected {decoders.expected}")
    frame_shape, stacked = first.frame_shape, first.stacked
    try:
        dtype = np.dtype(first.dtype)
    except (TypeError, ValueError):  # numpy refuses a name it cannot parse with either
        dtype = np.dtype(object)
    if dtype.kind not in "biufc" or not all(size > 0 for size in frame_shape) or len(frame_shape) > _MOST_AXES:
        raise ReplyError(f"frames: frames {frame_shape} of {first.dtype!r}, expected positive sizes of a numeric dtype")
    frame_bytes = math.prod(frame_shape) * dtype.itemsize
    stack = _rows(first, axis=2) or 0
    for payload in payloads:
        _check(payload, first, stack, frame_bytes)
    total = sum(payload.batch_size for payload in payloads)
    both = np.empty((2, total * stack, frame_bytes), np.uint8)
    slots = both.reshape(2 * total * stack, frame_bytes)
    offset = 0
    for payload in payloads:
        count = payload.batch_size
        # Global slot of each payload slot: obs in both[0], next_obs in both[1], this part at ``offset``.
        where = (np.arange(2)[:, None, None] * total + offset + np.arange(count)[None, :, None]) * stack
        where = (where + np.arange(stack)).reshape(-1)
        sources = payload.sources.reshape(-1).astype(np.int64)
        if payload.frames is not None:
            _place_raw(slots, where, sources, payload.frames)
        else:
            _place_compressed(slots, where, sources, payload, decoders.codec(payload), frame_bytes)
        offset += count
    out = torch.from_numpy(both.view(dtype).reshape(2, total, *((stack,) if stacked else ()), *frame_shape))
    return out[0], out[1]


def put_frames(fields: dict[str, Any], path: tuple[str, ...], obs: torch.Tensor, next_obs: torch.Tensor) -> None:
    """Put rebuilt stacks into a batch's fields (``{"obs": ..., "next_obs": ...}``, in place): the tensors
    themselves, or the followed key's leaf of dict observations.

    Example:
        >>> fields = {"obs": torch.zeros(2, 0), "next_obs": torch.zeros(2, 0)}
        >>> put_frames(fields, (), torch.ones(2, 3), torch.ones(2, 3))
        >>> fields["obs"].shape
        torch.Size([2, 3])
    """
    if not path:
        fields["obs"], fields["next_obs"] = obs, next_obs
        return
    for name, value in (("obs", obs), ("next_obs", next_obs)):
        fields[name].set(path, value)


def _rows(payload: FramePayload, axis: int = 1) -> int | None:
    """``payload.sources.shape[axis]`` (transitions, or stack slots), ``None`` for sources of no such shape."""
    shape = getattr(payload.sources, "shape", ())
    return int(shape[axis]) if len(shape) == 3 else None


_MOST_AXES = 32  # of a frame: numpy allows 64 axes in all, and the stacks add two or three


def _check_parts(payload: object) -> None:
    """Raise ``ReplyError`` unless ``payload`` is a ``FramePayload`` whose every part is of the type an rlbuf shard
    sends (checked before any part is read: a forged part must not reach numpy as something else)."""
    if not isinstance(payload, FramePayload):
        raise ReplyError(f"frames: {shown(payload)}, expected a FramePayload")
    codec = payload.codec
    parts = {
        "path": (isinstance(payload.path, tuple) and all(type(key) is str for key in payload.path), "a tuple of str"),
        "frame_shape": (isinstance(payload.frame_shape, tuple)
                        and all(type(size) is int for size in payload.frame_shape), "a tuple of int"),
        "dtype": (type(payload.dtype) is str, "the name of a numpy dtype"),
        "stacked": (type(payload.stacked) is bool, "a bool"),
        "sources": (isinstance(payload.sources, np.ndarray), "an int32 array [2, batch, frame_stack]"),
        "frames": (payload.frames is None or isinstance(payload.frames, np.ndarray), "None or a uint8 array"),
        "blobs": (payload.blobs is None or isinstance(payload.blobs, np.ndarray), "None or a uint8 array"),
        "lengths": (payload.lengths is None or isinstance(payload.lengths, np.ndarray), "None or an int64 array"),
        "codec": (codec is None or (isinstance(codec, tuple) and len(codec) == 2 and type(codec[0]) is str
                                    and (codec[1] is None or type(codec[1]) is int)), "None or (name, level)"),
        "dictionary_id": (type(payload.dictionary_id) is str, "a str"),
        "dictionary": (payload.dictionary is None or type(payload.dictionary) is bytes, "None or bytes"),
    }
    for name, (sent, expected) in parts.items():
        if not sent:
            raise ReplyError(f"frames: {name} {shown(getattr(payload, name))}, expected {expected}")
    compressed = [part is not None for part in (payload.blobs, payload.lengths, codec)]
    if len(set(compressed)) > 1 or (payload.frames is not None) == compressed[0]:
        raise ReplyError("frames: expected either raw frames or compressed ones with their lengths and codec, got "
                         f"frames={shown(payload.frames)}, blobs={shown(payload.blobs)}, "
                         f"lengths={shown(payload.lengths)}, codec={codec!r}")


def shown(value: object) -> str:
    """``value`` in a message: an array by its dtype and shape, anything else by a repr of at most 60 characters.

    Example:
        >>> shown(np.zeros((2, 3), np.uint8)), shown("x" * 100)[-5:]
        ('array of uint8 (2, 3)', 'xx...')
    """
    if isinstance(value, np.ndarray):
        return f"array of {value.dtype} {value.shape}"
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _check(payload: FramePayload, first: FramePayload, stack: int, frame_bytes: int) -> None:
    """Raise ``ReplyError`` unless ``payload`` is one an rlbuf shard sends beside ``first`` (of one batch)."""
    if (payload.frame_shape, payload.dtype, payload.stacked) != (first.frame_shape, first.dtype, first.stacked):
        raise ReplyError(f"frames: frames {payload.frame_shape} {payload.dtype} beside {first.frame_shape} "
                         f"{first.dtype} in one batch")
    sources = payload.sources
    if not (sources.dtype == np.int32 and sources.ndim == 3
            and sources.shape[0] == 2 and sources.shape[2] == stack and stack >= 1 and payload.stacked == (stack > 1)):
        raise ReplyError(f"frames: sources {shown(sources)} (stacked={payload.stacked}), expected int32 [2, batch, "
                         f"{stack}]")
    if payload.frames is not None:
        frames = payload.frames
        if not (frames.dtype == np.uint8 and frames.ndim == 2 and frames.shape[1] == frame_bytes):
            raise ReplyError(f"frames: raw frames of shape {frames.shape} ({frames.dtype}), expected uint8 "
                             f"[count, {frame_bytes}]")
        count = len(frames)
    else:
        blobs, lengths = payload.blobs, payload.lengths
        assert blobs is not None and lengths is not None  # _check_parts: both sent, or raw frames
        if not (blobs.dtype == np.uint8 and blobs.ndim == 1 and lengths.dtype == np.int64 and lengths.ndim == 1):
            raise ReplyError(f"frames: compressed frames {shown(blobs)} of lengths {shown(lengths)}, expected "
                             "uint8 [bytes] and int64 [frames]")
        if lengths.size and not 1 <= int(lengths.min()) <= int(lengths.max()) <= len(blobs):  # a sum that wraps
            raise ReplyError(f"frames: compressed frames of {int(lengths.min())} to {int(lengths.max())} bytes, "
                             f"expected 1 to {len(blobs)} (the bytes sent)")
        if lengths.size and frame_bytes > _MOST_EXPANDED * int(lengths.min()):
            raise ReplyError(f"frames: a compressed frame of {int(lengths.min())} bytes, which cannot decode to a "
                             f"frame of {frame_bytes} bytes")
        if int(lengths.sum()) != len(blobs):
            raise ReplyError(f"frames: lengths adding up to {int(lengths.sum())} bytes for {len(blobs)} bytes of "
                             "compressed frames")
        count = len(lengths)
    if sources.size and not ZERO <= int(sources.min()) <= int(sources.max()) < count:
        raise ReplyError(f"frames: slots naming frames {int(sources.min())} to {int(sources.max())} of "
                         f"{count} sent")


def _place_raw(slots: npt.NDArray[np.uint8], where: npt.NDArray[np.int64], sources: npt.NDArray[np.int64],
               frames: npt.NDArray[np.uint8]) -> None:
    """Copy raw distinct ``frames`` to the slots ``where`` by ``sources`` (zeros for ``ZERO``)."""
    zero = sources == ZERO
    if len(frames):
        half = len(where) // 2  # obs, then next_obs: each a contiguous run of slots
        for part in (slice(0, half), slice(half, None)):
            low = int(where[part][0])
            np.take(frames, sources[part], axis=0, out=slots[low:low + half], mode="clip")
    slots[where[zero]] = 0


def _place_compressed(slots: npt.NDArray[np.uint8], where: npt.NDArray[np.int64], sources: npt.NDArray[np.int64],
                      payload: FramePayload, codec: Codec, frame_bytes: int) -> None:
    """Decode each distinct frame into the first of ``where`` that holds it, copy it to the others."""
    assert payload.blobs is not None and payload.lengths is not None
    used = sources != ZERO
    distinct, first = np.unique(sources[used], return_index=True)
    targets = where[used][first]
    lengths = payload.lengths
    try:
        codec.decompress_rows(payload.blobs, (np.cumsum(lengths) - lengths)[distinct], lengths[distinct],
                              slots.data.cast("B"), targets, frame_bytes)
    except ValueError as error:
        raise ReplyError(f"frames: {error}") from None
    copy_from = np.empty(int(sources.max(initial=0)) + 1, np.int64)
    copy_from[distinct] = targets
    again = np.flatnonzero(used)
    again = again[where[again] != copy_from[sources[again]]]
    if again.size:
        copy_repeated(slots, where[again], copy_from[sources[again]])
    slots[where[~used]] = 0
