"""Declared per-step metrics of [`EpisodeStats`][rlbuf.EpisodeStats]: summed over the episode, or its last value.

Each declared metric keeps a running float64 value per env, fed with ``[num_envs]`` values at
every step: ``"sum"`` adds the step's value, ``"last"`` keeps it. When an env's episode ends,
its running value is the episode's and starts again at 0. A step is checked whole (every
declared metric given, of the right shape and dtype, finite, no sum overflowing) and planned
before anything changes; ``commit`` then stores the plan.

Example:
    >>> import numpy as np
    >>> from rlbuf._stats_inputs import StepInputs
    >>> declared = DeclaredMetrics(2, {"energy": "sum", "x": "last"})
    >>> inputs = StepInputs(2)
    >>> for energy, x in [([1.0, 2.0], [0.5, 0.1]), ([3.0, 4.0], [0.7, 0.2])]:
    ...     plan = declared.plan(inputs.metrics({"energy": energy, "x": x}), 1)
    ...     declared.commit(plan)
    >>> declared.ended(plan, np.array([1]))
    {'energy': [6.0], 'x': [0.2]}
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeAlias, cast

import numpy as np
import torch

from rlbuf._convert import all_finite, as_array
from rlbuf._stats_state import RESERVED
from rlbuf.errors import ConfigError, NonFiniteError

MetricMode: TypeAlias = Literal["sum", "last"]
"""How a declared metric's per-step values make the episode's value."""

MODES = ("sum", "last")

Plan: TypeAlias = "dict[str, np.ndarray[Any, Any]]"
"""Each declared metric's running values after a step (not yet stored)."""

StatSummary: TypeAlias = "dict[str, float | int | None]"
"""``mean``, ``std``, ``min``, ``max`` (``None`` when ``count`` is 0) and ``count``."""


def checked_modes(metrics: Any) -> dict[str, MetricMode]:
    """``EpisodeStats(metrics=...)`` as a plain dict, or a ``ConfigError`` naming what is wrong.

    Example:
        >>> checked_modes({"energy": "mean"})
        Traceback (most recent call last):
        ...
        rlbuf.errors.ConfigError: metrics['energy']: expected 'sum' or 'last', got 'mean'
    """
    if metrics is None:
        return {}
    if not isinstance(metrics, Mapping):
        raise ConfigError(f"metrics: expected a mapping name -> 'sum' or 'last', got {type(metrics).__name__}; "
                          f"e.g. metrics={{'x_position': 'last', 'energy': 'sum'}}")
    modes: dict[str, MetricMode] = {}
    for name, mode in metrics.items():
        if not isinstance(name, str) or name in RESERVED:
            raise ConfigError(f"metrics: name {name!r} is not allowed; expected a str other than {sorted(RESERVED)}")
        if not isinstance(mode, str) or mode not in MODES:
            raise ConfigError(f"metrics[{name!r}]: expected 'sum' or 'last', got {mode!r}")
        modes[name] = cast(MetricMode, mode)
    return modes


class DeclaredMetrics:
    """The running values of the metrics an ``EpisodeStats`` was built to track per step."""

    def __init__(self, num_envs: int, metrics: Mapping[str, str] | None) -> None:
        self.modes = checked_modes(metrics)
        self.running = {name: np.zeros(num_envs, dtype=np.float64) for name in self.modes}

    def plan(self, given: Mapping[str, torch.Tensor | np.ndarray[Any, Any]] | None,
             steps: np.ndarray[Any, Any] | int) -> Plan:
        """The running values after a step of ``given`` (checked ``[num_envs]`` values) in the envs ``steps`` marks.

        Raises:
            ConfigError: a declared metric is missing.
            NonFiniteError: a value is NaN or infinite, or a sum would overflow float64.
        """
        given = given or {}
        missing = [name for name in self.modes if name not in given]
        if missing:
            raise ConfigError(f"metrics: {missing} declared (EpisodeStats(metrics=...)) but not given; expected "
                              f"[num_envs] values of every declared metric at every step, e.g. "
                              f"metrics={{{', '.join(f'{name!r}: values' for name in self.modes)}}}")
        plan: Plan = {}
        for name, mode in self.modes.items():
            field = f"metrics[{name!r}]"
            values = as_array(field, given[name]).astype(np.float64)
            if not all_finite(values):
                env = int(np.flatnonzero(~np.isfinite(values))[0])
                raise NonFiniteError(f"{field}: expected finite values, got {values[env]} at env {env}")
            running = self.running[name]
            if mode == "last":
                plan[name] = np.where(steps, values, running)
                continue
            with np.errstate(over="ignore", invalid="ignore"):
                total = running + np.where(steps, values, 0.0)
            if not all_finite(total):
                env = int(np.flatnonzero(~np.isfinite(total))[0])
                raise NonFiniteError(f"{field}: {values[env]} at env {env} would take its episode's sum "
                                     f"({running[env]}) past the largest float64; check the metric's scale")
            plan[name] = total
        return plan

    def commit(self, plan: Plan) -> None:
        for name, values in plan.items():
            self.running[name][:] = values

    @staticmethod
    def ended(plan: Plan, index: np.ndarray[Any, Any]) -> dict[str, list[float]]:
        """Each declared metric's value for the episodes of the envs at ``index``, which end at this step."""
        return {name: values[index].tolist() for name, values in plan.items()}

    def restart(self, index: np.ndarray[Any, Any]) -> None:
        """Start the running values of the envs at ``index`` again (their episodes just ended)."""
        for values in self.running.values():
            values[index] = 0.0

    def state(self) -> dict[str, torch.Tensor]:
        return {name: torch.from_numpy(values.copy()) for name, values in self.running.items()}

    def snapshot(self) -> dict[str, np.ndarray[Any, Any]]:
        return {name: values.copy() for name, values in self.running.items()}


def describe(values: Sequence[float] | Sequence[int]) -> StatSummary:
    """What ``EpisodeStats.summary`` reports of one quantity (returns, lengths, a metric) over episodes.

    Example:
        >>> describe([1.0, 3.0])
        {'mean': 2.0, 'std': 1.0, 'min': 1.0, 'max': 3.0, 'count': 2}
    """
    count = len(values)
    if count == 0:
        return {"mean": None, "std": None, "min": None, "max": None, "count": 0}
    mean = math.fsum(values) / count
    variance = math.fsum((v - mean) ** 2 for v in values) / count
    return {"mean": mean, "std": math.sqrt(variance), "min": min(values), "max": max(values), "count": count}
