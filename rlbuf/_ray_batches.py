"""The learner's batch from its shards' replies: each reply checked, fields concatenated, indices made global,
weights normalised over all shards, and a compact shard's stacks rebuilt from its distinct frames
([`rlbuf._compact_wire`][rlbuf._compact_wire]).

Example:
    >>> import numpy as np, torch
    >>> reply = {"fields": {"obs": np.zeros((2, 1), np.float32), "index": np.array([0, 1]),
    ...                     "weight": np.ones(2, np.float32), "extras": {}, "hidden_state": None},
    ...          "stats": {"smallest": 1.0}}
    >>> fields = merged_fields([(1, 2)], [reply], shard_capacity=10, weights=None, decoders=FrameDecoders())
    >>> fields["index"].tolist()
    [10, 11]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from rlbuf._compact_wire import FrameDecoders, put_frames, rebuild, shown
from rlbuf._delivery import deliver
from rlbuf._ray_wire import BATCH_FIELDS, concat, from_wire
from rlbuf.batches import ReplayBatch
from rlbuf.errors import ReplyError

_STATS = {"size": "an int", "mass": "a finite float", "smallest": "a positive finite float",
          "limiter": "None or a dict", "write_count": "an int", "incarnation": "a str"}


def check_reply(reply: object, rows: int) -> None:
    """Raise ``ReplyError`` unless ``reply`` has the parts of a shard's ``shard_sample`` of ``rows`` rows:
    ``"fields"`` (see ``check_fields``), ``"stats"`` of the types the learner reads, and ``"frames"``
    (a payload, checked by ``rebuild``, or ``None``).

    Example:
        >>> check_reply({"fields": {}, "stats": {}}, 2)
        Traceback (most recent call last):
        ...
        rlbuf.errors.ReplyError: reply: keys ['fields', 'stats'], expected ['fields', 'frames', 'stats']
    """
    if not isinstance(reply, dict) or set(reply) != {"fields", "stats", "frames"}:
        keys = sorted(map(str, reply)) if isinstance(reply, dict) else None
        raise ReplyError(f"reply: {shown(reply) if keys is None else f'keys {keys}'}, expected "
                         "['fields', 'frames', 'stats']")
    stats = reply["stats"]
    if not isinstance(stats, dict) or set(stats) != set(_STATS):
        raise ReplyError(f"reply: stats {shown(stats)}, expected a dict of {sorted(_STATS)}")
    sent = {"size": type(stats["size"]) is int and stats["size"] >= 0,
            "mass": type(stats["mass"]) is float and math.isfinite(stats["mass"]) and stats["mass"] >= 0,
            "smallest": type(stats["smallest"]) is float and math.isfinite(stats["smallest"]) and stats["smallest"] > 0,
            "limiter": stats["limiter"] is None or isinstance(stats["limiter"], dict),
            "write_count": type(stats["write_count"]) is int, "incarnation": type(stats["incarnation"]) is str}
    for name, good in sent.items():
        if not good:
            raise ReplyError(f"reply: stats {name} {shown(stats[name])}, expected {_STATS[name]}")
    check_fields(reply["fields"], rows)


def check_fields(fields: object, rows: int | None) -> None:
    """Raise ``ReplyError`` unless ``fields`` are a batch's fields as a shard sends them (``to_wire(fields_of(batch))``):
    each of ``BATCH_FIELDS`` and ``extras`` a numeric numpy array, a tensor, a TensorDict, a dict of str to them
    (``extras``, ``hidden_state``) or ``None``; ``index`` int64 and ``weight`` float arrays; every one of ``rows``
    rows (``None``: as many as ``index``).

    Example:
        >>> check_fields({name: None for name in (*BATCH_FIELDS, "extras")}, 2)
        Traceback (most recent call last):
        ...
        rlbuf.errors.ReplyError: reply: fields index None, expected an int64 array [2]
    """
    if not isinstance(fields, dict) or set(fields) != {*BATCH_FIELDS, "extras"}:
        keys = sorted(map(str, fields)) if isinstance(fields, dict) else shown(fields)
        raise ReplyError(f"reply: fields {keys}, expected {sorted((*BATCH_FIELDS, 'extras'))}")
    index, weight = fields["index"], fields["weight"]
    if not (isinstance(index, np.ndarray) and index.dtype == np.int64 and index.ndim == 1
            and (rows is None or len(index) == rows)):
        raise ReplyError(f"reply: fields index {shown(index)}, expected an int64 array [{rows or 'rows'}]")
    if not (isinstance(weight, np.ndarray) and weight.dtype.kind == "f" and weight.shape == index.shape):
        raise ReplyError(f"reply: fields weight {shown(weight)}, expected a float array [{len(index)}]")
    for name, value in fields.items():
        if isinstance(value, dict) and name in ("extras", "hidden_state"):
            wrong = [(f"{name}[{key!r}]", item) for key, item in value.items()
                     if type(key) is not str or _leaf_rows(item) != len(index)]
        else:
            wrong = [(name, value)] if value is not None and _leaf_rows(value) != len(index) else []
        if wrong:
            where, item = wrong[0]
            raise ReplyError(f"reply: fields {where} {shown(item)}, expected a numeric array, a tensor or a "
                             f"TensorDict of {len(index)} rows, or None")


def _leaf_rows(value: object) -> int | None:
    """Rows of a field as shards send it (``None``: a value no shard sends)."""
    if isinstance(value, np.ndarray):
        return len(value) if value.ndim and value.dtype.kind in "biufc" else None
    if isinstance(value, torch.Tensor | TensorDictBase):
        return int(value.shape[0]) if len(value.shape) else None
    return None


def _check_frames_left_out(fields: dict[str, Any], path: object, shard: int) -> None:
    """Raise ``ReplyError`` unless the ``obs`` and ``next_obs`` of a reply whose frames travel apart hold, at ``path``
    (their followed key, ``()``: the tensors themselves), the ``[rows, 0]`` leaves ``rebuild``'s stacks replace."""
    for name in ("obs", "next_obs"):
        leaf = fields[name]
        if isinstance(path, tuple) and path and isinstance(leaf, TensorDictBase):
            leaf = leaf.get(path, None) if all(type(key) is str for key in path) else None
        elif path != ():
            leaf = None
        if _leaf_rows(leaf) != len(fields["index"]) or tuple(getattr(leaf, "shape", ()))[1:] != (0,):
            raise ReplyError(f"reply: shard {shard}'s {name} at {shown(path)}: {shown(leaf)}, expected the "
                             f"[{len(fields['index'])}, 0] leaf its frames replace")


