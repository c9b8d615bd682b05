"""GAE's input checks: kinds, dtypes, shapes and devices of the rollout, output tensors of their own, finiteness.

[`compute_gae`][rlbuf.gae.compute_gae] and the [`GAE`][rlbuf.GAE] transform check everything here
before they compute anything; each refusal names the input, what was expected and what was received.

Example:
    >>> import torch
    >>> check_like("value", torch.zeros(3, 2, dtype=torch.float64), (3, 2), torch.float32, torch.device("cpu"))
    Traceback (most recent call last):
    ...
    rlbuf.errors.DtypeError: value: expected dtype torch.float32 (the dtype of reward), got torch.float64
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from rlbuf.errors import ConfigError, DeviceError, DtypeError, NonFiniteError, ShapeError

_FLOAT_DTYPES = (torch.float32, torch.float64)


class Rollout:
    """The inputs of one GAE computation as ``[T, N]`` views (strided for time_dim=1)."""

    __slots__ = (
        "bootstrap_value",
        "last_value",
        "next_value",
        "reward",
        "terminated",
        "truncated",
        "value",
    )

    def __init__(
        self,
        *,
        reward: torch.Tensor,
        value: torch.Tensor,
        terminated: torch.Tensor,
        truncated: torch.Tensor | None,
        last_value: torch.Tensor | None,
        bootstrap_value: torch.Tensor | None,
        next_value: torch.Tensor | None,
    ) -> None:
        self.reward = reward
        self.value = value
        self.terminated = terminated
        self.truncated = truncated
        self.last_value = last_value
        self.bootstrap_value = bootstrap_value
        self.next_value = next_value


def check_time_dim(time_dim: object) -> None:
    """Refuse a ``time_dim`` other than 0, 1 or -1 (a bool too) with a ``ConfigError``."""
    if isinstance(time_dim, bool) or time_dim not in (0, 1, -1):
        raise ConfigError(f"time_dim: expected 0, 1 or -1, got {time_dim!r}")


def check_unit_interval(name: str, number: object) -> float:
    """The number as a float; NaN and inf fail the range test like any other outsider."""
    if isinstance(number, bool) or not isinstance(number, numbers.Real):
        raise ConfigError(f"{name}: expected a float in [0, 1], got {number!r}")
    try:
        value = float(number)
    except OverflowError:  # an int beyond any float: outside [0, 1] too
        value = math.inf
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{name}: expected a float in [0, 1], got {number!r}")
    return value


def check_out(
    out: object,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
    inputs: dict[str, torch.Tensor | None],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both output tensors, checked like inputs and for memory shared with anything else."""
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise ConfigError(f"out: expected a tuple (advantage, returns) of two tensors, got {out!r}")
    advantage, returns = out
    check_like("out[0] (advantage)", advantage, shape, dtype, device)
    check_like("out[1] (returns)", returns, shape, dtype, device)
    assert isinstance(advantage, torch.Tensor) and isinstance(returns, torch.Tensor)
    out_spans = {label: _byte_span(tensor) for label, tensor in (("advantage", advantage), ("returns", returns))}
    if _overlap(out_spans["advantage"], out_spans["returns"]):
        raise ConfigError("out: expected two separate tensors, got advantage and returns sharing memory")
    in_spans = {name: _byte_span(tensor) for name, tensor in inputs.items() if tensor is not None}
    for (label, span), index in zip(out_spans.items(), (0, 1), strict=True):
        for name, other in in_spans.items():
            if _overlap(span, other):
                raise ConfigError(
                    f"out[{index}] ({label}): expected a tensor of its own, got one sharing memory with {name}"
                )
    return advantage, returns


def _byte_span(tensor: torch.Tensor) -> tuple[int, int]:
    """The addresses a tensor's elements lie between (end exclusive); empty for no elements.

    Live allocations never interleave, so two tensors whose spans meet share memory, whether
    or not they are views of one storage (a conservative test for strided views).
    """
    if tensor.numel() == 0:
        return 0, 0
    last = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True))
    start = tensor.data_ptr()
    return start, start + (last + 1) * tensor.element_size()


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def check_float(name: str, tensor: object, dtype: torch.dtype | None) -> None:
    """Refuse anything but a dense float tensor (of ``dtype``, or float32/float64 when ``None``)."""
    if not isinstance(tensor, torch.Tensor):
        raise DtypeError(f"{name}: expected a torch.Tensor, got {type(tensor).__name__}")
    _check_dense(name, tensor)
    if dtype is None:
        if tensor.dtype not in _FLOAT_DTYPES:
            raise DtypeError(f"{name}: expected dtype torch.float32 or torch.float64, got {tensor.dtype}")
    elif tensor.dtype != dtype:
        raise DtypeError(f"{name}: expected dtype {dtype} (the dtype of reward), got {tensor.dtype}")


