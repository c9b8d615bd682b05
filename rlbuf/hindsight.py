"""Hindsight experience replay: sampled transitions relabelled with goals their episode reached.

A goal env's observation is a dict with ``"observation"``, ``"achieved_goal"`` and
``"desired_goal"`` (gymnasium-robotics' layout). With
``ReplayBuffer(..., hindsight=Hindsight(...))``, ``sample`` replaces, in a fraction ``ratio``
of the drawn transitions, the desired goal of ``obs`` and ``next_obs`` by the achieved goal
(``next_obs["achieved_goal"]``) of a row of the same episode, and recomputes the reward with
``reward_fn(achieved_goal, desired_goal, info)`` (``compute_reward``'s signature, called on
numpy arrays ``[B, *goal_shape]`` with ``info={}``, returning ``[B]`` rewards):

* ``"future"``: a row of the episode at or after the sampled one (the paper's ``future``);
* ``"episode"``: any stored row of the episode;
* ``"final"``: the episode's last row (the newest so far while the episode runs).

A goal never comes from another episode or env, whatever the interleaving of vector-env rows,
the ring's wrap or rows left out by ``env_mask``; rows of an episode whose start was
overwritten draw from what is still stored. A relabelled transition keeps its ``terminated``
and ``truncated``: a time limit still bootstraps. Only ``sample`` relabels; ``sample_by_index``,
``sample_all`` and ``epochs`` return rows as stored.

Example:
    >>> import numpy as np, torch
    >>> from rlbuf import Hindsight, ReplayBuffer
    >>> def reward_fn(achieved, desired, info):
    ...     return np.where((achieved == desired).all(-1), 0.0, -1.0)
    >>> buf = ReplayBuffer(100, obs_shape={"observation": 2, "achieved_goal": 2, "desired_goal": 2},
    ...                    action_shape=(), action_dtype=torch.int64, seed=0,
    ...                    hindsight=Hindsight("final", ratio=1.0, reward_fn=reward_fn))
    >>> goal = torch.tensor([9.0, 9.0])
    >>> for t in range(3):
    ...     obs = {"observation": torch.full((2,), t + 0.0), "achieved_goal": torch.full((2,), t + 0.0),
    ...            "desired_goal": goal}
    ...     nxt = {"observation": torch.full((2,), t + 1.0), "achieved_goal": torch.full((2,), t + 1.0),
    ...            "desired_goal": goal}
    ...     buf.add(obs, 0, -1.0, nxt, False, truncated=t == 2)
    >>> batch = buf.sample(4)
    >>> batch.obs["desired_goal"][:, 0].tolist()      # the episode's final achieved goal
    [3.0, 3.0, 3.0, 3.0]
    >>> batch.index.tolist(), batch.reward.tolist()   # reached by the step from row 2
    ([2, 0, 2, 0], [0.0, -1.0, 0.0, -1.0])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_args

import numpy as np

from rlbuf._episodes import Strategy
from rlbuf.errors import (
    ConfigError,
)

RewardFn = Callable[[np.ndarray[Any, Any], np.ndarray[Any, Any], dict[str, Any]], Any]
GOAL_KEYS = ("observation", "achieved_goal", "desired_goal")
ACHIEVED, DESIRED_GOAL = 'next_obs["achieved_goal"]', 'obs["desired_goal"]'


@dataclass(frozen=True)
class Hindsight:
    """How ``sample`` relabels goals (see [Hindsight](hindsight.md)).

    Args:
        strategy: ``"future"``, ``"episode"`` or ``"final"``.
        ratio: the fraction of sampled transitions relabelled, in ``[0, 1]`` (0.8: SB3's and
            the paper's ``k = 4``).
        reward_fn: ``reward_fn(achieved_goal, desired_goal, info) -> rewards``, vectorised over
            a leading batch dim (gymnasium-robotics' ``env.unwrapped.compute_reward``).

    Raises:
        ConfigError: an unknown strategy, a ratio outside ``[0, 1]`` or a reward_fn that is not
            callable.

    Example:
        >>> Hindsight("future", ratio=1.5, reward_fn=print)
        Traceback (most recent call last):
        ...
        rlbuf.errors.ConfigError: hindsight ratio: expected a number in [0, 1], got 1.5
    """

    strategy: Strategy = "future"
    ratio: float = 0.8
    reward_fn: RewardFn | None = None

    def __post_init__(self) -> None:
        if self.strategy not in get_args(Strategy):
            raise ConfigError(f"hindsight strategy: expected one of {list(get_args(Strategy))}, got {self.strategy!r}")
        ratio = self.ratio
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0.0 <= float(ratio) <= 1.0:
            raise ConfigError(f"hindsight ratio: expected a number in [0, 1], got {ratio!r}")
        if not callable(self.reward_fn):
            raise ConfigError("hindsight reward_fn: expected a function reward_fn(achieved_goal, desired_goal, info) "
                              f"-> rewards (e.g. env.unwrapped.compute_reward), got {self.reward_fn!r}")

    def describe(self) -> str:
        """The options as ``repr`` shows them."""
        return f"hindsight={self.strategy}:{self.ratio}"
