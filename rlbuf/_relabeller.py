"""A hindsight buffer's write and sample side: rows checked and indexed by episode, goals relabelled.

Every row a hindsight buffer stores goes through [`Relabeller.add`][rlbuf._relabeller.Relabeller.add]
(an ``add`` of every env: the ring's staged numpy path) or
[`Relabeller.write`][rlbuf._relabeller.Relabeller.write] (``env_mask``, ``extend``: rows read as
tensors): the ring's readers check the fields, then each row's ``obs`` must be the ``next_obs`` of
its env's previous row unless that row ended its episode (so an episode is one unbroken chain,
and a goal drawn from it is one the agent reached from there), then the rows are written and the
[`EpisodeIndex`][rlbuf._episodes.EpisodeIndex] learns their env and position under the same lock.
A checkpoint holds the env of each row; a load derives the index from it and checks the same
chain on the stored rows.

Example:
    >>> import numpy as np, torch
    >>> from rlbuf import Hindsight, ReplayBuffer, StreamError
    >>> buf = ReplayBuffer(8, obs_shape={"observation": 1, "achieved_goal": 1, "desired_goal": 1}, action_shape=(),
    ...                    hindsight=Hindsight("future", 0.5, lambda a, d, i: -np.abs(a - d).sum(-1)))
    >>> step = lambda x: {"observation": torch.tensor([x]), "achieved_goal": torch.tensor([x]),
    ...                   "desired_goal": torch.tensor([5.0])}
    >>> buf.add(step(0.0), 0.0, -1.0, step(1.0), False, truncated=False)
    >>> try:
    ...     buf.add(step(3.0), 0.0, -1.0, step(4.0), False, truncated=False)   # not where the episode was
    ... except StreamError as error:
    ...     print(str(error)[:72])
    hindsight: env 0's obs is not the next_obs of its previous row, whose ep
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from rlbuf._episodes import EpisodeIndex, described
from rlbuf._nstep import nstep_discount, nstep_return
from rlbuf._obs import Layout, Leaf, leaf_names
from rlbuf._ring import RowRing
from rlbuf.errors import (
    CheckpointError,
    ConfigError,
    DeviceError,
    DtypeError,
    NonFiniteError,
    ShapeError,
    StreamError,
)
from rlbuf.hindsight import ACHIEVED, DESIRED_GOAL, GOAL_KEYS, Hindsight
from rlbuf.spec import FieldSpec

_Ints = npt.NDArray[np.int64]
_Bools = npt.NDArray[np.bool_]
_Array = np.ndarray[Any, Any]
_RUNNING = ("running", "next_obs")  # each env's running episode; older checkpoints hold only the envs


class Relabeller:
    """A hindsight buffer's relabelling: its options, its episode index and their checkpoint state.

    Args:
        options: the strategy, ratio and reward function.
        ring: the buffer's ring.
        obs: the observation's layout.
        num_envs: envs whose rows are added.
        n_step: steps per sampled transition at most (never past its episode's end or newest row).
        gamma: the discount of n-step returns.
    """

    def __init__(self, options: Hindsight, ring: RowRing, obs: Layout, num_envs: int, *, n_step: int = 1,
                 gamma: float = 0.99) -> None:
        self.options = options
        self.n_step = n_step
        self.gamma = gamma
        self.ring = ring
        self.num_envs = num_envs
        self.episodes = EpisodeIndex(ring.capacity, num_envs)
        self._obs_names = leaf_names("obs", obs)
        self._next_names = leaf_names("next_obs", obs)
        self._all_envs = np.arange(num_envs, dtype=np.int64)
        # Each env's last next_obs while its episode runs: what its next row's obs must be.
        self._last_next = [np.zeros((num_envs, *ring.by_name[name].shape), ring.by_name[name].np_dtype)
                           for name in self._next_names]
        self._running = np.zeros(num_envs, np.bool_)

    @property
    def nbytes(self) -> int:
        """Bytes of the episode index and of each env's last ``next_obs``."""
        return self.episodes.nbytes + sum(last.nbytes for last in self._last_next) + self._running.nbytes

    def clear(self) -> None:
        """Forget every row and episode."""
        self.episodes.clear()
        self._running[:] = False

    # -- writing -----------------------------------------------------------------------------
    def add(self, values: Sequence[Any]) -> None:
        """Store one step of every env (``values``: one per input field, in field order).

        Raises:
            ShapeError, DtypeError, DeviceError, NonFiniteError: a field's reader refused it.
            StreamError: a row does not continue its env's running episode (see ``write``).
        """
        ring, rows = self.ring, self.num_envs
        with ring.lock:
            arrays = ring.read_staged(values, rows)
            if arrays is None:
                self.write(ring.read_tensors(ring.input_specs, values, rows), self._all_envs)
                return
            columns = dict(zip((spec.name for spec in ring.input_specs), arrays, strict=True))
            ended, next_rows = self._check(columns, self._all_envs)
            first = ring.write_count
            ring.write_staged(arrays, rows)
            self._record(first, self._all_envs, ended, next_rows)

    def write(self, columns: Mapping[str, Any], env_ids: _Ints) -> None:
        """Store rows read by the ring's readers, of envs ``env_ids`` (in write order).

        Raises:
            StreamError: a row's ``obs`` is not the ``next_obs`` of its env's previous row, whose
                episode had not ended (rows of an episode out of order, or one left out).
        """
        ring = self.ring
        with ring.lock:  # the index learns the rows' positions in the state that stores them
            ended, next_rows = self._check(columns, env_ids)
            first = ring.write_count
            ring.write_checked(columns, len(env_ids))
            self._record(first, env_ids, ended, next_rows)

    def _rows(self, columns: Mapping[str, Any], name: str, rows: int) -> _Array:
        value = columns[name]
        array = value.cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
        return array.reshape(rows, *self.ring.by_name[name].shape)

    def _check(self, columns: Mapping[str, Any], env_ids: _Ints) -> tuple[_Bools, list[_Array]]:
        """The rows' ended flags and next_obs leaves, once every row continues its env's episode."""
        rows = len(env_ids)
        ended = self._rows(columns, "terminated", rows) | self._rows(columns, "truncated", rows)
        next_rows = [self._rows(columns, name, rows) for name in self._next_names]
        if env_ids is self._all_envs:  # one row per env: each continues its env's last next_obs
            for last, name in zip(self._last_next, self._obs_names, strict=True):
                obs = self._rows(columns, name, rows)
                if not np.array_equal(obs, last):  # some env's differs, or a NaN: which one, by row
                    broken_envs = np.flatnonzero(self._running & ~_same_rows(obs, last))
                    if len(broken_envs):
                        raise _not_continued(int(broken_envs[0]))
            return ended, next_rows
        envs = np.unique(env_ids)
        before = envs[self._running[envs]]
        broken = broken_link(np.concatenate([before, env_ids]), np.concatenate([np.zeros(len(before), np.bool_), ended]),
                             [np.concatenate([last[before], self._rows(columns, name, rows)])
                              for last, name in zip(self._last_next, self._obs_names, strict=True)],
                             [np.concatenate([last[before], rows_]) for last, rows_ in zip(self._last_next, next_rows,
                                                                                           strict=True)])
        if broken is not None:
            raise _not_continued(int(env_ids[broken[1] - len(before)]))
        return ended, next_rows

    def _record(self, first: int, env_ids: _Ints, ended: _Bools, next_rows: list[_Array]) -> None:
        """Index rows written from write count ``first``; keep each env's last next_obs."""
        rows = len(env_ids)
        self.episodes.record((first + np.arange(rows, dtype=np.int64)) % self.ring.capacity, env_ids, ended,
                             distinct=env_ids is self._all_envs)
        if env_ids is self._all_envs:
            envs, newest = env_ids, env_ids
        else:
            envs, from_end = np.unique(env_ids[::-1], return_index=True)
            newest = rows - 1 - from_end
        for last, rows_ in zip(self._last_next, next_rows, strict=True):
            last[envs] = rows_[newest]
        self._running[envs] = ~ended[newest]

    def cut(self, env_ids: _Ints) -> None:
        """End the running episode of each of ``env_ids`` at its newest stored row, as a time limit would
        (see [`ReplayBuffer.truncate_episodes`][rlbuf.ReplayBuffer.truncate_episodes])."""
        with self.ring.rewriting("truncate_episodes"):
            self.ring.mark_truncated(self.episodes.end_running(env_ids))
            self._running[env_ids] = False

    # -- sampling ----------------------------------------------------------------------------
    def relabel(self, columns: dict[str, torch.Tensor], index: torch.Tensor) -> None:
        """Relabel a ``ratio`` of the sampled ``columns`` (rows at ``index``) in place: new goals
        and rewards (and, with ``n_step > 1``, the n-step transitions); call with the ring's lock
        held.

        Raises:
            ShapeError, DtypeError, NonFiniteError: ``reward_fn`` returned something that is not one
                finite number per row; nothing was changed.
        """
        generator = self.ring.generator
        draws = torch.rand((2, len(index)), generator=generator, dtype=torch.float64,
                           device=generator.device).cpu().numpy()
        positions = index.cpu().numpy()
        chosen = np.flatnonzero(draws[0] < self.options.ratio)
        goals = None
        if len(chosen):
            goal_rows = self.episodes.goal_rows(positions[chosen], self.options.strategy, draws[1, chosen])
            goals = self.ring.gather(torch.from_numpy(goal_rows).to(self.ring.storing_device), [ACHIEVED])[ACHIEVED]
        if self.n_step > 1:
            self._relabel_steps(columns, positions, chosen, goals)
        elif goals is not None:
            rewards = self._rewards(columns[ACHIEVED][torch.from_numpy(chosen).to(columns[ACHIEVED].device)], goals)
            self._set_goals(columns, chosen, goals)
            reward = columns["reward"]
            reward.index_copy_(0, torch.from_numpy(chosen).to(reward.device), rewards.to(reward.device, reward.dtype))

    def _rewards(self, achieved: torch.Tensor, goals: torch.Tensor) -> torch.Tensor:
        """``reward_fn`` of achieved goals and desired ones (``[rows, *goal_shape]`` each), checked."""
        assert self.options.reward_fn is not None  # checked when built
        # Copies: a reward_fn that writes into its arguments changes neither the batch nor its goals.
        given = (np.array(achieved.cpu().numpy()), np.array(goals.cpu().numpy()))
        return reward_values(self.options.reward_fn(*given, {}), len(achieved))

    @staticmethod
    def _set_goals(columns: dict[str, torch.Tensor], chosen: _Ints, goals: torch.Tensor) -> None:
        """The desired goal of ``obs`` and ``next_obs`` of the ``chosen`` rows becomes ``goals``."""
        for name in (DESIRED_GOAL, "next_" + DESIRED_GOAL):
            column = columns[name]
            column.index_copy_(0, torch.from_numpy(chosen).to(column.device), goals.to(column.device))

    def _relabel_steps(self, columns: dict[str, torch.Tensor], positions: _Ints, chosen: _Ints,
                       goals: torch.Tensor | None) -> None:
        """``relabel`` of n-step transitions: each row's next ``m <= n_step`` rows of its episode
        give the discounted reward sum (recomputed for the new goal where relabelled), the
        observation it bootstraps from, its flags and ``gamma**m`` (0 once terminated)."""
        ring, n = self.ring, self.n_step
        rows, steps = self.episodes.window(positions, n)
        device = columns["reward"].device
        window = ring.gather(torch.from_numpy(rows.reshape(-1)).to(ring.storing_device), ["reward", ACHIEVED])
        rewards = window["reward"].to(device).view(len(positions), n).clone()
        if goals is not None:
            achieved = window[ACHIEVED].view(len(positions), n, *goals.shape[1:])[torch.from_numpy(chosen)]
            used = np.arange(n)[None, :] < steps[chosen, None]
            per_step = self._rewards(achieved[torch.from_numpy(used)],
                                     goals.repeat_interleave(torch.from_numpy(steps[chosen]).to(goals.device), dim=0))
            relabelled = rewards[torch.from_numpy(chosen).to(device)]
            relabelled[torch.from_numpy(used).to(device)] = per_step.to(device, rewards.dtype)
            rewards[torch.from_numpy(chosen).to(device)] = relabelled
        last = torch.from_numpy(rows[np.arange(len(positions)), steps - 1]).to(ring.storing_device)
        ends = ring.gather(last, [*self._next_names, "terminated", "truncated"])
        for name in self._next_names:
            columns[name] = ends[name].to(device)
        if goals is not None:
            self._set_goals(columns, chosen, goals)
        step_count = torch.from_numpy(steps).to(device)
        terminated, truncated = ends["terminated"].to(device), ends["truncated"].to(device)
        columns["reward"] = nstep_return(rewards, step_count, self.gamma)
        columns["terminated"], columns["truncated"], columns["done"] = terminated, truncated, terminated | truncated
        columns["discount"] = nstep_discount(step_count, terminated, self.gamma)

    # -- checkpoints -------------------------------------------------------------------------
    def _chronological(self, size: int, write_count: int) -> _Ints:
        return (np.arange(size, dtype=np.int64) + (write_count - size)) % self.ring.capacity

    def state_dict(self) -> dict[str, Any]:
        """The episode index's state, and whether each env's episode runs with the ``next_obs`` its
        next row must continue (zeros where it does not): an env whose stored rows were all
        overwritten still refuses a step that breaks its episode after a load (call with the ring's
        lock held, the ring flushed)."""
        running = self._running.copy()
        kept = {}
        for name, last in zip(self._next_names, self._last_next, strict=True):
            leaves = np.zeros_like(last)
            leaves[running] = last[running]
            kept[name] = torch.from_numpy(leaves)
        episodes = self.episodes.state_dict(self._chronological(len(self.ring), self.ring.write_count))
        return {"episodes": {**episodes, "running": torch.from_numpy(running), "next_obs": kept}}

    def _ended(self, fields: Mapping[str, torch.Tensor], size: int, write_count: int) -> _Bools:
        positions = torch.from_numpy(self._chronological(size, write_count))
        return ((fields["terminated"].cpu()[positions] | fields["truncated"].cpu()[positions]).numpy()
                .astype(np.bool_))

    def state_problem(self, extra: Mapping[str, Any], fields: Mapping[str, torch.Tensor], *, size: int,
                      write_count: int) -> str:
        """What is wrong with a checkpoint's episode state for its stored ``fields``, or ``""``."""
        state = extra.get("episodes")
        if not isinstance(state, Mapping) or set(state) not in ({"env"}, {"env", *_RUNNING}):
            got = sorted(state) if isinstance(state, Mapping) else type(state).__name__
            return ("hindsight: a checkpoint's episodes must be {'env': tensor, 'running': tensor, 'next_obs': "
                    f"{{name: tensor}}}} (or, saved before these were, {{'env': tensor}}), got {got}")
        problem = self.episodes.problem(state["env"], size) or self._running_shape_problem(state)
        if problem:
            return problem
        ended = self._ended(fields, size, write_count)
        chronological = self._chronological(size, write_count)
        order = torch.from_numpy(chronological)
        env = state["env"].numpy().astype(np.int64)
        obs, next_obs = ([fields[name].cpu().index_select(0, order).numpy() for name in names]
                         for names in (self._obs_names, self._next_names))
        broken = broken_link(env, ended, obs, next_obs) if size else None
        if broken is not None:
            before, after = (int(chronological[i]) for i in broken)
            return (f"hindsight: the row at position {after} does not continue row {before} of the same env "
                    f"({int(env[broken[1]])}), whose episode had not ended: its obs is not that row's next_obs")
        return self._running_problem(state, env, ended, next_obs, stored_all=size == write_count)

    def _running_shape_problem(self, state: Mapping[str, Any]) -> str:
        """``running`` and ``next_obs`` (where saved) of one row per env, as this buffer stores them."""
        if "running" not in state:
            return ""
        running, kept, envs = state["running"], state["next_obs"], self.num_envs
        if not isinstance(running, torch.Tensor) or running.dtype != torch.bool or tuple(running.shape) != (envs,):
            return f"hindsight: episodes['running'] must be bool of shape ({envs},) (one per env), got {described(running)}"
        if not isinstance(kept, Mapping) or set(kept) != set(self._next_names):
            got = sorted(kept) if isinstance(kept, Mapping) else type(kept).__name__
            return f"hindsight: episodes['next_obs'] must hold {self._next_names}, got {got}"
        for name in self._next_names:
            spec, value = self.ring.by_name[name], kept[name]
            if (not isinstance(value, torch.Tensor) or value.dtype != spec.dtype
                    or tuple(value.shape) != (envs, *spec.shape)):
                return (f"hindsight: episodes['next_obs'][{name!r}] must be {spec.dtype} of shape "
                        f"{(envs, *spec.shape)} (one per env), got {described(value)}")
        return ""

    def _running_problem(self, state: Mapping[str, Any], env: _Ints, ended: _Bools, next_obs: list[_Array], *,
                         stored_all: bool) -> str:
        """Each env's saved running flag and ``next_obs`` are those its newest stored row gives
        (any, where all its rows were overwritten; zeros where its episode does not run)."""
        if "running" not in state:
            return ""
        running = state["running"].numpy()
        kept = [state["next_obs"][name].numpy() for name in self._next_names]
        envs, from_end = np.unique(env[::-1], return_index=True)
        newest = len(env) - 1 - from_end
        unstored = np.setdiff1d(self._all_envs, envs)
        if stored_all and running[unstored].any():  # no row was ever overwritten: a running episode has rows
            return (f"hindsight: episodes['running'] says env {int(unstored[running[unstored]][0])}'s episode runs, "
                    "but no row of it was ever stored")
        wrong = np.flatnonzero(running[envs] == ended[newest])
        if len(wrong):
            e = int(envs[wrong[0]])
            return (f"hindsight: episodes['running'] says env {e}'s episode {'runs' if running[e] else 'has ended'}, "
                    f"but its newest stored row {'ended' if running[e] else 'did not end'} it")
        for name, leaves, stored in zip(self._next_names, kept, next_obs, strict=True):
            continued = _same_rows(leaves[envs[running[envs]]], stored[newest[running[envs]]])
            if not continued.all():
                return (f"hindsight: episodes['next_obs'][{name!r}] of env {int(envs[running[envs]][~continued][0])} "
                        "is not the next_obs of its newest stored row, whose episode runs")
            if (leaves[~running] != 0).any():
                return (f"hindsight: episodes['next_obs'][{name!r}] of env {int(np.flatnonzero(~running)[0])}, whose "
                        "episode does not run, is not zeros")
        return ""

    def load_state_dict(self, extra: Mapping[str, Any]) -> None:
        """Rebuild the episode index and each env's running episode from a checked state (the
        ring holds its rows)."""
        ring, episodes, state = self.ring, self.episodes, extra["episodes"]
        size, count = len(ring), ring.write_count
        episodes.derive(state["env"], self._chronological(size, count), self._ended(ring.leaves, size, count))
        if "running" in state:  # checked against the newest stored rows by state_problem
            self._running[:] = state["running"].numpy()
            for last, name in zip(self._last_next, self._next_names, strict=True):
                last[:] = state["next_obs"][name].numpy()
            return
        self._running[:] = False  # an older checkpoint's: the episodes running in its stored rows
        rows = episodes.running_rows(self._all_envs)
        envs = episodes.env[rows]
        for last, name in zip(self._last_next, self._next_names, strict=True):
            last[envs] = ring.leaves[name].index_select(0, torch.from_numpy(rows).to(ring.storing_device)).cpu().numpy()
        self._running[envs] = True


def check_goal_layout(leaves: Mapping[str, tuple[tuple[int, ...], torch.dtype]], grouped: Collection[str] = ()) -> None:
    """Refuse an observation layout that is not a goal env's.

    Args:
        leaves: shape and dtype of each top-level observation key (``{}`` for a single tensor).
        grouped: the top-level keys that hold a dict of tensors.

    Raises:
        ConfigError: keys missing or holding a dict, or achieved and desired goals that differ in
            shape or dtype.
    """
    dicts = [key for key in GOAL_KEYS if key in grouped]
    if dicts:
        raise ConfigError(f"hindsight: obs {dicts} must each be one tensor (a goal env's), got a dict of tensors; "
                          "give each goal as one Box")
    missing = [key for key in GOAL_KEYS if key not in leaves]
    if missing:
        raise ConfigError(f"hindsight: needs a dict observation with keys {list(GOAL_KEYS)} (a goal env's), "
                          f"got {sorted({*leaves, *grouped}) or 'a single tensor'}; missing {missing}")
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
    check_goal_layout({leaf.path[0]: (leaf.shape, leaf.dtype) for leaf in leaves if len(leaf.path) == 1},
                      {leaf.path[0] for leaf in leaves if len(leaf.path) > 1})
    return {"strategy": hindsight.strategy, "ratio": hindsight.ratio}


def checked_reward_fn(reward_fn: Any) -> Any:
    """``load``'s ``reward_fn``: ``None`` or a function, checked before any checkpoint is read.

    Raises:
        ConfigError: a ``reward_fn`` that is not callable.
    """
    if reward_fn is not None and not callable(reward_fn):
        raise ConfigError("reward_fn: expected the hindsight reward function reward_fn(achieved_goal, desired_goal, "
                          f"info) -> rewards (e.g. env.unwrapped.compute_reward) or None, got {reward_fn!r}")
    return reward_fn


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


_REWARD = FieldSpec("hindsight reward_fn", "reward", (), torch.float32, finite=True)


def reward_values(value: Any, rows: int) -> torch.Tensor:
    """``reward_fn``'s result as ``[rows]`` finite float32.

    Example:
        >>> reward_values(np.array([0.0, -1.0]), 2).tolist()
        [0.0, -1.0]
    """
    if isinstance(value, torch.Tensor):
        if value.device.type == "meta":
            raise DeviceError("hindsight reward_fn: expected rewards, got a tensor on the meta device (shapes, no "
                              "values); compute them on the CPU or a real device")
        if value.dtype == torch.bool or value.is_complex():
            raise DtypeError(f"hindsight reward_fn: expected real numbers, got a {value.dtype} tensor; return float "
                             f"rewards (successes as floats: flags.float())")
        try:  # a tensor that needs grad, of bfloat16, on another device: its values
            array = value.detach().to("cpu", torch.float32).numpy()
        except (RuntimeError, TypeError, NotImplementedError) as error:
            raise DtypeError(f"hindsight reward_fn: a {value.layout} tensor rlbuf cannot read ({error}); return a "
                             f"dense float tensor or array") from None
    else:
        try:  # a list of numbers, or of tensors that numpy reads one by one (not those that need grad)
            array = np.asarray(value)
        except (ValueError, TypeError, RuntimeError) as error:
            raise DtypeError(f"hindsight reward_fn: expected {rows} rewards as an array or a tensor, got a "
                             f"{type(value).__name__} numpy cannot read as one ({error}); return an array or a "
                             f"tensor") from None
    if array.dtype.kind not in "iuf":
        raise DtypeError(f"hindsight reward_fn: expected real numbers, got {array.dtype}; return float rewards "
                         f"(successes as floats: flags.astype(np.float32))")
    if array.shape not in ((rows,), (rows, 1)):
        raise ShapeError(f"hindsight reward_fn: expected {rows} rewards (shape ({rows},)), got shape {array.shape}; "
                         "it is called with [B, *goal_shape] goals and must be vectorised over B")
    array = array.reshape(rows)
    if not np.isfinite(array).all():  # NaN or inf as returned, before the cast (which turns 1e300 into inf)
        bad = array[~np.isfinite(array)][0]
        raise NonFiniteError(f"hindsight reward_fn: expected finite rewards, got {bad} "
                             f"(of {int((~np.isfinite(array)).sum())} non-finite)")
    _REWARD.check_range(array)  # the stored reward column's check: overflow of float32 is a DtypeError
    return torch.from_numpy(array.astype(np.float32))


def _not_continued(env: int) -> StreamError:
    return StreamError(f"hindsight: env {env}'s obs is not the next_obs of its previous row, whose episode had not "
                       "ended: a hindsight buffer needs each env's steps in order, none left out inside an episode "
                       "(leave out only the reset steps of gymnasium's NEXT_STEP autoreset; rlbuf.gym.Recorder does); "
                       "envs reset mid-episode or anew after a load: call buffer.truncate_episodes(), or "
                       "recorder.reset(), first")


def _same_rows(x: _Array, y: _Array) -> _Bools:
    """Per row, whether ``x`` and ``y`` hold the same values (NaN equals NaN)."""
    equal = x == y
    if x.dtype.kind == "f" and not equal.all():
        equal |= np.isnan(x) & np.isnan(y)
    same: _Bools = equal.all(axis=tuple(range(1, equal.ndim)))
    return same


def broken_link(env: _Ints, ended: _Bools, obs: Sequence[_Array], next_obs: Sequence[_Array]) -> tuple[int, int] | None:
    """The first rows ``(a, b)``, ``b`` the next row of ``a``'s env, ``a`` not ending its episode,
    where ``b``'s obs is not ``a``'s next_obs (each leaf, bit for bit; NaN continues NaN); rows in
    write order.

    Example:
        >>> broken_link(np.array([0, 0, 0]), np.zeros(3, np.bool_), [np.array([[0.0], [1.0], [3.0]])],
        ...             [np.array([[1.0], [2.0], [9.0]])])
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
        same &= _same_rows(leaf[b], next_leaf[a])
    bad = np.flatnonzero(~same)
    return None if len(bad) == 0 else (int(a[bad[0]]), int(b[bad[0]]))
