"""The byte gather of compressed frames, compiled by numba (imported when a compressed buffer samples).

A sample of a compressed buffer decodes its distinct frames from one run of bytes (see
``Codec.decode_rows``); ``gather_bytes`` puts them one after another in one compiled loop, where a
Python loop makes an object per frame (about 1,650 frames for a batch of 256 Atari transitions).
numba compiles it once and keeps it in its on-disk cache.

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
