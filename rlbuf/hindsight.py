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
from rlbuf._obs import Layout, Leaf, leaf_names
from rlbuf._ring import RowRing
from rlbuf.errors import (
    CheckpointError,
    ConfigError,
    DtypeError,
    NonFiniteError,
    ShapeError,
    StreamError,
)

RewardFn = Callable[[np.ndarray[Any, Any], np.ndarray[Any, Any], dict[str, Any]], Any]
GOAL_KEYS = ("observation", "achieved_goal", "desired_goal")
_ACHIEVED, _DESIRED = 'next_obs["achieved_goal"]', '["desired_goal"]'


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
    desired = columns["obs" + _DESIRED]
    goals = achieved_at(torch.from_numpy(goal_rows)).to(desired.device)
    achieved = columns[_ACHIEVED][torch.from_numpy(chosen).to(desired.device)]
    assert options.reward_fn is not None  # checked when built
    rewards = _rewards(options.reward_fn(achieved.cpu().numpy(), goals.cpu().numpy(), {}), len(chosen))
    rows = torch.from_numpy(chosen).to(desired.device)
    desired.index_copy_(0, rows, goals)
    columns["next_obs" + _DESIRED].index_copy_(0, rows, goals)
    reward = columns["reward"]
    reward.index_copy_(0, rows.to(reward.device), rewards.to(reward.device, reward.dtype))


def _rewards(value: Any, rows: int) -> torch.Tensor:
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


class Relabeller:
    """A hindsight buffer's relabelling: its options, its episode index and their checkpoint state.

    Args:
        options: the strategy, ratio and reward function.
        ring: the buffer's ring.
        obs: the observation's layout.
        num_envs: envs whose rows are added.
    """

    def __init__(self, options: Hindsight, ring: RowRing, obs: Layout, num_envs: int) -> None:
        self.options = options
        self.ring = ring
        self.episodes = EpisodeIndex(ring.capacity, num_envs)
        self._obs_names = leaf_names("obs", obs)
        self._next_names = leaf_names("next_obs", obs)

    def write(self, columns: Mapping[str, torch.Tensor], env_ids: npt.NDArray[np.int64]) -> None:
        """Write rows read by the ring's readers (of envs ``env_ids``, in order) and index them.

        Raises:
            StreamError: a row's ``obs`` is not the ``next_obs`` of its env's previous row, whose
                episode had not ended (rows of an episode out of order, or one left out).
        """
        ring, episodes = self.ring, self.episodes
        rows = len(env_ids)
        ended = (columns["terminated"] | columns["truncated"]).cpu().numpy().astype(np.bool_)
        with ring.lock:  # the index learns the rows' positions in the state that stores them
            previous = episodes.running_rows(np.unique(env_ids))
            before = ring.gather(torch.from_numpy(previous).to(ring.storing_device), self._next_names)
            broken = broken_link(np.concatenate([episodes.env[previous], env_ids]),
                                 np.concatenate([np.zeros(len(previous), np.bool_), ended]),
                                 [torch.cat([before[n], columns[o]]) for o, n in zip(self._obs_names, self._next_names,
                                                                                     strict=True)],
                                 [torch.cat([before[n], columns[n]]) for n in self._next_names])
            if broken is not None:
                env = int(env_ids[broken[1] - len(previous)])
                raise StreamError(f"hindsight: env {env}'s obs is not the next_obs of its previous row, whose episode "
                                  "had not ended: a hindsight buffer needs each env's steps in order, none left out "
                                  "inside an episode (leave out only the reset steps of gymnasium's NEXT_STEP "
                                  "autoreset; rlbuf.gym.Recorder does)")
            first = ring.write_count
            ring.write_checked(columns, rows)
            episodes.record((first + np.arange(rows, dtype=np.int64)) % ring.capacity, env_ids, ended)

    def relabel(self, columns: dict[str, torch.Tensor], index: torch.Tensor) -> None:
        """Relabel sampled ``columns`` (rows at ``index``) in place; call with the ring's lock held."""
        ring = self.ring
        generator = ring.generator
        draws = torch.rand((2, len(index)), generator=generator, dtype=torch.float64,
                           device=generator.device).cpu().numpy()
        relabel(columns, index.cpu().numpy(), draws, self.options, self.episodes,
                lambda rows: ring.gather(rows.to(ring.storing_device), [_ACHIEVED])[_ACHIEVED])

    def _chronological(self, size: int, write_count: int) -> npt.NDArray[np.int64]:
        capacity = self.ring.capacity
        return (np.arange(size, dtype=np.int64) + (write_count - size)) % capacity

    def state_dict(self) -> dict[str, Any]:
        """The episode index's state (call with the ring's lock held, the ring flushed)."""
        return {"episodes": self.episodes.state_dict(self._chronological(len(self.ring), self.ring.write_count))}

    def state_problem(self, extra: Mapping[str, Any], fields: Mapping[str, torch.Tensor], *, size: int,
                      write_count: int) -> str:
        """What is wrong with a checkpoint's episode state for its stored ``fields``, or ``""``."""
        ended = self._ended(fields, size, write_count)
        state = extra.get("episodes")
        problem = self.episodes.problem(state, ended)
        if problem or not size or not isinstance(state, Mapping):
            return problem
        chronological = self._chronological(size, write_count)
        order = torch.from_numpy(chronological)
        broken = broken_link(state["env"].numpy().astype(np.int64), ended,
                             [fields[name].index_select(0, order.to(fields[name].device)) for name in self._obs_names],
                             [fields[name].index_select(0, order.to(fields[name].device)) for name in self._next_names])
        if broken is None:
            return ""
        before, after = (int(chronological[i]) for i in broken)
        return (f"hindsight: the row at position {after} does not continue row {before} of the same env "
                f"({int(state['env'][broken[1]])}), whose episode had not ended: its obs is not that row's next_obs")

    def _ended(self, fields: Mapping[str, torch.Tensor], size: int, write_count: int) -> npt.NDArray[np.bool_]:
        positions = torch.from_numpy(self._chronological(size, write_count))
        return ((fields["terminated"].cpu()[positions] | fields["truncated"].cpu()[positions]).numpy()
                .astype(np.bool_))

    def load_state_dict(self, extra: Mapping[str, Any]) -> None:
        """Rebuild the episode index from a checked state (the ring holds its rows)."""
        ring = self.ring
        size, count = len(ring), ring.write_count
        self.episodes.derive(extra["episodes"], self._chronological(size, count), self._ended(ring.leaves, size, count))


