"""The invariants of a buffer's state, written once: each function returns ``""`` or the reason it fails.

[`rlbuf._state`][rlbuf._state] runs them on a ``state_dict`` before anything is loaded, and on
the live buffer's state in ``check_valid()``: one implementation for both. What a state says
about its rows is either derived from the stored rows again and compared (``done``, the written
priorities, the compact layout's stream tables: see [`rlbuf._stream_check`][rlbuf._stream_check])
or cross-checked against them (counters against each other and the capacity, options against
the buffer's).

What no check can tell, because rlbuf could have written either value for the same rows: which
row set ``max_priority`` (``max_priority_index``; the row may have been overwritten since), the
order of a replay buffer's envs within each step when ``interleaved`` is true (only that the
write count is whole steps), the reason strings of episode statistics (any string a caller gave),
and the env of rows loaded from a compact checkpoint without an ``env`` table (kept as -1).

The counters are checked by [`rlbuf._manifest_state`][rlbuf._manifest_state], which ``rlbuf inspect``
shares without torch.

Example:
    >>> steps_problem(size=4, write_count=4, num_envs=2, capacity=8)
    ''
    >>> steps_problem(size=4, write_count=10, num_envs=2, capacity=8)
    'write count 10 is above the capacity 8: this buffer never wraps'
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from rlbuf._convert import _NUMPY_DTYPES
from rlbuf._priorities import MAX_PRIORITY
from rlbuf.errors import CheckpointError
from rlbuf.spec import FieldSpec

_STATE_BYTES = {"cpu": 5056, "cuda": 16}  # Mersenne Twister; Philox seed and offset
DEVICE_OPTIONS = ("device", "storing_device", "seed", "storage")
"""Options a state may be loaded under other values of (``load_state_dict`` into another buffer,
``load(..., device=...)``): where rows live and the seed, which the saved generators replace."""


def refusing(what: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)``, any failure turned into a ``CheckpointError`` about ``what``.

    Example:
        >>> refusing("sampler state", int, "x")
        Traceback (most recent call last):
        ...
        rlbuf.errors.CheckpointError: sampler state: ValueError: invalid literal for int() with base 10: 'x'
    """
    try:
        return function(*args, **kwargs)
    except CheckpointError as error:
        raise CheckpointError(f"{what}: {error}") from error
    except Exception as error:  # a damaged state may fail anywhere; only CheckpointError may escape
        raise CheckpointError(f"{what}: {type(error).__name__}: {error}") from error


def steps_problem(*, size: int, write_count: int, num_envs: int, capacity: int) -> str:
    """Counters of a buffer filled a whole step (``num_envs`` rows) at a time that never wraps (a rollout).

    Example:
        >>> steps_problem(size=3, write_count=3, num_envs=2, capacity=8)
        'size 3 is not a whole number of steps of 2 envs'
    """
    if size % num_envs:
        return f"size {size} is not a whole number of steps of {num_envs} envs"
    if write_count > capacity:
        return f"write count {write_count} is above the capacity {capacity}: this buffer never wraps"
    return ""


def options_problem(saved: Any, own: Mapping[str, Any]) -> str:
    """Saved constructor options (JSON form) that differ from the buffer's, devices and seed aside.

    Example:
        >>> options_problem({"n_step": 2, "seed": 1}, {"n_step": 3, "seed": 0})
        'options: n_step is 2 in the state, 3 in this buffer'
    """
    if not isinstance(saved, Mapping):
        return f"options must be a mapping, got {type(saved).__name__}"
    unknown = sorted(str(name) for name in set(saved) - set(own))
    if unknown:
        return f"options {unknown} are not options of this buffer"
    for name, value in saved.items():
        if name not in DEVICE_OPTIONS and not same_json(value, own[name]):
            return f"options: {name} is {value!r} in the state, {own[name]!r} in this buffer"
    return ""


