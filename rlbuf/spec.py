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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
import torch
from tensordict import TensorDictBase, is_tensor_collection

from rlbuf._bounds import Bounds
from rlbuf._convert import _NUMPY_DTYPES, all_finite, largest_finite, numpy_dtype_or_none, tensor_of
from rlbuf._convert import as_array as as_array
from rlbuf._convert import as_flag as as_flag
from rlbuf._convert import as_int as as_int
from rlbuf._convert import float_limit as float_limit
from rlbuf._convert import numpy_dtype as numpy_dtype
from rlbuf._convert import positive_int as positive_int
from rlbuf._convert import short_repr as short_repr
from rlbuf._dtypes import as_dtype
from rlbuf._hints import cast_hint, shape_hint
from rlbuf.errors import (
    ConfigError,
    DeviceError,
    DtypeError,
    MissingFieldError,
    NonFiniteError,
    ShapeError,
)

NestedKey: TypeAlias = str | tuple[str, ...]
ExtraFields: TypeAlias = Mapping[str, tuple[tuple[int, ...], torch.dtype]]
_CPU = torch.device("cpu")


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
        bounds: the values allowed (a discrete action space's: an ``rlbuf._bounds.Bounds``), or ``None``.

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
    bounds: Bounds | None = None
    np_dtype: np.dtype[Any] = field(init=False, compare=False, repr=False)
    float_max: float = field(init=False, compare=False, repr=False)
    float_limit: float = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", as_dtype(f"{self.name}: dtype", self.dtype))  # "int64" too
        if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in self.shape):
            raise ConfigError(f"{self.name}: shape must be a tuple of non-negative ints, got {self.shape!r}")
        if not isinstance(self.dtype, torch.dtype) or self.dtype not in _NUMPY_DTYPES:
            raise ConfigError(f"{self.name}: dtype {self.dtype!r} is not supported; use one of "
                              f"{sorted(map(str, _NUMPY_DTYPES))}")
        object.__setattr__(self, "np_dtype", numpy_dtype(self.dtype))
        if self.bounds is not None:
            self.bounds.check_shape(self.name, self.shape)
        # The largest finite value a float field holds (read on every narrowing conversion).
        object.__setattr__(self, "float_max", float(np.finfo(self.np_dtype).max) if self.dtype.is_floating_point
                           else 0.0)
        # The largest magnitude stored finite (rounded down to float_max), by every conversion rlbuf makes.
        object.__setattr__(self, "float_limit", float_limit(self.np_dtype) if self.dtype.is_floating_point else 0.0)

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
        bounds = {} if self.bounds is None else {"bounds": self.bounds.to_json()}
        return {"name": self.name, "key": key, "shape": list(self.shape),
                "dtype": str(self.dtype).removeprefix("torch."), "finite": self.finite, **bounds}

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
            >>> FieldSpec("action", "action", (), torch.int64).check_dtype(torch.float32)
            Traceback (most recent call last):
            ...
            rlbuf.errors.DtypeError: action: expected dtype torch.int64 (or one that converts to it without changing kind), got torch.float32; convert the values: action.long() (numpy: action.astype(np.int64)), e.g. actions kept as floats
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
                             f"without changing kind), got {dtype}{cast_hint(self.name, kind, self.dtype)}")

    def check_range(self, values: np.ndarray[Any, Any] | torch.Tensor) -> None:
        """Raise [`DtypeError`][rlbuf.errors.DtypeError] if ``values`` do not fit the stored dtype's range.

        Integers must fit an integer field; finite numbers must stay finite in a float field
        (``1e300`` would be stored as ``inf``); a value that rounds to the largest finite one is taken
        (``65519`` into ``float16`` is stored as ``65504``). NaN and inf given as such are left to the
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
            largest, limit = self.float_max, self.float_limit
            if is_float:
                # One value (a reward of one env) is read as a Python float: several times cheaper.
                peak = (abs(float(values.item())) if count == 1
                        else float(values.abs().max()) if isinstance(values, torch.Tensor) else float(np.abs(values).max()))
                if not peak <= limit:  # NaN or inf somewhere (allowed here), or a real overflow
                    peak = largest_finite(values)
            else:
                peak = float(max(abs(int(values.min())), abs(int(values.max()))))
            if peak > limit:
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
                abs(value) <= self.float_limit)
        else:
            fits = True
        if not fits:
            raise DtypeError(f"{self.name}: {short_repr(value)} does not fit {self.dtype}")

    def check_tensor(self, value: torch.Tensor, lead: tuple[int, ...], devices: tuple[torch.device, ...],
                     finite_later: list[tuple[FieldSpec, torch.Tensor]] | None = None) -> None:
        """Validate a tensor holding rows of this field, with leading dims ``lead`` (any device).

        The checks and wording of [`RowReader`][rlbuf.spec.RowReader], for tensors laid out
        otherwise (a rollout's ``[num_steps, num_envs]`` views, a scalar ``last_value``). With
        ``finite_later``, the finiteness check is left to ``check_finite_together`` over the list.

        Raises:
            ShapeError, DtypeError, DeviceError, NonFiniteError: with the field named.

        Example:
            >>> FieldSpec("value", "state_value", (), torch.float32, finite=True).check_tensor(
            ...     torch.tensor([[0.0, float("inf")]]), (1, 2), (torch.device("cpu"),))
            Traceback (most recent call last):
            ...
            rlbuf.errors.NonFiniteError: value: expected finite values, got inf at row 1
        """
        check_strided(self.name, value)
        expected = (*lead, *self.shape)
        if tuple(value.shape) != expected:
            raise ShapeError(f"{self.name}: expected shape {_shape_str(expected)}, got {_shape_str(value.shape)}")
        _check_device(self, value, devices)
        if value.dtype is not self.dtype:
            self.check_dtype(value.dtype)
            self.check_range(value)
        if self.finite and value.is_floating_point() and finite_later is not None:
            finite_later.append((self, value))
        elif self.finite and value.is_floating_point() and not bool(torch.isfinite(value).all()):
            check_finite_rows(self, as_array(self.name, value).reshape(-1, max(math.prod(self.shape), 1)))
        if self.bounds is not None:
            self.bounds.check(self.name, value, self.shape)


def _check_device(spec: FieldSpec, value: torch.Tensor, devices: tuple[torch.device, ...]) -> None:
    if value.device not in devices:
        raise DeviceError(f"{spec.name}: expected a tensor on {' or '.join(map(str, devices))}, got one on "
                          f"{value.device}: move it there first (.to({str(devices[0])!r}))")


def check_strided(name: str, tensor: torch.Tensor) -> None:
    """Refuse a tensor without strided memory (sparse, mkldnn, nested): it holds no rows to copy.

    Raises:
        DtypeError: a layout other than strided, or a nested tensor.

    Example:
        >>> check_strided("obs", torch.zeros(3).to_sparse())
        Traceback (most recent call last):
        ...
        rlbuf.errors.DtypeError: obs: expected a dense (strided) tensor, got a sparse_coo one
    """
    if tensor.layout is not torch.strided or tensor.is_nested:
        layout = "nested" if tensor.is_nested else str(tensor.layout).removeprefix("torch.")
        raise DtypeError(f"{name}: expected a dense (strided) tensor, got a {layout} one")


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


class NotStaged(Exception):
    """A tensor off the CPU: no numpy view reads it, so its rows go the tensor way (``RowReader.tensor``)."""


def _scalar_types(spec: FieldSpec) -> tuple[type, ...]:
    """The Python and numpy scalar types one scalar row of ``spec`` may be given as."""
    if spec.shape != ():
        return ()
    if spec.np_dtype.kind == "b":
        return (bool, np.bool_)
    if spec.np_dtype.kind in "iu":
        return (bool, int, np.bool_, np.integer)
    if not spec.finite:  # kinds never change: an int action or observation is refused by check_dtype
        return (float, np.floating)
    return (bool, int, float, np.bool_, np.integer, np.floating)


def _zeros_and_ones(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``array`` (bool) with bytes 0 or 1: a numpy copy keeps any other byte a bool may hold
    (a uint8 array viewed as bool), as torch's copy does not."""
    return array.view(np.uint8).astype(np.bool_)


class RowReader:
    """The one reader of one field's rows: any user value in, checked rows out, one wording per error.

    ``rows`` rows of ``spec`` are read from a tensor (CPU or one of ``devices``), a numpy
    array, a list or a number; one row may omit its row dim. Every way rows enter a buffer
    reads them here: [`read`][rlbuf.spec.RowReader.read] for the staged add (numpy rows, or a
    Python number for one scalar row), [`tensor`][rlbuf.spec.RowReader.tensor] for every
    other write. ``read`` takes a tensor or array of exactly the stored dtype and shape in a
    few attribute reads and hands anything else to [`checked`][rlbuf.spec.RowReader.checked],
    the general path, which decides for every input; ``tensor`` goes through ``checked`` too.

    Args:
        spec: the field.
        rows: rows per value (``num_envs``).
        devices: the devices a tensor may be on (the CPU, and the storing device).

    Raises:
        MissingFieldError: a value is ``None``.
        ShapeError, DtypeError, DeviceError, NonFiniteError: a value does not fit ``spec``.

    Example:
        >>> reader = RowReader(FieldSpec("obs", "observation", (2,), torch.float32), 1)
        >>> reader.read(torch.ones(1, 2))
        array([[1., 1.]], dtype=float32)
        >>> reader.tensor([3, 4.5])
        tensor([[3.0000, 4.5000]])
        >>> reader.read(np.ones((1, 3), np.float32))
        Traceback (most recent call last):
        ...
        rlbuf.errors.ShapeError: obs: expected shape (1, 2) or (2,), got (1, 3)
    """

    def __init__(self, spec: FieldSpec, rows: int, devices: tuple[torch.device, ...] = (_CPU,)) -> None:
        self.spec = spec
        self.rows = rows
        self.row_shape = (rows, *spec.shape)
        self.single_shape = spec.shape if rows == 1 else None
        self.devices = devices
        self._scalar_types = _scalar_types(spec)
        self.read: Callable[[Any], Any] = self._number_reader() if self.single_shape == () else self._array_reader()

    def checked(self, value: Any) -> Any:
        """The general path: a numpy array of the rows (any numeric dtype numpy assigns exactly into
        the stored one), or a Python number for one scalar row.

        Raises:
            NotStaged: a tensor off the CPU (see [`tensor`][rlbuf.spec.RowReader.tensor]).
        """
        spec = self.spec
        if type(value) is np.ndarray:
            # Of the stored dtype as it is; else the one conversion (long doubles, big-endian, objects).
            array = value if value.dtype == spec.np_dtype else as_array(spec.name, value)
        elif isinstance(value, torch.Tensor):
            if not value.is_cpu:
                raise NotStaged
            check_strided(spec.name, value)
            if numpy_dtype_or_none(value.dtype) is None:  # bfloat16, uint16 ...: refused unless exact
                spec.check_dtype(value.dtype)
                array = as_array(spec.name, value)
            else:
                try:
                    array = value.numpy() if not value.requires_grad else value.detach().numpy()
                except RuntimeError:  # a negated view: read by value
                    array = as_array(spec.name, value)
        elif self.single_shape is not None and isinstance(value, self._scalar_types):
            spec.check_scalar(value)  # type: ignore[arg-type]
            if spec.finite and not math.isfinite(value):  # type: ignore[arg-type]
                check_finite_rows(spec, np.asarray([value]))
            if spec.bounds is not None:
                spec.bounds.check(spec.name, value, ())
            return value
        else:
            array = self._other_input(value)
        shape = array.shape
        if shape != self.row_shape and shape != self.single_shape:
            raise ShapeError(self._shape_message(shape))
        stored = spec.np_dtype
        if array.dtype != stored:
            spec.check_dtype(array.dtype)
            if array.dtype.itemsize > stored.itemsize or array.dtype.kind != stored.kind:
                spec.check_range(array)
        if spec.finite and array.dtype.kind == "f" and not all_finite(array):
            check_finite_rows(spec, array.reshape(self.rows, -1))
        if spec.bounds is not None:
            spec.bounds.check(spec.name, array, spec.shape)
        if self.single_shape == ():
            return array.item()
        return _zeros_and_ones(array) if stored.kind == "b" else array

    def tensor(self, value: Any, finite_later: list[tuple[FieldSpec, torch.Tensor]] | None = None) -> torch.Tensor:
        """The rows as a ``[rows, *shape]`` tensor of the stored dtype (on the CPU, or on the
        tensor's own device when that is one of ``devices``), checked like ``read`` (a device
        tensor's finiteness left to ``finite_later``, when given: see ``check_tensor``)."""
        spec = self.spec
        if isinstance(value, torch.Tensor) and not value.is_cpu:
            check_strided(spec.name, value)
            if tuple(value.shape) == self.single_shape:
                value = value.unsqueeze(0)
            if tuple(value.shape) != self.row_shape:
                raise ShapeError(self._shape_message(tuple(value.shape)))
            spec.check_tensor(value, (self.rows,), self.devices, finite_later)
            rows: torch.Tensor = value.detach().to(spec.dtype)
            return rows
        array = np.ascontiguousarray(np.asarray(self.checked(value), spec.np_dtype).reshape(self.row_shape))
        return tensor_of(array)

    def _shape_message(self, got: tuple[int, ...]) -> str:
        expected = str(self.row_shape) + (f" or {self.single_shape}" if self.single_shape is not None else "")
        return f"{self.spec.name}: expected shape {expected}, got {got}" + shape_hint(self.spec, self.rows, got)

    def _other_input(self, value: Any) -> np.ndarray[Any, Any]:
        """Lists and scalars, as arrays (or a specific error)."""
        spec = self.spec
        if value is None:
            raise MissingFieldError(f"{spec.name}: a value is required")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            spec.check_scalar(value)  # a Python number too large for any numpy dtype is named here
        array = as_array(spec.name, value)
        if array.dtype == np.float64 and spec.np_dtype.kind == "f":
            spec.check_range(array)
            array = array.astype(spec.np_dtype)
        if array.shape == () and self.single_shape is None:
            raise ShapeError(f"{spec.name}: expected shape {self.row_shape}, got a scalar {value!r}")
        return array

    def _number_reader(self) -> Callable[[Any], Any]:
        """``read`` for one scalar row: a Python number."""
        spec, checked = self.spec, self.checked
        np_dtype = spec.np_dtype
        finite = spec.finite and np_dtype.kind == "f"
        boolean, integer = np_dtype.kind == "b", np_dtype.kind in "iu"
        low, high = (int(np.iinfo(np_dtype).min), int(np.iinfo(np_dtype).max)) if integer else (0, 0)
        bounds = spec.bounds
        if bounds is not None and integer:  # a discrete action: its space's range, in the same compare
            low, high = max(low, int(bounds.low)), min(high, int(bounds.high))  # type: ignore[arg-type]
        largest = spec.float_limit
        floating = np_dtype.kind == "f" and bounds is None  # within range and finite: taken as it is
        tensor, ndarray, isfinite = torch.Tensor, np.ndarray, math.isfinite

        def read_number(value: Any) -> Any:  # a float64 reward array is judged as the Python float it holds
            given, kind = value, type(value)
            if kind is tensor:
                if not value.is_cpu:
                    return checked(given)
                try:
                    # One call for the value and its layout: tolist() refuses sparse, mkldnn and nested
                    # tensors and reads a negated view by value (a bool as True or False, whatever its byte).
                    value = value.tolist()
                except (RuntimeError, NotImplementedError, TypeError):
                    return checked(given)
                if type(value) is list:
                    if len(value) != 1 or type(value[0]) is list:
                        return checked(given)
                    value = value[0]
                # Then judged as a Python number is: the tensor's dtype decides nothing more (a float64
                # reward within float32's range is stored as a Python float would be).
                kind = type(value)
            if kind is float and floating:  # a gymnasium env's reward
                return value if isfinite(value) and abs(value) <= largest else checked(given)
            if kind is bool and boolean:  # a gymnasium env's flags
                return value
            if kind is int and integer:  # a discrete action
                return value if low <= value <= high else checked(given)
            if kind is not ndarray or value.size != 1 or value.ndim > 1:
                return checked(given)
            if value.dtype == np_dtype:  # equal, maybe not the same object (an unpickled array's)
                number = value.item()
                if integer and low <= number <= high:  # a discrete action's array: the int path's compare
                    return number
            elif floating and value.dtype.kind == "f" and type(number := value.item()) is float:
                return number if isfinite(number) and abs(number) <= largest else checked(given)
            else:
                return checked(given)
            if finite and not isfinite(number):
                check_finite_rows(spec, np.asarray([number]))
            if bounds is not None:
                bounds.check(spec.name, number, ())
            return number
        return read_number

    def _array_reader(self) -> Callable[[Any], Any]:
        """``read`` for rows of arrays: a tensor or array of the stored dtype and shape as it is
        (within the field's bounds, where it has some)."""
        read = self._unbounded_array_reader()
        spec, bounds = self.spec, self.spec.bounds
        if bounds is None:
            return read

        def read_bounded(value: Any) -> Any:
            rows = read(value)
            bounds.check(spec.name, rows, spec.shape)
            return rows
        return read_bounded

    def _unbounded_array_reader(self) -> Callable[[Any], Any]:
        spec, checked, row_shape, single_shape = self.spec, self.checked, self.row_shape, self.single_shape
        np_dtype = spec.np_dtype
        finite = spec.finite and np_dtype.kind == "f"
        boolean = np_dtype.kind == "b"
        tensor, ndarray = torch.Tensor, np.ndarray
        # a vector env's float64 rewards into a float32 field (a float64 field takes them as they are)
        wider = np.dtype(np.float64) if finite and np_dtype != np.float64 else None

        if not finite and not boolean:  # most fields: observations, actions
            def read_rows(value: Any) -> Any:
                kind = type(value)
                if kind is tensor:
                    try:
                        array = value.numpy()  # refuses (and checked then judges) GPU, grad, bfloat16, sparse ...
                    except (TypeError, RuntimeError, NotImplementedError):
                        return checked(value)
                elif kind is ndarray:
                    array = value
                else:
                    return checked(value)
                if array.dtype == np_dtype and ((shape := array.shape) == row_shape or shape == single_shape):
                    return array
                return checked(value)  # the value as given: a tensor is judged as a tensor
            return read_rows

        def read_array(value: Any) -> Any:
            kind = type(value)
            if kind is tensor:
                try:
                    array = value.numpy()
                except (TypeError, RuntimeError, NotImplementedError):
                    return checked(value)
            elif kind is ndarray:
                array = value
            else:
                return checked(value)
            shape = array.shape
            if array.dtype == wider and shape in (row_shape, single_shape) and all_finite(array, spec.float_limit):
                return array  # taken as the general path takes it (finite, within the limit; 3.5 -> 1 us for 8)
            if array.dtype != np_dtype or (shape != row_shape and shape != single_shape) or (
                    finite and not all_finite(array)):
                return checked(value)
            return _zeros_and_ones(array) if boolean else array
        return read_array


def as_tensordict(td: Any) -> TensorDictBase:
    """``td`` itself if it is a TensorDict, else a [`ShapeError`][rlbuf.errors.ShapeError] that says how to wrap it.

    Example:
        >>> as_tensordict({"observation": torch.zeros(2, 3)})
        Traceback (most recent call last):
        ...
        rlbuf.errors.ShapeError: td: expected a TensorDict with a batch size, got dict; wrap it: TensorDict(d, batch_size=[n])
    """
    if not is_tensor_collection(td):
        raise ShapeError(f"td: expected a TensorDict with a batch size, got {type(td).__name__}; wrap it: "
                         f"TensorDict(d, batch_size=[n])")
    result: TensorDictBase = td
    return result
