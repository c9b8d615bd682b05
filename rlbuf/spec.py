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

import contextlib
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


def as_int(name: str, value: object, *, minimum: int = 1, maximum: int | None = None,
           error: type[RlbufError] = ConfigError) -> int:
    """``value`` as an int in ``[minimum, maximum]``, else ``error`` naming ``name``: the one check of integer options.

    Python, numpy and 0-d integer tensor values are welcome; bools, floats (even ``2.0``) and
    strings are refused, so a mix-up of arguments never passes as a count.

    Example:
        >>> as_int("seed", np.int64(7), minimum=0)
        7
        >>> as_int("seed", True, minimum=0)
        Traceback (most recent call last):
        ...
        rlbuf.errors.ConfigError: seed: expected an int >= 0, got True
    """
    try:
        number = None if isinstance(value, (bool, np.bool_)) else operator.index(value)  # type: ignore[arg-type]
    except (TypeError, RuntimeError, ValueError):
        number = None
    if number is None or number < minimum or (maximum is not None and number > maximum):
        expected = (f"an int in [{minimum}, {maximum}]" if maximum is not None
                    else "a positive int" if minimum == 1 else f"an int >= {minimum}")
        raise error(f"{name}: expected {expected}, got {short_repr(value)}")
    return number


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
    return as_int(name, value, error=error)


def as_flag(name: str, value: object) -> bool:
    """``value`` as a bool (Python or numpy), else ``ConfigError`` naming ``name``.

    Example:
        >>> as_flag("shuffle", np.bool_(True))
        True
    """
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"{name}: expected True or False, got {short_repr(value)}")
    return bool(value)


def short_repr(value: object) -> str:
    """``repr(value)`` cut to a readable length (a 10**400 or a huge list stays legible).

    Example:
        >>> text = short_repr(list(range(100)))
        >>> len(text), text[-6:]
        (80, ' 21...')
    """
    try:
        text = repr(value)
    except Exception:  # a hostile __repr__ must not hide the real message
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


_ARRAY_KINDS = "biuf"
_TORCH_CHARS = "?bBhHiIlLqQefd"  # the numpy dtypes torch.from_numpy takes


def as_array(name: str, value: object, error: type[RlbufError] | None = None) -> np.ndarray[Any, Any]:
    """Any user value (tensor, array, list, number) as a numeric numpy array, or an rlbuf error naming ``name``.

    The one conversion for values that are not already tensors of the right dtype: ragged
    lists, strings, objects, complex numbers, numbers too large for any dtype, generators and
    meta tensors are refused here. ``bfloat16`` tensors convert exactly to ``float32``.

    Args:
        name: the field named in errors.
        value: what the user passed.
        error: raise this class for every refusal (e.g. ``StoredIndexError`` for indices);
            by default ``ShapeError`` for a bad structure, ``DtypeError`` for a bad type,
            ``DeviceError`` for a tensor without data.

    Example:
        >>> as_array("reward", [1, 2.5])
        array([1. , 2.5])
        >>> as_array("obs", [[1, 2], [3]])
        Traceback (most recent call last):
        ...
        rlbuf.errors.ShapeError: obs: expected a rectangular array, got a ragged sequence [[1, 2], [3]]
    """
    if isinstance(value, torch.Tensor):
        if value.device.type == "meta":
            raise (error or DeviceError)(f"{name}: got a tensor on the meta device (it holds no values)")
        tensor = value.detach().resolve_neg()  # a negated view (``x.conj().imag``) has no numpy twin
        if tensor.dtype is torch.bfloat16:
            tensor = tensor.float()  # exact: every bfloat16 is a float32
        if numpy_dtype_or_none(tensor.dtype) is None:
            raise (error or DtypeError)(f"{name}: expected a bool, int or float dtype, got {tensor.dtype}")
        return tensor.cpu().numpy()
    if value is None or isinstance(value, (str, bytes, Mapping)) or not isinstance(
            value, (np.ndarray, np.generic, list, tuple, int, float)):
        raise (error or ShapeError)(f"{name}: expected a tensor, numpy array or number, got "
                                    f"{type(value).__name__}")
    try:
        array = np.asarray(value)
    except ValueError:
        raise (error or ShapeError)(f"{name}: expected a rectangular array, got a ragged sequence "
                                    f"{short_repr(value)}") from None
    except (TypeError, OverflowError):
        raise (error or DtypeError)(f"{name}: expected numbers, got {short_repr(value)}") from None
    if array.dtype.kind == "O" and _all_ints(array):
        # Ints beyond int64/uint64 are numbers still: as floats, like a Python int stored in a float
        # column (an integer column's range check refuses them); beyond float64 they are refused.
        with contextlib.suppress(OverflowError):
            array = np.asarray(value, dtype=np.float64)
        if array.dtype.kind == "O":
            raise (error or DtypeError)(f"{name}: expected numbers that fit float64, got {short_repr(value)}")
    if array.dtype.kind not in _ARRAY_KINDS:
        raise (error or DtypeError)(f"{name}: expected bool, int or float values, got {array.dtype}: "
                                    f"{short_repr(value)}")
    # numpy's canonical spelling of the dtype in native byte order: torch refuses the others
    # (``ulonglong``, which numpy picks for ints above int64, and big-endian arrays).
    canonical = np.dtype(array.dtype.name)
    if canonical.char not in _TORCH_CHARS:
        raise (error or DtypeError)(f"{name}: expected bool, int or float values of at most 64 bits, got "
                                    f"{array.dtype}")
    if array.dtype.char != canonical.char or not array.dtype.isnative:
        array = array.astype(canonical)
    return array