def check_like(
    name: str, tensor: object, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> None:
    """Refuse anything but a dense tensor of ``dtype`` and ``shape`` on ``device`` (those of ``reward``)."""
    check_float(name, tensor, dtype)
    assert isinstance(tensor, torch.Tensor)
    _check_shape_device(name, tensor, shape, device)


def check_flag(name: str, tensor: object, shape: tuple[int, ...], device: torch.device) -> None:
    """Refuse anything but a dense bool tensor of ``shape`` on ``device``."""
    if not isinstance(tensor, torch.Tensor):
        raise DtypeError(f"{name}: expected a torch.Tensor, got {type(tensor).__name__}")
    _check_dense(name, tensor)
    if tensor.dtype != torch.bool:
        raise DtypeError(f"{name}: expected dtype torch.bool, got {tensor.dtype}")
    _check_shape_device(name, tensor, shape, device)


def _check_dense(name: str, tensor: torch.Tensor) -> None:
    if tensor.layout != torch.strided:
        raise DtypeError(f"{name}: expected a dense (strided) tensor, got layout {tensor.layout}")


def _check_shape_device(
    name: str, tensor: torch.Tensor, shape: tuple[int, ...], device: torch.device
) -> None:
    if tuple(tensor.shape) != shape:
        raise ShapeError(f"{name}: expected shape {shape}, got {tuple(tensor.shape)}")
    if tensor.device != device:
        raise DeviceError(f"{name}: expected device {device} (the device of reward), got {tensor.device}")


def _non_finite_error(name: str, tensor: torch.Tensor, step: int, env: int) -> NonFiniteError:
    return NonFiniteError(
        f"{name}: expected finite values, got {tensor[step, env].item()} at step {step}, env {env}"
    )


def _sum_is_finite(tensor: torch.Tensor) -> bool:
    return bool(torch.isfinite(tensor.sum()))


def _cpu_sum_is_finite(tensor: torch.Tensor) -> bool:
    """``_sum_is_finite``, summed by numpy on the CPU: torch's threads, left spinning after a sum, would
    slow the numba kernel of the next call down twofold on a machine of few cores."""
    if tensor.device.type != "cpu":
        return _sum_is_finite(tensor)
    with np.errstate(all="ignore"):
        return bool(np.isfinite(tensor.detach().numpy().sum()))


def check_finite(views: Rollout) -> None:
    """Raise NonFiniteError for NaN/inf in any input value that the computation reads."""
    read: list[tuple[str, torch.Tensor]] = [("reward", views.reward), ("value", views.value)]
    if views.next_value is not None:
        read.append(("next_value", views.next_value))
    else:
        assert views.last_value is not None
        read.append(("last_value", views.last_value.unsqueeze(0)))
        bootstrap = views.bootstrap_value
        # Bootstrap values count only at timeouts; masking costs a pass, so only when needed.
        if views.truncated is not None and bootstrap is not None and not _sum_is_finite(bootstrap):
            timeout = views.truncated & ~views.terminated
            read.append(("bootstrap_value", torch.where(timeout, bootstrap, 0.0)))
    for name, tensor in read:
        # A sum is one cheap pass and is non-finite whenever an element is; it can also
        # overflow on huge finite values, so the exact element check confirms.
        if not _sum_is_finite(tensor):
            bad = torch.nonzero(~torch.isfinite(tensor))
            if len(bad):
                step, env = (int(i) for i in bad[0])
                if name == "last_value":
                    raise NonFiniteError(
                        f"last_value: expected finite values, got {tensor[0, env].item()} at env {env}"
                    )
                raise _non_finite_error(name, tensor, step, env)


def check_outputs(advantage: torch.Tensor, returns: torch.Tensor) -> None:
    """Raise NonFiniteError if finite inputs gave advantages or returns beyond the dtype (``[T, N]`` views).

    ``returns = advantage + value`` is finite only where the advantage is: one sum checks both (a sum
    that overflows on finite values is confirmed element by element).
    """
    if _cpu_sum_is_finite(returns) or bool(torch.isfinite(returns).all()):
        return
    name, tensor = ("advantage", advantage) if not bool(torch.isfinite(advantage).all()) else ("returns", returns)
    step, env = (int(i) for i in torch.nonzero(~torch.isfinite(tensor))[0])
    raise NonFiniteError(
        f"{name}: the computed values do not fit {tensor.dtype} (got {tensor[step, env].item()} at step {step}, "
        f"env {env}) although the inputs are finite; scale the rewards and values down, or compute in float64"
    )
