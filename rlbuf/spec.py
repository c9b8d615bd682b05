"""FieldSpec: the shape, dtype and TorchRL key of one stored field, and its validation.

A buffer is described by an ordered tuple of [`FieldSpec`][rlbuf.FieldSpec]. Each spec knows how a user
hands the field in (``shape``, per row) and how TorchRL lays it out (``key`` and
``td_shape``: scalars such as the reward carry a trailing ``1`` in TorchRL tensordicts).

Example:
    >>> import torch
    >>> from rlbuf.spec import FieldSpec
    >>> spec = FieldSpec("reward", ("next", "reward"), (), torch.float32, trailing_one=True)
    >>> spec.td_shape
    (1,)
    >>> spec.describe()
    'reward: () float32'
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
import torch

from rlbuf.errors import (
    ConfigError,
    DeviceError,
    DtypeError,
    NonFiniteError,
    RlbufError,
    ShapeError,
)

NestedKey: TypeAlias = str | tuple[str, ...]
ExtraFields: TypeAlias = Mapping[str, tuple[tuple[int, ...], torch.dtype]]

_NUMPY_DTYPES: dict[torch.dtype, np.dtype[Any]] = {
    torch.float16: np.dtype(np.float16),
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
    torch.uint8: np.dtype(np.uint8),
    torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16),
    torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64),
    torch.bool: np.dtype(np.bool_),
}


def numpy_dtype_or_none(dtype: torch.dtype) -> np.dtype[Any] | None:
    """The numpy dtype for ``dtype``, or ``None`` where numpy has none (``bfloat16``, complex halves)."""
    return _NUMPY_DTYPES.get(dtype)


def numpy_dtype(dtype: torch.dtype) -> np.dtype[Any]:
    """The numpy dtype that holds ``dtype`` bit for bit.

    Raises:
        ConfigError: ``dtype`` has no numpy equivalent (e.g. ``torch.bfloat16``).

    Example:
        >>> numpy_dtype(torch.uint8)
        dtype('uint8')
    """
    try:
        return _NUMPY_DTYPES[dtype]
    except KeyError:
        raise ConfigError(f"dtype {dtype} is not supported; use one of {sorted(map(str, _NUMPY_DTYPES))}") from None


def positive_int(name: str, value: object, error: type[RlbufError] = ConfigError) -> int:
    """``value`` as a positive int (numpy and 0-d integer tensors welcome), else ``error`` naming ``name``.

    Example:
        >>> positive_int("batch_size", np.int64(32))
        32
        >>> positive_int("capacity", 0)
        Traceback (most recent call last):
        ...
        rlbuf.errors.ConfigError: capacity: expected a positive int, got 0
    """
    try:
        count = None if isinstance(value, bool) else operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        count = None
    if count is None or count <= 0:
        raise error(f"{name}: expected a positive int, got {value!r}")
    return count


def _shape_str(shape: tuple[int, ...] | torch.Size) -> str:
    return str(tuple(shape))


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One stored field: user name, TorchRL key, per-row shape and dtype.

    Args:
        name: the name users see (``"obs"``, ``"reward"``, an extra field's name).
        key: the TorchRL tensordict key (``"observation"``, ``("next", "reward")``).
        shape: the shape of one row as users pass it (``()`` for a scalar per step).
        dtype: the stored dtype.
        finite: whether values must be finite (rewards, values, log-probs).
        trailing_one: a scalar that TorchRL stores with a trailing 1 (``("next", "reward")``,
            the done flags, ``"state_value"``); actions and log-probs have none.

    Example:
        >>> spec = FieldSpec("obs", "observation", (84, 84, 4), torch.uint8)
        >>> spec.np_dtype
        dtype('uint8')
    """

    name: str
    key: NestedKey
    shape: tuple[int, ...]
    dtype: torch.dtype
    finite: bool = False
    trailing_one: bool = False
    np_dtype: np.dtype[Any] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if any((not isinstance(d, int)) or d < 0 for d in self.shape):
            raise ConfigError(f"{self.name}: shape must be a tuple of non-negative ints, got {self.shape!r}")
        object.__setattr__(self, "np_dtype", numpy_dtype(self.dtype))

    @property
    def td_shape(self) -> tuple[int, ...]:
        """The per-row shape in TorchRL layout (rewards and flags get a trailing 1)."""
        return (1,) if self.trailing_one and not self.shape else self.shape

    def fits_rows(self, shape: tuple[int, ...] | torch.Size, lead: tuple[int, ...]) -> bool:
        """Whether a tensordict entry of ``shape`` holds rows ``lead`` of this field.

        Scalars may come with or without TorchRL's trailing 1.

        Example:
            >>> FieldSpec("action", "action", (), torch.int64).fits_rows((8, 1), (8,))
            True
        """
        shape = tuple(shape)
        return shape == (*lead, *self.shape) or (not self.shape and shape == (*lead, 1))

    def describe(self) -> str:
        """A short ``name: shape dtype`` description for reprs and messages."""
        return f"{self.name}: {_shape_str(self.shape)} {str(self.dtype).removeprefix('torch.')}"

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable description (used by checkpoints)."""
        key = list(self.key) if isinstance(self.key, tuple) else self.key
        return {"name": self.name, "key": key, "shape": list(self.shape),
                "dtype": str(self.dtype).removeprefix("torch."), "finite": self.finite}

    def check_dtype(self, dtype: torch.dtype | np.dtype[Any]) -> None:
        """Raise [`DtypeError`][rlbuf.errors.DtypeError] unless ``dtype`` converts to the stored dtype within its kind.

        One rule for numpy and torch inputs: floats of any precision go into float fields;
        integers and bools into integer or float fields; only bools into bool fields; a float
        never goes into an integer field (it would be truncated silently). Narrowing integer
        conversions are range-checked by [`check_range`][rlbuf.FieldSpec.check_range].

        Example:
            >>> FieldSpec("obs", "observation", (2,), torch.uint8).check_dtype(torch.float32)
            Traceback (most recent call last):
            ...
            rlbuf.errors.DtypeError: obs: expected dtype torch.uint8 (or one that converts to it without changing kind), got torch.float32
        """
        kind = (np.dtype(dtype) if isinstance(dtype, np.dtype) else numpy_dtype_or_none(dtype))
        target = self.np_dtype.kind
        # Rewards, values and log-probabilities are quantities: a bool there is a mix-up of arguments.
        ok = kind is not None and not (self.finite and kind.kind == "b") and (
            kind.kind == "b" if target == "b"
            else kind.kind in "biu" if target in "iu"
            else kind.kind in "biuf" if target == "f"
            else False
        )
        if not ok:
            raise DtypeError(f"{self.name}: expected dtype {self.dtype} (or one that converts to it "
                             f"without changing kind), got {dtype}")

    def check_range(self, values: np.ndarray[Any, Any] | torch.Tensor) -> None:
        """Raise [`DtypeError`][rlbuf.errors.DtypeError] if integer ``values`` do not fit the stored integer dtype.

        Example:
            >>> FieldSpec("action", "action", (), torch.uint8).check_range(np.array([3, 300]))
            Traceback (most recent call last):
            ...
            rlbuf.errors.DtypeError: action: values in [3, 300] do not fit torch.uint8 [0, 255]
        """
        if self.np_dtype.kind not in "iu" or values.dtype in (torch.bool, np.bool_):
            return
        info = np.iinfo(self.np_dtype)
        if isinstance(values, torch.Tensor):
            if values.numel() == 0 or values.is_floating_point():
                return
            low, high = int(values.min()), int(values.max())
        else:
            if values.size == 0 or values.dtype.kind not in "iu":
                return
            low, high = int(values.min()), int(values.max())
        if low < info.min or high > info.max:
            raise DtypeError(f"{self.name}: values in [{low}, {high}] do not fit {self.dtype} [{info.min}, {info.max}]")

    def check_scalar(self, value: float | int | bool) -> None:
        """Raise [`DtypeError`][rlbuf.errors.DtypeError] if a Python number does not fit the stored dtype.

        Example:
            >>> FieldSpec("action", "action", (), torch.int32).check_scalar(2**40)
            Traceback (most recent call last):
            ...
            rlbuf.errors.DtypeError: action: 1099511627776 does not fit torch.int32
        """
        if self.finite and isinstance(value, (bool, np.bool_)):
            raise DtypeError(f"{self.name}: expected a number, got the bool {value!r}")
        kind = self.np_dtype.kind
        if kind in "iu":
            info = np.iinfo(self.np_dtype)
            fits = info.min <= value <= info.max
        elif kind == "f":
            fits = not math.isfinite(value) or abs(value) <= np.finfo(self.np_dtype).max
        else:
            fits = True
        if not fits:
            raise DtypeError(f"{self.name}: {value!r} does not fit {self.dtype}")

    def check_tensor(self, value: torch.Tensor, lead: tuple[int, ...], devices: tuple[torch.device, ...]) -> None:
        """Validate a tensor holding rows of this field, with leading dims ``lead``.

        Raises:
            ShapeError, DtypeError, DeviceError, NonFiniteError: with the field named.
        """
        expected = (*lead, *self.shape)
        if tuple(value.shape) != expected:
            raise ShapeError(f"{self.name}: expected shape {_shape_str(expected)}, got {_shape_str(value.shape)}")
        if value.dtype is not self.dtype:
            self.check_dtype(value.dtype)
            if value.dtype.itemsize > self.dtype.itemsize or value.dtype.is_signed != self.dtype.is_signed:
                self.check_range(value)
        if value.device not in devices:
            allowed = " or ".join(str(d) for d in devices)
            raise DeviceError(f"{self.name}: expected a tensor on {allowed}, got one on {value.device}")
        if self.finite and value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise NonFiniteError(f"{self.name}: expected finite values, got NaN or inf")


def check_finite_rows(spec: FieldSpec, rows: np.ndarray[Any, Any]) -> None:
    """Raise [`NonFiniteError`][rlbuf.errors.NonFiniteError] if any value in ``rows`` is NaN or infinite.

    Example:
        >>> spec = FieldSpec("reward", ("next", "reward"), (), torch.float32, finite=True)
        >>> check_finite_rows(spec, np.array([1.0, float("nan")]))
        Traceback (most recent call last):
        ...
        rlbuf.errors.NonFiniteError: reward: expected finite values, got nan at row 1
    """
    # A sum is finite whenever every term is (short of overflow), and costs far less than
    # an element-wise check; the exact check only runs to name the bad row.
    if math.isfinite(float(rows.sum())):
        return
    flat = rows.reshape(rows.shape[0], -1) if rows.ndim else rows.reshape(1, 1)
    bad_rows = np.flatnonzero(~np.isfinite(flat).all(axis=1))
    if bad_rows.size:
        row = int(bad_rows[0])
        shown = flat[row].tolist()
        raise NonFiniteError(f"{spec.name}: expected finite values, got {shown[0] if len(shown) == 1 else shown} at row {row}")
