"""The writing half of [`ReplayBuffer`][rlbuf.ReplayBuffer]: ``add`` and ``extend``, with the checks of a step.

``add`` takes the plain layout's fast path (the fields straight to the ring) or the general one
(a [`Transition`][rlbuf.Transition], ``env_mask``, extras, hidden states, dict observations, the
compact layout). Both refuse a step without ``truncated``, warn once for the reset step of
gymnasium's ``NEXT_STEP`` autoreset ([`ResetSteps`][rlbuf._autoreset.ResetSteps]) and add the fix to
a refused shape when the buffer was built from a vector env's batched space.

Example:
    >>> import torch
    >>> from rlbuf import ReplayBuffer
    >>> buf = ReplayBuffer(10, obs_shape=(2,), action_shape=(), num_envs=2)
    >>> buf.add(torch.zeros(2, 2), torch.zeros(2), torch.ones(2), torch.ones(2, 2), torch.tensor([False, True]),
    ...         truncated=False)
    >>> len(buf)
    2
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from rlbuf._autoreset import ResetSteps, truncated_missing
from rlbuf._buffer import RingBuffer
from rlbuf._hints import done_order_hint, sb3_order_hint
from rlbuf._keywords import check_extras
from rlbuf._obs import Layout, check_hidden_state
from rlbuf._replay_layout import ReplayWriter, env_major
from rlbuf.batches import ReplayBatch, Transition
from rlbuf.errors import ConfigError, DtypeError, MissingFieldError, ShapeError
from rlbuf.spec import FieldSpec


class ReplayWriting(RingBuffer[ReplayBatch]):
    """``add`` and ``extend`` of [`ReplayBuffer`][rlbuf.ReplayBuffer] (which sets the attributes below); not used
    directly."""

    _plain: bool
    _writer: ReplayWriter
    _resets: ResetSteps | None
    _no_truncation: bool | np.ndarray[Any, Any]
    _extra_specs: dict[str, FieldSpec]
    _hidden: Layout | None
    _interleaved: bool
    _own_rows = 0  # the write count add and extend account for: more rows were written through buffer.torchrl
    # Each env's newest stored row, by write serial (-1: not known), for truncate_episodes; None: the last add
    # stored one row of every env, so each env's newest row is among the last num_envs rows.
    _newest: np.ndarray[Any, Any] | None = None
    _flag_at: tuple[int, int]  # where the ring's last read holds terminated and truncated
    _mask_unchecked = True  # no env_mask has left out a row ending an episode yet (warned once)

    def add(
        self,
        obs: Any = None,
        action: Any = None,
        reward: Any = None,
        next_obs: Any = None,
        terminated: Any = None,
        truncated: Any = None,
        hidden_state: Any = None,
        *,
        env_mask: Any = None,
        metrics: Mapping[str, Any] | None = None,
        **extras: Any,
    ) -> None:
        """Store one env step: ``num_envs`` transitions (the env dim may be omitted if 1).

        Accepts torch tensors (CPU or the storing device), numpy arrays and, for a single
        env, Python numbers. Values are converted to the stored dtype when the conversion
        stays within its kind (float64 → float32 is fine, float → uint8 is refused).

        Args:
            obs: observations ``[num_envs, *obs_shape]``; or a [`Transition`][rlbuf.Transition].
            action: actions ``[num_envs, *action_shape]``.
            reward: rewards ``[num_envs]``, finite.
            next_obs: observations after the step (the final observation for a truncated
                episode, not the reset one).
            terminated: the MDP ended the episode (no bootstrap) ``[num_envs]`` bool.
            truncated: a time limit cut the episode ``[num_envs]`` bool, required: ``False`` (for
                every env) without time limit. A timeout is not a death: CleanRL's ``done`` is not ``terminated``.
            hidden_state: the policy's hidden state the action was computed from, if the buffer
                stores one (``[num_envs, *shape]``, a dict for ``{"h": ..., "c": ...}``).
            env_mask: ``[num_envs]`` bools: store only the rows of these envs (e.g. leave out
                the reset steps of gymnasium's ``NEXT_STEP`` autoreset; [`Recorder`][rlbuf.gym.Recorder]
                does it for you). Every row is still validated; the stats skip the others.
            metrics: per-step values for the buffer's [`EpisodeStats`][rlbuf.EpisodeStats]
                (``{name: [num_envs] values}``, every metric it declares), summed or kept per episode.
            **extras: one value per declared extra field.

        Raises:
            ShapeError, DtypeError, DeviceError, NonFiniteError, MissingFieldError: before
                anything is stored.

        Warns:
            NextStepResetWarning: once per buffer, before anything is stored, for the reset step of
                gymnasium's ``NEXT_STEP`` autoreset (an env whose previous stored row ended and whose
                ``obs`` is that row's ``next_obs``); see [Gymnasium](gymnasium.md).

        Example:
            >>> import torch
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(10, obs_shape=(3,), action_shape=(), num_envs=2, seed=0)
            >>> buf.add(obs=torch.zeros(2, 3), action=torch.zeros(2), reward=torch.ones(2),
            ...         next_obs=torch.zeros(2, 3), terminated=torch.tensor([False, True]),
            ...         truncated=torch.tensor([False, False]))
            >>> len(buf)
            2
        """
        if isinstance(obs, TensorDictBase) and action is None and reward is None and next_obs is None:
            raise MissingFieldError("add: got a TensorDict in place of obs and nothing else; extend(td) stores a "
                                    "TensorDict of rows (TorchRL keys; ObjectRL's add(td) and add_batch(td))")
        try:
            if self._ring.rb._rlbuf_read_only:  # the flag read inline: 0.3 us of a 10 us add for the call
                self._require_writable("add")
            if truncated is False:
                truncated = self._no_truncation
            if env_mask is not None:  # checked once: [num_envs] numpy bools from here on
                env_mask = self._writer.checked_env_mask(env_mask)
                if np.count_nonzero(env_mask) == self._num_envs:  # (a third of the time of env_mask.all())
                    env_mask = None  # the add without a mask and its fast paths (9x faster for one env of frame stacks)
            if (self._plain and truncated is not None and not extras and hidden_state is None and env_mask is None
                    and metrics is None and not isinstance(obs, Transition)):
                # The plain layout (decided once, in the constructor): the fields go to the ring's add as given.
                # Statistics checked first and recorded once the rows are stored: a refusal changes neither.
                # Under the ring's (re-entrant) lock throughout: the flags read back and the statistics are this
                # add's, whatever other threads add or extend meanwhile.
                ring = self._ring
                lock = ring.lock
                lock.acquire()  # not ``with``: 0.3 us of a 10 us add
                try:
                    record = None if self._stats is None else self._planned_stats(reward, terminated, truncated)
                    resets = self._resets
                    warned = resets is not None and resets.watching and resets.check(
                        obs, resets.read_step(reward, terminated, truncated), None)
                    ring.add((obs, action, reward, next_obs, terminated, truncated), self._num_envs)
                    self._own_rows += self._num_envs
                    self._newest = None
                    if warned:
                        self._resets = resets = None  # warned of an add that stored: once per buffer
                    if resets is not None:
                        # The step's flags as stored: when no episode ends, two reads of Python bools (one env).
                        ended, cut = ring.last_read[4], ring.last_read[5]
                        if resets.watching or ended is True or cut is True or (ended is not False and ended.any()) or (
                                cut is not False and cut.any()):
                            resets.record(ended, cut, next_obs, None)
                    if record is not None:
                        record()
                finally:
                    lock.release()
                return
            self._add(obs, action, reward, next_obs, terminated, truncated, hidden_state, env_mask, extras, metrics)
        except (ShapeError, DtypeError) as error:
            hint = sb3_order_hint(obs, action, str(error)) or done_order_hint(obs, next_obs, terminated)
            if hint:
                raise type(error)(f"{error}{hint}") from None
            raise

    def _fed_by_recorder(self) -> None:
        """A [`Recorder`][rlbuf.gym.Recorder] feeds this buffer and leaves NEXT_STEP's reset steps out
        itself: the reset-step heuristic is off (it takes an episode that ends in its start state
        with no reward, an idle Breakout truncated, for a reset step)."""
        self._resets = None

    def truncate_episodes(self, env_mask: Any = None) -> None:
        """End each env's running episode at its newest stored step, as a time limit would: after you
        reset envs yourself mid-episode (``envs.reset()``, a crashed worker started again).

        That step's ``truncated`` flag is set (its ``next_obs`` stays: a target bootstraps from it) and
        the env's next step starts an episode: the buffer then holds what it would hold had that step
        been added with ``truncated=True``. A buffer that follows each env's stream (the compact
        layout, ``hindsight``) needs this call before that step, and refuses the step otherwise
        (``StreamError``); in a buffer of whole transitions, sequences (``sample_sequences``) no
        longer cross the reset. (A buffer of whole transitions knows each env's newest row from its
        adds and extends, not from a checkpoint of adds that left rows out with ``env_mask``, nor from
        an ``extend`` of several envs' ``(envs, T)`` batch into a one-env buffer: after those, its rows
        stay as they are until each env adds again.) The running episodes leave the statistics
        unrecorded (no episode ended), as gymnasium's ``RecordEpisodeStatistics`` leaves them.
        [`Recorder.reset`][rlbuf.gym.Recorder.reset] calls it for you.

        Args:
            env_mask: ``[num_envs]`` bools: the envs reset (``None``: all). An env whose episode ended
                with its last step is left as it is.

        Raises:
            ShapeError: ``env_mask`` is not one bool per env (nothing changes).

        Example:
            >>> import torch
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(8, obs_shape=(1,), action_shape=(), n_step=2, seed=0)
            >>> buf.add(torch.zeros(1), 0.0, 1.0, torch.ones(1), False, truncated=False)
            >>> buf.truncate_episodes()                 # the env was reset: its next obs starts anew
            >>> buf.add(torch.full((1,), 5.0), 0.0, 1.0, torch.full((1,), 6.0), False, truncated=False)
            >>> buf.sample_all().truncated.tolist()
            [True]
        """
        self._require_writable("truncate_episodes")
        envs = np.arange(self._num_envs) if env_mask is None else np.flatnonzero(self._writer.checked_env_mask(env_mask))
        with self._ring.lock:
            if self._writer.compact is not None:
                self._writer.compact.cut(envs)
            elif self._writer.relabeller is not None:
                self._writer.relabeller.cut(envs)
            else:
                self._cut_newest_rows(envs)
            if self._stats is not None:
                self._stats.reset(envs.tolist())
            if self._resets is not None:
                self._resets.clear()  # what it knew of each env's previous row is no longer what is stored

    def _cut_newest_rows(self, envs: np.ndarray[Any, Any]) -> None:
        """``truncate_episodes`` of a buffer of whole transitions: the newest stored row of each of ``envs`` that
        ended no episode is marked truncated (rows not known to be an env's newest are left as they are)."""
        ring = self._ring
        self._rows_interleaved()  # rows written through buffer.torchrl: each env's newest row unknown
        with ring.rewriting("truncate_episodes"):
            count, size, n = ring.write_count, len(ring), self._num_envs
            newest = (count - n + np.arange(n) if self._newest is None else self._newest)[envs]
            positions = newest[newest >= count - size] % ring.capacity
            flags = ring.gather(torch.from_numpy(positions), ["terminated", "truncated"])
            running = ~(flags["terminated"] | flags["truncated"]).cpu().numpy()
            ring.mark_truncated(positions[running])

    def _set_interleaved(self, interleaved: bool) -> None:
        """Whether each env's rows are ``num_envs`` apart (built, cleared, loaded): then each env's newest row is
        known; else not (a loaded buffer's masked adds)."""
        self._interleaved = interleaved
        self._own_rows = self._ring.write_count
        self._newest = None if interleaved else np.full(self._num_envs, -1, np.int64)

    def _rows_interleaved(self) -> bool:
        """Whether each env's rows are ``num_envs`` apart: written a whole step at a time, by add and extend only.
        Rows written through ``buffer.torchrl`` (here or in a worker process) are in an order of their own."""
        if self._num_envs > 1 and self._interleaved and self._ring.write_count != self._own_rows:
            self._set_interleaved(False)
        return self._interleaved

    def _newest_after_add(self, stored: np.ndarray[Any, Any] | None) -> None:
        """Each env's newest row after an add that stored the rows of the envs in ``stored`` (all: ``None``)."""
        if stored is None or stored.all():
            self._newest = None
            return
        n, kept = self._num_envs, np.flatnonzero(stored)
        count = self._ring.write_count
        newest = count - len(kept) - n + np.arange(n) if self._newest is None else self._newest.copy()
        newest[kept] = count - len(kept) + np.arange(len(kept))
        self._newest = newest

    def _newest_after_extend(self, lead: tuple[int, ...], interleaved: bool) -> None:
        """Each env's newest row after an ``extend`` of a ``lead`` batch (``[num_envs, T]``: env by env)."""
        n, count = self._num_envs, self._ring.write_count
        if not math.prod(lead):
            return
        if env_major(lead, n):  # env by env, as the writer reads it
            steps = math.prod(lead) // n
            self._newest = count - n * steps + np.arange(n) * steps + steps - 1
        else:
            self._newest = None if interleaved else np.full(n, -1, np.int64)

    def _add(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any,
             hidden_state: Any, env_mask: Any, extras: dict[str, Any], metrics: Mapping[str, Any] | None) -> None:
        """``add`` of every layout but the plain one (a Transition, env_mask, extras, dict observations ...)."""
        if isinstance(obs, Transition):
            if any(v is not None for v in (action, reward, next_obs, terminated, truncated)) or extras:
                raise ConfigError("add: pass either a Transition or the fields, not both")
            obs, action, reward, next_obs, terminated, truncated, given = obs
            extras = dict(given or {})
            hidden_state = extras.pop("hidden_state", None)
        if len(extras) != len(self._extra_specs) or (extras and extras.keys() != self._extra_specs.keys()):
            check_extras(self._extra_specs, extras)  # first: done= gets its own answer
        if truncated is None:
            raise truncated_missing()
        if truncated is False:
            truncated = self._no_truncation
        check_hidden_state(self._hidden, hidden_state)
        with self._ring.lock:  # this add's flags read back, whatever other threads write (see add)
            record = self._planned_stats(reward, terminated, truncated, env_mask=env_mask, metrics=metrics)
            resets = self._resets
            stored = None if resets is None else env_mask  # checked by add: numpy bools that leave some env out
            # The step read once for both checks, where one runs.
            step = None if resets is None or not (resets.watching or (stored is not None and self._mask_unchecked)) \
                else resets.read_step(reward, terminated, truncated)
            warned = resets is not None and resets.watching and resets.check(obs, step, stored)
            mask_warned = (resets is not None and not warned and stored is not None and self._mask_unchecked
                           and resets.check_mask(step, stored))
            interleaved = self._writer.add(obs, action, reward, next_obs, terminated, truncated, hidden_state, extras,
                                           env_mask)
            self._interleaved = self._interleaved and interleaved
            self._own_rows += self._num_envs if env_mask is None else int(env_mask.sum())
            self._newest_after_add(env_mask)
            # Each warning is given once per buffer, once an add it was given for has stored: a refused add
            # leaves the watch as it was.
            if warned:
                self._resets = resets = None
            self._mask_unchecked = self._mask_unchecked and not mask_warned
            if resets is not None:
                resets.forget_left_out()
            if resets is not None and (stored is None or stored.any()):
                read = self._ring.last_read
                resets.record(read[self._flag_at[0]], read[self._flag_at[1]], next_obs, stored)
            if record is not None:
                record()

    def _check_extend(self, td: TensorDictBase) -> None:
        """Every check ``extend`` makes of ``td`` but a compact layout's streams'; nothing stored (a Ray shard's,
        before its rate limiter holds the batch)."""
        self._require_writable("extend")
        self._writer.check_extend(td, per_env=self._stats is not None)

    def extend(self, td: TensorDictBase) -> None:
        """Store a TensorDict in TorchRL layout, e.g. a collector's ``[num_envs, T]`` batch.

        Reads ``"observation"``, ``"action"``, ``("next", "observation")``,
        ``("next", "reward")``, ``("next", "terminated")`` and ``("next", "truncated")``
        (derived as ``done & ~terminated`` when absent; refused when ``("next", "done")`` is absent
        too) plus the extra fields; every batch dim is flattened, row-major. Other keys are ignored.

        Raises:
            MissingFieldError, ShapeError, DtypeError, DeviceError, NonFiniteError: before
                anything is stored (``ShapeError`` too for a plain dict: wrap it in a TensorDict).

        Example:
            >>> from tensordict import TensorDict
            >>> import torch
            >>> from rlbuf import ReplayBuffer
            >>> td = TensorDict({"observation": torch.zeros(2, 5, 3), "action": torch.zeros(2, 5),
            ...                  "next": {"observation": torch.zeros(2, 5, 3), "reward": torch.ones(2, 5, 1),
            ...                           "terminated": torch.zeros(2, 5, 1, dtype=torch.bool),
            ...                           "truncated": torch.zeros(2, 5, 1, dtype=torch.bool)}}, batch_size=[2, 5])
            >>> buf = ReplayBuffer(100, obs_shape=(3,), action_shape=(), seed=0)
            >>> buf.extend(td)
            >>> len(buf)
            10
        """
        self._require_writable("extend")
        stats = self._stats
        with self._ring.lock:  # one step of statistics and of the reset-step watcher at a time (see add)
            if stats is None:
                interleaved = self._writer.extend(td, per_env=False)
            else:
                with stats.restored_on_error():  # statistics fed before the rows are stored, undone if refused
                    interleaved = self._writer.extend(td, per_env=True, before_write=lambda tensors: (
                        self._feed_stats_from_rollout(tensors["reward"], tensors["terminated"], tensors["truncated"])))
            if self._resets is not None:
                self._resets.clear()  # stored: the last row of each env is a collector's now
            self._interleaved = self._interleaved and interleaved
            self._own_rows += int(td.batch_size.numel())
            self._newest_after_extend(tuple(td.batch_size), interleaved)

