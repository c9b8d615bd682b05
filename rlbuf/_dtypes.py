"""Dtypes users name: torch dtypes, their names (``"int64"``) or numpy dtypes, and the cast a refused value needs.

Every dtype option (``obs_dtype``, ``action_dtype``, the dtype of an extra field) is read by
[`as_dtype`][rlbuf._dtypes.as_dtype]; a value of the wrong kind is refused with the cast that
converts it ([`cast_hint`][rlbuf._dtypes.cast_hint]).

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

from rlbuf._convert import _NUMPY_DTYPES, short_repr
from rlbuf.errors import ConfigError

_BY_NAME = {str(dtype).removeprefix("torch."): dtype for dtype in _NUMPY_DTYPES}
_BY_NUMPY = {np_dtype: dtype for dtype, np_dtype in _NUMPY_DTYPES.items()}
# torch's method for each cast, where it has one (``x.long()``); else ``x.to(torch.uint8)``.
_METHOD = {torch.bool: "bool", torch.int64: "long", torch.int32: "int", torch.float32: "float",
           torch.float64: "double", torch.float16: "half"}


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


_MAX_DEPTH = 32  # a dict observation's nesting; deeper is refused by name where the shapes are read


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
        if depth >= _MAX_DEPTH:
            return value
        return {key: _nested(sub, f"{name}[{key!r}]", depth + 1) for key, sub in value.items()}
    return as_dtype(name, value)


def cast_hint(field: str, given: np.dtype[Any] | None, stored: torch.dtype) -> str:
    """The end of a dtype refusal: the cast that converts ``given`` values to the ``stored`` dtype.

    Example:
        >>> cast_hint("terminated", np.dtype(np.float32), torch.bool)
        '; convert the values: terminated.bool() (numpy: terminated.astype(bool)); dones stored as floats (CleanRL) are flags: pass terminated=terminations.bool(), truncated=truncations.bool()'
        >>> cast_hint("action", np.dtype(np.float32), torch.int64)
        '; convert the values: action.long() (numpy: action.astype(np.int64)), e.g. actions kept as floats'
    """
    if given is None or stored not in _NUMPY_DTYPES:
        return ""
    kind, target = given.kind, _NUMPY_DTYPES[stored].kind
    if target == "f" and kind == "b" and field in ("reward", "value", "log_prob", "bootstrap_value"):
        return "; a flag where a number belongs: check the order of the arguments"
    if target == "f" and kind in "biu":
        if field in ("action", "expert_action"):
            return ("; for discrete actions build the buffer with action_dtype=torch.int64 or "
                    "action_space=envs.single_action_space")
        if field in ("obs", "next_obs", "privileged_obs") or field.startswith(("obs[", "next_obs[")):
            return (f"; store them as they come with obs_dtype=torch.{given} or "
                    f"observation_space=envs.single_observation_space, or convert them yourself")
        return f"; declare the field with dtype torch.{given}, or convert the values yourself"
    method = _METHOD.get(stored)
    name = field  # obs["camera"] and info["final_obs"][1] read as Python expressions too
    cast = f"{name}.{method}()" if method else f"{name}.to({stored})"
    numpy_cast = f"{name}.astype({'bool' if target == 'b' else 'np.' + str(_NUMPY_DTYPES[stored])})"
    hint = f"; convert the values: {cast} (numpy: {numpy_cast})"
    if target == "b" and name in ("terminated", "truncated"):
        return (hint + "; dones stored as floats (CleanRL) are flags: pass terminated=terminations.bool(), "
                "truncated=truncations.bool()")
    if target in "iu" and kind == "f" and name in ("action", "expert_action"):
        return hint + ", e.g. actions kept as floats"
    return hint
