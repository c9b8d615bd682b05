"""EpisodeStats' saved state: every key checked before anything is restored.

A state that [`EpisodeStats.state_dict`][rlbuf.EpisodeStats.state_dict] could not have written
is refused with a [`CheckpointError`][rlbuf.errors.CheckpointError] naming the key: NaN or
infinite returns, negative lengths, a running return without a running episode, lists of
different lengths, metrics under the names ``summary`` uses itself.

Example:
    >>> import torch
    >>> state = {"num_envs": 1, "window": 10, "episodes_finished": 0, "running_return": torch.tensor([float("nan")],
    ...          dtype=torch.float64), "running_length": torch.tensor([3]), "returns": [], "lengths": [], "reasons": [],
    ...          "metrics": {}}
    >>> checked_state(state, 1)
    Traceback (most recent call last):
    ...
    rlbuf.errors.CheckpointError: stats state: running_return: expected finite values, got nan at env 0
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from rlbuf.errors import CheckpointError

STATE_KEYS = ("num_envs", "window", "episodes_finished", "running_return", "running_length", "returns", "lengths",
              "reasons", "metrics")
RESERVED = frozenset({"return", "length", "reasons", "episodes"})
"""Keys that ``summary()`` uses itself; a metric of that name would overwrite them."""


@dataclass(frozen=True, slots=True)
class Episode:
    """One finished episode: its return, length (steps), end reason and custom metrics."""

    episode_return: float
    length: int
    reason: str
    metrics: dict[str, float]


@dataclass(frozen=True, slots=True)
class CheckedState:
    """A saved state that passed every check, ready to be restored as it is."""

    running_return: torch.Tensor
    running_length: torch.Tensor
    episodes: list[Episode]
    finished: int
    running_metrics: dict[str, torch.Tensor]


def checked_state(state: Mapping[str, Any], num_envs: int, window: int | None = None,
                  modes: Mapping[str, str] | None = None) -> CheckedState:
    """The parts of ``state`` once every key is known to hold what ``state_dict`` writes.

    Raises:
        CheckpointError: a key missing, ``num_envs`` different, or a value of the wrong type,
            shape, length or range (NaN or infinite returns and metrics, negative lengths,
            finished episodes of no step, a running return or metric where no episode runs,
            more episodes than the window keeps, a window other than ``window`` when given,
            declared metrics other than ``modes`` when given, or a declared metric missing
            from a finished episode).
    """
    if not isinstance(state, Mapping):
        raise CheckpointError(f"stats state: expected a mapping, got {type(state).__name__}")
    for key in STATE_KEYS:
        if key not in state:
            raise CheckpointError(f"stats state: missing key {key!r}")
    unknown = sorted(set(state) - set(STATE_KEYS) - {"metric_modes", "running_metrics"}, key=repr)  # rlbuf ≤ 0.4: none
    if unknown:
        raise CheckpointError(f"stats state: unknown key {unknown[0]!r}; EpisodeStats writes {list(STATE_KEYS)} and "
                              f"its metrics' modes and running values")
    if type(state["num_envs"]) is not int or state["num_envs"] != num_envs:
        raise CheckpointError(f"stats state: expected num_envs={num_envs}, got {state['num_envs']!r}")
    saved_window = state["window"]
    if type(saved_window) is not int or not 0 < saved_window < 2**63:
        raise CheckpointError(f"stats state: window: expected a positive int, got {saved_window!r}")
    if window is not None and saved_window != window:
        raise CheckpointError(f"stats state: window: {saved_window} in the state, {window} in this tracker")
    running_return = _state_tensor(state, "running_return", torch.float64, num_envs)
    running_length = _state_tensor(state, "running_length", torch.int64, num_envs)
    _check_finite("running_return", running_return.tolist())
    negative = ((running_length < 0) | (running_length >= 2**63 - 1)).nonzero().flatten().tolist()
    if negative:  # the next step adds one: int64's largest would wrap
        raise CheckpointError(f"stats state: running_length: expected counts in [0, 2**63 - 1), got "
                              f"{int(running_length[negative[0]])} at env {negative[0]}")
    idle = ((running_length == 0) & (running_return != 0)).nonzero().flatten().tolist()
    if idle:
        raise CheckpointError(f"stats state: running_return: env {idle[0]} has a return of "
                              f"{float(running_return[idle[0]])} but no step in its running episode "
                              f"(running_length 0)")
    returns, lengths, reasons, metrics = state["returns"], state["lengths"], state["reasons"], state["metrics"]
    n = _state_list("returns", returns, (int, float))
    if n > saved_window:
        raise CheckpointError(f"stats state: returns: {n} episodes, more than the window of {saved_window} keeps")
    _check_finite("returns", returns)
    for key, value, kinds in (("lengths", lengths, (int,)), ("reasons", reasons, (str,))):
        if _state_list(key, value, kinds) != n:
            raise CheckpointError(f"stats state: {key}: expected length {n}, got {len(value)}")
    short = next((i for i, length in enumerate(lengths) if not 1 <= length < 2**63), None)
    if short is not None:
        raise CheckpointError(f"stats state: lengths: expected episodes of 1 to 2**63 - 1 steps, got {lengths[short]} "
                              f"at episode {short}")
    if not isinstance(metrics, Mapping):
        raise CheckpointError(f"stats state: metrics: expected a mapping, got {type(metrics).__name__}")
    for name, column in metrics.items():
        if not isinstance(name, str) or name in RESERVED:
            raise CheckpointError(f"stats state: metrics: invalid name {name!r}")
        if _state_list(f"metrics[{name!r}]", column, (int, float, type(None))) != n:
            raise CheckpointError(f"stats state: metrics[{name!r}]: expected length {n}, got {len(column)}")
        _check_finite(f"metrics[{name!r}]", [v for v in column if v is not None])
    finished = state["episodes_finished"]
    if isinstance(finished, bool) or not isinstance(finished, int) or finished < n:
        raise CheckpointError(f"stats state: episodes_finished: expected an int >= {n}, got {finished!r}")
    if finished >= 2**63:
        raise CheckpointError(f"stats state: episodes_finished: expected a count below 2**63, got {finished!r}")
    running_metrics = _running_metrics(state, num_envs, modes, running_length)
    for name in running_metrics:
        if n and (name not in metrics or None in metrics[name]):
            raise CheckpointError(f"stats state: metrics[{name!r}]: declared, so every finished episode has a value")
    episodes = [Episode(float(returns[i]), int(lengths[i]), str(reasons[i]),
                        {name: float(column[i]) for name, column in metrics.items() if column[i] is not None})
                for i in range(n)]
    return CheckedState(running_return, running_length, episodes, finished, running_metrics)


def _running_metrics(state: Mapping[str, Any], num_envs: int, modes: Mapping[str, str] | None,
                     running_length: torch.Tensor) -> dict[str, torch.Tensor]:
    """The running values of the declared metrics: declared as ``modes`` (when given), finite, 0 where no episode runs."""
    saved_modes, running = state.get("metric_modes", {}), state.get("running_metrics", {})
    if not isinstance(saved_modes, Mapping) or not all(
            isinstance(name, str) and name not in RESERVED and mode in ("sum", "last") for name, mode in saved_modes.items()):
        raise CheckpointError(f"stats state: metric_modes: expected a mapping name -> 'sum' or 'last', got {saved_modes!r}")
    if modes is not None and dict(saved_modes) != dict(modes):
        raise CheckpointError(f"stats state: metric_modes: {dict(saved_modes)} in the state, {dict(modes)} in this "
                              f"tracker; build it with EpisodeStats(..., metrics={dict(saved_modes)})")
    if not isinstance(running, Mapping) or set(running) != set(saved_modes):
        found = sorted(running) if isinstance(running, Mapping) else type(running).__name__
        raise CheckpointError(f"stats state: running_metrics: expected {sorted(saved_modes)}, got {found}")
    checked = {}
    for name in saved_modes:
        key = f"running_metrics[{name!r}]"
        tensor = _state_tensor(running, name, torch.float64, num_envs, key)
        _check_finite(key, tensor.tolist())
        idle = ((running_length == 0) & (tensor != 0)).nonzero().flatten().tolist()
        if idle:
            raise CheckpointError(f"stats state: {key}: env {idle[0]} has {float(tensor[idle[0]])} but no step in its "
                                  f"running episode (running_length 0)")
        checked[name] = tensor
    return checked


def _state_tensor(state: Mapping[str, Any], key: str, dtype: torch.dtype, num_envs: int,
                  name: str | None = None) -> torch.Tensor:
    """``state[key]`` (a tensor, or a list as a JSON file holds it) as a CPU copy of ``dtype``."""
    value, key = state[key], name or key
    try:
        if isinstance(value, torch.Tensor) and value.device.type == "meta":
            raise TypeError
        tensor = torch.as_tensor(value).detach().to("cpu")
    except (TypeError, ValueError, RuntimeError, OverflowError):
        raise CheckpointError(f"stats state: {key}: expected a tensor, got {type(value).__name__}") from None
    if tuple(tensor.shape) != (num_envs,):
        raise CheckpointError(f"stats state: {key}: expected shape ({num_envs},), got {tuple(tensor.shape)}")
    if tensor.dtype is torch.bool or tensor.is_complex() or (dtype is torch.int64 and tensor.is_floating_point()):
        raise CheckpointError(f"stats state: {key}: expected dtype {dtype}, got {tensor.dtype}")
    return tensor.to(dtype, copy=True)


def _state_list(key: str, value: object, kinds: tuple[type, ...]) -> int:
    if not isinstance(value, list):
        raise CheckpointError(f"stats state: {key}: expected a list, got {type(value).__name__}")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, kinds):
            raise CheckpointError(f"stats state: {key}: unexpected item {item!r}")
    return len(value)


def _check_finite(key: str, values: list[Any]) -> None:
    for i, value in enumerate(values):
        if isinstance(value, int) and not -2**1023 < value < 2**1023:  # as a float: infinite (OverflowError)
            raise CheckpointError(f"stats state: {key}: expected finite values, got an int of {value.bit_length()} "
                                  f"bits at {'env' if key.startswith('running') else 'episode'} {i}")
        if isinstance(value, float) and not math.isfinite(value):
            raise CheckpointError(f"stats state: {key}: expected finite values, got {value} at "
                                  f"{'env' if key.startswith('running') else 'episode'} {i}")
