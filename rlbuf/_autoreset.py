"""The reset step of gymnasium's ``NEXT_STEP`` autoreset, recognised at ``ReplayBuffer.add``.

With ``NEXT_STEP`` (``gym.make_vec``'s default), the step after an episode's end resets the env:
a loop that adds every step stores a row from the final observation to the reset one, with
reward 0 and no flag, a transition the env never made. Such a row is an env whose previous
stored row ended an episode and whose ``obs`` now equals that row's ``next_obs``.
[`ResetSteps`][rlbuf._autoreset.ResetSteps] remembers, per env, whether its last stored row
ended and, only then, that row's ``next_obs``; the next add of that env compares. It warns
([`NextStepResetWarning`][rlbuf.errors.NextStepResetWarning]) before anything is stored, once per
buffer, and then stops watching: an add refused by a warnings filter (``"error"``) stores nothing.

Example:
    >>> import warnings
    >>> import torch
    >>> from rlbuf import NextStepResetWarning, ReplayBuffer
    >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=())
    >>> buf.add(torch.zeros(1), 0.0, 1.0, torch.ones(1), terminated=True, truncated=False)  # the episode ends
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     buf.add(torch.ones(1), 0.0, 0.0, torch.full((1,), 5.0), terminated=False, truncated=False)  # reset
    >>> [type(warning.message).__name__ for warning in caught]
    ['NextStepResetWarning']
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from rlbuf._compact import CompactLayout
from rlbuf._obs import Layout
from rlbuf._ring import RowRing
from rlbuf.errors import MissingFieldError, NextStepResetWarning, RlbufError
from rlbuf.spec import FieldSpec, NotStaged, RowReader


def _rows(value: Any) -> np.ndarray[Any, Any]:
    """Rows read by a ring's reader (a Python bool, a numpy array or a tensor) as a flat numpy array."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy().reshape(-1)
    return np.asarray(value).reshape(-1)


def _read(reader: RowReader, value: Any) -> np.ndarray[Any, Any]:
    """``value`` read and checked by ``reader``, as numpy rows ``[rows, *shape]`` (copied only off the CPU)."""
    try:
        rows = reader.read(value)
    except NotStaged:  # a tensor on the storing device
        rows = reader.tensor(value).cpu().numpy()
    return np.asarray(rows).reshape(reader.row_shape)


