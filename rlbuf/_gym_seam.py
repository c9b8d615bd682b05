"""The one seam to gymnasium's private attributes: which envs of a ``NEXT_STEP`` vector env are in their reset step.

Under ``NEXT_STEP`` autoreset, the step after an episode's end resets the env and returns its
first observation with reward 0 and no flag: a step the [`Recorder`][rlbuf.gym.Recorder] must not
store. A Recorder made while the envs are mid-run has not seen which envs just ended; gymnasium
keeps that in private attributes, read here alone (``tests/test_gym_seam.py`` pins them against
the installed gymnasium): ``SyncVectorEnv._autoreset_envs`` and the ``prev_done`` of gymnasium's
own vector envs (``CartPole-v1``'s); and ``SyncVectorEnv._observations``, the observations it
returned last (an env reset since then returns others). ``AsyncVectorEnv`` keeps it inside its
worker processes, where nothing reads it: a Recorder made mid-run on one needs ``resetting=``.

Checked against gymnasium 1.4.0.

Example:
    >>> import gymnasium as gym
    >>> envs = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    >>> _ = envs.reset(seed=0)
    >>> pending_resets(envs).tolist()
    [False, False]
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.vector import SyncVectorEnv

_PENDING_ATTRIBUTES = {SyncVectorEnv: "_autoreset_envs"}  # by class; else a vector env's own "prev_done"


def pending_resets(envs: Any) -> np.ndarray[Any, Any] | None:
    """``[num_envs]`` bools: the envs whose next step is ``NEXT_STEP``'s reset step, or ``None`` where the
    envs do not say (``AsyncVectorEnv``, other libraries' vector envs)."""
    unwrapped = getattr(envs, "unwrapped", envs)
    name = next((attribute for kind, attribute in _PENDING_ATTRIBUTES.items() if isinstance(unwrapped, kind)),
                "prev_done")
    pending = getattr(unwrapped, name, None)
    num_envs = getattr(envs, "num_envs", None)
    if not isinstance(pending, np.ndarray) or pending.dtype != np.bool_ or pending.shape != (num_envs,):
        return None
    return pending.copy()


def last_observations(envs: Any) -> np.ndarray[Any, Any] | None:
    """A copy of the ``[num_envs, ...]`` observations a ``SyncVectorEnv`` returned last (before any vector
    wrapper), or ``None`` where the envs do not keep them as one array (other vector envs, dict spaces).

    Example:
        >>> import gymnasium as gym
        >>> envs = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
        >>> obs, _ = envs.reset(seed=0)
        >>> bool((last_observations(envs) == obs).all())
        True
    """
    unwrapped = getattr(envs, "unwrapped", envs)
    observations = getattr(unwrapped, "_observations", None) if isinstance(unwrapped, SyncVectorEnv) else None
    if not isinstance(observations, np.ndarray) or observations.shape[:1] != (getattr(envs, "num_envs", None),):
        return None
    return observations.copy()
