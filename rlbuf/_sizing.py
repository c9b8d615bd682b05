"""Bytes one stored transition of a replay buffer takes, from its stored fields and layout.

One formula for [`ReplayBuffer.bytes_per_transition`][rlbuf.ReplayBuffer.bytes_per_transition]
(and the buffer's ``repr``) and for ``rlbuf inspect``, which reads the stored fields from a
checkpoint's manifest and must not import torch: dtypes are given by their sizes or names.

Example:
    >>> row_bytes([((84, 84), 1), ((), 8), ((), 4), ((), 1), ((), 1), ((), 1)], prioritized=False,
    ...           compact=True, frame_stack=4)
    7121.0
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rlbuf._manifest import DTYPE_BYTES

PRIORITY_BYTES = 32
"""The sum tree's sum and min nodes of one row: two float64 pairs."""


def stream_bytes(frame_stack: int) -> int:
    """Bytes of a compact row's stream bookkeeping (``rlbuf._streams``): back, next and final-slot links
    and the row's env (int64), and two flags.

    Example:
        >>> stream_bytes(4)
        50
    """
    return 8 * (frame_stack - 1) + 8 + 8 + 8 + 2


def row_bytes(fields: Iterable[tuple[Sequence[int], int]], *, prioritized: bool, compact: bool, frame_stack: int,
              final_obs_bytes: float = 0.0, episode_length: float | None = None) -> float:
    """Estimated bytes per stored transition.

    Args:
        fields: ``(shape, itemsize)`` of every stored field (hidden states included).
        prioritized: the buffer keeps a priority tree.
        compact: ``next_obs`` is stored once (the compact layout's stream bookkeeping is counted).
        frame_stack: frames per stacked observation.
        final_obs_bytes: bytes of one final observation kept aside (its newest frame with
            ``frame_stack > 1``); counted once per ``episode_length`` rows of a compact buffer.
        episode_length: mean steps per episode (``None``: final observations not counted).

    Returns:
        The bytes of the fields, plus the priority tree, stream links and final observations.

    Example:
        >>> row_bytes([((3,), 4), ((3,), 4)], prioritized=True, compact=False, frame_stack=1)
        56.0
    """
    total = float(sum(math.prod(shape) * itemsize for shape, itemsize in fields))
    if prioritized:
        total += PRIORITY_BYTES
    if compact:
        total += stream_bytes(frame_stack)
        if episode_length is not None:
            total += final_obs_bytes / episode_length
    return total


def manifest_row_bytes(kind: Any, options: Mapping[str, Any], spec: Sequence[Any]) -> float | None:
    """The estimate for a checkpoint's manifest (its ``kind``, ``options`` and stored ``spec``).

    Returns:
        Bytes per transition of a ``ReplayBuffer`` checkpoint; ``None`` for other kinds or a
        manifest that does not describe its fields (``rlbuf inspect`` then prints no estimate).

    Example:
        >>> spec = [{"shape": [84, 84], "dtype": "uint8"}, {"shape": [], "dtype": "float32"}]
        >>> manifest_row_bytes("ReplayBuffer", {"frame_stack": 4}, spec)
        7110.0
        >>> manifest_row_bytes("ReplayBuffer", {"n_step": 3, "hindsight": {"strategy": "future"}}, spec)
        7060.0
        >>> manifest_row_bytes("RolloutBuffer", {}, spec) is None
        True
    """
    if kind != "ReplayBuffer" or not spec:
        return None
    fields = []
    for entry in spec:
        shape, itemsize = (entry.get("shape"), DTYPE_BYTES.get(str(entry.get("dtype")))) if isinstance(
            entry, Mapping) else (None, None)
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape) or itemsize is None:
            return None
        fields.append((shape, itemsize))
    frame_stack, n_step = options.get("frame_stack", 1), options.get("n_step", 1)
    if not isinstance(frame_stack, int) or not isinstance(n_step, int):
        return None
    # A hindsight buffer follows each env's episodes itself: its n-step transitions are never compact.
    compact = options.get("hindsight") is None and (options.get("compact") is True or frame_stack > 1 or n_step > 1)
    return row_bytes(fields, prioritized=options.get("prioritized") is True, compact=compact, frame_stack=frame_stack)
