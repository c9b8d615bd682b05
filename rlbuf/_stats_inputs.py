"""The checks of one step's inputs to [`EpisodeStats`][rlbuf.EpisodeStats]: shapes, flags, metrics, reasons.

Example:
    >>> inputs = StepInputs(2)
    >>> inputs.flag("terminated", [True, False]).tolist()
    [True, False]
    >>> inputs.flag("terminated", [1, 0])
    Traceback (most recent call last):
    ...
    rlbuf.errors.DtypeError: terminated: expected dtype bool, got int64; pass flags as bools (a tensor's .bool(), an array's .astype(bool))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias, TypeVar

import numpy as np
import torch

from rlbuf._convert import as_array
from rlbuf._stats_state import RESERVED
from rlbuf.errors import ConfigError, DtypeError, NonFiniteError, OutOfRangeError, ShapeError

Values: TypeAlias = "torch.Tensor | np.ndarray[Any, Any] | Sequence[float] | float"
"""Per-env values: a ``[num_envs]`` tensor, array or sequence; a bare number when ``num_envs == 1``."""

Reasons: TypeAlias = "Sequence[str | None] | Mapping[int, str | None]"
"""Per-env end reasons: one entry per env, or env index -> reason."""

ArrayT = TypeVar("ArrayT", torch.Tensor, "np.ndarray[Any, Any]")
_METRIC_KINDS = "fiub"  # numpy dtype kinds a metric may have: float, signed int, unsigned int, bool


def _kind(value: torch.Tensor | np.ndarray[Any, Any]) -> str:
    """The numpy dtype kind of a tensor or array, without moving the tensor."""
    if isinstance(value, np.ndarray):
        return str(value.dtype.kind)
    if value.dtype == torch.bool:
        return "b"
    if value.dtype.is_floating_point:
        return "f"
    if value.dtype.is_complex:
        return "c"
    return "i" if value.dtype.is_signed else "u"


class StepInputs:
    """Checks of one step's per-env inputs for a tracker of ``num_envs`` envs."""

    def __init__(self, num_envs: int) -> None:
        self._num_envs = num_envs
        self._shape = torch.Size([num_envs])
        self._expected = f"({num_envs},)" + (" or ()" if num_envs == 1 else "")

    def shape(self, name: str, value: ArrayT) -> ArrayT:
        if value.shape == self._shape:
            return value
        if self._num_envs == 1 and value.ndim == 0:
            return value.reshape(1)
        raise ShapeError(f"{name}: expected shape {self._expected}, got {tuple(value.shape)}")

    def flag(self, name: str, value: Values) -> np.ndarray[Any, Any]:
        flag = self.shape(name, as_array(name, value))
        if flag.dtype != np.bool_:
            raise DtypeError(f"{name}: expected dtype bool, got {flag.dtype}; pass flags as bools (a tensor's .bool(), "
                             f"an array's .astype(bool))")
        return flag

    def metrics(
        self, metrics: Mapping[str, Values]
    ) -> dict[str, torch.Tensor | np.ndarray[Any, Any]]:
        # Tensors are only checked here and moved to the CPU when an episode ends.
        if not isinstance(metrics, Mapping):
            raise DtypeError(f"metrics: expected a mapping name -> [num_envs] values, e.g. metrics={{'cost': values}}, "
                             f"got {type(metrics).__name__}")
        checked: dict[str, torch.Tensor | np.ndarray[Any, Any]] = {}
        for name, value in metrics.items():
            if not isinstance(name, str) or name in RESERVED:
                raise ConfigError(
                    f"metrics: name {name!r} is not allowed; expected a str other than "
                    f"{sorted(RESERVED)}"
                )
            field = f"metrics[{name!r}]"
            array: torch.Tensor | np.ndarray[Any, Any]
            if isinstance(value, torch.Tensor):
                array = self.shape(field, value)
            else:
                array = self.shape(field, as_array(field, value))
            if _kind(array) not in _METRIC_KINDS:
                raise DtypeError(f"{field}: expected a float, int or bool dtype, got {array.dtype}")
            checked[name] = array
        return checked

    def reasons(self, reasons: Reasons) -> None:
        if isinstance(reasons, Mapping):
            for env in reasons:
                if (
                    isinstance(env, bool)
                    or not isinstance(env, int | np.integer)
                    or not 0 <= env < self._num_envs
                ):
                    raise ShapeError(
                        f"reasons: expected env indices in [0, {self._num_envs}), got {env!r}"
                    )
        elif isinstance(reasons, str) or not isinstance(reasons, Sequence | np.ndarray) or (isinstance(reasons, np.ndarray) and reasons.ndim != 1):
            raise DtypeError(
                f"reasons: expected a sequence of {self._num_envs} str or None, or a mapping "
                f"env index -> str, got {type(reasons).__name__}"
            )
        elif len(reasons) != self._num_envs:
            raise ShapeError(f"reasons: expected length {self._num_envs}, got {len(reasons)}")

    @staticmethod
    def reason(reasons: Reasons | None, env: int, terminated: bool) -> str:
        reason = None
        if isinstance(reasons, Mapping):
            reason = reasons.get(env)
        elif reasons is not None:
            reason = reasons[env]
        if reason is None:
            return "terminated" if terminated else "truncated"
        if not isinstance(reason, str):
            raise DtypeError(f"reasons[{env}]: expected str or None, got {type(reason).__name__}")
        return str(reason)

    @staticmethod
    def ended_metrics(
        metrics: dict[str, torch.Tensor | np.ndarray[Any, Any]], index: np.ndarray[Any, Any]
    ) -> dict[str, list[float]]:
        ended = {}
        for name, value in metrics.items():
            field = f"metrics[{name!r}]"
            column = as_array(field, value)[index].astype(np.float64)
            if not np.isfinite(column).all():
                i = int(np.flatnonzero(~np.isfinite(column))[0])
                raise NonFiniteError(
                    f"{field}: expected finite values for ending episodes, "
                    f"got {column[i]} at env {int(index[i])}"
                )
            ended[name] = column.tolist()
        return ended


