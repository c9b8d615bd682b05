"""Value bounds of a field: the actions a discrete action space allows, checked on every write and load.

A ``Discrete(n)`` action is an index in ``[start, start + n - 1]``; storing ``7`` for
``Discrete(2)`` fits ``int64`` but is an action no env takes (a policy's ``argmax`` over the
wrong dim, a flattened ``MultiDiscrete``). [`Bounds`][rlbuf._bounds.Bounds] holds the range,
from the space (``Discrete``, ``MultiDiscrete``, an integer ``Box``, TorchRL's ``Categorical``
and ``MultiCategorical``) or from the buffers' ``action_range=(low, high)`` option, and refuses
values outside it with an [`OutOfRangeError`][rlbuf.errors.OutOfRangeError].

Example:
    >>> import gymnasium as gym
    >>> bounds = Bounds.of_space(gym.spaces.Discrete(2))
    >>> bounds.to_json()
    [0, 1]
    >>> bounds.check("action", np.array([0, 7]), ())
    Traceback (most recent call last):
    ...
    rlbuf.errors.OutOfRangeError: action: expected values in [0, 1], got 7 at row 1; an action outside the action space (a policy's argmax over the wrong dim?): fix the policy's output, or build the buffer with action_range=(low, high) for the values you mean to store
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rlbuf._convert import _FEW_VALUES
from rlbuf.errors import ConfigError, OutOfRangeError


@dataclass(frozen=True)
class Bounds:
    """Inclusive bounds of a field's values: one ``(low, high)`` pair for every element, or one per element.

    Args:
        low: the smallest value allowed, an int, or a tuple of ints (one per element of a row, flattened).
        high: the largest value allowed, in the same form.

    Example:
        >>> Bounds(0, 3).check("action", 2, ())
        >>> Bounds((0, 0), (2, 3)).to_json()
        [[0, 0], [2, 3]]
    """

    low: int | tuple[int, ...]
    high: int | tuple[int, ...]
    _low: np.ndarray[Any, Any] = field(init=False, compare=False, repr=False)
    _high: np.ndarray[Any, Any] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_low", np.asarray(self.low, np.int64))
        object.__setattr__(self, "_high", np.asarray(self.high, np.int64))

    @classmethod
    def of_space(cls, space: Any) -> Bounds | None:
        """The bounds a discrete space (an integer ``Box``, ``MultiBinary``: 0 and 1) sets, else ``None``.

        Example:
            >>> import gymnasium as gym
            >>> Bounds.of_space(gym.spaces.MultiDiscrete([3, 4], start=[1, 0]))
            Bounds(low=(1, 0), high=(3, 3))
            >>> Bounds.of_space(gym.spaces.Box(-1, 1, (2,))) is None
            True
        """
        from gymnasium import spaces

        if isinstance(space, spaces.Discrete):
            return cls(int(space.start), int(space.start) + int(space.n) - 1)
        if isinstance(space, spaces.MultiDiscrete):
            return cls._of_arrays(np.asarray(space.start), np.asarray(space.start) + np.asarray(space.nvec) - 1)
        if isinstance(space, spaces.MultiBinary):
            return cls(0, 1)
        if isinstance(space, spaces.Box) and np.dtype(space.dtype).kind in "iu":
            return cls._of_arrays(np.asarray(space.low), np.asarray(space.high))
        from torchrl.data import Categorical, MultiCategorical

        if isinstance(space, MultiCategorical):
            return cls._of_arrays(np.zeros(tuple(space.nvec.shape), np.int64), space.nvec.numpy() - 1)
        if isinstance(space, Categorical):
            return cls(0, int(space.space.n) - 1)
        return None

    @classmethod
    def _of_arrays(cls, low: np.ndarray[Any, Any], high: np.ndarray[Any, Any]) -> Bounds:
        if low.size and (low == low.flat[0]).all() and (high == high.flat[0]).all():
            return cls(int(low.flat[0]), int(high.flat[0]))
        return cls(tuple(int(v) for v in low.reshape(-1)), tuple(int(v) for v in high.reshape(-1)))

    @classmethod
    def parse(cls, value: Any, shape: tuple[int, ...], name: str = "action_range") -> Bounds | None:
        """The ``action_range`` option: ``None``, or ``(low, high)``, each an int or one int per element
        (an array of ``shape``, or flattened, as checkpoints record it).

        Raises:
            ConfigError: not two integers (or arrays of ``shape``), or ``low > high`` somewhere.

        Example:
            >>> Bounds.parse((0, 5), ())
            Bounds(low=0, high=5)
            >>> Bounds.parse((3, 1), ())
            Traceback (most recent call last):
            ...
            rlbuf.errors.ConfigError: action_range: expected (low, high) with low <= high, got (3, 1)
        """
        if value is None:
            return None
        try:
            low, high = (np.asarray(part) for part in value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: expected (low, high), two ints or arrays of shape {shape}, got "
                              f"{value!r}") from None
        for part in (low, high):
            # One bound for every element, or one per element (of the action's shape, or flattened as recorded).
            if part.dtype.kind not in "iu" or part.shape not in ((), shape, (math.prod(shape),)):
                raise ConfigError(f"{name}: expected (low, high), two ints or int arrays of shape {shape}, got "
                                  f"{value!r}")
        low, high = (part.reshape(shape) if part.ndim else part for part in (low, high))
        if (low > high).any():
            raise ConfigError(f"{name}: expected (low, high) with low <= high, got {value!r}")
        return cls._of_arrays(np.broadcast_to(low, shape).astype(np.int64), np.broadcast_to(high, shape).astype(np.int64))

    def to_json(self) -> list[Any]:
        """``[low, high]`` as JSON (how options and checkpoints record it)."""
        return [list(self.low) if isinstance(self.low, tuple) else self.low,
                list(self.high) if isinstance(self.high, tuple) else self.high]

    def check_shape(self, name: str, shape: tuple[int, ...]) -> None:
        """Raise a ``ConfigError`` unless per-element bounds have one pair per element of ``shape``."""
        if isinstance(self.low, tuple) and len(self.low) != math.prod(shape):
            raise ConfigError(f"{name}: {len(self.low)} bounds for rows of shape {shape} ({math.prod(shape)} values)")

    def check(self, name: str, values: Any, shape: tuple[int, ...]) -> None:
        """Raise [`OutOfRangeError`][rlbuf.errors.OutOfRangeError] if a value lies outside the bounds.

        ``values``: a Python number, or rows of ``shape`` (a numpy array or a tensor, one row or
        ``[rows, *shape]``).
        """
        problem = self.outside(values, shape)
        if problem:
            raise OutOfRangeError(
                f"{name}: {problem}; an action outside the action space (a policy's argmax over the wrong dim?): "
                "fix the policy's output, or build the buffer with action_range=(low, high) for the values you "
                "mean to store")

    def outside(self, values: Any, shape: tuple[int, ...]) -> str:
        """``""`` if every value lies within the bounds, else the first one outside, described.

        Example:
            >>> Bounds((0, 0), (2, 3)).outside(np.array([[1, 1], [2, 4]]), (2,))
            'expected values in [0, 3], got 4 at row 1, element 1'
        """
        width = math.prod(shape)
        if width == 0:
            return ""
        if isinstance(values, torch.Tensor):
            rows = values.reshape(-1, width)
            below = rows < torch.as_tensor(self._low, device=values.device)
            above = rows > torch.as_tensor(self._high, device=values.device)
            if values.dtype is torch.bool or not bool((below | above).any()):
                return ""
            array = values.cpu().numpy()
        elif isinstance(values, np.ndarray):
            if not self._low.ndim and values.dtype.kind in "iu" and 0 < values.size <= _FEW_VALUES:
                listed = values.ravel().tolist()  # a vector env's discrete actions: two compares of Python ints
                if self.low <= min(listed) and max(listed) <= self.high:
                    return ""
            array = values
        elif self._low.ndim or self.low <= values <= self.high:  # a scalar row: one pair of ints
            return ""
        else:
            array = np.asarray([values])
        if array.dtype.kind == "b" or array.size == 0:
            return ""
        flat = array.reshape(-1, width)
        bad = (flat < self._low) | (flat > self._high)
        if not bad.any():
            return ""
        row, column = (int(i) for i in np.argwhere(bad)[0])
        low, high = np.broadcast_to(self._low, (width,))[column], np.broadcast_to(self._high, (width,))[column]
        where = ", ".join(([f"row {row}"] if flat.shape[0] > 1 else []) + ([f"element {column}"] if width > 1 else []))
        return f"expected values in [{low}, {high}], got {flat[row, column].item()}" + (f" at {where}" if where else "")