def with_binary_range(saved_options: Any, saved_specs: Any, own_options: Mapping[str, Any],
                      own_specs: Sequence[dict[str, Any]]) -> tuple[Any, Any]:
    """A state saved before ``MultiBinary`` action spaces set a range, as this buffer records it: where the
    state has no ``action_range`` and this buffer has ``[0, 1]`` (a ``MultiBinary`` space's, whatever
    ``action_dtype``), its action spec otherwise the same, the state's options and action spec take that
    range; the load check then holds every stored action to it. Anything else comes back as given.

    Example:
        >>> spec = {"name": "action", "dtype": "int8"}
        >>> with_binary_range({"action_range": None}, [spec], {"action_range": [0, 1]},
        ...                   [{**spec, "bounds": [0, 1]}])
        ({'action_range': [0, 1]}, [{'name': 'action', 'dtype': 'int8', 'bounds': [0, 1]}])
    """
    binary = [0, 1]
    if not (isinstance(saved_options, Mapping) and saved_options.get("action_range", binary) is None
            and own_options.get("action_range") == binary and isinstance(saved_specs, list)):
        return saved_options, saved_specs
    own_action = next((spec for spec in own_specs if spec.get("name") == "action"), None)
    at = next((i for i, spec in enumerate(saved_specs) if isinstance(spec, Mapping) and spec.get("name") == "action"),
              None)
    if own_action is None or at is None or "bounds" in saved_specs[at] or (
            {**saved_specs[at], "bounds": own_action.get("bounds")} != own_action):
        return saved_options, saved_specs
    specs = list(saved_specs)
    specs[at] = own_action
    return {**saved_options, "action_range": binary}, specs


def same_json(saved: Any, own: Any) -> bool:
    """Whether ``saved`` is ``own``, a plain JSON value (an option, a spec, a counter), value for value and type for
    type (a list and a tuple alike).

    ``==`` alone takes ``0`` for ``False`` and ``6.0`` for ``6``, and raises on a tensor of several values.

    Example:
        >>> same_json({"finite": 0}, {"finite": False}), same_json([{"shape": [2]}], [{"shape": (2,)}])
        (False, True)
    """
    if type(saved) is not type(own) and not (isinstance(saved, (list, tuple)) and isinstance(own, (list, tuple))):
        return False
    if isinstance(own, Mapping):
        return saved.keys() == own.keys() and all(same_json(saved[key], own[key]) for key in own)
    if isinstance(own, (list, tuple)):
        return len(saved) == len(own) and all(map(same_json, saved, own))
    return bool(saved == own)


def tensors_problem(state: Any, where: str = "") -> str:
    """A tensor anywhere in ``state`` that holds no data rlbuf can read: on the meta device (or a
    device other than CPU or CUDA), or not a dense strided tensor.

    Example:
        >>> tensors_problem({"rng": {"sample": torch.empty(3, device="meta")}})
        'rng.sample is a tensor on the meta device; rlbuf stores dense tensors on the CPU or CUDA'
    """
    if isinstance(state, torch.Tensor):
        if state.device.type not in ("cpu", "cuda") or state.layout != torch.strided:
            return (f"{where} is a tensor on the {state.device.type} device"
                    f"{'' if state.layout == torch.strided else f' with layout {state.layout}'}; rlbuf stores "
                    "dense tensors on the CPU or CUDA")
        return ""
    if isinstance(state, Mapping):
        items: Any = state.items()
    elif isinstance(state, (list, tuple)):
        items = enumerate(state)
    else:
        return ""
    for key, value in items:
        reason = tensors_problem(value, f"{where}.{key}" if where else str(key))
        if reason:
            return reason
    return ""


def fields_problem(specs: Sequence[FieldSpec], fields: Any, size: int) -> str:
    """Columns missing, extra, or not ``size`` rows of each field's dtype and shape."""
    names = [spec.name for spec in specs]
    if not isinstance(fields, Mapping) or set(fields) != set(names):
        found = sorted(fields) if isinstance(fields, Mapping) else type(fields).__name__
        return f"fields {found}, expected {sorted(names)}"
    for spec in specs:
        value, expected = fields[spec.name], (size, *spec.shape)
        if not isinstance(value, torch.Tensor) or value.dtype != spec.dtype or tuple(value.shape) != expected:
            got = (value.dtype, tuple(value.shape)) if isinstance(value, torch.Tensor) else type(value).__name__
            return f"field {spec.name!r} is {got}, expected {spec.dtype} of shape {expected}"
    return ""


def rows_problem(specs: Sequence[FieldSpec], fields: Mapping[str, torch.Tensor], *, derives_done: bool) -> str:
    """Non-finite values in must-be-finite fields, values outside a field's bounds, or a ``done`` that is not ``terminated | truncated``."""
    for spec in specs:
        column = fields[spec.name]
        if spec.finite and column.is_floating_point() and not bool(torch.isfinite(column).all()):
            return f"field {spec.name!r} holds non-finite values"
        outside = "" if spec.bounds is None else spec.bounds.outside(column, spec.shape)
        if outside:
            return f"field {spec.name!r} holds a value outside its bounds ({outside})"
    # Other derived columns (a rollout's advantage) start as zeros and are computed later.
    if derives_done:
        done = fields["terminated"].to(torch.bool) | fields["truncated"].to(torch.bool)
        if not torch.equal(done, fields["done"].to(torch.bool)):
            return "field 'done' differs from terminated | truncated"
    return ""


