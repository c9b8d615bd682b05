"""The invariants of a compact buffer's stream tables, derived again from the stored rows.

A checkpoint of the compact layout holds the tables of [`rlbuf._streams`][rlbuf._streams]
(``back``, ``next``, ``terminated``, ``truncated``, ``final_slot``, ``last``, ``expected`` and
the final observations). ``streams_problem`` refuses any table that ``Streams.record`` could not
have written for the stored rows and counters:

* flags: the stream's ``terminated``/``truncated`` are the stored rows' (and False elsewhere);
* env: each stored row's env is the fact the links are derived from: a row that did not end its
  episode links to the next row of its env, and an env's open episode ends at its newest row
  (rows loaded from the first compact checkpoints, which stored no env, keep env -1, unknown:
  older than every row of known env; while any is stored only the links' own invariants hold);
* positions: a row of serial ``s`` lives at ``s % capacity``; only the newest
  ``min(write_count, capacity)`` serials are stored, and every table is at its empty value at
  positions that hold no row;
* ``next``: -1, or a newer stored serial, never after a row that ended its episode, and no row
  is the next of two;
* ``last``: the open episode of each env ends at its newest row: the stored rows that did not
  end their episode and have no next are exactly those ``last`` names;
* ``back`` (``frame_stack > 1``): a row that follows a stored row has that row's links shifted
  by one; any other row starts an episode (``-1 - serial`` throughout) or follows an
  overwritten row (its newest link older than every stored row);
* final observations: every stored row that ended an episode has its own slot, every other
  slot is free;
* ``expected``: an env's open stack is the stack of its newest row shifted by one frame (which
  also pins ``padding_type`` when that stack is padded).

Example:
    >>> import torch
    >>> from rlbuf._streams import Streams
    >>> streams = Streams(4, 1, (1,), torch.float32, frame_stack=1, padding_type="reset", n_step=2,
    ...                   storing_device=torch.device("cpu"))
    >>> flags, frames = torch.zeros(0, dtype=torch.bool), lambda positions: torch.zeros(len(positions), 1)
    >>> streams_problem(streams, streams.state_dict(), terminated=flags, truncated=flags, frames=frames,
    ...                 frame_shape=(1,), write_count=0, size=0)
    ''
    >>> tables = streams.state_dict()
    >>> tables["next"][0] = 3
    >>> streams_problem(streams, tables, terminated=flags, truncated=flags, frames=frames, frame_shape=(1,),
    ...                 write_count=0, size=0)
    'stream table next: position 0 holds no row but is not empty'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from rlbuf._streams import Streams, differs

_Ints = npt.NDArray[np.int64]
_TABLES = ("back", "next", "terminated", "truncated", "final_slot", "last", "env", "expected", "finals")
_OPTIONAL = {"env"}  # the first compact checkpoints did not store each row's env


def streams_problem(streams: Streams, tables: Any, *, terminated: torch.Tensor, truncated: torch.Tensor,
                    frames: Callable[[_Ints], torch.Tensor], frame_shape: tuple[int, ...], write_count: int,
                    size: int, env_required: bool = False) -> str:
    """``""`` when ``tables`` are what ``streams`` would hold after writing the stored rows, else why not.

    Args:
        streams: the buffer's streams (for the options: capacity, envs, frame stack, padding).
        tables: a ``Streams.state_dict()`` to check.
        terminated: the stored rows' flags ``[size]`` (storage positions).
        truncated: likewise.
        frames: the stored frames (one per row) at an array of positions ``[n, *frame_shape]``.
        frame_shape: one stored frame.
        write_count: rows written since the ring was last cleared.
        size: rows stored (``min(write_count, capacity)``, checked by the caller).
        env_required: every stored row's env must be named (a layout rlbuf has stored envs for since it came:
            compressed frames). Without the table (the first compact checkpoints), the links of several envs'
            rows cannot be checked against their envs.
    """
    reason = _shapes_problem(streams, tables)
    if reason:
        return reason
    arrays = {name: tables[name].numpy() for name in ("back", "next", "terminated", "truncated", "final_slot", "last")}
    capacity, oldest = streams.capacity, write_count - size
    serial = np.full(capacity, -1, np.int64)
    stored_serials = np.arange(oldest, write_count, dtype=np.int64)
    serial[stored_serials % capacity] = stored_serials
    stored = serial >= 0
    empty = {"back": -1, "next": -1, "terminated": False, "truncated": False, "final_slot": -1}
    for name, value in empty.items():
        if not bool((arrays[name][~stored] == value).all()):
            return f"stream table {name}: position {int(np.flatnonzero(~stored)[0])} holds no row but is not empty"
    for name, flags in (("terminated", terminated), ("truncated", truncated)):
        if not np.array_equal(arrays[name][:size], flags.to(torch.bool).cpu().numpy()):
            return f"stream table {name} differs from the stored rows' {name} flags"
    ended = arrays["terminated"] | arrays["truncated"]
    num_envs = len(arrays["last"])
    env = tables["env"].numpy() if "env" in tables else np.full(capacity, -1, np.int64)
    unknown, known = stored & (env == -1), stored & (env != -1)
    if env_required and bool(unknown.any()):
        return ("stream table env: a stored row's env is not named; every checkpoint of this layout names each "
                "row's env")
    if bool(unknown.any()) and bool(known.any()) and serial[unknown].max() > serial[known].min():
        return "stream table env: a row of unknown env (-1) is newer than a row of known env"  # only old rows lack it
    if num_envs == 1 and "env" not in tables:  # one env: every row is its (a legacy checkpoint's links checked too)
        env = np.where(stored, 0, -1)
    if "env" in tables or num_envs == 1:
        reason = _env_problem(env, arrays, ended, serial, streams.back.shape[1], oldest)
        if reason:
            return reason
    return (_next_problem(arrays["next"], serial, ended, oldest, write_count)
            or _last_problem(arrays["last"], arrays["next"], ended, stored, serial, oldest, write_count)
            or _finals_problem(arrays["final_slot"], ended, stored, tables["finals"], streams.finals.slots(tables["finals"]))
            or _back_problem(arrays["back"], arrays["next"], serial, oldest)
            or _expected_problem(streams, tables, arrays["last"], frames, frame_shape, oldest))


def _shapes_problem(streams: Streams, tables: Any) -> str:
    if not isinstance(tables, Mapping) or not set(_TABLES) - _OPTIONAL <= set(tables) <= set(_TABLES):
        found = sorted(tables) if isinstance(tables, Mapping) else type(tables).__name__
        return f"stream tables {found}, expected {sorted(_TABLES)}"
    own = streams.state_dict()
    for name in _TABLES[:-1]:
        if name not in tables:
            continue
        value, expected = tables[name], own[name]
        if (not isinstance(value, torch.Tensor) or value.dtype != expected.dtype
                or tuple(value.shape) != tuple(expected.shape)):
            got = (value.dtype, tuple(value.shape)) if isinstance(value, torch.Tensor) else type(value).__name__
            return f"stream table {name} is {got}, expected {expected.dtype} of shape {tuple(expected.shape)}"
    reason: str = streams.finals.structure_problem(tables["finals"])
    return reason


def _env_problem(env: _Ints, arrays: Mapping[str, Any], ended: npt.NDArray[np.bool_], serial: _Ints,
                 older_frames: int, oldest: int) -> str:
    """The links derived from each stored row's env: a row that did not end its episode links to the
    next row of its env; an env's open episode ends at its newest row; a row after one that ended
    starts an episode."""
    stored = serial >= 0
    num_envs = len(arrays["last"])
    if bool((env[~stored] != -1).any()) or bool(((env[stored] < -1) | (env[stored] >= num_envs)).any()):
        return f"stream table env: stored rows must name an env in [0, {num_envs}), other positions -1"
    if bool((stored & (env == -1)).any()):  # rows loaded from a checkpoint without env table (see streams_problem)
        return ""
    order = np.flatnonzero(stored)[np.argsort(serial[stored], kind="stable")]
    order = order[np.argsort(env[order], kind="stable")]  # by env, then oldest first
    same_env = env[order[:-1]] == env[order[1:]]
    first, then = order[:-1][same_env], order[1:][same_env]
    next_ = np.full(len(serial), -1, np.int64)
    open_ = first[~ended[first]]
    next_[open_] = serial[then[~ended[first]]]
    if not np.array_equal(next_, arrays["next"]):
        position = int(np.flatnonzero(next_ != arrays["next"])[0])
        return f"stream table next: the row at position {position} does not link to the next row of its env"
    newest = order[np.r_[~same_env, True]] if len(order) else order
    last = np.full(num_envs, -1, np.int64)
    last[env[newest]] = np.where(ended[newest], -1, serial[newest])
    rowless = np.ones(num_envs, np.bool_)
    rowless[env[newest]] = False
    saved = arrays["last"]
    if not (np.array_equal(saved[~rowless], last[~rowless]) and bool((saved[rowless] < oldest).all())):
        return "stream table last: an env's open episode does not end at its newest stored row"
    if older_frames:
        after_end = then[ended[first]]
        if not bool((arrays["back"][after_end] == (-1 - serial[after_end])[:, None]).all()):
            return "stream table back: a row after the end of an episode does not start one"
    return ""


def _next_problem(next_: _Ints, serial: _Ints, ended: npt.NDArray[np.bool_], oldest: int, write_count: int) -> str:
    linked = next_ >= 0
    if bool((next_[~linked] != -1).any()):
        return "stream table next holds a negative link other than -1"
    if bool((linked & ended).any()):
        return f"stream table next: the row at position {int(np.flatnonzero(linked & ended)[0])} ended its " \
               "episode but links to a next row"
    targets = next_[linked]
    bad = (targets <= serial[linked]) | (targets < oldest) | (targets >= write_count)
    if bool(bad.any()):
        return f"stream table next: the row at position {int(np.flatnonzero(linked)[bad][0])} links to serial " \
               f"{int(targets[bad][0])}, not a newer stored row"
    if len(np.unique(targets)) != len(targets):
        return "stream table next: two rows link to the same next row"
    return ""


def _last_problem(last: _Ints, next_: _Ints, ended: npt.NDArray[np.bool_], stored: npt.NDArray[np.bool_],
                  serial: _Ints, oldest: int, write_count: int) -> str:
    if bool(((last < -1) | (last >= write_count)).any()):
        return f"stream table last holds serials outside [-1, {write_count})"
    named = last[last >= 0]
    if len(np.unique(named)) != len(named):
        return "stream table last names one row for two envs"
    open_rows = np.sort(serial[stored & ~ended & (next_ < 0)])
    if not np.array_equal(np.sort(named[named >= oldest]), open_rows):
        return "stream table last does not name exactly the stored rows that end an open episode"
    return ""


def _finals_problem(final_slot: _Ints, ended: npt.NDArray[np.bool_], stored: npt.NDArray[np.bool_],
                    finals: Mapping[str, torch.Tensor], top: int) -> str:
    used = final_slot[stored & ended]
    if bool(((final_slot >= 0) != (stored & ended)).any()) or bool((final_slot < -1).any()):  # -1: no slot
        return "stream table final_slot: a row holds a final observation slot exactly when it ended its episode"
    if top > len(final_slot):  # rows release their slots before new ones are taken: one row, one slot at most
        return f"final observation slots: {top} kept, more than the {len(final_slot)} rows that could each hold one"
    free = finals["free"].numpy()
    slots = np.concatenate((used, free))
    if len(slots) != top or not np.array_equal(np.sort(slots), np.arange(top)):
        return f"final observation slots: the {len(used)} used and {len(free)} free slots are not the {top} kept"
    return ""


def _back_problem(back: _Ints, next_: _Ints, serial: _Ints, oldest: int) -> str:
    if back.shape[1] == 0:
        return ""
    capacity = len(serial)
    previous = np.full(capacity, -1, np.int64)
    linked = np.flatnonzero(next_ >= 0)
    previous[next_[linked] % capacity] = linked
    follows = np.flatnonzero(previous >= 0)
    before = previous[follows]
    if not (np.array_equal(back[follows, -1], serial[before])
            and np.array_equal(back[follows, :-1], back[before, 1:])):
        return "stream table back: a row's older frames are not those of the row before it shifted by one"
    heads = np.flatnonzero((previous < 0) & (serial >= 0))
    newest = back[heads, -1]
    starts = (back[heads] == (-1 - serial[heads])[:, None]).all(axis=1)
    after_overwritten = (newest >= 0) & (newest < oldest)
    if not bool((starts | after_overwritten).all()):
        position = int(heads[~(starts | after_overwritten)][0])
        return f"stream table back: the row at position {position} neither starts an episode nor follows an " \
               "overwritten row"
    decoded = np.where(back[heads] < 0, -1 - back[heads], back[heads])
    if bool((np.diff(decoded, axis=1) < 0).any()) or bool((decoded[:, -1] > serial[heads]).any()):
        return "stream table back: the older frames of a row are not in time order"
    return ""


def _expected_problem(streams: Streams, tables: Mapping[str, Any], last: _Ints,
                      frames: Callable[[_Ints], torch.Tensor], frame_shape: tuple[int, ...], oldest: int) -> str:
    """An open episode's stack is its newest row's stack shifted by one (``frame_stack > 1``)."""
    if streams.frame_stack == 1:
        return ""
    envs = np.flatnonzero(last >= oldest)
    if not envs.size:
        return ""
    positions = last[envs] % streams.capacity
    back = tables["back"].numpy()[positions]
    padded = back < 0
    rows = np.where(padded, -1 - back, back)
    complete = (rows >= oldest).all(axis=1)
    envs, positions, rows, padded = envs[complete], positions[complete], rows[complete], padded[complete]
    if not envs.size:
        return ""
    stack_rows = np.concatenate((rows % streams.capacity, positions[:, None]), axis=1)
    stacks = frames(stack_rows.reshape(-1)).cpu().view(len(envs), streams.frame_stack, *frame_shape).clone()
    if streams.padding_type == "zero":
        stacks[:, :-1][torch.from_numpy(padded)] = 0
    expected = tables["expected"].index_select(0, torch.from_numpy(envs))
    bad = differs(expected[:, :-1].cpu().numpy(), stacks[:, 1:].numpy())
    if bad.any():
        return (f"stream table expected: env {int(envs[bad.argmax()])}'s open stack is not its newest row's stack "
                f"shifted by one frame (padding_type={streams.padding_type!r})")
    return ""