def _all_ints(array: np.ndarray[Any, Any]) -> bool:
    return all(isinstance(item, int) and not isinstance(item, bool) for item in array.reshape(-1).tolist())


def _largest_finite(values: np.ndarray[Any, Any] | torch.Tensor) -> float:
    """The largest magnitude among the finite entries of float ``values`` (0 if none)."""
    if isinstance(values, torch.Tensor):
        magnitude = values.abs()
        finite = magnitude[torch.isfinite(magnitude)]
        return float(finite.max()) if finite.numel() else 0.0
    magnitude_np = np.abs(values)
    finite_np = magnitude_np[np.isfinite(magnitude_np)]
    return float(finite_np.max()) if finite_np.size else 0.0


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
    float_max: float = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in self.shape):
            raise ConfigError(f"{self.name}: shape must be a tuple of non-negative ints, got {self.shape!r}")
        if not isinstance(self.dtype, torch.dtype) or self.dtype not in _NUMPY_DTYPES:
            raise ConfigError(f"{self.name}: dtype {self.dtype!r} is not supported; use one of "
                              f"{sorted(map(str, _NUMPY_DTYPES))}")
        object.__setattr__(self, "np_dtype", numpy_dtype(self.dtype))
        # The largest finite value a float field holds (read on every narrowing conversion).
        object.__setattr__(self, "float_max", float(np.finfo(self.np_dtype).max) if self.dtype.is_floating_point
                           else 0.0)

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
        """Raise [`DtypeError`][rlbuf.DtypeError] unless ``dtype`` converts to the stored dtype within its kind.

        One rule for numpy and torch inputs: kinds never change. Floats of any precision go
        into float fields; integers (and bools) into integer fields; only bools into bool
        fields. Integers never go into float observations or actions (integer actions in a
        float buffer are a discrete action space the buffer was not built for; ``uint8``
        observations belong in a ``uint8`` buffer), and a float never goes into an integer
        field (it would be truncated silently). Quantities (rewards, values, log-probabilities)
        are the one exception: they take integers too, never bools. Narrowing integer
        conversions are range-checked by [`check_range`][rlbuf.spec.FieldSpec.check_range].

        Example:
            >>> FieldSpec("obs", "observation", (2,), torch.uint8).check_dtype(torch.float32)
            Traceback (most recent call last):
            ...
            rlbuf.errors.DtypeError: obs: expected dtype torch.uint8 (or one that converts to it without changing kind), got torch.float32
            >>> FieldSpec("action", "action", (), torch.float32).check_dtype(np.dtype(np.int64))
            Traceback (most recent call last):
            ...
            rlbuf.errors.DtypeError: action: expected dtype torch.float32 (or one that converts to it without changing kind), got int64; for discrete actions build the buffer with action_dtype=torch.int64 or action_space=envs.single_action_space
        """
        kind = (np.dtype(dtype) if isinstance(dtype, np.dtype)
                else np.dtype(np.float32) if dtype is torch.bfloat16 else numpy_dtype_or_none(dtype))
        target = self.np_dtype.kind
        # Rewards, values and log-probabilities are quantities: a bool there is a mix-up of arguments.
        ok = kind is not None and not (self.finite and kind.kind == "b") and (
            kind.kind == "b" if target == "b"
            else kind.kind in "biu" if target in "iu"
            else kind.kind in ("biuf" if self.finite else "f") if target == "f"
            else False
        )
        if not ok:
            raise DtypeError(f"{self.name}: expected dtype {self.dtype} (or one that converts to it "
                             f"without changing kind), got {dtype}{self._dtype_hint(kind)}")

    def _dtype_hint(self, kind: np.dtype[Any] | None) -> str:
        if self.np_dtype.kind != "f" or kind is None or kind.kind not in "biu":
            return ""
        if self.name in ("action", "expert_action"):
            return ("; for discrete actions build the buffer with action_dtype=torch.int64 or "
                    "action_space=envs.single_action_space")
        if self.name in ("obs", "next_obs", "privileged_obs"):
            return (f"; store them as they come with obs_dtype=torch.{kind} or "
                    f"observation_space=envs.single_observation_space, or convert them yourself")
        return f"; declare the field with dtype torch.{kind}, or convert the values yourself"

    def check_range(self, values: np.ndarray[Any, Any] | torch.Tensor) -> None:
        """Raise [`DtypeError`][rlbuf.errors.DtypeError] if ``values`` do not fit the stored dtype's range.

        Integers must fit an integer field; finite numbers must stay finite in a float field
        (``1e300`` would be stored as ``inf``). NaN and inf given as such are left to the
        finiteness check of the fields that require finite values.

        Example:
            >>> FieldSpec("action", "action", (), torch.uint8).check_range(np.array([3, 300]))
            Traceback (most recent call last):
            ...
            rlbuf.errors.DtypeError: action: values in [3, 300] do not fit torch.uint8 [0, 255]
            >>> FieldSpec("reward", "reward", (), torch.float32).check_range(np.array([1e300]))
            Traceback (most recent call last):
            ...
            rlbuf.errors.DtypeError: reward: values up to 1e+300 in magnitude do not fit torch.float32 (largest 3.4028234663852886e+38)
        """
        target = self.np_dtype.kind
        if target not in "iuf":
            return
        if isinstance(values, torch.Tensor):
            count = values.numel()
            if values.dtype is torch.bool or count == 0:
                return
            is_float = values.is_floating_point()
        else:
            kind = values.dtype.kind
            count = values.size
            if kind not in "iuf" or count == 0:
                return
            is_float = kind == "f"
        if target == "f":
            largest = self.float_max
            if is_float:
                # One value (a reward of one env) is read as a Python float: several times cheaper.
                peak = (abs(float(values.item())) if count == 1
                        else float(values.abs().max()) if isinstance(values, torch.Tensor) else float(np.abs(values).max()))
                if not peak <= largest:  # NaN or inf somewhere (allowed here), or a real overflow
                    peak = _largest_finite(values)
            else:
                peak = float(max(abs(int(values.min())), abs(int(values.max()))))
            if peak > largest:
                raise DtypeError(f"{self.name}: values up to {peak:.4g} in magnitude do not fit {self.dtype} "
                                 f"(largest {largest})")
            return
        if is_float:
            return
        info = np.iinfo(self.np_dtype)
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
            # Python compares a huge int with a float exactly (no OverflowError, unlike float(value)).
            fits = (isinstance(value, (float, np.floating)) and not math.isfinite(value)) or (
                abs(value) <= self.float_max)
        else:
            fits = True
        if not fits:
            raise DtypeError(f"{self.name}: {short_repr(value)} does not fit {self.dtype}")

    def check_tensor(self, value: torch.Tensor, lead: tuple[int, ...], devices: tuple[torch.device, ...]) -> None:
        """Validate a tensor holding rows of this field, with leading dims ``lead``.

        Raises:
            ShapeError, DtypeError, DeviceError, NonFiniteError: with the field named.
        """
        expected = (*lead, *self.shape)
        if tuple(value.shape) != expected:
            raise ShapeError(f"{self.name}: expected shape {_shape_str(expected)}, got {_shape_str(value.shape)}")
        if value.device not in devices:
            allowed = " or ".join(str(d) for d in devices)
            raise DeviceError(f"{self.name}: expected a tensor on {allowed}, got one on {value.device}")
        if value.dtype is not self.dtype:
            self.check_dtype(value.dtype)
            self.check_range(value)
        if self.finite and value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise NonFiniteError(f"{self.name}: expected finite values, got NaN or inf")


