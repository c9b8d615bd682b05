"""Dtypes users name: torch dtypes, their names (``"int64"``) or numpy dtypes.

Every dtype option (``obs_dtype``, ``action_dtype``, the dtype of an extra field) is read by
[`as_dtype`][rlbuf._dtypes.as_dtype]; a value of the wrong kind is refused with the cast that
converts it ([`cast_hint`][rlbuf._hints.cast_hint]).

Example:
    >>> import numpy as np
    >>> as_dtype("action_dtype", "int64"), as_dtype("obs_dtype", np.uint8)
    (torch.int64, torch.uint8)
    >>> as_dtype("action_dtype", "int65")
    Traceback (most recent call last):
    ...
    rlbuf.errors.ConfigError: action_dtype: unknown dtype 'int65'; give a torch dtype or its name: 'bool', 'float16', 'float32', 'float64', 'int16', 'int32', 'int64', 'int8', 'uint8'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from rlbuf._convert import _NUMPY_DTYPES, MAX_DEPTH, short_repr
from rlbuf.errors import ConfigError

_BY_NAME = {str(dtype).removeprefix("torch."): dtype for dtype in _NUMPY_DTYPES}
_BY_NUMPY = {np_dtype: dtype for dtype, np_dtype in _NUMPY_DTYPES.items()}


def as_dtype(name: str, value: Any) -> Any:
    """``value`` as a torch dtype when it names one (a torch dtype, ``"int64"``, ``"torch.int64"``, a
    numpy dtype or type), else unchanged (``None``, or something the option's own check refuses).

    Raises:
        ConfigError: a string or numpy dtype that names no dtype a buffer stores.

    Example:
        >>> as_dtype("obs_dtype", "torch.float32"), as_dtype("obs_dtype", None)
        (torch.float32, None)
    """
    if isinstance(value, torch.dtype) or value is None:
        return value
    if isinstance(value, str):
        dtype = _BY_NAME.get(value.removeprefix("torch."))
        if dtype is None:
            try:
                dtype = _BY_NUMPY.get(np.dtype(value))  # numpy's spellings: "f4", "float", "<i8"
            except TypeError:
                raise _refusal(name, value) from None
        if dtype is None:
            raise _refusal(name, value)
        return dtype
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        dtype = _BY_NUMPY.get(np.dtype(value))
        if dtype is None:
            raise _refusal(name, value)
        return dtype
    return value


def _refusal(name: str, value: Any) -> ConfigError:
    return ConfigError(f"{name}: unknown dtype {short_repr(value)}; give a torch dtype or its name: "
                       f"{', '.join(repr(n) for n in sorted(_BY_NAME))}")


def dtype_options(obs_dtype: Any, action_dtype: Any) -> tuple[Any, Any]:
    """``obs_dtype`` (one dtype, or a mapping by key) and ``action_dtype`` with every dtype name read as a
    torch dtype; anything else passes on unchanged to the option's own check.

    Example:
        >>> dtype_options({"a": "uint8"}, "int64")
        ({'a': torch.uint8}, torch.int64)
    """
    return _nested(obs_dtype, "obs_dtype", 0), as_dtype("action_dtype", action_dtype)


def extra_field_dtypes(extra_fields: Any) -> Any:
    """``extra_fields`` (``{name: (shape, dtype)}``) with every dtype name read as a torch dtype, so the
    options a checkpoint records are dtypes; anything else passes on to ``extra_fields``'s own check.

    Example:
        >>> extra_field_dtypes({"w": ((), "float32")})
        {'w': ((), torch.float32)}
    """
    if not isinstance(extra_fields, Mapping):
        return extra_fields
    return {key: (declared[0], as_dtype(f"extra_fields[{key!r}]", declared[1]))
            if isinstance(declared, (tuple, list)) and len(declared) == 2 else declared
            for key, declared in extra_fields.items()}


def _nested(value: Any, name: str, depth: int) -> Any:
    if isinstance(value, Mapping):
        if depth >= MAX_DEPTH:  # deeper is refused by name where the shapes are read
            return value
        return {key: _nested(sub, f"{name}[{key!r}]", depth + 1) for key, sub in value.items()}
    return as_dtype(name, value)
