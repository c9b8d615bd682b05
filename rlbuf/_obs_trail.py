"""Whether each env's ``obs`` continues the ``next_obs`` recorded with its previous step: the
[`Recorder`][rlbuf.gym.Recorder]'s check that the envs were not reset behind its back.

A vector env's step starts from what its previous step returned: the ``obs`` of a step is the
``next_obs`` of the one before (``SAME_STEP``'s reset observation after an end; ``NEXT_STEP``'s
reset step starts from the final one). An ``envs.reset()`` the Recorder was not told of, or a
step it did not see, breaks that. The trail keeps the last ``next_obs`` and a copy of its values
(an env built with ``copy=False`` changes the array in place): the usual loop (``obs =
next_obs``) gives the same object back, which continues it at no cost; another object is compared
with the copy value by value in the buffer's dtypes (a float64 observation given back as a float32
tensor continues it; NaN equals NaN).

Example:
    >>> import numpy as np
    >>> from rlbuf._obs import Layout
    >>> trail = ObservationTrail(Layout.parse((2,)), num_envs=2)
    >>> trail.remember(np.array([[0.0, 1.0], [2.0, 3.0]]))
    >>> trail.continues(np.array([[0.0, 1.0], [9.0, 9.0]])).tolist()
    [True, False]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlbuf._convert import numpy_dtype_or_none
from rlbuf._obs import Layout
from rlbuf.errors import RlbufError


class ObservationTrail:
    """The ``next_obs`` of the last recorded step, and whether a step's ``obs`` continues it, env by env.

    Args:
        layout: the buffer's observation layout (its leaves' dtypes are the ones compared in).
        num_envs: rows per step.
    """

    def __init__(self, layout: Layout, num_envs: int) -> None:
        self._layout = layout
        self._num_envs = num_envs
        self._last: Any = None  # the last next_obs as given; None: not known
        self._kept: list[np.ndarray[Any, Any]] | None = None  # a copy of its rows: the object may change in place

    def remember(self, next_obs: Any) -> None:
        """Keep ``next_obs`` as what each env's next ``obs`` must be: the object, and a copy of its values (an
        env built with ``copy=False``, or a loop reusing the array, changes it in place)."""
        try:
            self._kept = [np.array(rows) for rows in self._rows(next_obs)]
        except (RlbufError, TypeError, ValueError, RuntimeError):
            self._kept = None
        self._last = next_obs if self._kept is not None else None

    def continues(self, obs: Any) -> np.ndarray[Any, Any] | bool | None:
        """``[num_envs]`` bools: which envs' ``obs`` equal the remembered ``next_obs``; ``True`` where ``obs`` is
        that very object (every env's does, at no cost); ``None`` where nothing is remembered or either cannot
        be read as rows of the buffer's leaves (the buffer's ``add`` judges ``obs`` then)."""
        last, kept_rows, n = self._last, self._kept, self._num_envs
        if last is None or kept_rows is None:
            return None
        if obs is last:
            return True
        try:
            now = self._rows(obs)
        except (RlbufError, TypeError, ValueError, RuntimeError):
            return None
        same = np.ones(n, np.bool_)
        for given, kept in zip(now, kept_rows, strict=True):
            if given.shape != kept.shape:
                return None
            same &= same_rows(given, kept)
        return same

    def _rows(self, value: Any) -> list[np.ndarray[Any, Any]]:
        """Each leaf of ``value`` as ``[num_envs, -1]`` numpy rows of its stored dtype."""
        rows = []
        for leaf, part in zip(self._layout.leaves, self._layout.split("obs", value), strict=True):
            dtype = numpy_dtype_or_none(leaf.dtype)
            if dtype is None:
                raise TypeError(f"no numpy dtype for {leaf.dtype}")
            if isinstance(part, torch.Tensor):
                array = part.detach().to("cpu", leaf.dtype).numpy()
            else:
                array = np.asarray(part).astype(dtype, copy=False)
            rows.append(array.reshape(self._num_envs, -1))
        return rows


def same_rows(given: np.ndarray[Any, Any], kept: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Per row (the first dim) of two arrays of one shape: whether every value is equal (NaN equals NaN).

    Example:
        >>> same_rows(np.array([[1.0, np.nan], [2.0, 3.0]]), np.array([[1.0, np.nan], [2.0, 4.0]])).tolist()
        [True, False]
    """
    equal = given == kept
    if given.dtype.kind in "fc":
        equal |= np.isnan(given) & np.isnan(kept)
    return np.asarray(equal.reshape(len(equal), -1).all(axis=1))