_FEW_VALUES = 16  # up to this many, a loop over Python floats beats numpy's isfinite and all


def all_finite(values: np.ndarray[Any, Any]) -> bool:
    """Whether every value of a float array is finite (exact, and without numpy's floating-point warnings).

    Sums and dot products would be cheaper, but numpy warns (or raises, under ``-W error``)
    when they meet an inf, before the refusal could be raised.

    Example:
        >>> all_finite(np.array([3e38, -0.0, 1e-45], np.float32)), all_finite(np.array([1.0, -np.inf]))
        (True, False)
    """
    if values.size <= _FEW_VALUES:
        return all(map(math.isfinite, values.ravel().tolist()))
    return bool(np.isfinite(values).all())


def check_finite_rows(spec: FieldSpec, rows: np.ndarray[Any, Any]) -> None:
    """Raise [`NonFiniteError`][rlbuf.errors.NonFiniteError] if any value in ``rows`` is NaN or infinite.

    Example:
        >>> spec = FieldSpec("reward", ("next", "reward"), (), torch.float32, finite=True)
        >>> check_finite_rows(spec, np.array([1.0, float("nan")]))
        Traceback (most recent call last):
        ...
        rlbuf.errors.NonFiniteError: reward: expected finite values, got nan at row 1
    """
    if all_finite(rows):
        return
    flat = rows.reshape(rows.shape[0], -1) if rows.ndim else rows.reshape(1, 1)
    bad_rows = np.flatnonzero(~np.isfinite(flat).all(axis=1))
    if bad_rows.size:
        row = int(bad_rows[0])
        shown = flat[row].tolist()
        raise NonFiniteError(f"{spec.name}: expected finite values, got {shown[0] if len(shown) == 1 else shown} at row {row}")
