"""The compact add's stream check and record for one step of each env, compiled by numba.

Sampling walks each sampled row's stack back and its n steps forward (``walk_rows``). An add of one step of ``n`` envs (distinct envs: every ``add`` and every ``Recorder.record``)
checks each stack against its env's stream and links the new rows into the stream tables (see
[`rlbuf._streams`][rlbuf._streams]). In numpy that is some sixty small calls per add; here it is
two compiled loops that read each 8-byte word once and stop at the first mismatch. They do what
``Streams.check`` and ``Streams.record`` do for such an add, and the property tests of the
compact layout hold them to it. Observations are compared as bytes, so only integer and bool
observations (Atari frames) take this path: a float's ``-0.0`` and ``0.0`` differ as bytes.
numba compiles each kernel once (about a second) and keeps it in its on-disk cache.

Example:
    >>> obs = np.array([[1, 2, 3, 3]], np.uint8)       # one env, 2 frames of 2 bytes
    >>> next_obs = np.array([[3, 3, 5, 6]], np.uint8)  # obs shifted by one frame
    >>> no_open_stack = np.full(1, -1, np.int64)       # an episode's first stack: padded?
    >>> check_steps(obs, next_obs, np.zeros((1, 4), np.uint8), np.zeros(1, np.int64),
    ...             no_open_stack, 2, False)           # PADDING at env 0: [1, 2] is not [3, 3]
    (3, 0)
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from rlbuf._streams import CONTINUITY, PADDING, SHIFT

_JIT = {"cache": True, "nogil": True, "boundscheck": False}



@numba.njit(**_JIT)  # type: ignore[untyped-decorator]
def check_steps(obs: Any, next_obs: Any, expected: Any, env_ids: Any, last: Any, frame: int,
                zero_pad: bool) -> tuple[int, int]:  # pragma: no cover (compiled)
    """``(problem, env)`` of the first problem of rows ``obs``/``next_obs`` (``[n, words]``), else ``(0, -1)``.

    Rows are compared in words (see ``as_words``): ``expected``, each env's open stack
    (``[num_envs, words]``), is read where ``last[env] >= 0``; ``frame``: words per frame (the whole
    stack without frame stacking: no shift or padding check).
    """
    n, size = obs.shape
    for i in range(n):
        env = env_ids[i]
        if last[env] >= 0:
            for b in range(size):
                if obs[i, b] != expected[env, b]:
                    return CONTINUITY, env
    if frame == size:
        return 0, -1
    newest = size - frame
    for i in range(n):
        for b in range(newest):
            if next_obs[i, b] != obs[i, b + frame]:
                return SHIFT, env_ids[i]
    for i in range(n):
        env = env_ids[i]
        if last[env] < 0:
            for b in range(newest):
                pad = 0 if zero_pad else obs[i, newest + b % frame]
                if obs[i, b] != pad:
                    return PADDING, env
    return 0, -1


@numba.njit(**_JIT)  # type: ignore[untyped-decorator]
def record_steps(env_ids: Any, first_serial: int, terminated: Any, truncated: Any, oldest: int, back: Any,
                 next_: Any, stored_terminated: Any, stored_truncated: Any, final_slot: Any, env: Any,
                 last: Any, released: Any) -> int:  # pragma: no cover (compiled)
    """Link rows of serials ``first_serial + i`` (one per env) into the tables; return how many final-frame
    slots of overwritten rows were written to ``released``.

    The same updates as ``Streams.record`` for distinct envs, but for the final frames of the rows
    that end an episode (kept aside by the caller).
    """
    capacity = next_.shape[0]
    older = back.shape[1]
    count = 0
    for i in range(len(env_ids)):
        serial = first_serial + i
        owner = env_ids[i]
        link = last[owner]
        if serial >= oldest:
            position = serial % capacity
            if final_slot[position] >= 0:
                released[count] = final_slot[position]
                count += 1
            next_[position] = -1
            stored_terminated[position] = terminated[i]
            stored_truncated[position] = truncated[i]
            final_slot[position] = -1
            env[position] = owner
            if link >= oldest:
                next_[link % capacity] = serial
            if older > 0:
                if link < 0:  # an episode's first row: -1 - its own serial, padded
                    back[position, :] = -1 - serial
                elif link < oldest:  # the row before is overwritten: this one can never be complete
                    back[position, :] = link
                else:
                    linked = link % capacity
                    for j in range(older - 1):
                        back[position, j] = back[linked, j + 1]
                    back[position, older - 1] = link
        last[owner] = -1 if terminated[i] or truncated[i] else serial
    return count


@numba.njit(**_JIT)  # type: ignore[untyped-decorator]
def walk_rows(positions: Any, oldest: int, n_step: int, back: Any, next_: Any, stored_terminated: Any,
              stored_truncated: Any, stored_final_slot: Any, rows: Any, padded: Any, steps: Any, terminated: Any,
              truncated: Any, final_slot: Any, complete: Any) -> None:  # pragma: no cover (compiled)
    """Fill a ``Chain``'s arrays (``rows`` ... ``complete``, preset as ``Streams.walk`` says) for ``positions``.

    Per sampled row: the ``frame_stack - 1`` rows of its stack before it (from ``back``, oldest
    first; complete only if all are still stored), then up to ``n_step`` rows after it along
    ``next_`` until an episode ends (its flags and final slot noted) or a row is missing.
    """
    capacity = next_.shape[0]
    older = back.shape[1]
    for i in range(len(positions)):
        position = positions[i]
        rows[i, older] = position
        whole = True
        for j in range(older):
            link = back[position, j]
            serial = -1 - link if link < 0 else link
            padded[i, j] = link < 0
            rows[i, j] = serial % capacity
            whole = whole and serial >= oldest
        row = position
        walking = whole
        for step in range(1, n_step + 1):
            if walking:
                if stored_terminated[row] or stored_truncated[row]:
                    steps[i] = step
                    terminated[i] = stored_terminated[row]
                    truncated[i] = stored_truncated[row]
                    final_slot[i] = stored_final_slot[row]
                    walking = False
                elif next_[row] < 0:
                    whole = False
                    walking = False
                else:
                    row = next_[row] % capacity
            rows[i, older + step] = row
        if walking:
            steps[i] = n_step
        complete[i] = whole


def as_words(rows: np.ndarray[Any, Any], frame: int) -> np.ndarray[Any, Any]:
    """``[n, ...]`` C-contiguous rows as ``[n, words]``, without a copy: 8-byte words where rows and
    frames of ``frame`` bytes split into them (an 84×84 frame does), else bytes.

    Example:
        >>> as_words(np.zeros((2, 4, 84, 84), np.uint8), 84 * 84).shape
        (2, 3528)
        >>> as_words(np.zeros((2, 3), np.int16), 0).shape
        (2, 6)
    """
    flat = rows.reshape(len(rows), -1).view(np.uint8)
    words = flat.shape[1] % 8 == 0 and frame % 8 == 0
    return flat.view(np.uint64) if words else flat