def env_indices(envs: Any, num_envs: int) -> np.ndarray[Any, Any]:
    """``EpisodeStats.reset``'s ``envs``: env numbers in ``[0, num_envs)``, or a ``[num_envs]`` bool mask.

    Raises:
        DtypeError: neither ints nor bools (floats, strings ...).
        ShapeError: a mask of another length, or numbers of more than one dim.
        OutOfRangeError: a number outside ``[0, num_envs)``.

    Example:
        >>> env_indices([True, False, True], 3).tolist(), env_indices([2], 3).tolist()
        ([0, 2], [2])
        >>> env_indices([-1], 3)
        Traceback (most recent call last):
        ...
        rlbuf.errors.OutOfRangeError: envs: expected env numbers in [0, 3), got -1
    """
    values = as_array("envs", envs, DtypeError)
    if values.size == 0 and values.ndim == 1:  # no env (an empty list reads as float)
        return np.zeros(0, np.int64)
    if values.dtype == np.bool_:
        if values.shape != (num_envs,):
            raise ShapeError(f"envs: a mask must hold one bool per env, shape ({num_envs},); got {values.shape}")
        return np.flatnonzero(values)
    if values.dtype.kind not in "iu" or values.ndim > 1:
        raise DtypeError(f"envs: expected env numbers (ints, one dim) or a [{num_envs}] bool mask, got "
                         f"{values.dtype} of shape {values.shape}")
    outside = (values < 0) | (values >= num_envs)
    if outside.any():
        raise OutOfRangeError(f"envs: expected env numbers in [0, {num_envs}), got {values[outside][0]}")
    return values.reshape(-1).astype(np.int64)