def sampler_problem(state: Mapping[str, Any], *, size: int, alpha: float | None, eps: float | None,
                    drop_last: bool | None = None) -> str:
    """Priorities that are NaN, negative or infinite, that do not match the stored rows, or
    exponents other than the buffer's; a sampler without replacement's epoch that is not one of the rows
    (see [`without_replacement_problem`][rlbuf._invariants.without_replacement_problem]).

    A prioritized sampler's leaves are written exactly for the stored rows (positions below
    ``size``): there the sum and min leaves hold the same ``(p + eps) ** alpha``; elsewhere the
    sum leaf is 0 and the min leaf ``inf``.
    """
    for key, value in state.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            if bool(torch.isnan(value).any()) or bool((value < 0).any()):
                return f"{key} holds NaN or negative values"
            if key == "sum_leaves" and not bool(torch.isfinite(value).all()):
                return f"{key} holds infinite values"
        elif isinstance(value, float) and not math.isfinite(value):
            return f"{key} is {value}"
    if "_sample_list" in state:
        return without_replacement_problem(state, size=size, drop_last=drop_last)
    sums, mins = state.get("sum_leaves"), state.get("min_leaves")
    if not isinstance(sums, torch.Tensor) or not isinstance(mins, torch.Tensor):
        return ""  # a uniform sampler
    for name, own in (("alpha", alpha), ("eps", eps)):
        if own is not None and state.get(name) != own:
            return f"{name} is {state.get(name)!r}, this buffer's is {own!r}"
    written = torch.isfinite(mins[:size])
    if not bool(written.all()) or not torch.equal(sums[:size], mins[:size]):
        return f"the priorities of the {size} stored rows are not all written (sum and min leaves differ)"
    if not bool((sums[size:] == 0).all()) or not bool(torch.isinf(mins[size:]).all()):
        return f"rows from position {size} on are not stored but hold priorities"
    return max_priority_problem(state, sums[:size], capacity=len(sums))


def without_replacement_problem(state: Mapping[str, Any], *, size: int, drop_last: bool | None) -> str:
    """A state of TorchRL's ``SamplerWithoutReplacement`` (a rollout's, for ``buffer.torchrl.sample``) that it
    could not have left: ``len_storage`` (the rows stored when it last drew) above the rows stored (a rollout only
    grows until ``clear`` resets the sampler), ``_sample_list`` (the rows of that epoch not drawn yet) holding
    anything but distinct rows below ``len_storage``, or options other than the buffer's sampler's.

    Example:
        >>> without_replacement_problem({"len_storage": 6, "_sample_list": torch.tensor([9]), "drop_last": False,
        ...                              "_ran_out": False}, size=6, drop_last=False)
        '_sample_list: expected distinct rows in [0, 6) (int64, one dim, at most 6), got torch.int64 (1,)'
    """
    stored = state.get("len_storage")
    if type(stored) is not int or not 0 <= stored <= size:
        return f"len_storage: expected an int in [0, {size}] (the rows stored), got {stored!r}"
    rows = state.get("_sample_list")
    if rows is not None and (not isinstance(rows, torch.Tensor) or rows.dtype != torch.int64 or rows.dim() != 1
                             or rows.numel() > stored or bool(((rows < 0) | (rows >= stored)).any())
                             or bool((rows.sort().values.diff() == 0).any())):
        got = f"{rows.dtype} {tuple(rows.shape)}" if isinstance(rows, torch.Tensor) else type(rows).__name__
        return f"_sample_list: expected distinct rows in [0, {stored}) (int64, one dim, at most {stored}), got {got}"
    if type(state.get("drop_last")) is not bool or state.get("drop_last") != drop_last:
        return f"drop_last is {state.get('drop_last')!r}, this buffer's is {drop_last!r}"
    if type(state.get("_ran_out")) is not bool:
        return f"_ran_out: expected True or False, got {state.get('_ran_out')!r}"
    return ""


