"""Recorder: the real transitions of a vector env into a buffer, in every autoreset mode.

A vector env resets a finished episode by itself, and how it does so decides what one
``envs.step`` returns for that env (gymnasium 1.x, ``envs.metadata["autoreset_mode"]``):

* ``NEXT_STEP`` (gymnasium's default): the step that ends an episode returns its final
  observation; the *next* step ignores the action and returns a reset observation with
  reward 0. That reset step belongs to no episode: the Recorder never stores it.
* ``SAME_STEP``: the ending step already returns the reset observation; the final one is in
  ``info["final_obs"]`` (an object array, ``None`` for envs that did not end) with the mask
  ``info["_final_obs"]``. The Recorder stores the final observation as ``next_obs``.
* ``DISABLED``: nothing resets by itself; you reset the finished envs
  (``envs.reset(options={"reset_mask": ...})``) and pass the reset observation as the next
  ``obs``. Every step is real.

Stable-Baselines3 ``VecEnv``s and batched torch envs in the Isaac Lab style reset in the same
step: convert their flags with [`sb3_step`][rlbuf.gym.sb3_step] or
[`isaac_step`][rlbuf.gym.isaac_step] and build the Recorder with
``autoreset_mode="same_step"``.

Example:
    >>> import gymnasium as gym
    >>> import torch
    >>> from rlbuf import ReplayBuffer
    >>> from rlbuf.gym import Recorder
    >>> envs = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    >>> buffer = ReplayBuffer(1000, observation_space=envs.single_observation_space,
    ...                       action_space=envs.single_action_space, num_envs=2)
    >>> recorder = Recorder(envs, buffer)
    >>> obs, _ = envs.reset(seed=0)
    >>> for _ in range(100):
    ...     action = envs.action_space.sample()
    ...     next_obs, reward, terminated, truncated, info = envs.step(action)
    ...     recorder.record(obs, action, reward, next_obs, terminated, truncated, info)
    ...     obs = next_obs
    >>> len(buffer) == 200 - recorder.skipped   # NEXT_STEP's reset steps were left out
    True
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from tensordict import is_tensor_collection

from rlbuf._convert import MAX_DEPTH
from rlbuf._final_obs import rows_of, with_final_obs
from rlbuf._gym_seam import last_observations, pending_resets
from rlbuf._obs_trail import ObservationTrail, same_rows
from rlbuf.distill import DistillationBuffer
from rlbuf.errors import (
    ConfigError,
    DeviceError,
    DtypeError,
    MissingFieldError,
    NextStepResetWarning,
    ShapeError,
    StreamError,
)
from rlbuf.replay import ReplayBuffer
from rlbuf.rollout import RolloutBuffer
from rlbuf.spec import as_array, short_repr

Bootstrap = Callable[[Any], Any]
"""``bootstrap(final_obs) -> values``: V of the final observations of the truncated envs."""

# make_vec refuses vector_kwargs without vectorization_mode for envs that register their own vector
# env (CartPole-v1: "Custom vector environment can be passed arguments only through kwargs").
_SAME_STEP_HINT = ('build the envs with SAME_STEP autoreset: gymnasium.make_vec(env_id, num_envs, '
                   'vectorization_mode="sync", vector_kwargs={"autoreset_mode": '
                   'gymnasium.vector.AutoresetMode.SAME_STEP}) ("async" works too; without vectorization_mode, '
                   'CartPole-v1 and other envs with their own vector env refuse vector_kwargs), or '
                   'SyncVectorEnv(fns, autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP)')


class Recorder:
    """Stores exactly the real transitions of every env of ``envs`` into ``buffer``.

    Call ``record`` once per ``envs.step``. At an episode end the stored ``next_obs`` is
    the final observation, never a reset one; ``NEXT_STEP``'s reset steps are not stored.

    Args:
        envs: the vector env (its ``num_envs`` and ``metadata["autoreset_mode"]`` are read; for a
            buffer built from spaces, its ``single_observation_space`` is checked).
        buffer: a [`ReplayBuffer`][rlbuf.ReplayBuffer] (compact ones too: ``frame_stack``,
            ``n_step``), [`RolloutBuffer`][rlbuf.RolloutBuffer] or
            [`DistillationBuffer`][rlbuf.DistillationBuffer].
        bootstrap: for a ``RolloutBuffer``: ``bootstrap(final_obs) -> values``, V of the final
            observations of the envs truncated at a step (a batch of them, ``[k, *obs_shape]``;
            returns ``[k]`` or ``[k, 1]``), passed as ``bootstrap_value``.
        autoreset_mode: the envs' autoreset mode when ``envs.metadata`` does not say
            (``"same_step"`` for SB3 ``VecEnv``s and Isaac Lab-style envs).
        resetting: for a Recorder made while ``NEXT_STEP`` envs are mid-run: ``[num_envs]`` bools,
            the envs whose last step ended an episode (``terminated | truncated`` of that step),
            so that their next step, a reset step, is left out. Default: read from gymnasium's
            ``SyncVectorEnv`` and its own vector envs (``CartPole-v1``'s); none for other envs
            (``AsyncVectorEnv`` does not say: pass it there).

    Raises:
        ConfigError: an unknown mode or buffer, a ``RolloutBuffer`` with ``NEXT_STEP`` envs
            (a rollout is a fixed ``[num_steps, num_envs]`` grid: use ``SAME_STEP``), a
            ``num_envs`` that differs from the buffer's, or a buffer built from
            ``envs.observation_space`` (the batched space) instead of the single one.

    Example:
        >>> import gymnasium as gym
        >>> from rlbuf import RolloutBuffer
        >>> envs = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
        >>> buffer = RolloutBuffer(8, 2, observation_space=envs.single_observation_space,
        ...                        action_space=envs.single_action_space)
        >>> Recorder(envs, buffer)
        Traceback (most recent call last):
        ...
        rlbuf.errors.ConfigError: Recorder: a RolloutBuffer cannot take NEXT_STEP envs (their reset steps would be holes in the [num_steps, num_envs] rollout); build the envs with SAME_STEP autoreset: gymnasium.make_vec(env_id, num_envs, vectorization_mode="sync", vector_kwargs={"autoreset_mode": gymnasium.vector.AutoresetMode.SAME_STEP}) ("async" works too; without vectorization_mode, CartPole-v1 and other envs with their own vector env refuse vector_kwargs), or SyncVectorEnv(fns, autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP)
    """

    def __init__(self, envs: Any, buffer: ReplayBuffer | RolloutBuffer | DistillationBuffer, *,
                 bootstrap: Bootstrap | None = None, autoreset_mode: AutoresetMode | str | None = None,
                 resetting: Any = None) -> None:
        self.autoreset_mode = _mode(envs, autoreset_mode)
        if not isinstance(buffer, (ReplayBuffer, RolloutBuffer, DistillationBuffer)):
            raise ConfigError(f"buffer: expected a ReplayBuffer, RolloutBuffer or DistillationBuffer, "
                              f"got {type(buffer).__name__}")
        if isinstance(buffer, RolloutBuffer) and self.autoreset_mode is AutoresetMode.NEXT_STEP:
            raise ConfigError("Recorder: a RolloutBuffer cannot take NEXT_STEP envs (their reset steps would be "
                              f"holes in the [num_steps, num_envs] rollout); {_SAME_STEP_HINT}")
        if bootstrap is not None and not isinstance(buffer, RolloutBuffer):
            raise ConfigError(f"bootstrap: only a RolloutBuffer takes bootstrap values, not a {type(buffer).__name__}")
        num_envs = getattr(envs, "num_envs", None)
        if not isinstance(num_envs, int) or num_envs <= 0:
            raise ConfigError(f"envs: expected a vector env with a positive num_envs, got {num_envs!r}")
        if not isinstance(buffer, DistillationBuffer) and buffer.num_envs != num_envs:
            raise ConfigError(f"buffer: built for num_envs={buffer.num_envs}, the envs have {num_envs}; build it "
                              f"with num_envs={num_envs}")
        _check_obs_shape(envs, buffer)
        self.envs = envs
        self.buffer = buffer
        if isinstance(buffer, ReplayBuffer):
            buffer._fed_by_recorder()
        elif isinstance(buffer, RolloutBuffer):
            buffer._resets.stop()  # it stores no reset step: an env that restarts paying 0 is no false alarm
        self.bootstrap = bootstrap
        self.num_envs = num_envs
        self._resetting = self._pending(envs, resetting)
        # Read from the envs, not given: an envs.reset() before the first record makes them real steps (see
        # _real_first_steps), told apart by the observations the envs returned last.
        self._read_from_envs = self._resetting.copy() if resetting is None else np.zeros(num_envs, np.bool_)
        # What the envs returned last, where that is what the user saw (no vector wrapper changed it).
        unwrapped = envs is getattr(envs, "unwrapped", envs)
        self._last_seen = last_observations(envs) if self._read_from_envs.any() and unwrapped else None
        # Warned at the first record, not here: a recorder.reset() before it (after envs.reset()) answers it.
        self._unseen_reset_warning: str | None = None
        self._warning_of_read_envs = bool(self._read_from_envs.any() and self._last_seen is None)
        if self._warning_of_read_envs:
            self._unseen_reset_warning = (
                f"Recorder: envs {np.flatnonzero(self._read_from_envs).tolist()} were in NEXT_STEP's reset step when "
                f"the Recorder was made, and these envs do not show it an envs.reset() since: their first step is "
                f"left out as a reset step. If you called envs.reset() after making the Recorder, call "
                f"recorder.reset() too, before the first record")
        elif resetting is None and self._unknown_pending and len(buffer):
            self._unseen_reset_warning = (
                "Recorder: these NEXT_STEP envs do not say which of them are in their reset step (AsyncVectorEnv and "
                "other libraries' vector envs keep it to themselves), and the buffer holds rows already: if the envs "
                "ran before, pass resetting=terminated | truncated of their last step (else the reset step of each "
                "env that ended is stored as a transition); if you reset them since, call recorder.reset() before "
                f"the first record, or pass resetting=np.zeros({num_envs}, bool)")
        # What each env's next obs must be (the next_obs recorded last), and the envs whose next obs starts anew:
        # their last recorded step ended an episode, or recorder.reset() was told they were reset. A ReplayBuffer's
        # only: it stores both; the others store obs alone, which a loop may normalise and next_obs not.
        self._trail = ObservationTrail(buffer._obs, num_envs) if isinstance(buffer, ReplayBuffer) else None
        self._starting = np.ones(num_envs, np.bool_)
        self.skipped = 0
        """Reset steps (env rows) left out so far (``NEXT_STEP`` only)."""

    _unknown_pending = False  # NEXT_STEP envs that do not say which of them are in their reset step

    def _pending(self, envs: Any, resetting: Any) -> np.ndarray[Any, Any]:
        """The envs whose next step is a reset step, when the Recorder starts."""
        if resetting is not None:
            if self.autoreset_mode is not AutoresetMode.NEXT_STEP:
                raise ConfigError(f"resetting: only NEXT_STEP envs have reset steps; these are "
                                  f"{self.autoreset_mode.name} envs")
            return _flags("resetting", resetting, self.num_envs).copy()
        pending = pending_resets(envs) if self.autoreset_mode is AutoresetMode.NEXT_STEP else None
        self._unknown_pending = pending is None and self.autoreset_mode is AutoresetMode.NEXT_STEP
        return np.zeros(self.num_envs, np.bool_) if pending is None else pending

    def reset(self, env_mask: Any = None) -> None:
        """Forget pending ``NEXT_STEP`` reset steps after you reset the envs yourself (``envs.reset()``).

        Gymnasium's ``envs.reset()`` makes the next step a real one for every env it resets,
        including envs whose episode had just ended; tell the Recorder so it stores that step. A
        ``ReplayBuffer``'s running episodes of those envs end at their newest stored step, as a time
        limit would ([`truncate_episodes`][rlbuf.ReplayBuffer.truncate_episodes]). A ``RolloutBuffer``
        part-filled cannot end them so (that step would need its bootstrap value): the call is refused
        (``StreamError``) while one of those envs' episodes runs on in it.

        Args:
            env_mask: ``[num_envs]`` bools: the envs that were reset (``None``: all).

        Example:
            >>> import gymnasium as gym
            >>> from rlbuf import ReplayBuffer
            >>> envs = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
            >>> recorder = Recorder(envs, ReplayBuffer(100, obs_shape=(4,), action_shape=(),
            ...                                        action_dtype=torch.int64, num_envs=2))
            >>> obs, _ = envs.reset(seed=0)
            >>> recorder.reset()
        """
        reset = None if env_mask is None else _flags("env_mask", env_mask, self.num_envs)
        if isinstance(self.buffer, ReplayBuffer):
            self.buffer.truncate_episodes(reset)
        elif isinstance(self.buffer, RolloutBuffer) and 0 < (steps := self.buffer.steps) < self.buffer.num_steps:
            ended = self.buffer.view("done")[steps - 1].cpu().numpy()
            if (running := np.flatnonzero(~ended & (True if reset is None else reset))).size:
                raise StreamError(
                    f"reset: env {running[0]}'s episode runs on in the rollout (its step {steps - 1} ended nothing), "
                    f"and a rollout cannot end it afterwards: a time limit's step needs its bootstrap value, V of its "
                    f"final observation. Record the step before envs.reset() with truncated=True for the envs you "
                    f"reset (the Recorder then asks bootstrap for it), or reset the envs between rollouts")
        if reset is None:
            self._resetting[:] = False
            self._starting[:] = True
        else:
            self._resetting &= ~reset
            self._starting |= reset
        self._read_from_envs &= self._resetting
        if reset is None or (self._warning_of_read_envs and not self._read_from_envs.any()):
            self._unseen_reset_warning = None

    def record(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any = None,
               info: Mapping[str, Any] | None = None, **fields: Any) -> None:
        """Store the real transitions of one ``envs.step``.

        Args:
            obs: the observations the actions were taken from ``[num_envs, *obs_shape]``.
            action: the actions passed to ``envs.step``.
            reward: what ``envs.step`` returned: rewards ``[num_envs]``.
            next_obs: the observations ``envs.step`` returned.
            terminated: ``[num_envs]`` bools from ``envs.step``.
            truncated: ``[num_envs]`` bools from ``envs.step``.
            info: the info dict from ``envs.step`` (``SAME_STEP`` reads ``"final_obs"`` and
                ``"_final_obs"`` from it).
            **fields: the buffer's other fields, one row per env: ``value`` and ``log_prob``
                (RolloutBuffer), ``expert_action`` (DistillationBuffer; ``action`` when
                absent), extras.

        Every final observation is checked as a direct ``add`` checks a row (exact shape, dtype
        kind, range, a dict observation key by key) before anything is written or ``bootstrap``
        reads it; a refused call leaves the buffer, its statistics and the Recorder as they were.
        The Recorder follows every step of the envs, so record a refused step again (for a
        ``ReadOnlyError``: once the buffer is writable), or reset the envs (``envs.reset()``,
        then ``recorder.reset()``) before recording the next one.

        Raises:
            MissingFieldError: an env ended under ``SAME_STEP`` and ``info`` has no final
                observation for it, or a RolloutBuffer env was truncated without ``bootstrap``.
            ShapeError, DtypeError, DeviceError: a final observation (``info["final_obs"][env]``,
                or ``next_obs[env]`` for a RolloutBuffer's ``DISABLED`` envs) that the buffer's
                fields refuse, naming the env, what was expected and what was received; an
                ``info`` that is not a dict; flags that are not ``[num_envs]`` bools.
            ConfigError: ``info`` carries final observations although the envs are not ``SAME_STEP``
                ones (their ``next_obs`` would hold reset observations).
            StreamError: (a ``ReplayBuffer``'s) an env's ``obs`` is not the ``next_obs`` recorded with
                its previous step, whose episode did not end: the envs were reset without
                ``recorder.reset()``, or a step went unrecorded. Under ``NEXT_STEP``, an env in its
                reset step whose ``obs`` is not that step's final observation was reset: its step is
                stored, as a real one.
            RlbufError: whatever the buffer's ``add`` refuses (nothing is stored then).

        Example:
            >>> import numpy as np
            >>> from rlbuf import ReplayBuffer
            >>> class Envs:                   # two envs, SAME_STEP: env 1 ends at this step
            ...     num_envs, metadata = 2, {"autoreset_mode": "same_step"}
            >>> buffer = ReplayBuffer(10, obs_shape=(1,), action_shape=(), num_envs=2)
            >>> recorder = Recorder(Envs(), buffer)
            >>> final = np.empty(2, dtype=object)
            >>> final[1] = np.array([9.0])    # env 1's final observation; next_obs holds its reset one
            >>> recorder.record(np.zeros((2, 1)), np.zeros(2), np.ones(2), np.array([[1.0], [0.0]]),
            ...                 np.array([False, True]), np.array([False, False]),
            ...                 {"final_obs": final, "_final_obs": np.array([False, True])})
            >>> buffer.sample_all().next_obs.flatten().tolist()
            [1.0, 9.0]
        """
        n = self.num_envs
        if truncated is None:
            raise MissingFieldError("truncated: required: record(obs, action, reward, next_obs, terminated, truncated, "
                                    "info) takes what envs.step returned; CleanRL's done is not terminated (a timeout "
                                    "would count as a death)")
        if isinstance(truncated, (list, tuple)) and truncated and all(isinstance(i, Mapping) for i in truncated):
            raise MissingFieldError("truncated: got a list of info dicts where envs.step's truncations belong: an SB3 "
                                    "VecEnv's dones and infos? terminated, truncated, info = rlbuf.gym.sb3_step(dones, "
                                    "infos), then record(obs, action, reward, next_obs, terminated, truncated, info)")
        if isinstance(truncated, Mapping) and info is None:  # record(obs, action, reward, next_obs, terminated, info)
            raise MissingFieldError("truncated: got a dict where envs.step's truncations belong: was info passed in "
                                    "its place? record(obs, action, reward, next_obs, terminated, truncated, info)")
        info = self._checked_info(info)
        terminated_np, truncated_np = _flags("terminated", terminated, n), _flags("truncated", truncated, n)
        ended = terminated_np | truncated_np
        stored_next = next_obs if isinstance(self.buffer, DistillationBuffer) else self._final_observations(
            next_obs, ended, info)
        continues = None if self._trail is None else self._trail.continues(obs)  # True: every env's
        if continues is not None and continues is not True and (
                broken := ~(self._starting | self._resetting | continues)).any():
            raise StreamError(
                f"obs: env {int(broken.argmax())}'s observation is not the next_obs recorded with its previous step, "
                f"whose episode did not end: the envs were reset, or a step went unrecorded, without the Recorder "
                f"being told. After envs.reset(), call recorder.reset() (the buffer's running episodes then end as a "
                f"time limit would); record every envs.step, from the next_obs of the one before (both as the envs "
                f"gave them, or both normalised alike)")
        if self._unseen_reset_warning is not None:  # before anything is stored: a filter may make it an error
            warnings.warn(self._unseen_reset_warning, NextStepResetWarning, stacklevel=2)
        keep = None
        if self.autoreset_mode is AutoresetMode.NEXT_STEP and self._resetting.any():
            keep = ~self._resetting
            if continues is not None:  # a reset step starts from the final observation, and ends nothing
                keep |= ended if continues is True else ended | ~continues
            elif self._read_from_envs.any():
                keep |= self._read_from_envs & self._real_first_steps(obs, ended)
            if keep.all():
                keep = None
        buffer = self.buffer
        if isinstance(buffer, ReplayBuffer):
            buffer.add(obs, action, reward, stored_next, terminated, truncated, env_mask=keep, **fields)
        elif isinstance(buffer, RolloutBuffer):
            if truncated_np.any() and "bootstrap_value" not in fields:
                fields["bootstrap_value"] = self._bootstrap_values(stored_next, truncated_np, reward)
            buffer.add(obs, action, reward, terminated, truncated=truncated, **fields)
        else:
            expert_action = fields.pop("expert_action", action)
            # A DistillationBuffer takes batches of any size: the Recorder holds them to one row per env.
            select, kept = keep is not None, np.ones(n, np.bool_) if keep is None else keep
            rows = [_rows(value, kept, name, select=select)
                    for name, value in (("obs", obs), ("expert_action", expert_action), *fields.items())]
            if kept.any():
                buffer.add(*rows[:2], **dict(zip(fields, rows[2:], strict=True)))
        if self._trail is not None:
            self._trail.remember(next_obs)
        self._starting = ended.copy()  # an episode that ended continues nothing (SAME_STEP: whatever next_obs held)
        self._unseen_reset_warning = None
        if self.autoreset_mode is AutoresetMode.NEXT_STEP:
            self.skipped += 0 if keep is None else int((~keep).sum())
            self._resetting = ended
            self._read_from_envs[:] = False

    def _real_first_steps(self, obs: Any, ended: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Which envs the Recorder read as in their reset step took a real step at the first record, the envs
        having been reset since (``envs.reset()`` without ``recorder.reset()``). A reset step ends no episode,
        and its ``obs`` is the final observation the envs returned last: an episode end proves a real step, and
        so does another ``obs`` where the Recorder saw what the envs returned (a ``SyncVectorEnv`` with no vector
        wrapper; a reward proves nothing: reward wrappers shift a reset step's 0)."""
        n, seen = self.num_envs, self._last_seen
        given = as_array("obs", obs) if seen is not None and not isinstance(obs, Mapping) else None
        if given is None or seen is None or given.shape != seen.shape:
            return ended
        return np.asarray(ended | ~same_rows(given.reshape(n, -1), seen.reshape(n, -1)))

    def _checked_info(self, info: Any) -> Mapping[str, Any] | None:
        """``info`` once it is a mapping that agrees with the autoreset mode."""
        if info is None:
            return None
        if not isinstance(info, Mapping):
            raise ShapeError(f"info: expected the info dict of this envs.step (or None), got {type(info).__name__} "
                             f"{short_repr(info)}; SB3 VecEnvs return a list of infos: convert dones and infos "
                             f"with rlbuf.gym.sb3_step")
        if self.autoreset_mode is not AutoresetMode.SAME_STEP:
            key = next((k for k in ("final_obs", "final_observation") if k in info), None)
            if key is not None:
                raise ConfigError(f"info[{key!r}]: the Recorder was built for {self.autoreset_mode.name} envs, but "
                                  f"this step's info carries final observations, which only envs that reset in "
                                  f"the same step return: their next_obs holds reset observations and would be "
                                  f"stored as the ends of episodes; set envs.metadata['autoreset_mode'] to "
                                  f"'SameStep' (or, where it names no mode, pass autoreset_mode='same_step')")
        return info

    def _final_observations(self, next_obs: Any, ended: np.ndarray[Any, Any], info: Mapping[str, Any] | None) -> Any:
        """``next_obs`` with each ended env's row replaced by its checked final observation (SAME_STEP).

        Elsewhere ``next_obs`` holds the final observations itself: a ``ReplayBuffer``'s ``add``
        checks it, and for a ``RolloutBuffer`` (which stores no ``next_obs``) the ended envs'
        rows are checked here before ``bootstrap`` reads them.
        """
        if not ended.any():
            return next_obs
        if self.autoreset_mode is not AutoresetMode.SAME_STEP:
            if not isinstance(self.buffer, RolloutBuffer):
                return next_obs
            own = rows_of(self.buffer._obs, next_obs, self.num_envs)
            return with_final_obs(self.buffer._obs, next_obs, ended, own, self.num_envs, source="next_obs")
        final = None if info is None else info.get("final_obs")
        if info is None or final is None:
            env = int(np.flatnonzero(ended)[0])
            raise MissingFieldError(f"info['final_obs']: env {env} ended at this step but info holds no final "
                                    f"observation (SAME_STEP envs put it there; SB3 and Isaac-style envs: see "
                                    f"rlbuf.gym.sb3_step and rlbuf.gym.isaac_step)")
        has_final = _flags("info['_final_obs']", info.get("_final_obs", ended), self.num_envs)
        missing = ended & ~has_final
        if missing.any():
            raise MissingFieldError(f"info['final_obs']: envs {np.flatnonzero(missing).tolist()} ended at this step "
                                    f"but info['_final_obs'] marks no final observation for them")
        return with_final_obs(self.buffer._obs, next_obs, ended, final, self.num_envs)

    def _bootstrap_values(self, stored_next: Any, truncated: np.ndarray[Any, Any], reward: Any) -> Any:
        """``bootstrap_value`` for every env: V(final obs) where truncated, 0 elsewhere."""
        if self.bootstrap is None:
            raise MissingFieldError(f"bootstrap: envs {np.flatnonzero(truncated).tolist()} were truncated; pass "
                                    f"Recorder(..., bootstrap=lambda final_obs: critic(final_obs)) so the timeout "
                                    f"bootstraps from V(final observation) instead of counting as a death")
        rows = np.flatnonzero(truncated)
        final = _rows(stored_next, truncated, "next_obs")
        values = self.bootstrap(final)
        if isinstance(values, torch.Tensor):
            values = values.detach()
            _refuse_bools(values.dtype is torch.bool, values.dtype)
            if values.device.type == "meta":
                raise DeviceError("bootstrap: returned a tensor on the meta device (it holds no values)")
            if values.numel() != rows.size:
                raise ShapeError(f"bootstrap: expected {rows.size} values (one per truncated env), got shape "
                                 f"{tuple(values.shape)}")
            device = reward.device if isinstance(reward, torch.Tensor) else values.device
            out = torch.zeros(self.num_envs, dtype=torch.promote_types(values.dtype, torch.float32), device=device)
            out[torch.as_tensor(rows, device=device)] = values.reshape(-1).to(device)
            return out
        array = as_array("bootstrap", values).reshape(-1)
        _refuse_bools(array.dtype.kind == "b", array.dtype)
        if array.size != rows.size:
            raise ShapeError(f"bootstrap: expected {rows.size} values (one per truncated env), got {array.size}")
        out_np = np.zeros(self.num_envs, np.result_type(array.dtype, np.float32))
        out_np[rows] = array
        return out_np


def sb3_step(dones: Any, infos: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any],
                                                                     dict[str, Any]]:
    """An SB3 ``VecEnv`` step's ``dones, infos`` as gymnasium's ``terminated, truncated, info`` (SAME_STEP).

    SB3 resets a finished env in the same step, puts its final observation in
    ``infos[i]["terminal_observation"]`` and marks a time limit with
    ``infos[i]["TimeLimit.truncated"]``.

    Example:
        >>> import numpy as np
        >>> terminated, truncated, info = sb3_step(np.array([False, True]), [
        ...     {}, {"terminal_observation": np.array([9.0]), "TimeLimit.truncated": True}])
        >>> terminated.tolist(), truncated.tolist(), info["_final_obs"].tolist(), info["final_obs"][1].tolist()
        ([False, False], [False, True], [False, True], [9.0])
    """
    done = _flags("dones", dones, None)
    if not isinstance(infos, Sequence) or isinstance(infos, str | bytes) or len(infos) != done.size:
        got = f"{len(infos)} infos" if isinstance(infos, Sequence) else f"{type(infos).__name__} {short_repr(infos)}"
        raise ShapeError(f"infos: expected one info dict per env ({done.size}, as many as dones), got {got}; pass "
                         f"the dones and infos of one VecEnv.step")
    for i, info in enumerate(infos):
        if not isinstance(info, Mapping):
            raise ShapeError(f"infos[{i}]: expected the info dict of env {i}, got {type(info).__name__} "
                             f"{short_repr(info)}")
    truncated = np.zeros(done.size, np.bool_)
    final = np.empty(done.size, dtype=object)
    for i in np.flatnonzero(done).tolist():
        limit = infos[i].get("TimeLimit.truncated", False)
        if not isinstance(limit, bool | np.bool_):
            raise DtypeError(f"infos[{i}]['TimeLimit.truncated']: expected True or False, got {short_repr(limit)}")
        truncated[i] = limit
        final[i] = infos[i].get("terminal_observation")
    has_final = np.array([f is not None for f in final], dtype=np.bool_)
    return done & ~truncated, truncated, {"final_obs": final, "_final_obs": has_final}


def isaac_step(dones: torch.Tensor, extras: Mapping[str, Any], final_obs: torch.Tensor | None = None,
               ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """An Isaac Lab-style step (``dones``, ``extras["time_outs"]``) as ``terminated, truncated, info``.

    Such envs reset finished envs inside ``step`` and return tensors on their device. Pass
    ``final_obs`` (``[num_envs, *obs_shape]``, read where ``dones``) when the env exposes the
    observations before its reset; without it a truncation cannot bootstrap from its final
    observation and the Recorder refuses it. (rsl_rl approximates V(final obs) by V(obs before
    the step): ``final_obs=obs`` does the same, knowingly.)

    Example:
        >>> dones = torch.tensor([True, True])
        >>> terminated, truncated, info = isaac_step(dones, {"time_outs": torch.tensor([False, True])},
        ...                                          final_obs=torch.tensor([[1.0], [2.0]]))
        >>> terminated.tolist(), truncated.tolist(), info["_final_obs"].tolist()
        ([True, False], [False, True], [True, True])
    """
    dones = _torch_flags("dones", dones, None)
    if not isinstance(extras, Mapping):
        raise ShapeError(f"extras: expected the env's extras dict, got {type(extras).__name__} {short_repr(extras)}")
    time_outs = extras.get("time_outs")
    truncated = (torch.zeros_like(dones) if time_outs is None
                 else _torch_flags("extras['time_outs']", time_outs, dones.numel()).to(dones.device) & dones)
    info: dict[str, Any] = dict(extras)
    if final_obs is not None:
        info["final_obs"] = final_obs
        info["_final_obs"] = dones.cpu().numpy()
    return dones & ~truncated, truncated, info


def _torch_flags(name: str, value: Any, n: int | None) -> torch.Tensor:
    """``value`` as a 1-D bool tensor (``[n]``, or ``[n, 1]`` flattened); 0/1 integers are flags too."""
    if not isinstance(value, torch.Tensor):
        raise DtypeError(f"{name}: expected a tensor of flags, got {type(value).__name__} {short_repr(value)}")
    flat = value.detach().reshape(-1) if value.dim() == 2 and value.shape[1] == 1 else value.detach()
    if flat.dim() != 1 or (n is not None and flat.numel() != n) or flat.device.type == "meta":
        raise ShapeError(f"{name}: expected a tensor of shape ({'num_envs' if n is None else n},), got "
                         f"{tuple(value.shape)} on {value.device}")
    if flat.dtype is not torch.bool and (flat.is_floating_point() or flat.is_complex() or not bool(
            ((flat == 0) | (flat == 1)).all())):
        raise DtypeError(f"{name}: expected bools (or 0/1 integers), got {flat.dtype} {short_repr(value)}")
    return flat.to(torch.bool)


def _refuse_bools(is_bool: bool, dtype: Any) -> None:
    if is_bool:
        raise DtypeError(f"bootstrap: expected values (V of the final observations), got {dtype}")


def _mode(envs: Any, given: AutoresetMode | str | None) -> AutoresetMode:
    metadata = getattr(envs, "metadata", None)
    named = (metadata or {}).get("autoreset_mode") if isinstance(metadata, Mapping) else None
    if given is None and named is None:
        raise ConfigError("autoreset_mode: envs.metadata has no 'autoreset_mode' (not a gymnasium 1.x vector env): "
                          "pass Recorder(..., autoreset_mode=...); SB3 VecEnvs and Isaac Lab-style envs reset in "
                          "the same step: autoreset_mode='same_step'")
    mode = _parsed_mode(given if given is not None else named)
    try:
        said = None if given is None or named is None else _parsed_mode(named)
    except ConfigError:  # metadata that names no mode rlbuf reads: the given one stands
        said = None
    if said is not None and said is not mode:
        raise ConfigError(f"autoreset_mode: envs.metadata says the envs reset in mode {said.name}, got "
                          f"autoreset_mode={given!r}, and a wrong mode stores reset steps or loses real ones; leave "
                          f"it out (it is for envs whose metadata does not say), or, if the metadata is wrong, give "
                          f"the envs their own: envs.metadata = {{**envs.metadata, 'autoreset_mode': ...}}")
    return mode


def _parsed_mode(found: Any) -> AutoresetMode:
    if isinstance(found, AutoresetMode):
        return found
    by_name = {m.value.lower(): m for m in AutoresetMode} | {m.name.lower().replace("_", ""): m for m in AutoresetMode}
    mode = by_name.get(str(found).lower().replace("_", ""))
    if mode is None:
        raise ConfigError(f"autoreset_mode: expected an AutoresetMode or one of 'next_step', 'same_step', "
                          f"'disabled', got {found!r}")
    return mode


def _check_obs_shape(envs: Any, buffer: ReplayBuffer | RolloutBuffer | DistillationBuffer) -> None:
    """Refuse a buffer built from the batched ``envs.observation_space`` (a common slip)."""
    single = getattr(getattr(envs, "single_observation_space", None), "shape", None)
    batched = getattr(getattr(envs, "observation_space", None), "shape", None)
    stored = next((spec.shape for spec in buffer.fields if spec.name == "obs"), None)  # None: dict observations
    if stored is not None and single is not None and batched is not None and stored != tuple(single) and stored == tuple(batched):
        raise ConfigError(f"buffer: its observations have shape {stored}, the batched envs.observation_space's; build "
                          f"it with observation_space=envs.single_observation_space (one env's space, "
                          f"{tuple(single)})")


def _flags(name: str, value: Any, n: int | None) -> np.ndarray[Any, Any]:
    """``value`` as ``[n]`` bools (any length with ``n=None``), or an rlbuf error naming ``name``."""
    array = as_array(name, value)
    if array.ndim != 1 or (n is not None and array.shape != (n,)):
        raise ShapeError(f"{name}: expected shape ({'num_envs' if n is None else n},), got {array.shape}")
    if array.dtype.kind != "b":
        raise DtypeError(f"{name}: expected bools, got {array.dtype} {short_repr(value)}")
    return array


def _rows(value: Any, keep: np.ndarray[Any, Any], name: str, depth: int = 0, *, select: bool = True) -> Any:
    """The rows of ``value`` where ``keep`` is True, in ``value``'s own type (a dict key by key); with
    ``select=False``, ``value`` itself, once it is checked to hold one row per env."""
    if isinstance(value, Mapping):
        if depth >= MAX_DEPTH:
            raise ShapeError(f"{name}: nested more than {MAX_DEPTH} levels deep")
        rows = {key: _rows(part, keep, f"{name}[{key!r}]", depth + 1, select=select) for key, part in value.items()}
        return rows if select else value
    if isinstance(value, torch.Tensor) or is_tensor_collection(value):
        lead = tuple(value.shape[:1] if isinstance(value, torch.Tensor) else value.batch_size[:1])
        if lead != keep.shape:
            raise ShapeError(f"{name}: expected {keep.size} rows (one per env), got shape {tuple(value.shape)}")
        return value[torch.as_tensor(keep, device=value.device)] if select else value
    array = as_array(name, value)
    if array.shape[:1] != keep.shape:
        raise ShapeError(f"{name}: expected {keep.size} rows (one per env), got shape {array.shape}")
    return array[keep] if select else value
