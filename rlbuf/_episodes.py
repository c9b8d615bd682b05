"""Each env's episodes in a replay ring: which stored rows belong to the episode of a row.

Hindsight relabelling draws a goal from the same episode as the row it relabels: a later row
(``future``), any row (``episode``) or the last one (``final``). Rows of several envs
interleave in the ring in any order (an add may carry any subset of envs), so each row keeps
its env's *rank*: the number of rows of that env written before it. An env's rows of one
episode have consecutive ranks, so an episode is a rank range ``[first, last]`` of one env,
and ``slots[env, rank % width]`` is the ring position of any rank still stored. The ring
overwrites its oldest rows first, so an env's stored ranks are always one range
``[oldest[env], next_rank[env])``, and a row's later ranks are stored whenever it is.

Everything here derives from two stored facts per row, its env and whether it ended its
episode (``terminated | truncated``), taken in write order; a checkpoint holds the envs, and
[`EpisodeIndex.derive`][rlbuf._episodes.EpisodeIndex.derive] rebuilds the rest.

Example:
    >>> import numpy as np
    >>> index = EpisodeIndex(capacity=8, num_envs=2)
    >>> envs = np.array([0, 1, 0, 1, 0])                     # env 1 ends its episode on its 2nd row
    >>> index.record(np.arange(5), envs, np.array([False, False, False, True, False]))
    >>> index.episode_rows(np.array(1)).tolist(), index.episode_rows(np.array(0)).tolist()
    ([1, 3], [0, 2, 4])
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch

from rlbuf.errors import ShapeError

_Ints = npt.NDArray[np.int64]
_Bools = npt.NDArray[np.bool_]
Strategy = Literal["future", "final", "episode"]


def env_ids_of(lead: tuple[int, ...], num_envs: int, why: str) -> _Ints:
    """The env of each row of a TensorDict of batch size ``lead``, flattened row-major.

    ``(num_envs, T)`` (env first, as TorchRL collectors give) or, for one env, ``(T,)``.

    Raises:
        ShapeError: a batch size that does not tell envs apart (``why`` says who needs it).

    Example:
        >>> env_ids_of((2, 3), 2, "").tolist()
        [0, 0, 0, 1, 1, 1]
    """
    if len(lead) == 2 and lead[0] == num_envs:
        return np.repeat(np.arange(num_envs, dtype=np.int64), lead[1])
    if len(lead) == 1 and num_envs == 1:
        return np.zeros(lead[0], np.int64)
    raise ShapeError(f"td: {why}, so it needs batch size ({num_envs}, T) (env first, as TorchRL collectors give)"
                     f"{' or (T,)' if num_envs == 1 else ''}, got {lead}")


class EpisodeIndex:
    """The episode of every stored row: its env, its rank and the rank range of its episode.

    Args:
        capacity: rows of the ring.
        num_envs: envs whose rows are added.
    """

    def __init__(self, capacity: int, num_envs: int) -> None:
        self.capacity = capacity
        self.num_envs = num_envs
        self.clear()

    def clear(self) -> None:
        """Forget every row."""
        capacity, num_envs = self.capacity, self.num_envs
        self.env = np.full(capacity, -1, np.int64)    # per position; -1: nothing stored there
        self.rank = np.zeros(capacity, np.int64)
        self.first = np.zeros(capacity, np.int64)     # rank of its episode's first row (maybe overwritten)
        self.last = np.full(capacity, -1, np.int64)   # rank of its episode's last row; -1: still running
        self.next_rank = np.zeros(num_envs, np.int64)
        self.oldest = np.zeros(num_envs, np.int64)    # each env's oldest stored rank
        self.open_first = np.zeros(num_envs, np.int64)  # first rank of each env's running episode
        self.width = max(1, -(-capacity // num_envs))
        self.slots = np.zeros((num_envs, self.width), np.int64)

    @property
    def nbytes(self) -> int:
        """Bytes of the tables."""
        return sum(array.nbytes for array in (self.env, self.rank, self.first, self.last, self.slots))

    # -- writing -----------------------------------------------------------------------------
    def record(self, positions: _Ints, env_ids: _Ints, ended: _Bools, *, distinct: bool = False) -> None:
        """Index rows just written at ``positions`` (in write order) of envs ``env_ids``; ``ended``:
        each row ended its episode; ``distinct``: no env has two of the rows.

        More rows than the ring holds wrap it within one write: they are indexed a ring's worth at a
        time, so a row overwritten by a later row of the same write advances its env's oldest rank.
        """
        for start in range(0, len(positions), self.capacity):
            rows = slice(start, start + self.capacity)
            self._record_ring(positions[rows], env_ids[rows], ended[rows], distinct=distinct)

    def _record_ring(self, positions: _Ints, env_ids: _Ints, ended: _Bools, *, distinct: bool) -> None:
        """``record`` of at most ``capacity`` rows (at distinct positions)."""
        n = len(positions)
        if n == 0:
            return
        overwritten = self.env[positions]
        stored = overwritten >= 0
        if stored.any():
            np.maximum.at(self.oldest, overwritten[stored], self.rank[positions[stored]] + 1)
        if distinct:
            self._record_distinct(positions, env_ids, ended)
            return
        order = np.argsort(env_ids, kind="stable")
        env = env_ids[order]
        done = ended[order]
        where = positions[order]
        index = np.arange(n)
        starts_group = np.concatenate([[True], env[1:] != env[:-1]])
        rank = self.next_rank[env] + index - np.maximum.accumulate(np.where(starts_group, index, 0))
        # Where an episode starts: the env's running one at its first row, a new one after an ended row.
        begins = np.where(starts_group, self.open_first[env], np.where(np.concatenate([[False], done[:-1]]), rank, -1))
        first = begins[np.maximum.accumulate(np.where(begins >= 0, index, 0))]
        closing = np.minimum.accumulate(np.where(done, index, n)[::-1])[::-1]
        closes = (closing < n) & (env[np.minimum(closing, n - 1)] == env)
        last = np.where(closes, rank[np.minimum(closing, n - 1)], -1)
        counts = np.bincount(env, minlength=self.num_envs)
        self._fit(int((self.next_rank + counts - self.oldest).max()))
        # Stored rows of a running episode that ends in this write learn their last rank now.
        for group in np.flatnonzero(starts_group & closes):
            e = int(env[group])
            self.last[self._positions(e, max(int(self.open_first[e]), int(self.oldest[e])),
                                      int(self.next_rank[e]))] = last[group]
        self.slots[env, rank % self.width] = where
        self.env[where], self.rank[where], self.first[where], self.last[where] = env, rank, first, last
        ends_group = np.concatenate([starts_group[1:], [True]])
        self.open_first[env[ends_group]] = np.where(done[ends_group], rank[ends_group] + 1, first[ends_group])
        self.next_rank += counts

    def _record_distinct(self, positions: _Ints, env: _Ints, done: _Bools) -> None:
        """``record`` of rows of distinct envs (one step of a vector env): no sorting."""
        rank = self.next_rank[env]
        first = self.open_first[env]
        self._fit(int((rank - self.oldest[env]).max()) + 1)
        last = np.where(done, rank, -1)
        if done.any():  # the stored rows of the episodes that end here learn their last rank
            for e, r in zip(env[done].tolist(), rank[done].tolist(), strict=True):
                self.last[self._positions(e, max(int(self.open_first[e]), int(self.oldest[e])), r)] = r
        self.slots[env, rank % self.width] = positions
        self.env[positions], self.rank[positions], self.first[positions], self.last[positions] = env, rank, first, last
        self.open_first[env] = np.where(done, rank + 1, first)
        self.next_rank[env] = rank + 1

    def end_running(self, envs: _Ints) -> _Ints:
        """End the running episode of each of ``envs`` at its newest row (the rows stored learn their
        last rank); return the positions of the newest rows that were stored."""
        positions = self.running_rows(envs)
        for env in envs.tolist():
            newest, first = int(self.next_rank[env]) - 1, int(self.open_first[env])
            if first <= newest:
                if newest >= self.oldest[env]:
                    self.last[self._positions(env, max(first, int(self.oldest[env])), newest + 1)] = newest
                self.open_first[env] = newest + 1
        return positions

    def running_rows(self, envs: _Ints) -> _Ints:
        """Positions of the newest stored row of each of ``envs`` whose episode is still running."""
        newest = self.next_rank[envs] - 1
        running = (newest >= self.oldest[envs]) & (self.open_first[envs] <= newest)
        positions: _Ints = self.slots[envs[running], newest[running] % self.width]
        return positions

    def _positions(self, env: int, low: int, high: int) -> _Ints:
        """Ring positions of ranks ``[low, high)`` of ``env`` (all stored)."""
        positions: _Ints = self.slots[env, np.arange(low, high) % self.width]
        return positions

    def _fit(self, ranks: int) -> None:
        """Make room for ``ranks`` stored ranks of one env."""
        if ranks <= self.width:
            return
        width = min(max(ranks, 2 * self.width), self.capacity)
        slots = np.zeros((self.num_envs, width), np.int64)
        for e in range(self.num_envs):
            kept = np.arange(self.oldest[e], self.next_rank[e])
            slots[e, kept % width] = self.slots[e, kept % self.width]
        self.slots, self.width = slots, width

    # -- reading -----------------------------------------------------------------------------
    def _range(self, positions: _Ints) -> tuple[_Ints, _Ints, _Ints]:
        """Env, oldest stored rank and last rank (so far) of the episode of each row at ``positions``."""
        env = self.env[positions]
        last = self.last[positions]
        last = np.where(last >= 0, last, self.next_rank[env] - 1)
        return env, np.maximum(self.first[positions], self.oldest[env]), last

    def goal_rows(self, positions: _Ints, strategy: Strategy, uniform: npt.NDArray[np.float64]) -> _Ints:
        """For each row at ``positions``, a row of its episode: a later one (``future``, itself
        included), any stored one (``episode``) or the last so far (``final``), picked by
        ``uniform`` draws in ``[0, 1)``.

        Example:
            >>> index = EpisodeIndex(8, 1)
            >>> index.record(np.arange(4), np.zeros(4, np.int64), np.array([False, False, True, False]))
            >>> index.goal_rows(np.array([0, 1, 3]), "final", np.zeros(3)).tolist()
            [2, 2, 3]
        """
        env, oldest, last = self._range(positions)
        if strategy == "final":
            chosen = last
        else:
            low = self.rank[positions] if strategy == "future" else oldest
            chosen = low + np.minimum(np.floor(uniform * (last - low + 1)).astype(np.int64), last - low)
        return self.slots[env, chosen % self.width]

    def window(self, positions: _Ints, n_step: int) -> tuple[_Ints, _Ints]:
        """For each row at ``positions``, the positions ``[B, n_step]`` of it and the rows after it
        in its episode (the last one repeated past the episode's newest row), and how many
        there are (``m <= n_step``).

        Example:
            >>> index = EpisodeIndex(8, 1)
            >>> index.record(np.arange(4), np.zeros(4, np.int64), np.array([False, True, False, False]))
            >>> rows, steps = index.window(np.array([0, 2, 3]), 3)
            >>> rows.tolist(), steps.tolist()
            ([[0, 1, 1], [2, 3, 3], [3, 3, 3]], [2, 2, 1])
        """
        env, _, last = self._range(positions)
        rank = self.rank[positions]
        steps = np.minimum(last - rank + 1, n_step)
        ranks = rank[:, None] + np.minimum(np.arange(n_step), steps[:, None] - 1)
        rows: _Ints = self.slots[env[:, None], ranks % self.width]
        return rows, steps

    def episode_rows(self, position: npt.NDArray[np.int64]) -> _Ints:
        """Positions of the stored rows of the episode of the row at ``position``, in order."""
        env, oldest, last = self._range(np.atleast_1d(position))
        return self._positions(int(env[0]), int(oldest[0]), int(last[0]) + 1)

    # -- checkpoints -------------------------------------------------------------------------
    def state_dict(self, chronological: _Ints) -> dict[str, Any]:
        """The env of every stored row, in write order (``chronological``: their positions)."""
        return {"env": torch.from_numpy(self.env[chronological].copy())}

    def problem(self, env: Any, size: int) -> str:
        """What is wrong with a checkpoint's envs of ``size`` stored rows, or ``""``."""
        if not isinstance(env, torch.Tensor) or env.dtype != torch.int64 or tuple(env.shape) != (size,):
            return f"hindsight: episodes['env'] must be int64 of shape ({size},) (one per stored row), got {described(env)}"
        if size and (int(env.min()) < 0 or int(env.max()) >= self.num_envs):
            return f"hindsight: episodes['env'] holds envs outside [0, {self.num_envs}): {sorted(set(env.tolist()))[:8]}"
        return ""

    def derive(self, env: torch.Tensor, chronological: _Ints, ended: _Bools) -> None:
        """Rebuild every table from a checkpoint's envs (checked by ``problem``) and the stored
        rows' ended flags, both in write order."""
        self.clear()
        self.record(chronological, env.numpy().astype(np.int64), ended)


def described(value: Any) -> str:
    """A checkpoint value as a refusal names it: a tensor's dtype and shape, else its type."""
    return f"{value.dtype} {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