def max_priority_problem(state: Mapping[str, Any], leaves: torch.Tensor, *, capacity: int) -> str:
    """A ``max_priority`` (the largest raw priority set so far, new rows' default) that
    ``update_priority`` could not have left: not -1 (none set) or in ``[0, 1e100]``, below a stored
    row's priority (rows added before the first update keep the default 1.0), or an index that is
    no position. Which row set it cannot be checked (it may have been overwritten since)."""
    value, index = state.get("max_priority"), state.get("max_priority_index")
    if not isinstance(value, (int, float)) or isinstance(value, bool) or type(index) is not int:
        return f"max_priority and max_priority_index must be a number and an int, got {value!r} and {index!r}"
    value = float(value)
    alpha, eps = float(state.get("alpha", 0.0)), float(state.get("eps", 0.0))
    raw = leaves.double() ** (1.0 / alpha) - eps if alpha > 0 and len(leaves) else None
    default = torch.isclose(raw, torch.ones_like(raw), rtol=1e-4) if raw is not None else None
    if value == -1:
        if index != -1:
            return f"max_priority_index is {index} but no priority was set (max_priority -1)"
        if raw is not None and default is not None and not bool(default.all()):
            return "max_priority is -1 (no priority set yet) but stored rows hold priorities other than the default 1.0"
        return ""
    if not (math.isfinite(value) and 0 <= value <= MAX_PRIORITY):
        return f"max_priority {value!r} is outside [0, {MAX_PRIORITY:g}], the priorities update_priority takes"
    if not 0 <= index < capacity:
        return f"max_priority_index {index} is not a row position in [0, {capacity})"
    if raw is not None and default is not None:
        above = (raw > value * (1 + 1e-4) + 1e-9) & ~default
        if bool(above.any()):
            return (f"max_priority {value!r} is below the priority {float(raw[above].max()):.6g} of a stored row "
                    "(it is the largest priority set so far)")
    return ""


def extra_problem(saved: Any, own: Mapping[str, Any], *, capacity: int, field_names: Sequence[str]) -> str:
    """Extra state other than what this buffer writes: other keys, a flag that is no bool, or
    attached tensors (``RolloutBuffer.set_extras``) not of ``capacity`` rows or named like a field."""
    if not isinstance(saved, Mapping):
        return f"extra must be a mapping, got {type(saved).__name__}"
    # rlbuf 0.1.0 wrote no "interleaved" (loaded as True).
    if set(saved) - set(own) or set(own) - set(saved) - {"interleaved"}:
        return f"extra state holds {sorted(saved)}, this buffer writes {sorted(own)}"
    for key, value in own.items():
        if isinstance(value, bool) and key in saved and not isinstance(saved[key], bool):
            return f"extra state {key!r} must be true or false, got {saved[key]!r}"
    attached = saved.get("attached", {})
    if not isinstance(attached, Mapping):
        return f"attached extras must be a mapping, got {type(attached).__name__}"
    for name, tensor in attached.items():
        if not isinstance(name, str) or not name.isidentifier() or name in field_names:
            return f"attached extra {name!r} is not a usable name (a public identifier, not a stored field)"
        if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0 or tensor.shape[0] != capacity:
            return f"attached extra {name!r} must be a tensor of {capacity} rows"
        if tensor.dtype not in _NUMPY_DTYPES or tensor.requires_grad:  # what set_extras stores (detached values)
            return f"attached extra {name!r} is {tensor.dtype}{' requiring grad' * tensor.requires_grad}, not stored values"
    stats = saved.get("stats")
    if stats is not None and not isinstance(stats, Mapping):
        return f"stats state must be a mapping, got {type(stats).__name__}"
    return ""


def generator_problem(saved: Any, own: torch.Generator, what: str) -> tuple[str, bool]:
    """Whether ``saved`` is a state ``own`` takes: ``(reason, moved)``; ``moved`` when it was
    saved on another device type (another size: the load warns and keeps ``own``'s state)."""
    if (not isinstance(saved, torch.Tensor) or saved.dtype != torch.uint8 or saved.dim() != 1
            or saved.device.type != "cpu"):
        return f"rng {what!r} must be a generator state (a 1-D uint8 tensor on the CPU)", False
    current = own.get_state()
    if saved.numel() != current.numel():
        if saved.numel() in _STATE_BYTES.values():
            return "", True
        return f"rng {what!r} holds {saved.numel()} bytes: no generator state of {sorted(_STATE_BYTES)}", False
    trial = torch.Generator(device=own.device)
    try:
        trial.set_state(saved.clone())
    except RuntimeError as error:
        return f"rng {what!r} is not a valid generator state ({error})", False
    return "", False
