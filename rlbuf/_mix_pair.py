"""Which two buffers a MixedReplay can pair: their batches must join field by field.

Example:
    >>> import torch
    >>> from rlbuf import ReplayBuffer
    >>> offline = ReplayBuffer(10, obs_shape=(2,), action_shape=())
    >>> offline.add(torch.zeros(2), 0.0, 0.0, torch.zeros(2), False, truncated=False)
    >>> check_pair(offline, ReplayBuffer(10, obs_shape=(3,), action_shape=()))
    Traceback (most recent call last):
    ...
    rlbuf.errors.ShapeError: obs: expected shape (2,) (the offline buffer's), got (3,) in the online buffer
"""

from __future__ import annotations

from typing import Any

import torch

from rlbuf._obs import leaf_name
from rlbuf.errors import (
    ConfigError,
    DeviceError,
    DtypeError,
    EmptyBufferError,
    MissingFieldError,
    ShapeError,
)
from rlbuf.replay import ReplayBuffer

Layout = dict[str, tuple[tuple[int, ...], torch.dtype]]


def _batch_layout(buffer: ReplayBuffer) -> Layout:
    """Shape of one row and dtype of every tensor in the buffer's batches, by field name."""
    # Observations as batches give them (whole stacks, decompressed), whatever a compact row stores of them;
    # every batch has a next_obs like its obs.
    observed = {leaf_name("obs", leaf.path): (leaf.shape, leaf.dtype) for leaf in buffer._obs.leaves}
    skipped = {leaf_name(kind, leaf.path) for leaf in buffer._obs.leaves for kind in ("obs", "next_obs")}
    return {**observed, **{spec.name: (tuple(spec.shape), spec.dtype) for spec in buffer.fields
                           if spec.name not in skipped}}


def check_pair(offline: Any, online: Any) -> None:
    """Refuse two buffers whose batches cannot be joined, naming the first field that differs (see ``MixedReplay``)."""
    for name, buffer in (("offline", offline), ("online", online)):
        if not isinstance(buffer, ReplayBuffer):
            raise ConfigError(f"{name}: expected a ReplayBuffer, got {type(buffer).__name__}")
    if offline is online:
        raise ConfigError("online: the same buffer as offline; mix two buffers (a dataset and a live one)")
    if len(offline) == 0:
        raise EmptyBufferError("offline: the offline buffer is empty; fill it with the dataset (e.g. "
                               "rlbuf.offline.from_minari) before mixing, it is read-only from then on")
    off_options, on_options = (buffer.state_dict(data=False)["options"] for buffer in (offline, online))
    expected, got = _batch_layout(offline), _batch_layout(online)
    for name in [*expected, *(name for name in got if name not in expected)]:
        if name not in got or name not in expected:
            (side, other), (shape, dtype) = (("offline", "online"), expected[name]) if name in expected else (
                ("online", "offline"), got[name])
            raise MissingFieldError(f"{name}: in the {side} buffer's batches ({shape} {dtype}), not in the {other} buffer's" + (
                "" if name.startswith(("obs", "hidden_state")) else "; give both the same extra_fields (an offline buffer "
                "from rlbuf.offline.from_minari(..., exact=False) has none)"))
        (shape, dtype), (got_shape, got_dtype) = expected[name], got[name]
        if shape != got_shape:
            raise ShapeError(f"{name}: expected shape {shape} (the offline buffer's), got {got_shape} in the online buffer")
        if dtype != got_dtype:
            raise DtypeError(f"{name}: expected dtype {dtype} (the offline buffer's), got {got_dtype} in the online buffer")
    if offline.device != online.device:
        raise DeviceError(f"device: expected {offline.device} (where the offline buffer delivers), got {online.device} "
                          "for the online buffer; build both with the same device=")
    if off_options.get("gamma") != on_options.get("gamma"):
        raise ConfigError(f"gamma: expected {off_options.get('gamma')} (the offline buffer's), got "
                          f"{on_options.get('gamma')} in the online buffer: batch.discount would mix two discounts")
