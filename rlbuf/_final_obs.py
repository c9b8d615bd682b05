"""Final observations: ``info["final_obs"]`` checked row by row against the buffer's observation fields.

A vector env that resets in the same step returns the reset observation as ``next_obs`` and
each ended env's final observation in ``info["final_obs"]`` (an object array, a list, or a
``[num_envs, ...]`` tensor). Each of those rows is checked the way a direct ``add`` checks a
row, against the buffer's own [`FieldSpec`][rlbuf.spec.FieldSpec]s: the exact row shape
(nothing is broadcast), the dtype's kind (no float into an integer field), the range (no
``1e300`` into float32, no ``300`` into uint8), finiteness where the field requires it, and a
dict observation key by key. Only then is ``next_obs`` rebuilt with those rows, in a dtype that
holds both (nothing is cast on the way), and handed to the buffer, whose ``add`` checks it again.

Example:
    >>> import numpy as np
    >>> import torch
    >>> from rlbuf._obs import Layout
    >>> layout = Layout.parse((2,), torch.uint8)
    >>> final = np.array([None, np.array([3.7, 300.0])], dtype=object)
    >>> with_final_obs(layout, np.zeros((2, 2), np.uint8), np.array([False, True]), final, 2)
    Traceback (most recent call last):
    ...
    rlbuf.errors.DtypeError: info["final_obs"][1]: expected dtype torch.uint8 (or one that converts to it without changing kind), got float64; env 1's final observation is its next_obs (stored, or passed to bootstrap): give it as the envs give observations, one row of (2,) uint8 (nothing is broadcast or converted)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from rlbuf._convert import all_finite, as_array, short_repr
from rlbuf._obs import Layout, leaf_name
from rlbuf.errors import DeviceError, NonFiniteError, RlbufError, ShapeError
from rlbuf.spec import FieldSpec

Row = np.ndarray[Any, Any] | torch.Tensor
"""One checked row of one leaf: a numpy array or a tensor, exactly ``spec.shape``."""


def with_final_obs(layout: Layout, next_obs: Any, ended: np.ndarray[Any, Any], final: Any, num_envs: int, *,
                   source: str = 'info["final_obs"]') -> Any:
    """``next_obs`` with each ended env's row replaced by its checked final observation.

    Args:
        layout: the observation layout of the buffer (what ``add`` takes per row).
        next_obs: what ``envs.step`` returned (the reset observations of the ended envs).
        ended: ``[num_envs]`` bools: the envs whose episode ended at this step.
        final: ``info["final_obs"]``: one entry per env, read where ``ended``.
        num_envs: the envs' count.
        source: where ``final`` came from, as messages name it.

    Returns:
        A new ``next_obs`` (``next_obs`` itself is not modified): a tensor, an array, or for a
        dict observation a nested dict of them.

    Raises:
        ShapeError, DtypeError, DeviceError, NonFiniteError, MissingFieldError: a final
            observation that a direct ``add`` would refuse, naming ``info["final_obs"][env]``
            (and the key), what was expected and what was received; or a ``final`` that does
            not hold one entry per env.
    """
    entries = _entries(final, num_envs, source)
    rows = {env: _checked_row(layout, entries[env], env, source) for env in np.flatnonzero(ended).tolist()}
    specs = layout.specs("next_obs", "observation")
    containers = layout.split("next_obs", next_obs)
    replaced = [_replace(spec, container, {env: row[k] for env, row in rows.items()}, num_envs)
                for k, (spec, container) in enumerate(zip(specs, containers, strict=True))]
    return _tree(layout, replaced) if layout.structured else replaced[0]


def rows_of(layout: Layout, next_obs: Any, num_envs: int) -> list[Any]:
    """Each env's row of ``next_obs`` (``[num_envs, ...]``; a dict observation as a dict per env).

    Where an env's episode ends in ``next_obs`` itself (``DISABLED`` envs), these rows are its
    final observations, checked by ``with_final_obs`` like those of ``info["final_obs"]``.

    Raises:
        ShapeError, DtypeError, MissingFieldError: ``next_obs`` is not ``[num_envs, ...]`` of the
            layout's keys, naming the key.

    Example:
        >>> from rlbuf._obs import Layout
        >>> rows_of(Layout.parse({"a": (1,)}), {"a": np.array([[1.0], [2.0]])}, 2)
        [{'a': array([1.])}, {'a': array([2.])}]
    """
    specs = layout.specs("next_obs", "observation")
    leaves = []
    for spec, container in zip(specs, layout.split("next_obs", next_obs), strict=True):
        value = container.detach() if isinstance(container, torch.Tensor) else as_array(spec.name, container)
        leaves.append(_with_env_dim(spec, value, tuple(value.shape), num_envs))
    if not layout.structured:
        return [leaves[0][env] for env in range(num_envs)]
    return [_tree(layout, [leaf[env] for leaf in leaves]) for env in range(num_envs)]


def _tree(layout: Layout, values: list[Any]) -> dict[str, Any]:
    """The layout's leaf values as a nested dict."""
    out: dict[str, Any] = {}
    for leaf, value in zip(layout.leaves, values, strict=True):
        node = out
        for key in leaf.path[:-1]:
            node = node.setdefault(key, {})
        node[leaf.path[-1]] = value
    return out