class ResetSteps:
    """Per env: did its last stored row end an episode, and that row's ``next_obs`` (see the module).

    Args:
        obs: the specs of the observation's leaves, as ``add`` takes them (a stack with ``frame_stack``).
        next_obs: the specs of ``next_obs``'s leaves.
        split: one add's ``obs`` or ``next_obs`` as its leaves, in spec order.
        step: the specs of ``reward``, ``terminated`` and ``truncated``: a reset step has reward 0 and no flag.
        num_envs: rows per add.
        devices: where a tensor may be (the ring's accepted devices).
    """

    def __init__(self, obs: Sequence[FieldSpec], next_obs: Sequence[FieldSpec], split: Callable[[str, Any], list[Any]],
                 step: Sequence[FieldSpec], *, num_envs: int, devices: tuple[torch.device, ...]) -> None:
        self._obs = [RowReader(spec, num_envs, devices) for spec in obs]
        self._step = [RowReader(spec, num_envs, devices) for spec in step]
        self._next_obs = [RowReader(spec, num_envs, devices) for spec in next_obs]
        self._split = split
        self._num_envs = num_envs
        self.watching = False  # whether some env's last stored row ended an episode
        self._ended = np.zeros(num_envs, np.bool_)
        self._all_envs = np.arange(num_envs)
        self._final: list[np.ndarray[Any, Any]] | None = None  # per leaf, [num_envs, *shape], read where ended
        # Episode starts seen after a stored end, and how many of them from that end's next_obs (committed by
        # record, once the add stored), and this add's.
        self._starts, self._pending = (0, 0), (0, 0)
        self._left_out: np.ndarray[Any, Any] | None = None  # envs whose reset step this add leaves out (check)

    def clear(self) -> None:
        """Forget every env's last row (the buffer was cleared, loaded or extended)."""
        self.watching = False
        self._ended[:] = False
        self._left_out = None

    def read_step(self, reward: Any, terminated: Any, truncated: Any) -> list[np.ndarray[Any, Any]] | None:
        """An add's ``reward``, ``terminated`` and ``truncated`` read by their readers, as flat numpy rows (the flags
        as bools), for ``check`` and ``check_mask``; ``None`` where a reader refuses one (so will the add)."""
        try:
            reward_rows, ended, cut = (_read(reader, value).reshape(-1) for reader, value in
                                       zip(self._step, (reward, terminated, truncated), strict=True))
        except RlbufError:
            return None
        return [reward_rows, ended.astype(bool), cut.astype(bool)]

    def check(self, obs: Any, step: list[np.ndarray[Any, Any]] | None, stored: np.ndarray[Any, Any] | None) -> bool:
        """Before an add: warn if an env stored now (``stored``: all when ``None``) resets as ``NEXT_STEP`` does:
        its ``obs`` is its last row's ``next_obs``, with reward 0 and no flag (``step``: ``read_step``'s), as
        gymnasium gives the reset step;
        or, where no env does, if every episode start after a stored end so far (``_SYSTEMATIC`` at least)
        came from that end's ``next_obs``: those rows stored the reset observation as their ``next_obs``
        (``SAME_STEP`` without ``info["final_obs"]``).

        A watched env whose row looks so but is left out by ``env_mask`` had its reset step left out, as
        the docs say to: once the add is stored (``forget_left_out``) it is watched no more, so its
        next step, from the reset observation, is not taken for a reset step where that observation
        equals the final one (Breakout after a life loss).

        Returns:
            Whether it warned (the buffer then stops watching; a warning made an error raises here).
        """
        self._left_out, self._pending = None, (0, 0)
        if not self._ended.any() or self._final is None or step is None:
            return False
        try:
            leaves = [_read(reader, value) for reader, value in zip(self._obs, self._split("obs", obs), strict=True)]
        except RlbufError:
            return False  # the add refuses it, by the same reader
        equal = self._ended.copy()  # obs is the next_obs of the env's last row, which ended
        rows = [(leaf.reshape(self._num_envs, -1), final.reshape(self._num_envs, -1))
                for leaf, final in zip(leaves, self._final, strict=True)]
        for env in np.flatnonzero(equal).tolist():  # only those rows: most envs' did not end
            equal[env] = all(_same_row(given[env], final[env]) for given, final in rows)
        same = equal & (step[0] == 0) & ~step[1] & ~step[2]
        if stored is not None:
            self._left_out = same & ~stored
            same &= stored
            equal &= stored
        if not same.any():  # real steps after an end: from the stored next_obs at every end, that was a reset obs
            starts = self._ended if stored is None else self._ended & stored
            self._pending = (int(starts.sum()), int(equal.sum()))
            seen, matched = self._starts[0] + self._pending[0], self._starts[1] + self._pending[1]
            return matched >= _SYSTEMATIC and matched == seen and _warn_first(equal, lambda env: (
                f"add: env {env}'s obs is the next_obs of its previous row, which ended an episode, as at every one of "
                f"the {seen} episode ends so far: that next_obs was the new episode's first observation, not the final "
                f"one of the ended episode. With gymnasium's "
                f"SAME_STEP autoreset, next_obs of an ended env is already the reset observation: store "
                f"info['final_obs'] there (next_obs[i] = info['final_obs'][i] where info['_final_obs'][i]), or "
                f"collect with rlbuf.gym.Recorder, which does. (An env whose reset observation can equal its final "
                f"one, as Atari's after a life loss, or a loop that ends an episode and goes on without a reset, looks "
                f"the same: ignore this warning there.) Warned once per buffer"))
        return _warn_first(same, lambda env: (
            f"add: env {env}'s obs is the next_obs of its previous row, which ended an episode, with reward 0 and no "
            f"flag: this is the reset step of gymnasium's NEXT_STEP autoreset (make_vec's default), a final "
            f"observation followed by a reset one, which is no transition of the env. Collect with "
            f"rlbuf.gym.Recorder, which leaves those steps out, or pass env_mask=~(prev_terminated | prev_truncated), "
            f"the flags of the step BEFORE this one. (An env that can end an episode in the very state it restarts "
            f"from, with no reward, looks the same: ignore this warning there.) Warned once per buffer"))

    def check_mask(self, step: list[np.ndarray[Any, Any]] | None, kept: np.ndarray[Any, Any]) -> bool:
        """Before an add with ``env_mask``: warn if the mask leaves out a row that ends an episode (``step``:
        ``read_step``'s).

        The reset steps of ``NEXT_STEP`` carry no flag; a row left out with ``terminated`` or
        ``truncated`` set is the last real transition of its episode, most often dropped by a mask
        built from this step's flags instead of the previous step's.

        Returns:
            Whether it warned (a warning made an error raises here, before anything is stored).
        """
        if step is None:
            return False  # the add refuses it, by the same reader
        flags = step[1:]
        return _warn_first(~kept & (flags[0] | flags[1]), lambda env: (
            f"add: env_mask leaves out env {env}'s row, which ends an episode (terminated or truncated): that row is "
            f"a real transition, the last of its episode. The NEXT_STEP reset steps to leave out come one step "
            f"later: env_mask=~(prev_terminated | prev_truncated), the flags of the PREVIOUS step "
            f"(rlbuf.gym.Recorder does this for you). Warned once per buffer"))

    def forget_left_out(self) -> None:
        """After an add stored: stop watching the envs whose reset step it left out (see ``check``)."""
        if self._left_out is not None:
            self._ended &= ~self._left_out
            self.watching = bool(self._ended.any())
            self._left_out = None

    def record(self, terminated: Any, truncated: Any, next_obs: Any, stored: np.ndarray[Any, Any] | None) -> None:
        """After an add: remember which envs stored now ended (their flags as the ring read them, for the
        envs in ``stored``), and their ``next_obs``."""
        self._starts = (self._starts[0] + self._pending[0], self._starts[1] + self._pending[1])
        self._pending = (0, 0)
        if terminated is False and truncated is False and stored is None:  # one env whose episode goes on
            self._ended[0] = self.watching = False
            return
        ended = _rows(terminated) | _rows(truncated)
        ending = bool(ended.any())
        if stored is None:
            self._ended = ended  # a new array: its own
            envs = self._all_envs
            self.watching = ending
        else:
            envs = np.flatnonzero(stored)
            self._ended[envs] = ended
            self.watching = ending or bool(self._ended.any())
        if not ending:
            return
        leaves = [_read(reader, value) for reader, value in zip(self._next_obs, self._split("next_obs", next_obs),
                                                                strict=True)]
        if self._final is None:
            self._final = [np.zeros((self._num_envs, *reader.spec.shape), reader.spec.np_dtype) for reader in self._next_obs]
        for leaf, final in zip(leaves, self._final, strict=True):
            final[envs[ended]] = leaf[envs[ended]]


