"""The learner's batch from its shards' replies: fields concatenated, indices made global, weights normalised
over all shards, and a compact shard's stacks rebuilt from its distinct frames
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

from collections.abc import Sequence
from typing import Any

import torch

from rlbuf._compact_wire import FrameDecoders, put_frames, rebuild
from rlbuf._delivery import deliver
from rlbuf._ray_wire import concat, from_wire
from rlbuf.batches import ReplayBatch


def merged_fields(drawn: Sequence[tuple[int, int]], replies: Sequence[dict[str, Any]], *, shard_capacity: int,
                  weights: tuple[float, float] | None, decoders: FrameDecoders) -> dict[str, Any]:
    """The fields of one batch from the replies of shards ``drawn`` (``(shard, rows)``), as tensors.

    Args:
        drawn: the shard of each reply, in order (and the rows asked of it).
        replies: ``{"fields", "stats"}`` each, and ``"frames"`` (a ``FramePayload``) from compact shards.
        shard_capacity: rows a shard holds (a global index is ``shard * shard_capacity + position``).
        weights: ``(smallest priority over all shards, beta)``: each shard's importance weights scaled to
            the batch's (``None``: left as they are).
        decoders: the learner's codecs (dictionaries cached by id).
    """
    # Merged as numpy arrays first: Ray hands them over read-only, so one copy makes them
    # the batch's (concatenating tensors would copy twice: pixel batches are megabytes).
    parts = [dict(reply["fields"]) for reply in replies]
    for (k, _), part in zip(drawn, parts, strict=True):
        part["index"] = part["index"] + k * shard_capacity
    if weights is not None:
        overall, beta = weights
        for reply, part in zip(replies, parts, strict=True):
            part["weight"] = part["weight"] * float((reply["stats"]["smallest"] / overall) ** -beta)
    fields: dict[str, Any] = from_wire(concat(parts))
    payloads = [reply["frames"] for reply in replies if reply.get("frames") is not None]
    if payloads:
        if len(payloads) != len(replies):
            raise AssertionError("some shards sent their frames apart and some whole: shards of one service differ")
        obs, next_obs = rebuild(payloads, decoders, [len(part["index"]) for part in parts])
        put_frames(fields, payloads[0].path, obs, next_obs)
    return fields


def batch_of(fields: dict[str, Any], device: torch.device) -> ReplayBatch:
    """A [`ReplayBatch`][rlbuf.ReplayBatch] of merged ``fields``, delivered on ``device``."""
    extras, hidden_state = fields.pop("extras"), fields.pop("hidden_state")
    fields = deliver(fields, device)
    return ReplayBatch(**fields, extras=deliver(extras, device) if extras else {},
                       hidden_state=None if hidden_state is None else deliver(hidden_state, device))