def _layout(value: Any) -> Any:
    """What must agree across shards for their fields to be concatenated: kind, dtype and shape past the rows."""
    if isinstance(value, dict):
        return {name: _layout(item) for name, item in value.items()}
    if isinstance(value, TensorDictBase):
        return sorted((str(key), str(leaf.dtype), tuple(leaf.shape[1:]))
                      for key, leaf in value.items(include_nested=True, leaves_only=True))
    if isinstance(value, np.ndarray | torch.Tensor):
        return type(value).__name__, str(value.dtype), tuple(value.shape[1:])
    return value


def merged_fields(drawn: Sequence[tuple[int, int]], replies: Sequence[dict[str, Any]], *, shard_capacity: int,
                  weights: tuple[float, float] | None, decoders: FrameDecoders) -> dict[str, Any]:
    """The fields of one batch from the replies of shards ``drawn`` (``(shard, rows)``), as tensors.

    Args:
        drawn: the shard of each reply, in order (and the rows asked of it).
        replies: ``{"fields", "stats"}`` each, and ``"frames"`` (a ``FramePayload``) from compact shards; their
            ``fields`` pass ``check_fields``.
        shard_capacity: rows a shard holds (a global index is ``shard * shard_capacity + position``).
        weights: ``(smallest priority over all shards, beta)``: each shard's importance weights scaled to
            the batch's (``None``: left as they are).
        decoders: the learner's codecs (dictionaries cached by id).

    Raises:
        ReplyError: replies whose fields differ in kind, dtype or shape past the rows (no two rlbuf shards of one
            service send such), or that send their frames apart and whole; a payload ``rebuild`` refuses.
    """
    # Merged as numpy arrays first: Ray hands them over read-only, so one copy makes them
    # the batch's (concatenating tensors would copy twice: pixel batches are megabytes).
    parts = [dict(reply["fields"]) for reply in replies]
    layout = _layout(parts[0])
    for (k, _), part in zip(drawn[1:], parts[1:], strict=True):
        other = _layout(part)
        for name in sorted(set(layout) | set(other)):
            if other.get(name) != layout.get(name):
                raise ReplyError(f"reply: shard {k}'s {name} {other.get(name)} beside {layout.get(name)} from shard "
                                 f"{drawn[0][0]}: expected the same kind, dtype and shape past the rows")
    for (k, _), part in zip(drawn, parts, strict=True):
        part["index"] = part["index"] + k * shard_capacity
    if weights is not None:
        overall, beta = weights
        for reply, part in zip(replies, parts, strict=True):
            part["weight"] = part["weight"] * float((reply["stats"]["smallest"] / overall) ** -beta)
    payloads = [reply["frames"] for reply in replies if reply.get("frames") is not None]
    if payloads and len(payloads) != len(replies):
        raise ReplyError(f"reply: {len(payloads)} of {len(replies)} shards sent their frames apart: shards of one "
                         "service send them all apart or all whole")
    fields: dict[str, Any] = from_wire(concat(parts))
    if payloads:
        obs, next_obs = rebuild(payloads, decoders, [len(part["index"]) for part in parts])
        for (k, _), part, payload in zip(drawn, parts, payloads, strict=True):
            _check_frames_left_out(part, payload.path, k)
        put_frames(fields, payloads[0].path, obs, next_obs)
    return fields


def batch_of(fields: dict[str, Any], device: torch.device) -> ReplayBatch:
    """A [`ReplayBatch`][rlbuf.ReplayBatch] of merged ``fields``, delivered on ``device``."""
    extras, hidden_state = fields.pop("extras"), fields.pop("hidden_state")
    fields = deliver(fields, device)
    return ReplayBatch(**fields, extras=deliver(extras, device) if extras else {},
                       hidden_state=None if hidden_state is None else deliver(hidden_state, device))
