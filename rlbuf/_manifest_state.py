"""What a checkpoint's manifest says of its buffer, cross-checked without torch.

A manifest has no checksum of its own: its files' checksums show they are whole, not that the
state describing them is what rlbuf wrote. ``rlbuf inspect`` checks here what the load check
([`rlbuf._state`][rlbuf._state]) would refuse and can be told from JSON alone: the kind, the
counters against each other and the capacity, the capacity against the options, and each
field's tensor file against the field's dtype and shape. The counters are checked by the same
functions at load (``saved_count``, ``counts_problem``).

Example:
    >>> state = {"kind": "ReplayBuffer", "options": {"capacity": 8}, "capacity": 8, "spec": [], "data": True,
    ...          "fields": {}, "size": 5, "cursor": 1, "write_count": 1}
    >>> check_manifest_state({"state": state, "files": {}})
    Traceback (most recent call last):
    ...
    rlbuf.errors.CheckpointError: state: size 5, cursor 1, write count 1 do not fit capacity 8 (expected size min(write count, capacity) = 1 and cursor write count % capacity = 1)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlbuf._manifest import DTYPE_BYTES, TENSOR_REF
from rlbuf.errors import CheckpointError

MIXED_KIND = "MixedReplay"
CAPACITY_OPTIONS = {"ReplayBuffer": ("capacity",), "DistillationBuffer": ("capacity",),
                    "RolloutBuffer": ("num_steps", "num_envs"), MIXED_KIND: ()}
"""The kinds of state rlbuf saves, and the options whose product is the capacity (a mixer has none:
its parts are checkpoints of their own)."""


def saved_count(state: Mapping[str, Any], key: str, where: str = "state") -> int:
    """``state[key]`` as an int in ``[0, 2**63)`` (TorchRL keeps counters in int64; a bool, float or
    string is refused).

    Example:
        >>> saved_count({"size": float("nan")}, "size")
        Traceback (most recent call last):
        ...
        rlbuf.errors.CheckpointError: state: size must be an int in [0, 2**63), got nan
    """
    value = state.get(key)
    if type(value) is not int or not 0 <= value < 2**63:
        raise CheckpointError(f"{where}: {key} must be an int in [0, 2**63), got {value!r}")
    return value


def counts_problem(*, size: int, cursor: int, write_count: int, capacity: int) -> str:
    """Counters that rlbuf never writes: the ring holds the newest ``min(write_count, capacity)``
    rows and the next one goes to ``write_count % capacity`` (``clear`` resets all three).

    Example:
        >>> counts_problem(size=4, cursor=4, write_count=4, capacity=8)
        ''
    """
    if size == min(write_count, capacity) and cursor == write_count % capacity:
        return ""
    return (f"size {size}, cursor {cursor}, write count {write_count} do not fit capacity {capacity} (expected "
            f"size min(write count, capacity) = {min(write_count, capacity)} and cursor write count % capacity = "
            f"{write_count % capacity})")


def check_manifest_state(manifest: Mapping[str, Any]) -> None:
    """Refuse a manifest (its files already verified) whose state is not what rlbuf writes.

    Raises:
        CheckpointError: naming the part of the state, what it should be and what it is.

    Example:
        >>> check_manifest_state({"state": {"kind": "Buffer"}, "files": {}})
        Traceback (most recent call last):
        ...
        rlbuf.errors.CheckpointError: state: kind 'Buffer' is none rlbuf saves; expected one of ['DistillationBuffer', 'MixedReplay', 'ReplayBuffer', 'RolloutBuffer']
    """
    state, files = manifest["state"], manifest["files"]
    kind = state.get("kind")
    if not isinstance(kind, str) or kind not in CAPACITY_OPTIONS:
        raise CheckpointError(f"state: kind {kind!r} is none rlbuf saves; expected one of {sorted(CAPACITY_OPTIONS)}")
    if kind == MIXED_KIND:
        return
    options = state.get("options")
    if not isinstance(options, Mapping):
        raise CheckpointError(f"state: options must be a table, got {options!r}")
    capacity = 1
    for name in CAPACITY_OPTIONS[kind]:
        capacity *= saved_count(options, name, f"state: options of a {kind}")
    if capacity == 0 or saved_count(state, "capacity") != capacity:
        raise CheckpointError(f"state: capacity {state.get('capacity')}, but the options of this {kind} make it "
                              f"{capacity} ({' x '.join(CAPACITY_OPTIONS[kind])})")
    size, cursor, count = (saved_count(state, key) for key in ("size", "cursor", "write_count"))
    reason = counts_problem(size=size, cursor=cursor, write_count=count, capacity=capacity)
    if reason:
        raise CheckpointError(f"state: {reason}")
    _check_fields(state, files, size)


def _check_fields(state: Mapping[str, Any], files: Mapping[str, Any], size: int) -> None:
    """Each field of the spec stored in a file of its dtype and shape, ``size`` rows (none without data)."""
    spec, fields, data = state.get("spec"), state.get("fields"), state.get("data")
    if not isinstance(spec, list) or type(data) is not bool or not isinstance(fields, Mapping):
        raise CheckpointError(f"state: expected a spec list, data true or false and a fields table, got spec "
                              f"{str(spec)[:100]}, data {data!r}, fields {str(fields)[:100]}")
    names = []
    for number, field in enumerate(spec):
        key, dtype = (field.get("key"), field.get("dtype")) if isinstance(field, Mapping) else (None, None)
        if (not isinstance(field, Mapping) or not isinstance(field.get("name"), str) or not isinstance(dtype, str)
                or dtype not in DTYPE_BYTES or not isinstance(field.get("shape"), list) or not all(
                type(d) is int and d >= 0 for d in field["shape"]) or not (isinstance(key, str) or (
                isinstance(key, list) and key and all(isinstance(part, str) for part in key)))):
            raise CheckpointError(f"state: spec[{number}]: expected a name, a key (a str or list of str), a shape "
                                  f"(a list of sizes) and one of the dtypes {sorted(DTYPE_BYTES)}, got "
                                  f"{str(field)[:200]}")
        names.append(field["name"])
    if not data:
        if fields:
            raise CheckpointError(f"state: data is false (options and counters only), yet it holds the fields "
                                  f"{sorted(fields)}")
        return
    if len(set(names)) != len(names) or set(fields) != set(names):
        raise CheckpointError(f"state: fields {sorted(fields)}, expected the spec's {names}")
    for field in spec:
        ref = fields[field["name"]]
        rel = ref.get(TENSOR_REF) if isinstance(ref, Mapping) and set(ref) == {TENSOR_REF} else None
        entry = files.get(rel) if isinstance(rel, str) else None
        expected = [size, *field["shape"]]
        if not isinstance(entry, Mapping) or entry.get("dtype") != field["dtype"] or entry.get("shape") != expected:
            found = (entry.get("dtype"), entry.get("shape")) if isinstance(entry, Mapping) else str(ref)[:100]
            raise CheckpointError(f"state: field {field['name']!r} is stored as {found}, expected "
                                  f"{field['dtype']} of shape {expected} ({size} rows)")
