"""Each env's stream of rows in a replay ring: which row follows which, and where episodes end.

A compact replay buffer stores one observation per row (or, with frame stacks, one frame) and
no ``next_obs``: the next observation of a row is the observation of the next row *of the same
env*, found by following that env's stream. Rows of several envs interleave in the ring in any
order (an add may carry any subset of envs), so every row keeps links to its neighbours:

* a row is named by its *serial*, the number of rows written before it; it lives at position
  ``serial % capacity`` and is still stored while ``serial >= write_count - size``. Links hold
  serials, so a link to an overwritten row is recognised instead of followed.
* ``back``: the serials of the ``frame_stack - 1`` rows before it in the same env and episode
  (the older frames of its stack), oldest first; a slot before the episode start holds
  ``-1 - start`` (``start``: the serial of the episode's first row, whose frame pads the stack
  with ``padding_type="reset"``). Kept at write time, so a sample reads one row of links.
* ``next``: the serial of the next row of the same env (-1 until it is added, or when the row
  ends its episode).
* ``env``: the env each row came from, the fact the links are derived from again when a
  checkpoint loads (see [`rlbuf._stream_check`][rlbuf._stream_check]).
* the observation that ends an episode (the real final observation, which the env replaced by a
  reset) is kept aside in ``FinalFrames``, one slot per stored row that ended an episode.

From these, ``Streams.walk`` finds for each sampled row the rows that make up its
transition: ``frame_stack - 1`` rows back (the older frames of its stack, padded at an episode
start) and up to ``n_step`` rows forward (the n-step return and the observation it bootstraps
from). A row is *complete* when all of them are still stored: one whose oldest frames were
overwritten, or whose next rows are not added yet (and whose episode has not ended), is not.

Adds are checked before anything is stored (``Streams.check``): a row's observation must
be the ``next_obs`` given with the previous row of its env unless that row ended the episode,
and a stack must be the previous one shifted by one frame (an episode's first stack: padded as
gymnasium's ``FrameStackObservation`` pads it). So what ``sample`` rebuilds is exactly what was
added.

Example:
    >>> import numpy as np, torch
    >>> streams = Streams(4, 1, (1,), torch.float32, frame_stack=1, padding_type="reset", n_step=1,
    ...                   storing_device=torch.device("cpu"))
    >>> obs, next_obs = np.array([[0.0], [1.0]], np.float32), np.array([[1.0], [2.0]], np.float32)
    >>> env, no = np.zeros(2, np.int64), np.zeros(2, np.bool_)
    >>> streams.check(obs, next_obs, env, no, no)
    >>> streams.record(env, 0, next_obs, no, no, write_count=2, size=2)
    >>> chain = streams.walk(np.array([0, 1]), write_count=2, size=2)
    >>> chain.complete.tolist()                   # row 1 waits for the row after it
    [True, False]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch

from rlbuf._final_frames import FinalFrames
from rlbuf.errors import StreamError

PaddingType = Literal["reset", "zero"]
# What a check finds first: an obs that does not continue its env's stream, a next_obs stack that is not
# obs shifted by one frame, an episode's first stack not padded as it should (rlbuf._streams_numba's codes too).
CONTINUITY, SHIFT, PADDING = 1, 2, 3
REPEATED = -1  # the compiled kernels' answer to an env with two rows in one call: the numpy path takes them
# Observations compared as bytes by the compiled check: equal bytes are equal values (floats are not: -0.0).
_BYTE_EXACT = frozenset((torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool))


_Ints = npt.NDArray[np.int64]
_Bools = npt.NDArray[np.bool_]


_ONE_TRUE = np.ones(1, np.bool_)  # one row that ends its episode (read only)


@dataclass(frozen=True, slots=True)
class Chain:
    """The rows that make up the transitions of some sampled rows (see ``Streams.walk``).

    Attributes:
        complete: every row needed is stored ``[B]``.
        rows: positions ``[B, frame_stack + n_step]``: the stack of the sampled row (oldest
            first, the sampled row at ``frame_stack - 1``), then the rows after it.
        padded: slots of ``rows`` before the episode start ``[B, frame_stack + n_step]``.
        steps: ``m``, the steps to the observation the transition bootstraps from ``[B]``.
        terminated: the episode ended by termination within those steps ``[B]``; truncated: by
            truncation (either way ``next_obs`` is a final observation, see ``ended``).
        final_slot: where the final observation is kept, for ended rows (else -1) ``[B]``.
    """

    complete: _Bools
    rows: _Ints
    padded: _Bools
    steps: _Ints
    terminated: _Bools
    truncated: _Bools
    final_slot: _Ints

    @property
    def ended(self) -> _Bools:
        """The episode ended within the steps (``next_obs`` is a final observation) ``[B]``."""
        return self.terminated | self.truncated

    def merge(self, where: _Bools, other: Chain) -> None:
        """Replace the entries at ``where`` by those of ``other`` (walked for those rows only)."""
        for name in Chain.__slots__:
            getattr(self, name)[where] = getattr(other, name)


class Streams:
    """Per-env stream bookkeeping of a ring of ``capacity`` rows (see the module docstring).

    Args:
        capacity: rows in the ring.
        num_envs: envs whose rows are added.
        obs_shape: one observation as added (with the stack dim first when ``frame_stack > 1``).
        obs_dtype: the stored observation dtype.
        frame_stack: frames per observation (1: observations are not stacks).
        padding_type: how an episode's first stack is padded: ``"reset"`` repeats its first
            frame, ``"zero"`` uses zeros (gymnasium's ``FrameStackObservation`` options).
        n_step: rows a transition spans at most.
        storing_device: where final observations are kept.
        names: what errors call the observations and next observations followed.
    """

    def __init__(self, capacity: int, num_envs: int, obs_shape: tuple[int, ...], obs_dtype: torch.dtype, *,
                 frame_stack: int, padding_type: PaddingType, n_step: int, storing_device: torch.device,
                 names: tuple[str, str] = ("obs", "next_obs")) -> None:
        self.capacity = capacity
        self.num_envs = num_envs
        self.names = names  # of the followed observation and its next one, in messages: obs["image"] ...
        self.frame_stack = frame_stack
        self.padding_type = padding_type
        self.n_step = n_step
        self.back = np.full((capacity, frame_stack - 1), -1, np.int64)
        # Rows of packed tables (changed in place, never rebound), which the compiled record takes as three
        # arguments instead of eight. ``env``: a fact the links are derived from (checked at load).
        self._links = np.full((3, capacity), -1, np.int64)
        self.next, self.final_slot, self.env = self._links
        self._flags = np.zeros((2, capacity), np.bool_)
        self.terminated, self.truncated = self._flags
        # Per env: the serial of its newest row while that row's episode is open (else -1), and
        # the next_obs given with it, which the env's next observation must equal.
        self._per_env = np.full((2, num_envs), -1, np.int64)
        self.last, self._released = self._per_env
        self.expected = torch.zeros((num_envs, *obs_shape), dtype=obs_dtype)
        # numpy views of it (a load copies into it in place): the checks read them, ``record`` writes them.
        self._expected = self.expected.numpy()
        self._expected_bytes = as_words(self._expected, 0)
        frame_shape = obs_shape[1:] if frame_stack > 1 else obs_shape
        self._frame_bytes = math.prod(frame_shape) * obs_dtype.itemsize if frame_stack > 1 else 0
        self._expected_words = as_words(self._expected, self._frame_bytes)
        self._word = self._expected_words.dtype
        self._words_per_frame = self._frame_bytes // self._word.itemsize if self._frame_bytes else self._expected_words.shape[1]
        self._byte_exact = obs_dtype in _BYTE_EXACT
        # numba types no float16 rows: the kernels take them as uint16 (compared and copied as bytes all the same).
        self._untyped = obs_dtype == torch.float16
        self._zero_pad = padding_type == "zero"
        self.finals: Any = FinalFrames(frame_shape, obs_dtype, storing_device)  # or a compressed layout's
        # numba is imported with the first compact buffer, not with rlbuf; its kernels are loaded here.
        from rlbuf._streams_numba import loaded

        rows = self._expected.view(np.uint16) if self._untyped else self._expected  # an add's rows' type
        (self._check_steps, self._record_steps, self._walk_rows, self._build_stacks,
         self._nstep_targets) = loaded(rows, self._expected_words, self._expected_bytes, self.back)

    # -- writing -----------------------------------------------------------------------------
    def check(self, obs: np.ndarray[Any, Any], next_obs: np.ndarray[Any, Any], env_ids: _Ints, terminated: _Bools,
              truncated: _Bools) -> None:
        """Raise ``StreamError`` unless rows ``obs``/``next_obs`` continue their envs' streams.

        Rows (numpy, ``[n, *obs_shape]`` of the stored dtype) are in the order they happened;
        ``env_ids`` may repeat (several steps of one env). Changes nothing.
        """
        if self._checked_compiled(obs, next_obs, env_ids):
            return
        ended = terminated | truncated
        previous = _previous_in_call(env_ids, self.num_envs)
        first = previous < 0
        inherited = first & (self.last[env_ids] >= 0)
        following = ~first
        following[following] = ~ended[previous[following]]
        starts = ~(inherited | following)
        continued = ((np.flatnonzero(inherited), self._expected, env_ids), (np.flatnonzero(following), next_obs,
                                                                             previous))
        for rows, source, at in continued:
            if rows.size:
                bad = differs(obs[rows], source[at[rows]])
                if bad.any():
                    raise self._stream_error(CONTINUITY, int(env_ids[rows[bad.argmax()]]))
        if self.frame_stack == 1:
            return
        shifted = differs(next_obs[:, :-1], obs[:, 1:])
        if shifted.any():
            raise self._stream_error(SHIFT, int(env_ids[shifted.argmax()]))
        rows = np.flatnonzero(starts)
        if rows.size:
            stacks = obs[rows]
            first_frames = stacks[:, :-1]
            pad = np.broadcast_to(stacks[:, -1:], first_frames.shape) if self.padding_type == "reset" else np.zeros_like(
                first_frames)
            bad = differs(first_frames, pad)
            if bad.any():
                raise self._stream_error(PADDING, int(env_ids[rows[bad.argmax()]]))

    def _checked_compiled(self, obs: np.ndarray[Any, Any], next_obs: np.ndarray[Any, Any], env_ids: _Ints) -> bool:
        """``check`` of one step of each env, compiled, by bytes: True once checked (or raises), False where it
        does not apply (an env with two rows: the kernel declines) or cannot decide (float rows whose bytes differ:
        -0.0, NaNs; the numpy path compares values)."""
        if not (obs.flags.c_contiguous and next_obs.flags.c_contiguous):
            return False
        if self._untyped:
            obs, next_obs = obs.view(np.uint16), next_obs.view(np.uint16)
        problem, env = self._check_steps(obs, next_obs, self._expected_words, env_ids, self.last, self._words_per_frame,
                                         self._zero_pad)
        if problem > 0 and self._byte_exact:
            raise self._stream_error(problem, int(env))
        return not problem

    def _stream_error(self, problem: int, env: int) -> StreamError:
        """The error of what a check found first (``CONTINUITY``, ``SHIFT`` or ``PADDING``) at ``env``."""
        if problem == CONTINUITY:
            # compact=False is refused with frame stacks or n-step returns: offered only where it would build.
            plain = self.n_step == 1 and self.frame_stack == 1
            return StreamError(
                f"{self.names[0]}: env {env}'s observation differs from the {self.names[1]} added with its previous step, whose "
                "episode did not end; a buffer that stores next_obs once follows each env's stream: mark the end of every "
                "episode with terminated or truncated (resumed with envs reset anew: call buffer.truncate_episodes(), "
                "or recorder.reset(), first)" + (", or build it with compact=False" if plain else ""))
        if problem == SHIFT:
            # CleanRL's loop adds every step of NEXT_STEP envs: their reset step (a final stack, then a reset one) lands here.
            return StreamError(f"{self.names[1]}: env {env}'s stack is not {self.names[0]} shifted by one frame (frame_stack="
                               f"{self.frame_stack}, newest frame last), as gymnasium's FrameStackObservation gives: "
                               f"expected {self.names[1]}[:-1] == {self.names[0]}[1:]; if env {env}'s previous step ended "
                               "its episode, this is the reset step of gymnasium's NEXT_STEP autoreset (make_vec's "
                               "default), no transition: record with rlbuf.gym.Recorder, which leaves it out, or pass "
                               "env_mask=~(previous terminated | truncated)")
        what = "its first frame" if self.padding_type == "reset" else "zeros"
        return StreamError(f"{self.names[0]}: env {env} starts an episode (its previous step ended one, or it is its first "
                           f"step here), expected the older frames of its stack to be {what} "
                           f"(padding_type={self.padding_type!r}), got other frames (after clear(), each env's next "
                           "step starts an episode: reset the envs when you clear the buffer)")

    def record(self, env_ids: _Ints, first_serial: int, next_obs: np.ndarray[Any, Any], terminated: _Bools,
               truncated: _Bools, *, write_count: int, size: int) -> None:
        """Note rows of serials ``first_serial, first_serial + 1, ...``, already written and checked
        (``next_obs``: numpy rows of the stored dtype)."""
        oldest = write_count - size
        if next_obs.flags.c_contiguous:  # compiled, unless the kernel declines (not one step of each env)
            freed, ends = self._record_steps(env_ids, first_serial, terminated, truncated, oldest, self.back,
                                             self._links, self._flags, self._per_env,
                                             next_obs.view(np.uint16) if self._untyped else next_obs,
                                             self._expected_bytes)
            if freed > 0:  # the final-frame slots of overwritten rows (distinct envs: at most one slot each)
                self.finals.release(self._released[:freed])
            if ends:
                self._keep_finals(first_serial, next_obs, terminated | truncated, oldest)
            if freed != REPEATED:
                return
        ended = terminated | truncated
        newest = self._record_rows(env_ids, first_serial, ended, oldest, terminated, truncated)
        if ended.any():
            self._keep_finals(first_serial, next_obs, ended, oldest)
        # numpy copies: a tensor's indexed assignment costs ~50x more per 84x84 stack on the CPU.
        self._expected[env_ids[newest]] = next_obs[newest]

    def _keep_finals(self, first_serial: int, next_obs: np.ndarray[Any, Any], ended: _Bools, oldest: int) -> None:
        """Keep the final observation (its newest frame) of each stored row that ended an episode."""
        ending = np.flatnonzero(ended & (first_serial + np.arange(len(ended)) >= oldest))
        if ending.size:  # the newest frames copied alone, not the stacks first (28 KB each on Atari)
            frames = next_obs[ending, -1] if self.frame_stack > 1 else next_obs[ending]
            self.final_slot[(first_serial + ending) % self.capacity] = self.finals.put(frames)

    def _record_rows(self, env_ids: _Ints, first_serial: int, ended: _Bools, oldest: int, terminated: _Bools,
                     truncated: _Bools) -> _Ints:
        """``record``'s table updates for rows of which several may belong to one env (an ``extend``
        of ``[num_envs, T]``); returns the index of each env's newest row."""
        serials = first_serial + np.arange(len(env_ids), dtype=np.int64)
        kept = np.flatnonzero(serials >= oldest)
        previous = _previous_in_call(env_ids, self.num_envs)
        links = np.where(previous >= 0, serials[np.maximum(previous, 0)], self.last[env_ids])
        links[(previous >= 0) & ended[np.maximum(previous, 0)]] = -1
        positions = serials[kept] % self.capacity
        released = self.final_slot[positions]
        self.finals.release(released[released >= 0])
        self.next[positions] = -1
        self.terminated[positions] = terminated[kept]
        self.truncated[positions] = truncated[kept]
        self.final_slot[positions] = -1
        self.env[positions] = env_ids[kept]
        stored_links = links[kept]
        linked = stored_links >= oldest
        self.next[stored_links[linked] % self.capacity] = serials[kept][linked]
        if self.frame_stack > 1:
            self._record_back(serials, links, kept, previous, oldest)
        newest = _last_in_call(env_ids, self.num_envs)
        self.last[env_ids[newest]] = np.where(ended[newest], -1, serials[newest])
        return newest

    def _record_back(self, serials: _Ints, links: _Ints, kept: _Ints, previous: _Ints, oldest: int) -> None:
        """Fill ``back`` of the kept rows, a row after the one it links to (rows of one env come in rounds)."""
        rounds = np.zeros(len(serials), np.int64)
        for row in np.flatnonzero(previous >= 0).tolist():
            rounds[row] = rounds[previous[row]] + 1
        for round_ in range(int(rounds[kept].max()) + 1 if kept.size else 0):
            rows = kept[rounds[kept] == round_]
            own, link = serials[rows], links[rows]
            back = np.empty((len(rows), self.frame_stack - 1), np.int64)
            start = link < 0
            back[start] = (-1 - own[start])[:, None]
            gone = ~start & (link < oldest)  # the row before is overwritten: this one can never be complete
            back[gone] = link[gone][:, None]
            live = ~(start | gone)
            back[live, :-1] = self.back[link[live] % self.capacity, 1:]
            back[live, -1] = link[live]
            self.back[own % self.capacity] = back

    def cut(self, env_ids: _Ints, oldest: int) -> _Ints:
        """End the open episode of each of ``env_ids`` at its newest row, as a time limit would: the row
        is marked truncated and its ``next_obs`` (the stack its env's next step had to continue) is kept
        as the final observation. Returns the storage positions of the rows marked (an episode whose
        newest row is overwritten only ends). Each env's next step then starts an episode.
        """
        marked = []
        for env in env_ids.tolist():
            serial = int(self.last[env])
            if serial < 0:
                continue
            self.last[env] = -1
            if serial >= oldest:
                position = serial % self.capacity
                self.truncated[position] = True
                self._keep_finals(serial, self._expected[env:env + 1], _ONE_TRUE, oldest)
                marked.append(position)
        return np.array(marked, np.int64)

    def clear(self) -> None:
        """Forget every row and every open episode."""
        self.back.fill(-1)
        self.next.fill(-1)
        self.terminated.fill(False)
        self.truncated.fill(False)
        self.final_slot.fill(-1)
        self.env.fill(-1)
        self.last.fill(-1)
        self.finals.clear()

    # -- reading -----------------------------------------------------------------------------
    def walk(self, positions: _Ints, *, write_count: int, size: int) -> Chain:
        """The rows making up the transitions of the rows at ``positions`` (see ``Chain``; compiled:
        ``rlbuf._streams_numba.walk_rows``)."""
        count, width = len(positions), self.frame_stack + self.n_step
        chain = Chain(np.zeros(count, np.bool_), np.empty((count, width), np.int64), np.zeros((count, width), np.bool_),
                      np.zeros(count, np.int64), np.zeros(count, np.bool_), np.zeros(count, np.bool_),
                      np.full(count, -1, np.int64))
        self._walk_rows(np.ascontiguousarray(positions, np.int64), write_count - size, self.n_step, self.back, self.next,
                  self.terminated, self.truncated, self.final_slot, chain.rows, chain.padded, chain.steps,
                  chain.terminated, chain.truncated, chain.final_slot, chain.complete)
        return chain

    def stacks(self, frame_shape: tuple[int, ...], chain: Chain,
               gather: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``obs`` and ``next_obs`` of complete transitions, rebuilt from stored frames.

        Args:
            frame_shape: one stored frame.
            chain: the walk of the sampled rows (all complete).
            gather: ``gather(positions) -> frames`` reading the ring at a 1-D position array.
        """
        stack, n_step = self.frame_stack, self.n_step
        count = len(chain.steps)
        next_rows = chain.rows[:, n_step:n_step + stack]
        next_padded = chain.padded[:, n_step:n_step + stack]
        short = np.flatnonzero(chain.steps < n_step)  # episodes that ended within the n steps
        if short.size:
            offsets = chain.steps[short, None] + np.arange(stack)
            next_rows, next_padded = next_rows.copy(), next_padded.copy()
            next_rows[short] = np.take_along_axis(chain.rows[short], offsets, axis=1)
            next_padded[short] = np.take_along_axis(chain.padded[short], offsets, axis=1)
        both = gather(np.concatenate((chain.rows[:, :stack].reshape(-1), next_rows.reshape(-1))))
        both = both.view(2, count, *((stack,) if stack > 1 else ()), *frame_shape)
        obs, next_obs = both[0], both[1]
        ended = np.flatnonzero(chain.ended)
        # On the CPU through numpy views: a tensor's indexed assignment costs ~10-50x more per frame.
        obs_view: Any = obs.numpy() if obs.is_cpu else obs
        next_view: Any = next_obs.numpy() if obs.is_cpu else next_obs
        if ended.size:
            kept = self.finals.take(chain.final_slot[ended])
            final: Any = kept.numpy() if obs.is_cpu else kept.to(next_obs.device)
            at = ended if obs.is_cpu else torch.from_numpy(ended).to(next_obs.device)
            if stack > 1:
                next_view[at, -1] = final
            else:
                next_view[at] = final
        if self.padding_type == "zero" and stack > 1:
            for view, padded in ((obs_view, chain.padded[:, :stack]), (next_view, next_padded)):
                view[padded if obs.is_cpu else torch.from_numpy(padded).to(obs.device)] = 0
        return obs, next_obs

    def stacks_from(self, frames: np.ndarray[Any, Any], chain: Chain) -> tuple[torch.Tensor, torch.Tensor]:
        """``stacks`` of frames held in a CPU array (``[capacity, *frame]``, the ring's numpy view, with the
        final observations kept on the CPU: a CPU storage's, not a compressed layout's), copied once, by the
        compiled ``build_stacks``, straight into the batch.

        Example:
            >>> streams = Streams(4, 1, (2, 1), torch.uint8, frame_stack=2, padding_type="reset", n_step=1,
            ...                   storing_device=torch.device("cpu"))
            >>> frames = np.arange(4, dtype=np.uint8).reshape(4, 1)
            >>> chain = Chain(np.ones(1, np.bool_), np.array([[1, 2, 3]]), np.zeros((1, 3), np.bool_),
            ...               np.ones(1, np.int64), np.zeros(1, np.bool_), np.zeros(1, np.bool_), np.full(1, -1))
            >>> obs, next_obs = streams.stacks_from(frames, chain)
            >>> obs[0, :, 0].tolist(), next_obs[0, :, 0].tolist()
            ([1, 2], [2, 3])
        """
        finals = self.finals.frames
        count, stack = len(chain.steps), self.frame_stack
        obs = torch.empty((count, *((stack,) if stack > 1 else ()), *frames.shape[1:]), dtype=self.expected.dtype)
        next_obs = torch.empty_like(obs)
        stored = self._frame_words(frames)
        self._build_stacks(stored, self._frame_words(finals.numpy()), chain.rows, chain.padded, chain.steps,
                           chain.ended, chain.final_slot, self._zero_pad,
                           self._frame_words(obs.numpy()).reshape(count, stack, stored.shape[1]),
                           self._frame_words(next_obs.numpy()).reshape(count, stack, stored.shape[1]))
        return obs, next_obs

    def nstep_from(self, rewards: np.ndarray[Any, Any], chain: Chain, powers: np.ndarray[Any, Any]
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """The n-step ``reward`` and ``discount`` of complete transitions (as [`rlbuf._nstep`][rlbuf._nstep]
        gives them), read along the walk from the stored ``rewards`` (a CPU array, one per row), compiled:
        ``nstep_targets``. ``powers[i]``: ``gamma**i`` for ``i <= n_step``."""
        count = len(chain.steps)
        reward, discount = np.empty(count, np.float32), np.empty(count, np.float32)
        self._nstep_targets(chain.rows, self.frame_stack - 1, chain.steps, chain.terminated,
                            rewards.reshape(len(rewards)), powers, reward, discount)
        return torch.from_numpy(reward), torch.from_numpy(discount)

    def _frame_words(self, frames: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """C-contiguous ``[n, ..., *frame]`` as ``[n, words]`` of this stream's word type (no copy)."""
        return frames.reshape(len(frames), math.prod(frames.shape[1:])).view(np.uint8).view(self._word)

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Links, flags, envs, open episodes and final observations, as tensors (for checkpoints)."""
        return {
            "back": torch.from_numpy(self.back.copy()), "next": torch.from_numpy(self.next.copy()),
            "terminated": torch.from_numpy(self.terminated.copy()),
            "truncated": torch.from_numpy(self.truncated.copy()),
            "final_slot": torch.from_numpy(self.final_slot.copy()), "last": torch.from_numpy(self.last.copy()),
            "env": torch.from_numpy(self.env.copy()),
            "expected": self.expected.clone(), "finals": self.finals.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict`` checked by [`streams_problem`][rlbuf._stream_check.streams_problem].

        A state of rlbuf 0.2's first compact checkpoints holds no ``env`` table: rows load with
        env -1 (unknown), and only the links' own invariants were checked.
        """
        self.finals.load_state_dict(state["finals"])
        for name in ("back", "next", "terminated", "truncated", "final_slot", "last"):
            getattr(self, name)[:] = state[name].numpy()
        self.env[:] = state["env"].numpy() if "env" in state else -1
        self.expected.copy_(state["expected"])


def _previous_in_call(env_ids: _Ints, num_envs: int) -> _Ints:
    """For each row, the index of the previous row of the same env in this call, or -1."""
    if num_envs == 1:  # every row follows the one before (a one-env extend: no sort)
        return np.arange(-1, len(env_ids) - 1, dtype=np.int64)
    previous = np.full(len(env_ids), -1, np.int64)
    if _distinct(env_ids, num_envs):
        return previous
    order = np.argsort(env_ids, kind="stable")   # each env's rows together, in call order
    same_env = env_ids[order[1:]] == env_ids[order[:-1]]
    previous[order[1:][same_env]] = order[:-1][same_env]
    return previous


def _last_in_call(env_ids: _Ints, num_envs: int) -> _Ints:
    """Indices of the last row of each env present in this call."""
    if _distinct(env_ids, num_envs):
        return np.arange(len(env_ids), dtype=np.int64)
    if num_envs == 1:
        return np.array([len(env_ids) - 1], np.int64)
    reversed_first = np.unique(env_ids[::-1], return_index=True)[1]
    return np.sort(len(env_ids) - 1 - reversed_first)


def _distinct(env_ids: _Ints, num_envs: int) -> bool:
    """Whether no env has two rows in this call (one step of each env: every add); more rows than
    ``num_envs`` never are."""
    return len(env_ids) <= 1 or (len(env_ids) <= num_envs and len(set(env_ids.tolist())) == len(env_ids))


def differs(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> npt.NDArray[np.bool_]:
    """Per row, whether ``a`` and ``b`` differ anywhere (NaN equals NaN: a stored NaN rebuilds as NaN).

    A memcmp-speed ``array_equal`` first, for the common case (every stack continues).

    Example:
        >>> differs(np.array([[1, 2], [3, 4]]), np.array([[1, 2], [3, 5]])).tolist()
        [False, True]
    """
    if np.array_equal(a, b):
        return np.zeros(len(a), np.bool_)
    same = (a == b) | (np.isnan(a) & np.isnan(b)) if a.dtype.kind == "f" else a == b
    return ~same.reshape(len(a), -1).all(axis=1)  # type: ignore[no-any-return]


def as_words(rows: np.ndarray[Any, Any], frame: int) -> np.ndarray[Any, Any]:
    """``[n, ...]`` C-contiguous rows as ``[n, words]``, without a copy: 8-byte words where rows and
    frames of ``frame`` bytes split into them (an 84×84 frame does), else bytes (the compiled kernels' input).

    Example:
        >>> as_words(np.zeros((2, 4, 84, 84), np.uint8), 84 * 84).shape
        (2, 3528)
        >>> as_words(np.zeros((2, 3), np.int16), 0).shape
        (2, 6)
    """
    flat = rows.reshape(len(rows), math.prod(rows.shape[1:])).view(np.uint8)
    words = flat.shape[1] % 8 == 0 and frame % 8 == 0
    return flat.view(np.uint64) if words else flat