def broken_link(env: npt.NDArray[np.int64], ended: npt.NDArray[np.bool_], obs: Sequence[torch.Tensor],
                next_obs: Sequence[torch.Tensor]) -> tuple[int, int] | None:
    """The first rows ``(a, b)``, ``b`` the next row of ``a``'s env, ``a`` not ending its episode,
    where ``b``'s obs is not ``a``'s next_obs (each leaf, bit for bit; NaN continues NaN); rows in
    write order.

    Example:
        >>> next_obs = [torch.tensor([[1.0], [2.0], [9.0]])]
        >>> broken_link(np.array([0, 0, 0]), np.zeros(3, np.bool_), [torch.tensor([[0.0], [1.0], [3.0]])], next_obs)
        (1, 2)
    """
    order = np.argsort(env, kind="stable")
    a, b = order[:-1], order[1:]
    linked = (env[a] == env[b]) & ~ended[a]
    a, b = a[linked], b[linked]
    if len(a) == 0:
        return None
    same = np.ones(len(a), np.bool_)
    for leaf, next_leaf in zip(obs, next_obs, strict=True):
        x = leaf.index_select(0, torch.from_numpy(b).to(leaf.device))
        y = next_leaf.index_select(0, torch.from_numpy(a).to(next_leaf.device))
        equal = (x == y) | ((x != x) & (y != y))
        same &= equal.reshape(len(a), -1).all(dim=1).cpu().numpy()
    bad = np.flatnonzero(~same)
    return None if len(bad) == 0 else (int(a[bad[0]]), int(b[bad[0]]))
