"""Compressed frames' bookkeeping, compiled by numba (imported at a compressed buffer's first add or sample).

An add copies its compressed frames into the byte log and records their offsets in one compiled call
(``append_frames``): between two adds a DQN loop's network evicts the caches, and there each numpy call
it replaces cost 5-40 µs.

A sample of a compressed buffer plans its stacks in one compiled pass (``plan_stacks``: which place
of the batch decodes each distinct frame, which places copy one), and decodes the distinct frames
from one run of bytes (see ``Codec.decode_rows``): ``gather_bytes`` puts them one after another in
one compiled loop, where a Python loop makes an object per frame (about 1,650 frames for a batch of
256 Atari transitions). numba compiles each once and keeps it in its on-disk cache.

Example:
    >>> import numpy as np
    >>> arena = np.arange(10, dtype=np.uint8)
    >>> out = np.empty(5, np.uint8)
    >>> gather_bytes(arena, np.array([6, 1]), np.array([2, 3]), out)
    >>> out.tolist()
    [6, 7, 1, 2, 3]
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / the golden ratio


@numba.njit(cache=True, nogil=True)  # type: ignore[untyped-decorator]
def append_frames(arena: Any, start: Any, length: Any, sums: Any, data: Any, lengths: Any, checksums: Any, at: int,
                  first: int) -> int:  # pragma: no cover (compiled)
    """Copy ``data`` (frames of ``lengths`` bytes, one after another) to ``arena[at:]`` and record frame ``i``'s
    offset, size and checksum in ``start``, ``length`` and ``sums`` at ring position ``(first + i) % len(start)``
    (in order: of more frames than positions, the newest are kept); returns where the frames end. A copy past the
    arena's end is an error (numba refuses to assign a slice of another size).

    Example:
        >>> arena, start = np.zeros(8, np.uint8), np.zeros(2, np.int64)
        >>> length, sums = np.zeros(2, np.int32), np.zeros(2, np.uint32)
        >>> append_frames(arena, start, length, sums, np.arange(1, 6, dtype=np.uint8), np.array([2, 3]),
        ...               np.array([7, 9], np.uint32), 1, 3)
        6
        >>> arena.tolist(), start.tolist(), length.tolist(), sums.tolist()
        ([0, 1, 2, 3, 4, 5, 0, 0], [3, 1], [3, 2], [9, 7])
    """
    capacity = len(start)
    arena[at:at + len(data)] = data
    offset = at
    for i in range(len(lengths)):
        position = (first + i) % capacity
        start[position], length[position], sums[position] = offset, lengths[i], checksums[i]
        offset += lengths[i]
    return offset


@numba.njit(cache=True, nogil=True)  # type: ignore[untyped-decorator]
def gather_bytes(arena: Any, starts: Any, lengths: Any, out: Any) -> None:  # pragma: no cover (compiled)
    """``out`` = ``arena[starts[i]:starts[i] + lengths[i]]`` for each ``i``, one after another (``out`` holds
    ``lengths.sum()`` bytes). A range past either array's end is an error: the slices clip to the arrays, and
    numba refuses to assign one of another size."""
    at = 0
    for i in range(len(starts)):
        start, length = starts[i], lengths[i]
        out[at:at + length] = arena[start:start + length]
        at += length


@numba.njit(cache=True, nogil=True)  # type: ignore[untyped-decorator]
def gather_runs(arena: Any, starts: Any, lengths: Any, rows: Any, size: int) -> tuple[Any, Any]:  # pragma: no cover
    """``gather_bytes`` into new bytes, and the byte range ``[low, high)`` of each run of consecutive ``rows``
    (ascending) in an output of rows of ``size`` bytes: ``(data, runs)``, ``runs`` of shape ``[runs, 2]`` (what
    ``Codec.decode_rows`` reads into, one call a run).

    Example:
        >>> data, runs = gather_runs(np.arange(10, dtype=np.uint8), np.array([6, 1, 0]), np.array([2, 3, 1]),
        ...                          np.array([0, 1, 3]), 4)
        >>> data.tolist(), runs.tolist()
        ([6, 7, 1, 2, 3, 0], [[0, 8], [12, 16]])
    """
    total = 0
    for i in range(len(lengths)):
        total += lengths[i]
    data = np.empty(total, np.uint8)
    gather_bytes(arena, starts, lengths, data)
    count = 0
    for i in range(len(rows)):
        if i == 0 or rows[i] != rows[i - 1] + 1:
            count += 1
    runs = np.empty((count, 2), np.int64)
    run = -1
    for i in range(len(rows)):
        if i == 0 or rows[i] != rows[i - 1] + 1:
            run += 1
            runs[run, 0] = rows[i] * size
        runs[run, 1] = (rows[i] + 1) * size
    return data, runs


@numba.njit(cache=True, nogil=True)  # type: ignore[untyped-decorator]
def plan_stacks(rows: Any, padded: Any, steps: Any, ended: Any, stack: int,
                zero_pad: bool) -> tuple[Any, Any, Any, Any, Any]:  # pragma: no cover (compiled)
    """Where each frame of the ``obs`` and ``next_obs`` stacks of a walk (``rows``, ``padded``, ``steps``,
    ``ended``: a ``Chain``'s) comes from: ``(decode, positions, destinations, sources, finals)``.

    The batch is ``2 * B * stack`` frames: ``obs`` frame ``j`` of transition ``i`` at place ``i * stack + j``,
    its ``next_obs`` frame ``j`` at ``(B + i) * stack + j`` (``next_obs`` is the stack ``steps[i]`` rows later,
    as ``rlbuf._streams_numba.build_stacks`` reads it). Each stored frame the batch holds is decoded once,
    into the first place that holds it: ``decode`` (those places, ascending) and ``positions`` (their ring
    positions). The other places copy one: ``destinations[i]`` from ``sources[i]``, zeros where a source is
    negative (a frame before the episode start, with ``zero_pad``). ``finals``: the places of the final
    observations (the newest ``next_obs`` frame of the ``ended`` transitions, ascending).

    Example:
        >>> rows = np.array([[5, 6, 7]])  # one transition: stacks of 2 frames, one step
        >>> plan = plan_stacks(rows, np.zeros((1, 3), np.bool_), np.ones(1, np.int64), np.zeros(1, np.bool_), 2, False)
        >>> [part.tolist() for part in plan]  # row 6, in both stacks, is decoded at place 1 and copied to place 2
        [[0, 1, 3], [5, 6, 7], [2], [1], []]
    """
    count = rows.shape[0]
    total = 2 * count * stack
    bits = 1
    while (1 << bits) < 2 * total:  # an open-addressing table, at most half full
        bits += 1
    mask, shift = (1 << bits) - 1, np.uint64(64 - bits)
    held = np.full(mask + 1, -1, np.int64)  # a stored row's position, at its hash
    placed = np.empty(mask + 1, np.int64)  # the place that decodes it
    decode, positions = np.empty(total, np.int64), np.empty(total, np.int64)
    destinations, sources = np.empty(total, np.int64), np.empty(total, np.int64)
    finals = np.empty(count, np.int64)
    decoded = copies = ends = 0
    for place in range(total):  # ascending: the first place of each frame decodes it
        later = place >= count * stack
        i, j = (place - count * stack * later) // stack, place % stack
        column = steps[i] + j if later else j
        if later and j == stack - 1 and ended[i]:
            finals[ends] = place
            ends += 1
        elif zero_pad and padded[i, column]:
            destinations[copies], sources[copies] = place, -1
            copies += 1
        else:
            position = rows[i, column]
            at = np.int64((np.uint64(position) * _GOLDEN) >> shift)  # Fibonacci hashing: near rows spread out
            while held[at] >= 0 and held[at] != position:
                at = (at + 1) & mask
            if held[at] == position:
                destinations[copies], sources[copies] = place, placed[at]
                copies += 1
            else:
                held[at], placed[at] = position, place
                decode[decoded], positions[decoded] = place, position
                decoded += 1
    return decode[:decoded], positions[:decoded], destinations[:copies], sources[:copies], finals[:ends]
