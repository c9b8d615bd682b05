"""The compact add's stream check and record for one step of each env, compiled by numba.

Sampling walks each sampled row's stack back and its n steps forward (``walk_rows``). An add of one step of ``n`` envs (distinct envs: every ``add`` and every ``Recorder.record``)
checks each stack against its env's stream and links the new rows into the stream tables (see
[`rlbuf._streams`][rlbuf._streams]). In numpy that is some sixty small calls per add; here it is
two compiled loops that read each 8-byte word once, in blocks that compile to vector instructions,
and stop at the first differing block; the record also copies each env's ``next_obs`` into the
stack its next add is checked against. An add checks, writes the ring, then records (a write that
fails leaves the tables as they were). They do what
``Streams.check`` and ``Streams.record`` do for such an add, and the property tests of the
compact layout hold them to it. Observations are compared as bytes: for integer and bool observations (Atari
frames) a difference is a refusal; for floats, whose ``-0.0`` and ``0.0`` differ as bytes, the check only decides
the steps whose bytes continue and leaves the others to the numpy path, which compares values.
numba compiles each kernel once (about a second) and keeps it in its on-disk cache; ``loaded`` calls
each one on no rows when a compact buffer is made, so the first add does not load them.

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

from rlbuf._streams import CONTINUITY, PADDING, REPEATED, SHIFT

_JIT = {"cache": True, "nogil": True, "boundscheck": False}

_BLOCK = 64  # words compared per block: a block's fixed-length loop compiles to vector instructions


@numba.njit(**_JIT, inline="always")  # type: ignore[untyped-decorator]
def _same(a: Any, a_start: int, b: Any, b_start: int, count: int) -> bool:  # pragma: no cover (compiled)
    """Whether ``a[a_start:a_start + count]`` and ``b[b_start:b_start + count]`` hold the same words, read in
    blocks that stop at the first differing one.

    Both ranges are sliced first, so every index is a loop counter from 0 (an index plus a run-time
    offset gets numba's negative-index handling, which keeps the loop scalar), and a block ORs the
    XOR of its word pairs (no branch, a fixed trip count). A compare of the 3,528 words of an Atari
    stack takes 1 µs so, against 24 µs for the scalar loop this replaced.
    """
    a = a[a_start:a_start + count]
    b = b[b_start:b_start + count]
    full = count - count % _BLOCK
    for block in range(0, full, _BLOCK):
        differ = a[0] ^ a[0]  # a zero of the words' type
        for w in range(block, block + _BLOCK):
            differ |= a[w] ^ b[w]
        if differ:
            return False
    for w in range(full, count):  # noqa: SIM110 (a loop: numba compiles no generator)
        if a[w] != b[w]:
            return False
    return True


@numba.njit(**_JIT, inline="always")  # type: ignore[untyped-decorator]
def _copy(destination: Any, source: Any, zero: bool) -> None:  # pragma: no cover (compiled)
    """``destination[:] = 0 if zero else source``, word by word (twice as fast as numba's slice assignment)."""
    if zero:
        for w in range(destination.shape[0]):
            destination[w] = 0
    else:
        for w in range(destination.shape[0]):
            destination[w] = source[w]


@numba.njit(**_JIT)  # type: ignore[untyped-decorator]
def copy_rows(rows: Any, destinations: Any, sources: Any) -> None:  # pragma: no cover (compiled)
    """``rows[destinations[i]] = rows[sources[i]]`` for each ``i`` (zeros where ``sources[i] < 0``), word by word
    (``rows``: ``[n, words]``): the frames a decoded batch asks for again (``rlbuf._frames.copy_repeated``), a
    third of a numpy fancy assignment's time.

    Example:
        >>> rows = np.arange(6, dtype=np.uint64).reshape(3, 2)
        >>> copy_rows(rows, np.array([0, 1]), np.array([2, -1]))
        >>> rows.tolist()
        [[4, 5], [0, 0], [4, 5]]
    """
    for i in range(len(destinations)):
        source = sources[i]
        _copy(rows[destinations[i]], rows[max(source, 0)], source < 0)


@numba.njit(**_JIT, inline="always")  # type: ignore[untyped-decorator]
def _words(rows: Any, words: Any, count: int) -> Any:  # pragma: no cover (compiled)
    """C-contiguous rows ``[count, ...]`` as ``[count, words]`` of the word type of ``words`` (no copy): what
    ``as_words`` gives in Python, here inside the kernel, so an add pays no Python reshape and view per array."""
    n = rows.shape[0]
    viewed = rows.reshape(n, rows.size // n if n else 0).view(words.dtype)
    if n != count or (n and viewed.shape[1] != words.shape[1]):  # the kernels index without bounds checks
        raise ValueError("rows of another count than the env ids' or of another size than the open stacks'")
    return viewed


@numba.njit(**_JIT, inline="always")  # type: ignore[untyped-decorator]
def _distinct(env_ids: Any, num_envs: int) -> bool:  # pragma: no cover (compiled)
    """Whether no env has two rows (one step of each env: every add), as ``rlbuf._streams._distinct`` says;
    raises ``ValueError`` for an id outside ``[0, num_envs)``."""
    if len(env_ids) > num_envs:
        return False
    seen = np.zeros(num_envs, np.bool_)
    for i in range(len(env_ids)):
        if not 0 <= env_ids[i] < num_envs:  # indexed without bounds checks (numpy would wrap a negative one)
            raise ValueError("env ids outside [0, num_envs)")
        if seen[env_ids[i]]:
            return False
        seen[env_ids[i]] = True
    return True


@numba.njit(**_JIT)  # type: ignore[untyped-decorator]
def check_steps(obs_rows: Any, next_rows: Any, expected: Any, env_ids: Any, last: Any, frame: int,
                zero_pad: bool) -> tuple[int, int]:  # pragma: no cover (compiled)
    """``(problem, env)`` of the first problem of rows ``obs_rows``/``next_rows`` (C-contiguous ``[n, ...]``),
    else ``(0, -1)``; ``(REPEATED, -1)`` where an env has two rows (not one step of each env: the caller's numpy
    path decides).

    Rows are compared in the words of ``expected``, each env's open stack as ``as_words`` gives it
    (``[num_envs, words]``), which is read where ``last[env] >= 0``; ``frame``: words per frame (the whole
    stack without frame stacking: no shift or padding check).
    """
    if not _distinct(env_ids, last.shape[0]):
        return REPEATED, -1
    obs, next_obs = _words(obs_rows, expected, len(env_ids)), _words(next_rows, expected, len(env_ids))
    n, size = obs.shape
    for i in range(n):
        env = env_ids[i]
        if last[env] >= 0 and not _same(obs[i], 0, expected[env], 0, size):
            return CONTINUITY, env
    if frame == size:
        return 0, -1
    newest = size - frame
    for i in range(n):
        if not _same(next_obs[i], 0, obs[i], frame, newest):
            return SHIFT, env_ids[i]
    for i in range(n):
        env = env_ids[i]
        if last[env] < 0:
            for start in range(0, newest, frame):
                if zero_pad:
                    for b in range(frame):
                        if obs[i, start + b] != 0:
                            return PADDING, env
                elif not _same(obs[i], start, obs[i], newest, frame):
                    return PADDING, env
    return 0, -1


@numba.njit(**_JIT)  # type: ignore[untyped-decorator]
def record_steps(env_ids: Any, first_serial: int, terminated: Any, truncated: Any, oldest: int, back: Any, links: Any,
                 flags: Any, per_env: Any, next_rows: Any, expected: Any) -> tuple[int, int]:  # pragma: no cover
    """Link rows of serials ``first_serial + i`` (one per env) into the tables and copy each row's ``next_obs``
    (``next_rows``: C-contiguous ``[n, ...]``) to its env's ``expected`` (``[num_envs, words]``); return how many
    final-frame slots of overwritten rows were written to ``released``, and how many of the rows stored end an
    episode; ``(REPEATED, 0)``, changing nothing, where an env has two rows (the caller's numpy path records them).

    The tables come packed, as ``Streams`` holds them (each argument costs numba's dispatch about 0.2 us):
    ``links`` is ``next``, ``final_slot`` and ``env`` (``[3, capacity]``), ``flags`` the stored ``terminated``
    and ``truncated`` (``[2, capacity]``), ``per_env`` each env's ``last`` serial and a ``released`` scratch row
    (``[2, num_envs]``). The same updates as ``Streams.record`` for distinct envs, but for the final frames of
    the rows that end an episode (kept aside by the caller).
    """
    next_, final_slot, env = links[0], links[1], links[2]
    stored_terminated, stored_truncated = flags[0], flags[1]
    last, released = per_env[0], per_env[1]
    if not _distinct(env_ids, last.shape[0]):
        return REPEATED, 0
    next_obs = _words(next_rows, expected, len(env_ids))
    if len(terminated) != len(env_ids) or len(truncated) != len(env_ids):
        raise ValueError("flags of another count than the env ids'")
    capacity = next_.shape[0]
    older = back.shape[1]
    count = 0
    ends = 0
    for i in range(len(env_ids)):
        serial = first_serial + i
        owner = env_ids[i]
        link = last[owner]
        ended = terminated[i] or truncated[i]
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
            if ended:
                ends += 1
        last[owner] = -1 if ended else serial
        _copy(expected[owner], next_obs[i], False)
    return count, ends


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


@numba.njit(**_JIT)  # type: ignore[untyped-decorator]
def build_stacks(frames: Any, finals: Any, rows: Any, padded: Any, steps: Any, ended: Any, final_slot: Any,
                 zero_pad: bool, obs: Any, next_obs: Any) -> None:  # pragma: no cover (compiled)
    """Copy each transition's ``obs`` and ``next_obs`` stacks (``[B, stack, words]``) from stored
    ``frames`` (``[capacity, words]``) along a walk's ``rows``, as ``Streams.stacks`` rebuilds them.

    ``next_obs`` of row ``i`` is the stack ``steps[i]`` rows later, its newest frame the kept final
    observation ``finals[final_slot[i]]`` where the episode ``ended``; with ``zero_pad`` a frame
    before the episode start is zeros.
    """
    stack = obs.shape[1]
    for i in range(rows.shape[0]):
        for j in range(stack):
            _copy(obs[i, j], frames[rows[i, j]], zero_pad and padded[i, j])
            k = steps[i] + j
            if ended[i] and j == stack - 1:
                _copy(next_obs[i, j], finals[final_slot[i]], False)
            else:
                _copy(next_obs[i, j], frames[rows[i, k]], zero_pad and padded[i, k])


@numba.njit(**_JIT)  # type: ignore[untyped-decorator]
def nstep_targets(rows: Any, start: int, steps: Any, terminated: Any, rewards: Any, powers: Any, reward: Any,
                  discount: Any) -> None:  # pragma: no cover (compiled)
    """Each transition's n-step ``reward`` (``sum_{i<m} gamma**i * r``, in float64, summed in step order) and
    ``discount`` (``gamma**m``, 0 when it terminated) from stored ``rewards`` read along a walk's ``rows``
    (the transition's first row at column ``start``; ``powers[i]``: ``gamma**i``); see ``rlbuf._nstep``."""
    for i in range(rows.shape[0]):
        total = np.float64(rewards[rows[i, start]]) if steps[i] > 0 else 0.0  # from the first term: -0.0 stays -0.0
        for step in range(1, steps[i]):
            total += np.float64(rewards[rows[i, start + step]]) * powers[step]
        reward[i] = np.float32(total)
        discount[i] = 0.0 if terminated[i] else np.float32(powers[steps[i]])


def loaded(expected: Any, expected_words: Any, expected_bytes: Any, back: Any) -> tuple[Any, Any, Any, Any, Any]:
    """``check_steps``, ``record_steps``, ``walk_rows``, ``build_stacks`` and
    ``nstep_targets``, each called once on no rows of a buffer's table types (``expected``: its open stacks as
    stored, the type of an add's rows; ``expected_words``, ``expected_bytes``: the same as ``as_words`` gives them
    with and without frames; ``back``: its table of older rows), so numba loads (or compiles) them now: a
    buffer's constructor, not its first add or sample, pays the second that takes.

    Example:
        >>> from rlbuf._streams import as_words
        >>> stacks = np.zeros((1, 2, 8), np.uint8)
        >>> kernels = loaded(stacks, as_words(stacks, 8), as_words(stacks, 0), np.zeros((4, 1), np.int64))
        >>> kernels[0] is check_steps, kernels[2] is walk_rows
        (True, True)
    """
    none, flags, tables = np.zeros(0, np.int64), np.zeros(0, np.bool_), np.zeros(len(back), np.int64)
    marks = np.zeros(len(back), np.bool_)
    links, marked = np.zeros((3, len(back)), np.int64), np.zeros((2, len(back)), np.bool_)
    width = back.shape[1] + 2
    walked, padded = np.zeros((0, width), np.int64), np.zeros((0, width), np.bool_)
    check_steps(expected[:0], expected[:0], expected_words, none, none, 1, False)
    for rows in (expected_bytes[:0], expected_bytes[:0].view(np.uint8)):  # a compressed log's decoded frames
        copy_rows(rows, none, none)
    record_steps(none, 0, flags, flags, 0, back, links, marked, np.zeros((2, 0), np.int64), expected[:0], expected_bytes)
    walk_rows(none, 0, 1, back, tables, marks, marks, tables, walked, padded, none, flags, flags, none, flags)
    stacked = np.zeros((0, back.shape[1] + 1, expected_words.shape[1] // (back.shape[1] + 1)), expected_words.dtype)
    build_stacks(stacked[:, 0].copy(), stacked[:, 0].copy(), walked, padded, none, flags, none, False, stacked, stacked)
    rewards = np.zeros(0, np.float32)
    nstep_targets(walked, 0, none, flags, rewards, np.ones(1), rewards, rewards)
    return check_steps, record_steps, walk_rows, build_stacks, nstep_targets