def _entries(final: Any, num_envs: int, source: str) -> Any:
    """``final`` itself, once it is known to hold one entry per env."""
    if isinstance(final, torch.Tensor | np.ndarray):
        count = final.shape[0] if final.ndim else None
    elif isinstance(final, list | tuple):
        count = len(final)
    else:
        count = None
    if count != num_envs:
        got = (f"shape {tuple(final.shape)}" if isinstance(final, torch.Tensor | np.ndarray)
               else f"{count} entries" if count is not None else f"{type(final).__name__} {short_repr(final)}")
        raise ShapeError(f"{source}: expected one entry per env ({num_envs}: an object array, a list, or a "
                         f"[num_envs, ...] tensor), got {got}; pass the info dict of this envs.step as it came")
    return final


def _checked_row(layout: Layout, value: Any, env: int, source: str) -> list[Row]:
    """The leaves of env ``env``'s final observation, each checked against its field."""
    name = f"{source}[{env}]"
    expected = ", ".join(f"{leaf_name('', leaf.path) or 'one row of'} {leaf.shape} "
                         f"{str(leaf.dtype).removeprefix('torch.')}" for leaf in layout.leaves)
    fix = (f"env {env}'s final observation is its next_obs (stored, or passed to bootstrap): give it as the envs "
           f"give observations, "
           f"{expected} (nothing is broadcast or converted)")
    try:
        values = layout.split(name, value)
        return [_checked_leaf(spec, leaf_value) for spec, leaf_value in zip(layout.specs(name, "observation"), values,
                                                                               strict=True)]
    except RlbufError as error:
        raise type(error)(f"{error}; {fix}") from None


def _checked_leaf(spec: FieldSpec, value: Any) -> Row:
    """``value`` as one row of ``spec``: exact shape, kind, range, finiteness; refused by name otherwise."""
    if isinstance(value, torch.Tensor):
        if value.device.type == "meta":
            raise DeviceError(f"{spec.name}: got a tensor on the meta device (it holds no values)")
        row: Row = value.detach()
    else:
        row = as_array(spec.name, value)
    if tuple(row.shape) != spec.shape:
        raise ShapeError(f"{spec.name}: expected shape {spec.shape}, got {tuple(row.shape)}")
    spec.check_dtype(row.dtype)
    spec.check_range(row)
    if spec.finite and not _finite(row):
        raise NonFiniteError(f"{spec.name}: expected finite values, got NaN or inf")
    return row


def _finite(row: Row) -> bool:
    if isinstance(row, torch.Tensor):
        return not row.is_floating_point() or bool(torch.isfinite(row).all())
    return row.dtype.kind != "f" or all_finite(row)


def _replace(spec: FieldSpec, container: Any, rows: Mapping[int, Row], num_envs: int) -> Any:
    """A copy of ``container`` (``[num_envs, *shape]``) with ``rows`` in, in a dtype that holds every value."""
    if isinstance(container, torch.Tensor):
        base = container.detach()
        base = _with_env_dim(spec, base, tuple(base.shape), num_envs)
        dtype = base.dtype
        tensors = {env: row if isinstance(row, torch.Tensor) else torch.tensor(row) for env, row in rows.items()}
        for tensor in tensors.values():
            dtype = torch.promote_types(dtype, tensor.dtype)
        out = base.to(dtype=dtype, copy=True)
        for env, tensor in tensors.items():
            out[env] = tensor.to(out.device)
        return out
    array = as_array(spec.name, container)
    array = _with_env_dim(spec, array, array.shape, num_envs)
    arrays = {env: as_array(spec.name, row) for env, row in rows.items()}
    out_np = array.astype(np.result_type(array.dtype, *(a.dtype for a in arrays.values())), copy=True)
    for env, row_np in arrays.items():
        out_np[env] = row_np
    return out_np


def _with_env_dim(spec: FieldSpec, value: Any, shape: tuple[int, ...], num_envs: int) -> Any:
    """``value`` with its env dim (a single env may omit it), or ``ShapeError`` naming the field."""
    if num_envs == 1 and shape == spec.shape:
        return value[None]
    if shape != (num_envs, *spec.shape):
        raise ShapeError(f"{spec.name}: expected shape {(num_envs, *spec.shape)}, got {shape}")
    return value