def _same_row(row: np.ndarray[Any, Any], final: np.ndarray[Any, Any]) -> bool:
    """Whether an obs row holds a kept ``next_obs`` row's values: integers and bools by their bytes (a memcmp of
    two copies, 1.5 µs for an 84×84×4 stack, against 8-13 µs for numpy's ``==`` and ``all``), floats by ``==``
    (NaN differs, ``-0.0`` equals ``0.0``).

    Example:
        >>> _same_row(np.array([1, 2], np.uint8), np.array([1, 2], np.uint8)), _same_row(np.array([-0.0]), np.zeros(1))
        (True, True)
    """
    if row.dtype == final.dtype and row.dtype.kind in "biu":
        return row.tobytes() == final.tobytes()
    return bool((row == final).all())


_SYSTEMATIC = 3
"""Episode ends after which a stored next_obs equal to every next start's obs is warned (once: a discrete env may
restart in the state it ended in)."""


def _warn_first(envs: np.ndarray[Any, Any], message: Callable[[int], str]) -> bool:
    """Warn ``message(env)`` for the first env flagged in ``envs``, at the line that called rlbuf; whether it did."""
    if not envs.any():
        return False
    level, frame = 2, inspect.currentframe()  # 1: this function; 2: its caller ...
    frame = frame.f_back if frame is not None else None
    while frame is not None and frame.f_globals.get("__name__", "").startswith("rlbuf."):
        level, frame = level + 1, frame.f_back
    warnings.warn(message(int(np.flatnonzero(envs)[0])), NextStepResetWarning, stacklevel=level)
    return True


def reset_steps(ring: RowRing, obs: Layout, compact: CompactLayout | None, num_envs: int) -> ResetSteps:
    """The [`ResetSteps`][rlbuf._autoreset.ResetSteps] of a replay buffer's layout (``obs`` and ``next_obs`` as
    ``add`` takes them: whole stacks with ``frame_stack``)."""
    if compact is not None:
        specs: tuple[list[FieldSpec], list[FieldSpec]] = ([compact.obs_spec], [compact.next_obs_spec])
    else:
        specs = (obs.specs("obs", "observation"), obs.specs("next_obs", ("next", "observation")))
    step = [ring.by_name[name] for name in ("reward", "terminated", "truncated")]
    return ResetSteps(*specs, obs.split, step, num_envs=num_envs, devices=ring.accepted_devices)


def truncated_missing() -> MissingFieldError:
    """The refusal of an ``add`` without ``truncated``, with the one-line fix.

    Example:
        >>> print(truncated_missing())
        truncated: required with every step: pass truncated=False for an env without time limit; with gymnasium, add(obs, action, reward, next_obs, terminated=terminations, truncated=truncations); CleanRL's done is not terminated (a timeout would count as a death)
    """
    return MissingFieldError("truncated: required with every step: pass truncated=False for an env without time "
                             "limit; with gymnasium, add(obs, action, reward, next_obs, terminated=terminations, "
                             "truncated=truncations); CleanRL's done is not terminated (a timeout would count as a "
                             "death)")
