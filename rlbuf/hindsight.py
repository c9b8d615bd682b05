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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, get_args

import numpy as np
import numpy.typing as npt
import torch

from rlbuf._episodes import EpisodeIndex, Strategy
from rlbuf._obs import Leaf
from rlbuf.errors import (
    CheckpointError,
    ConfigError,
    DtypeError,
    NonFiniteError,
    ShapeError,
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


def check_goal_layout(leaves: Mapping[str, tuple[tuple[int, ...], torch.dtype]]) -> None:
    """Refuse an observation layout that is not a goal env's.

    Args:
        leaves: shape and dtype of each top-level observation key (``{}`` for a single tensor).

    Raises:
        ConfigError: keys missing, or achieved and desired goals that differ in shape or dtype.
    """
    missing = [key for key in GOAL_KEYS if key not in leaves]
    if missing:
        raise ConfigError(f"hindsight: needs a dict observation with keys {list(GOAL_KEYS)} (a goal env's), "
                          f"got {sorted(leaves) or 'a single tensor'}; missing {missing}")
    achieved, desired = leaves["achieved_goal"], leaves["desired_goal"]
    if achieved != desired:
        raise ConfigError(f'hindsight: obs["achieved_goal"] and obs["desired_goal"] must match in shape and dtype, '
                          f"got {achieved} and {desired}")


def recorded_options(hindsight: Any, leaves: Sequence[Leaf]) -> dict[str, Any] | None:
    """The ``hindsight`` option as a checkpoint records it (its function left out), once checked
    against the observation's ``leaves``.

    Raises:
        ConfigError: not a [`Hindsight`][rlbuf.Hindsight], or observations that are not a goal env's.
    """
    if hindsight is None:
        return None
    if not isinstance(hindsight, Hindsight):
        raise ConfigError(f"hindsight: expected rlbuf.Hindsight(strategy, ratio, reward_fn), got {hindsight!r}")
    check_goal_layout({leaf.path[0]: (leaf.shape, leaf.dtype) for leaf in leaves if len(leaf.path) == 1})
    return {"strategy": hindsight.strategy, "ratio": hindsight.ratio}


def with_reward_fn(options: dict[str, Any], reward_fn: Any) -> dict[str, Any]:
    """A checkpoint's constructor options with its recorded ``hindsight`` made a
    [`Hindsight`][rlbuf.Hindsight] again, around the ``reward_fn`` given to ``load``.

    Raises:
        CheckpointError: a malformed record, or no ``reward_fn`` for a buffer that relabels.
    """
    saved = options.get("hindsight")
    if saved is None:
        return options
    if not isinstance(saved, dict) or set(saved) != {"strategy", "ratio"}:
        raise CheckpointError(f"options: hindsight must be {{'strategy': ..., 'ratio': ...}}, got {saved!r}")
    if reward_fn is None:
        raise CheckpointError(f"this buffer relabels goals (hindsight {saved['strategy']}, ratio {saved['ratio']}), "
                              "and a checkpoint holds no function: load it with "
                              "ReplayBuffer.load(path, reward_fn=env.unwrapped.compute_reward)")
    return {**options, "hindsight": Hindsight(saved["strategy"], saved["ratio"], reward_fn)}


def relabel(columns: dict[str, torch.Tensor], positions: npt.NDArray[np.int64], draws: npt.NDArray[np.float64],
            options: Hindsight, episodes: EpisodeIndex, achieved_at: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Relabel a ``ratio`` of the sampled rows of ``columns`` in place (new goals and rewards).

    Args:
        columns: the sampled columns by field name (``obs["desired_goal"]`` ...).
        positions: their storage positions.
        draws: ``[2, B]`` uniform draws in ``[0, 1)``: which rows are relabelled, and their goal rows.
        options: the strategy, ratio and reward function.
        episodes: the ring's episode index.
        achieved_at: the stored ``next_obs["achieved_goal"]`` of the rows at some positions.

    Raises:
        ShapeError, DtypeError, NonFiniteError: ``reward_fn`` returned something that is not one
            finite number per row; nothing was changed.
    """
    chosen = np.flatnonzero(draws[0] < options.ratio)
    if len(chosen) == 0:
        return
    goal_rows = episodes.goal_rows(positions[chosen], options.strategy, draws[1, chosen])
    desired = columns[DESIRED_GOAL]
    goals = achieved_at(torch.from_numpy(goal_rows)).to(desired.device)
    achieved = columns[ACHIEVED][torch.from_numpy(chosen).to(desired.device)]
    assert options.reward_fn is not None  # checked when built
    rewards = reward_values(options.reward_fn(achieved.cpu().numpy(), goals.cpu().numpy(), {}), len(chosen))
    rows = torch.from_numpy(chosen).to(desired.device)
    desired.index_copy_(0, rows, goals)
    columns["next_" + DESIRED_GOAL].index_copy_(0, rows, goals)
    reward = columns["reward"]
    reward.index_copy_(0, rows.to(reward.device), rewards.to(reward.device, reward.dtype))


def reward_values(value: Any, rows: int) -> torch.Tensor:
    """``reward_fn``'s result as ``[rows]`` finite float32."""
    array = np.asarray(value.cpu() if isinstance(value, torch.Tensor) else value)
    if array.dtype.kind not in "biuf":
        raise DtypeError(f"hindsight reward_fn: expected numbers, got {array.dtype}; return a float array")
    if array.shape not in ((rows,), (rows, 1)):
        raise ShapeError(f"hindsight reward_fn: expected {rows} rewards (shape ({rows},)), got shape {array.shape}; "
                         "it is called with [B, *goal_shape] goals and must be vectorised over B")
    array = array.reshape(rows).astype(np.float32)
    if not np.isfinite(array).all():
        bad = array[~np.isfinite(array)][0]
        raise NonFiniteError(f"hindsight reward_fn: expected finite rewards, got {bad} "
                             f"(of {int((~np.isfinite(array)).sum())} non-finite)")
    return torch.from_numpy(array)
