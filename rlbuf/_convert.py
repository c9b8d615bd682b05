"""Conversions of user values: numbers and options to ints and flags, anything to a numeric array.

The one place where a value given by a user (a tensor, an array, a list, a number, an option)
becomes something rlbuf can check: every refusal names the argument and what was received.

Example:
    >>> as_array("reward", [1, 2.5])
    array([1. , 2.5])
    >>> as_int("capacity", 0)
    Traceback (most recent call last):
    ...
    rlbuf.errors.ConfigError: capacity: expected a positive int, got 0
"""

from __future__ import annotations

import contextlib
import math
import operator
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from rlbuf.errors import (
    ConfigError,
    DeviceError,
    DtypeError,
    EmptyBufferError,
    RlbufError,
    ShapeError,
    StoredIndexError,
)

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


MAX_DEPTH = 32
"""How deep a dict observation (or its mapping of dtypes) may nest: deeper is refused, not recursed into."""
MAX_NUM_ENVS = 2**31 - 1
"""rlbuf's limit on ``num_envs`` (rows per add): far beyond any vector env, and checked before anything is allocated."""


class _Required:
    """The default of a constructor's size that must be given: shown as ``REQUIRED`` in signatures, so
    ``ReplayBuffer(buffer_size=...)`` still gets its message naming ``capacity``."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


def require(example: str, **options: object) -> None:
    """Raise [`ConfigError`][rlbuf.ConfigError] naming the first of ``options`` left out (``REQUIRED``).

    Example:
        >>> require("ReplayBuffer(100_000, observation_space=...)", capacity=REQUIRED)
        Traceback (most recent call last):
        ...
        rlbuf.errors.ConfigError: capacity: required (the rows the buffer keeps), e.g. ReplayBuffer(100_000, observation_space=...)
    """
    for name, value in options.items():
        if value is REQUIRED:
            what = {"capacity": " (the rows the buffer keeps)", "num_steps": " (steps per rollout)",
                    "num_envs": " (envs stepped together)"}.get(name, "")
            raise ConfigError(f"{name}: required{what}, e.g. {example}")


def as_num_envs(value: object) -> int:
    """``num_envs`` as a positive int up to ``MAX_NUM_ENVS``, checked before a buffer allocates anything per env.

    Example:
        >>> as_num_envs(2**63)
        Traceback (most recent call last):
        ...
        rlbuf.errors.ConfigError: num_envs: expected an int in [1, 2147483647], got 9223372036854775808
    """
    return as_int("num_envs", value, maximum=MAX_NUM_ENVS)


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
# numpy's canonical spelling of each of them (``int64`` is ``l`` here, not ``q``): an array of one of
# these, in native byte order, is taken as it is.
_CANONICAL_CHARS = frozenset(np.dtype(np.dtype(char).name).char for char in _TORCH_CHARS)


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
    if type(value) is np.ndarray and value.dtype.char in _CANONICAL_CHARS and value.dtype.isnative:
        return value  # what the general path below returns for it, in 0.3 µs rather than 5
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
        infos = isinstance(value, Mapping) and name in ("truncated", "terminated")  # gymnasium's info in its place
        # MixedReplay.update_priority takes the batch itself; a buffer's takes its positions.
        batch = name == "index" and isinstance(getattr(value, "index", None), torch.Tensor)
        raise (error or ShapeError)(f"{name}: expected a tensor, numpy array or number, got {type(value).__name__}"
                                    + ("; an info dict where the flags belong? add takes terminated, truncated and no "
                                       "infos (the Recorder reads info['final_obs'])" if infos else "")
                                    + ("; pass batch.index, the batch's storage positions" if batch else ""))
    if isinstance(value, np.ma.MaskedArray):
        masked = int(np.ma.getmaskarray(value).sum())
        if masked:
            raise (error or DtypeError)(f"{name}: expected plain values, got a masked array with "
                                        f"{masked} masked entries (rlbuf cannot store a "
                                        f"mask); fill them first, e.g. value.filled(0.0)")
        value = np.ma.getdata(value)  # nothing masked: the values are all there
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
        # An SB3 VecEnv's infos (a list of dicts) where the flags belong, as its buffers' add takes them.
        infos = name in ("truncated", "terminated") and array.dtype.kind == "O" and all(
            isinstance(info, Mapping) for info in array.flat)
        raise (error or DtypeError)(f"{name}: expected bool, int or float values, got {array.dtype}: "
                                    f"{short_repr(value)}" + (
                                        "; an SB3 VecEnv's infos where the flags belong? add takes no infos: "
                                        "terminated, truncated, info = rlbuf.gym.sb3_step(dones, infos)"
                                        if infos and array.size else ""))
    # numpy's canonical spelling of the dtype in native byte order: torch refuses the others
    # (``ulonglong``, which numpy picks for ints above int64, and big-endian arrays).
    canonical = np.dtype(array.dtype.name)
    if canonical.char not in _TORCH_CHARS:
        raise (error or DtypeError)(f"{name}: expected bool, int or float values of at most 64 bits, got "
                                    f"{array.dtype}")
    if array.dtype.char != canonical.char or not array.dtype.isnative:
        array = array.astype(canonical)
    return array


def tensor_of(array: np.ndarray[Any, Any]) -> torch.Tensor:
    """``array`` as a tensor sharing its memory, or a copy when it is read-only (as some envs return
    arrays): torch would warn that it cannot protect read-only memory.

    Example:
        >>> frozen = np.zeros(2)
        >>> frozen.flags.writeable = False
        >>> tensor_of(frozen)
        tensor([0., 0.], dtype=torch.float64)
    """
    return torch.from_numpy(array if array.flags.writeable else array.copy())


def _all_ints(array: np.ndarray[Any, Any]) -> bool:
    return all(isinstance(item, int) and not isinstance(item, bool) for item in array.reshape(-1).tolist())


_FEW_VALUES = 16  # up to this many, a loop over Python floats beats numpy's isfinite and all


def all_finite(values: np.ndarray[Any, Any], largest: float = math.inf) -> bool:
    """Whether every value of a float array is finite (exact, and without numpy's floating-point warnings), and
    at most ``largest`` in magnitude (a field's ``float_limit``: float64 values a float32 field takes).

    Sums and dot products would be cheaper, but numpy warns (or raises, under ``-W error``)
    when they meet an inf, before the refusal could be raised.

    Example:
        >>> all_finite(np.array([3e38, -0.0, 1e-45], np.float32)), all_finite(np.array([1.0, -np.inf]))
        (True, False)
        >>> all_finite(np.array([1.0, -4e38]), largest=3.5e38)
        False
    """
    if values.size <= _FEW_VALUES:
        listed = values.ravel().tolist()
        return all(map(math.isfinite, listed)) and (largest == math.inf or max(map(abs, listed), default=0.0) <= largest)
    return bool(np.isfinite(values).all()) and (largest == math.inf or float(np.abs(values).max()) <= largest)


def float_limit(np_dtype: np.dtype[Any]) -> float:
    """The largest float64 that rounds to a finite ``np_dtype``, directly or through float32 (torch's float64 to
    float16), ties included: values up to it are stored as at most the dtype's largest finite value.

    Example:
        >>> float_limit(np.dtype(np.float16)), float_limit(np.dtype(np.float32))
        (65519.99804687499, 3.4028235677973362e+38)
    """
    info = np.finfo(np_dtype)
    if info.bits == 64:
        return float(info.max)
    overflow = float(info.max) + 2.0 ** (info.maxexp - info.nmant - 2)  # halfway to the next power: rounds to inf
    if info.bits < 32:  # half a float32 ulp below, a float64 rounds up to it on its way through float32
        overflow -= 2.0 ** (math.floor(math.log2(overflow)) - np.finfo(np.float32).nmant - 1)
    return math.nextafter(overflow, 0.0)


def largest_finite(values: np.ndarray[Any, Any] | torch.Tensor) -> float:
    """The largest magnitude among the finite entries of float ``values`` (0 if none)."""
    if isinstance(values, torch.Tensor):
        magnitude = values.abs()
        finite = magnitude[torch.isfinite(magnitude)]
        return float(finite.max()) if finite.numel() else 0.0
    magnitude_np = np.abs(values)
    finite_np = magnitude_np[np.isfinite(magnitude_np)]
    return float(finite_np.max()) if finite_np.size else 0.0


def stored_positions(index: Any, size: int, storing_device: torch.device) -> torch.Tensor:
    """Positions of stored rows (``[0, size)``) as a long tensor on the storing device.

    Accepts an int, a sequence of ints, or an integer array or tensor on any device (a batch's
    own ``index`` comes on the training device); anything else (``None``, a slice, floats, bools, ``2**64``) is refused.

    Raises:
        StoredIndexError: not integer positions, or one outside ``[0, size)``.
        EmptyBufferError: nothing is stored.

    Example:
        >>> stored_positions([2, 0], 3, torch.device("cpu")).tolist()
        [2, 0]
        >>> stored_positions([3], 3, torch.device("cpu"))
        Traceback (most recent call last):
        ...
        rlbuf.errors.StoredIndexError: index: expected positions in [0, 3), got values in [3, 3]
    """
    values: torch.Tensor | np.ndarray[Any, Any]
    if isinstance(index, torch.Tensor) and index.device.type not in ("cpu", "meta"):
        values = index.detach()
        kind = "f" if values.is_floating_point() or values.is_complex() else "b" if values.dtype is torch.bool else "i"
    else:
        values = as_array("index", index, StoredIndexError)
        kind = values.dtype.kind
        if kind == "f" and values.size and isinstance(index, (int, list, tuple)) and bool(
                (np.abs(values) >= 2**63).any()):  # Python ints too large for int64 came as floats
            raise StoredIndexError(f"index: expected positions in [0, {size}), got {short_repr(index)}")
    count = values.numel() if isinstance(values, torch.Tensor) else values.size
    if kind not in "iu" and count:
        raise StoredIndexError(f"index: expected integer positions, got dtype {values.dtype}")
    if size == 0:
        raise EmptyBufferError("cannot read from an empty buffer: add transitions first")
    if count:
        low, high = int(values.min()), int(values.max())
        if low < 0 or high >= size:
            raise StoredIndexError(f"index: expected positions in [0, {size}), got values in [{low}, {high}]")
    if isinstance(values, np.ndarray):
        values = tensor_of(np.ascontiguousarray(values, dtype=np.int64))
    return values.reshape(-1).to(storing_device, torch.long)
