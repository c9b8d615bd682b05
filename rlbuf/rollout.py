"""RolloutBuffer: the on-policy buffer (PPO, A2C) with GAE that treats timeouts correctly.

Storage is preallocated ``[num_steps, num_envs, ...]`` (a TorchRL storage of ``num_steps * num_envs`` rows, row
``t * num_envs + n``). Fill it step by step with [`RolloutBuffer.add`][rlbuf.RolloutBuffer.add] or in one go with
[`RolloutBuffer.extend`][rlbuf.RolloutBuffer.extend] from a TorchRL collector, compute advantages, then iterate
shuffled minibatches on the training device.

Example:
    >>> import torch
    >>> from rlbuf import RolloutBuffer
    >>> buf = RolloutBuffer(num_steps=4, num_envs=2, obs_shape=(3,), action_shape=(), seed=0)
    >>> for t in range(4):
    ...     buf.add(obs=torch.randn(2, 3), action=torch.zeros(2), reward=torch.ones(2),
    ...             terminated=torch.tensor([t == 3, False]), value=torch.zeros(2),
    ...             log_prob=torch.zeros(2), truncated=False)
    >>> buf.compute_returns_and_advantages(last_value=torch.zeros(2), gamma=0.99, gae_lambda=0.95)
    >>> [batch.advantage.shape for batch in buf.minibatches(num_minibatches=2)]
    [torch.Size([4]), torch.Size([4])]
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, cast, overload

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import SamplerWithoutReplacement

from rlbuf._buffer import RingBuffer, done_of, refuse_foreign_options
from rlbuf._convert import REQUIRED, as_num_envs, require
from rlbuf._delivery import deliver, rows_at
from rlbuf._keywords import keywords_checked
from rlbuf._obs import (
    ObsDtype,
    ObsShape,
    as_shape,
    hidden_state_key,
    hidden_state_layout,
    leaf_names,
    record_layout,
)
from rlbuf._rollout_gae import write_advantages
from rlbuf._rollout_layout import (
    BUILT_IN,
    COMPUTED,
    attached_name_problem,
    checked_extras,
    minibatches_call,
    rollout_columns,
    rollout_specs,
    saved_iterator_rows,
    sequence_batch,
    step_values,
    zeros_column,
)
from rlbuf._rollout_resets import RolloutResets
from rlbuf.batches import RolloutBatch
from rlbuf.epochs import EpochIterator, batch_bounds, check_epoch_options, sizes_by_keyword
from rlbuf.errors import BufferFullError, RolloutIncompleteError
from rlbuf.sequences import PaddedTrajectories, SequenceBatch
from rlbuf.spaces import extra_field_dtypes, resolve_action_range, resolve_fields
from rlbuf.spec import ExtraFields, FieldSpec, RowReader, as_flag, positive_int
from rlbuf.stats import EpisodeStats
from rlbuf.storage import DeviceLike, StorageKind


class RolloutBuffer(RingBuffer[RolloutBatch]):
    """A preallocated ``[num_steps, num_envs]`` rollout for on-policy RL, backed by TorchRL.

    Args:
        num_steps: steps per rollout (T).
        num_envs: parallel environments (N).
        obs_shape: shape of one observation, or a (nested) mapping of shapes, a TorchRL
            ``Composite`` or a gymnasium ``Dict`` space for dict observations.
        action_shape: shape of one action (``()`` for a discrete index).
        privileged_obs_shape: shape of privileged (critic-only) observations, if any: a second
            observation key (``"privileged_observation"``), flat.
        hidden_state_shape: the recurrent policy's hidden state per env and step, e.g.
            ``(layers, 256)`` for a GRU or ``{"h": (layers, 256), "c": (layers, 256)}`` for an
            LSTM (float32; stored at TorchRL's ``"recurrent_state"``/``"recurrent_state_h"`` keys).
            Pass it to ``add`` as ``hidden_state=``; sequence minibatches give it at each
            trajectory's start.
        storage: ``"memory"`` or ``"memmap"``.
        scratch_dir: directory for memmap files.
        storing_device: where the rollout is stored.
        device: where minibatches are delivered (defaults to ``storing_device``).
        seed: seeds the buffer's generator (minibatch shuffling); the global RNG is untouched.
        extra_fields: ``{"name": (shape, dtype)}`` passed to [`add`][rlbuf.RolloutBuffer.add] with every step.
        observation_space: instead of ``obs_shape``/``obs_dtype``: a gymnasium space
            (``envs.single_observation_space``, a ``Dict`` space for dict observations) or a TorchRL
            spec (see [`rlbuf.spaces`][rlbuf.spaces]).
        action_space: instead of ``action_shape``/``action_dtype``: ``envs.single_action_space``
            or a TorchRL spec (a ``Discrete`` space stores an ``int64`` index).
        obs_dtype: stored observation dtype (``torch.uint8`` for images), or a mapping by key.
            Unset: the spec's or space's dtype, else float32.
        action_dtype: stored action dtype (default: the space's, else float32; ``torch.int64``
            for discrete actions).
        action_range: ``(low, high)``, the actions allowed, refused outside (default: a discrete space's).
        stats: an [`EpisodeStats`][rlbuf.EpisodeStats] fed with every step added.

    Raises:
        ConfigError: invalid options.

    Example:
        >>> buf = RolloutBuffer(24, 4096, obs_shape=(48,), action_shape=(12,))
        >>> buf
        RolloutBuffer(steps=0/24, num_envs=4096, storage=memory, storing_device=cpu, device=cpu, advantages=False, fields=[obs: (48,) float32, action: (12,) float32, reward: () float32, terminated: () bool, truncated: () bool, value: () float32, log_prob: () float32])
    """

    _batch_type = RolloutBatch
    _attached_name_problem = staticmethod(attached_name_problem)  # the load check's of set_extras' tensors
    _fills_by_whole_steps = True  # the load check: whole steps, never wrapping

    def __init__(
        self,
        num_steps: int = REQUIRED,
        num_envs: int = REQUIRED,
        *positional: Any,
        obs_shape: ObsShape | None = None,
        action_shape: Sequence[int] | int | None = None,
        privileged_obs_shape: Sequence[int] | int | None = None,
        hidden_state_shape: Sequence[int] | int | Mapping[str, Sequence[int] | int] | None = None,
        storage: StorageKind = "memory",
        scratch_dir: str | Path | None = None,
        storing_device: DeviceLike = "cpu",
        device: DeviceLike | None = None,
        seed: int | None = None,
        extra_fields: ExtraFields | None = None,
        observation_space: Any = None,
        action_space: Any = None,
        obs_dtype: ObsDtype | None = None,
        action_dtype: torch.dtype | None = None,
        action_range: Sequence[Any] | None = None,
        stats: EpisodeStats | None = None,
        **foreign: Any,
    ) -> None:
        refuse_foreign_options(RolloutBuffer.__init__, foreign, positional)
        require("RolloutBuffer(num_steps=128, num_envs=envs.num_envs, observation_space=...)", num_steps=num_steps, num_envs=num_envs)
        self._num_steps = positive_int("num_steps", num_steps)
        as_num_envs(num_envs)  # before the spaces: SB3's RolloutBuffer(n, observation_space) lands one here
        extra_fields = extra_field_dtypes(extra_fields)
        obs_shape, obs_dtype, action_shape, action_dtype = resolve_fields(
            observation_space, obs_shape, obs_dtype, action_space, action_shape, action_dtype, num_envs=num_envs)
        action_range = resolve_action_range(action_space, action_range, action_shape)
        # Parsed before the options are recorded: a mapping nested too deep is refused by name first.
        self._hidden = None if hidden_state_shape is None else hidden_state_layout(hidden_state_shape)
        self._record_options(locals())
        self._obs = record_layout(self._options, obs_shape, obs_dtype)
        self._attach_stats(stats, num_envs)
        privileged = None if privileged_obs_shape is None else as_shape(privileged_obs_shape, "privileged_obs_shape")
        specs = rollout_specs(obs_shape, as_shape(action_shape, "action_shape"), privileged,
                              obs_dtype, action_dtype, extra_fields, action_range)
        self._has_privileged = privileged is not None
        self._extra_specs = {s.name: s for s in specs if s.name not in BUILT_IN and not s.name.startswith("obs[")}
        if self._hidden is not None:
            specs = (*specs, *self._hidden.specs("hidden_state", hidden_state_key))
        self._setup(specs, num_steps * num_envs, SamplerWithoutReplacement(), num_envs=num_envs, storage=storage,
                    scratch_dir=scratch_dir, storing_device=storing_device, device=device, seed=seed,
                    derived={"advantage": zeros_column, "returns": zeros_column, "done": done_of})
        self._attached: dict[str, torch.Tensor] = {}
        # The buffer's change marks when advantages were last computed (None: never, or cleared); any write
        # since, an add or one through buffer.torchrl, moves the marks and makes them stale.
        self._advantages_at: tuple[int, int, int] | None = None
        self._gae_out: tuple[torch.Tensor, torch.Tensor] | None = None  # GAE's results, checked before stored
        self._resets = RolloutResets(self._ring, num_envs)  # warns of NEXT_STEP's reset steps added as steps

    # -- properties --------------------------------------------------------------------------
    @property
    def num_steps(self) -> int:
        """Steps per rollout (T)."""
        return self._num_steps

    @property
    def steps(self) -> int:
        """Steps stored so far (each step holds ``num_envs`` rows)."""
        return len(self._ring) // self._num_envs

    @property
    def advantages_ready(self) -> bool:
        """Whether advantages and returns are computed for the rollout as stored: a write since (a row
        set or added through ``buffer.torchrl`` too) makes them stale."""
        return self._advantages_at == self._change_marks()

    def __repr__(self) -> str:
        fields = ", ".join(s.describe() for s in self._ring.specs if s.name not in (*COMPUTED, "bootstrap_value", "done"))
        return (f"RolloutBuffer(steps={self.steps}/{self._num_steps}, num_envs={self._num_envs}, "
                f"storage={self._storage_kind}, storing_device={self._storing_device}, device={self._device}, "
                f"advantages={self.advantages_ready}, fields=[{fields}])")

    def view(self, name: str) -> torch.Tensor | TensorDict:
        """A stored field as a ``[num_steps, num_envs, ...]`` view of the storage (no copy).

        Dict observations: ``view("obs")`` is a ``TensorDict`` of views, and each key is a
        field of its own (``view('obs["camera"]')``); so is an LSTM's ``view("hidden_state")``.

        Raises:
            MissingFieldError: no such field.

        Example:
            >>> buf = RolloutBuffer(3, 2, obs_shape=(4,), action_shape=())
            >>> buf.view("obs").shape, buf.view("reward").shape
            (torch.Size([3, 2, 4]), torch.Size([3, 2]))
        """
        layout = {"obs": self._obs, "hidden_state": self._hidden}.get(name) if isinstance(name, str) else None
        if layout is not None and layout.structured:
            self._ring.flush()
            views = {leaf: self._ring.leaves[leaf].view(self._num_steps, self._num_envs, *self._ring.by_name[leaf].shape)
                     for leaf in leaf_names(name, layout)}
            return layout.assemble(name, views, batch_dims=2)
        self._ring.check_field_names([name])
        self._ring.flush()
        spec = self._ring.by_name[name]
        return self._ring.leaves[name].view(self._num_steps, self._num_envs, *spec.shape)

    # -- writing -----------------------------------------------------------------------------
    def add(
        self,
        obs: Any = None,
        action: Any = None,
        reward: Any = None,
        terminated: Any = None,
        value: Any = None,
        log_prob: Any = None,
        truncated: Any = None,
        privileged_obs: Any = None,
        bootstrap_value: Any = None,
        hidden_state: Any = None,
        *, metrics: Mapping[str, Any] | None = None,
        **extras: Any,
    ) -> None:
        """Store one step for all ``num_envs`` envs.

        Args:
            obs: observations ``[num_envs, *obs_shape]`` the action was taken from.
            action: actions ``[num_envs, *action_shape]``.
            reward: rewards ``[num_envs]``.
            terminated: the MDP ended the episode at this step ``[num_envs]`` bool.
            value: V(obs) ``[num_envs]``.
            log_prob: log-probability of ``action`` ``[num_envs]``.
            truncated: a time limit ended the episode ``[num_envs]`` bool, required (``False``: no env).
            privileged_obs: critic-only observations, if the buffer has them.
            bootstrap_value: V(final observation) ``[num_envs]``, read where ``truncated``:
                required whenever an env is truncated at this step.
            hidden_state: the policy's hidden state the action was computed from
                ``[num_envs, *shape]`` (a dict for ``{"h": ..., "c": ...}``), if the buffer has one.
            metrics: per-step values for the buffer's [`EpisodeStats`][rlbuf.EpisodeStats] (every metric it declares).
            **extras: one value per declared extra field.

        Raises:
            BufferFullError: ``num_steps`` steps are already stored (call [`clear`][rlbuf.RolloutBuffer.clear]).
            MissingFieldError: ``bootstrap_value`` missing at a truncation, or an extra missing.
            ShapeError, DtypeError, DeviceError, NonFiniteError: before anything is stored.

        Example:
            >>> buf = RolloutBuffer(2, 2, obs_shape=(3,), action_shape=())
            >>> buf.add(torch.zeros(2, 3), torch.zeros(2), torch.ones(2), torch.tensor([False, False]),
            ...         torch.zeros(2), torch.zeros(2), truncated=torch.tensor([True, False]),
            ...         bootstrap_value=torch.tensor([0.5, 0.0]))
            >>> buf.steps, buf.is_full
            (1, False)
        """
        self._require_writable("add")
        # Under the ring's lock throughout: two threads checking for room first both add the last step (over step 0).
        with self._ring.lock:
            if self.is_full:
                raise BufferFullError(f"add: the rollout already holds {self._num_steps} steps; call clear() first")
            values = step_values(dict(obs=obs, action=action, reward=reward, terminated=terminated, value=value,
                                      log_prob=log_prob, truncated=truncated, privileged_obs=privileged_obs,
                                      bootstrap_value=bootstrap_value), hidden_state, extras, num_envs=self._num_envs,
                                 obs_layout=self._obs, hidden=self._hidden, extra_specs=self._extra_specs,
                                 privileged=self._has_privileged)
            record = self._planned_stats(reward, terminated, values["truncated"], metrics=metrics)
            self._resets.add(tuple(values[spec.name] for spec in self._ring.input_specs), self._num_envs)
            if record is not None:
                record()

    def extend(self, td: TensorDictBase) -> None:
        """Store a whole rollout from a TorchRL collector: batch ``[num_envs, T]`` (time last).

        Reads ``"observation"``, ``"action"``, ``("next", "reward")``,
        ``("next", "terminated")``, ``("next", "truncated")``, ``"state_value"``,
        ``"sample_log_prob"`` (or ``"action_log_prob"``) and ``("next", "state_value")``
        (the bootstrap for truncated steps); ``"advantage"`` and ``"value_target"`` too when
        a [`GAE`][rlbuf.GAE] transform already wrote them. A single env may pass ``[T]``.

        Raises:
            BufferFullError: more steps than the rollout has room for.
            MissingFieldError, ShapeError, DtypeError, NonFiniteError: before anything is stored.

        Example:
            >>> from tensordict import TensorDict
            >>> td = TensorDict({"observation": torch.zeros(2, 4, 3), "action": torch.zeros(2, 4),
            ...                  "state_value": torch.zeros(2, 4, 1), "sample_log_prob": torch.zeros(2, 4),
            ...                  "next": {"reward": torch.ones(2, 4, 1), "terminated": torch.zeros(2, 4, 1).bool(),
            ...                           "truncated": torch.zeros(2, 4, 1, dtype=torch.bool)}}, batch_size=[2, 4])
            >>> buf = RolloutBuffer(4, 2, obs_shape=(3,), action_shape=())
            >>> buf.extend(td)
            >>> buf.steps, buf.advantages_ready
            (4, False)
        """
        self._require_writable("extend")  # first, as add: a full read-only rollout is refused as read-only
        ring = self._ring
        with ring.lock:  # the free steps read, the rows, the statistics and the advantage marks as one step (see add)
            columns, computed, steps = rollout_columns(td, ring, num_envs=self._num_envs,
                                                       free_steps=self._num_steps - self.steps, whole=self.steps == 0)
            if steps == 0:  # an empty batch, as ReplayBuffer.extend takes it: nothing to store
                return
            rows = steps * self._num_envs
            # Statistics fed before the rows are stored, and undone if the rows are refused.
            with contextlib.nullcontext() if self._stats is None else self._stats.restored_on_error():
                self._feed_stats_from_rollout(columns["reward"].view(steps, -1).T, columns["terminated"].view(steps, -1).T,
                                              columns["truncated"].view(steps, -1).T)
                with ring.rewriting("extend"):  # one commit: the rows, then the advantages written over them
                    ring.write_checked(columns, rows)
                    self._resets.forget()
                    if len(computed) == len(COMPUTED):
                        for name, tensor in computed.items():
                            ring.leaves[name].copy_(tensor)
            self._advantages_at = self._change_marks() if len(computed) == len(COMPUTED) else None

    def clear(self) -> None:
        """Empty the rollout (for the next one); extras attached with [`set_extras`][rlbuf.RolloutBuffer.set_extras] go too.

        Example:
            >>> buf = RolloutBuffer(1, 2, obs_shape=(3,), action_shape=())
            >>> buf.add(torch.zeros(2, 3), torch.zeros(2), torch.ones(2), torch.tensor([False, False]),
            ...         torch.zeros(2), torch.zeros(2), truncated=False)
            >>> buf.clear()
            >>> buf.steps, buf.advantages_ready
            (0, False)
        """
        with self._ring.lock:  # a save between the rows' clear and the advantages' would see empty rows "ready"
            super().clear()
            self._resets.forget()
            self._attached.clear()
            self._advantages_at = None

    def set_extras(self, mapping: Mapping[str, torch.Tensor]) -> None:
        """Attach algorithm tensors aligned with the rollout, ``[num_steps, num_envs, ...]``.

        They are delivered with every minibatch (``batch.extras[name]``, ``batch.name``)
        until [`clear`][rlbuf.RolloutBuffer.clear]. ``advantage`` and ``returns`` (given together) replace the
        computed ones instead, e.g. to supply custom advantages; other stored fields are refused.

        Raises:
            ShapeError: a tensor not shaped ``[num_steps, num_envs, ...]`` (or a stored
                field's exact shape).
            MissingFieldError: only one of advantage/returns, or another stored field (``logprobs``, ``values`` ...).
            DtypeError: a new tensor of a dtype no buffer stores (complex, bfloat16, uint16, float8 ...).

        Example:
            >>> buf = RolloutBuffer(2, 2, obs_shape=(3,), action_shape=())
            >>> for _ in range(2):
            ...     buf.add(torch.zeros(2, 3), torch.zeros(2), torch.ones(2), torch.tensor([False, False]),
            ...             torch.zeros(2), torch.zeros(2), truncated=False)
            >>> buf.set_extras({"advantage": torch.ones(2, 2), "returns": torch.ones(2, 2),
            ...                 "old_logits": torch.zeros(2, 2, 5)})
            >>> batch = buf.get_all_data()
            >>> batch.old_logits.shape, batch.advantage.tolist()
            (torch.Size([4, 5]), [1.0, 1.0, 1.0, 1.0])
        """
        checked = checked_extras(mapping, self._ring, num_steps=self._num_steps, num_envs=self._num_envs)
        ready = self.advantages_ready or any(name in COMPUTED for name in checked)
        with self._ring.rewriting("set_extras"):
            for name, tensor in checked.items():
                if name in self._ring.by_name:
                    self.view(name).copy_(tensor)
                else:
                    # A contiguous copy: the caller's tensor (or an expanded view of it) may change later.
                    self._attached[name] = tensor.detach().reshape(self.capacity, *tensor.shape[2:]).to(
                        self._storing_device, copy=True, memory_format=torch.contiguous_format)
        if ready:  # extras beside the advantages leave them current
            self._advantages_at = self._change_marks()

    # -- advantages --------------------------------------------------------------------------
    @keywords_checked
    def compute_returns_and_advantages(
        self, last_value: torch.Tensor, *, gamma: float = 0.99, gae_lambda: float = 0.95,
        normalize_advantages: bool = False,
    ) -> None:
        """Compute GAE advantages and returns for the full rollout, in place.

        A terminated step does not bootstrap; a truncated step bootstraps from its
        ``bootstrap_value`` (V of the final observation); the λ-trace never crosses an
        episode boundary; the last step bootstraps from ``last_value`` unless terminated.

        Args:
            last_value: V(observation after the last step) ``[num_envs]``.
            gamma: discount.
            gae_lambda: GAE λ.
            normalize_advantages: standardise the stored advantages over the whole rollout
                (returns are computed before, from the raw advantages).

        Raises:
            RolloutIncompleteError: fewer than ``num_steps`` steps stored.
            ShapeError, DeviceError, NonFiniteError: a bad ``last_value``.
            NonFiniteError: advantages or returns beyond float32 (rewards near ``3e38``); nothing is written.

        Example:
            >>> buf = RolloutBuffer(2, 1, obs_shape=(1,), action_shape=())
            >>> for _ in range(2):
            ...     buf.add(torch.zeros(1, 1), torch.zeros(1), torch.ones(1), torch.tensor([False]),
            ...             torch.zeros(1), torch.zeros(1), truncated=False)
            >>> buf.compute_returns_and_advantages(torch.zeros(1), gamma=0.5, gae_lambda=1.0)
            >>> buf.view("returns").flatten().tolist()
            [1.5, 1.0]
        """
        # Under the ring's lock throughout: the full check, the rewrite and the advantages marked ready are one step.
        with self._ring.lock:
            if not self.is_full:
                raise RolloutIncompleteError(f"compute_returns_and_advantages: the rollout holds {self.steps} of "
                                             f"{self._num_steps} steps; fill it first")
            normalize = as_flag("normalize_advantages", normalize_advantages)
            spec = FieldSpec("last_value", "last_value", (), torch.float32, finite=True)
            last = RowReader(spec, self._num_envs, self._ring.accepted_devices).tensor(last_value).to(self._storing_device)
            # Current advantages are computed around (a refused call leaves them), others in place.
            around = self.advantages_ready
            if around and self._gae_out is None:
                shape = (self._num_steps, self._num_envs)
                self._gae_out = (last.new_empty(shape), last.new_empty(shape))
            with self._ring.rewriting("compute_returns_and_advantages"):  # a save running meanwhile copies the new advantages, not a mix
                columns = {name: self._ring.leaves[name].view(self._num_steps, self._num_envs) for name in (
                    "reward", "value", "terminated", "truncated", "bootstrap_value", "advantage", "returns")}
                try:
                    write_advantages(columns, last, gamma=gamma, gae_lambda=gae_lambda, normalize=normalize,
                                     scratch=self._gae_out if around else None)
                except Exception:  # refused (a bad gamma, results beyond float32): current advantages are kept, current
                    self._advantages_at = self._change_marks() if around else None
                    raise
                self._advantages_at = self._change_marks()

    # -- reading -----------------------------------------------------------------------------
    def get_all_data(self) -> RolloutBatch:
        """The whole rollout flattened to ``num_steps * num_envs`` rows (``t * num_envs + n``).

        On the storing device these are views of the storage (no copy): clone what must
        outlive the next [`clear`][rlbuf.RolloutBuffer.clear].

        Raises:
            RolloutIncompleteError: the rollout is not full or advantages are not computed.

        Example:
            >>> buf = RolloutBuffer(2, 2, obs_shape=(3,), action_shape=())
            >>> for _ in range(2):
            ...     buf.add(torch.zeros(2, 3), torch.zeros(2), torch.ones(2), torch.tensor([False, False]),
            ...             torch.zeros(2), torch.zeros(2), truncated=False)
            >>> buf.compute_returns_and_advantages(torch.zeros(2))
            >>> data = buf.get_all_data()
            >>> len(data), data.obs.shape
            (4, torch.Size([4, 3]))
        """
        self._require_ready("get_all_data")
        self._ring.flush()
        return self._make_batch(dict(self._ring.leaves) | self._attached)

    @overload
    def minibatches(self, *, batch_size: int | None = None, num_minibatches: int | None = None, n_epochs: int = 1,
                    shuffle: bool = True, drop_last: bool = False,
                    sequences: Literal[False] = False) -> EpochIterator[RolloutBatch]: ...

    @overload
    def minibatches(self, *, batch_size: int | None = None, num_minibatches: int | None = None, n_epochs: int = 1,
                    shuffle: bool = True, drop_last: bool = False,
                    sequences: Literal[True]) -> EpochIterator[SequenceBatch]: ...

    @sizes_by_keyword
    def minibatches(self, *, batch_size: int | None = None, num_minibatches: int | None = None, n_epochs: int = 1,
                    shuffle: bool = True, drop_last: bool = False,
                    sequences: bool = False) -> EpochIterator[RolloutBatch] | EpochIterator[SequenceBatch]:
        """Shuffled minibatches on the training device, each row exactly once per epoch.

        The rollout is moved to the training device once, then every epoch draws a fresh
        permutation there and gathers each minibatch with ``index_select``.

        With ``sequences=True`` (recurrent policies) the unit is a trajectory instead of a row:
        each env's rollout is split at episode ends (``terminated | truncated``) and at the
        rollout's end, and each minibatch is a [`SequenceBatch`][rlbuf.SequenceBatch] of whole
        trajectories padded to ``[L, B, ...]`` with a ``mask`` and the hidden state stored at
        each trajectory's first step. Trajectories are shuffled across envs; ``batch_size`` then
        counts trajectories, and ``num_minibatches`` splits them into that many minibatches.
        With ``shuffle=False`` they come env by env, in time order (rsl_rl's order).

        Args:
            batch_size: rows (trajectories with ``sequences``) per minibatch, or give ``num_minibatches``
                (sizes are keywords: ``minibatches(4)`` is refused, as it reads like 4 minibatches).
            num_minibatches: minibatches per epoch, sizes differing by at most one.
            n_epochs: passes over the rollout.
            shuffle: fresh permutation each epoch (else storage order).
            drop_last: drop a last, smaller minibatch.
            sequences: minibatches of padded trajectories instead of rows.

        Raises:
            RolloutIncompleteError: the rollout is not full or advantages are not computed.
            BatchSizeError: a size ≤ 0, larger than the rollout (than its trajectories), or given by position.

        Example:
            >>> buf = RolloutBuffer(2, 2, obs_shape=(3,), action_shape=(), seed=0)
            >>> for _ in range(2):
            ...     buf.add(torch.zeros(2, 3), torch.zeros(2), torch.ones(2), torch.tensor([False, False]),
            ...             torch.zeros(2), torch.zeros(2), truncated=False)
            >>> buf.compute_returns_and_advantages(torch.zeros(2))
            >>> [len(batch) for batch in buf.minibatches(batch_size=3, n_epochs=2)]
            [3, 1, 3, 1]
            >>> batch = next(iter(buf.minibatches(num_minibatches=1, sequences=True)))
            >>> batch.obs.shape, batch.mask.shape
            (torch.Size([2, 2, 3]), torch.Size([2, 2]))
        """
        self._require_ready("minibatches")
        if as_flag("sequences", sequences):
            return self._sequence_minibatches(batch_size, num_minibatches, n_epochs, shuffle, drop_last)
        # Validate before the epoch generator draws the iterator's seed: a refused call changes nothing.
        options = check_epoch_options(self.capacity, batch_size=batch_size, num_batches=num_minibatches,
                                      n_epochs=n_epochs, drop_last=drop_last, shuffle=shuffle)
        if options["n_epochs"] == 0:
            self._ring.require_rows(options["batch_size"], without_replacement=False)
        self._ring.flush()
        columns = self._following_rewrites(lambda: deliver(dict(self._ring.leaves) | self._attached, self._device))

        def make_batch(index: torch.Tensor) -> RolloutBatch:
            current = columns()
            self._require_ready("minibatches")  # an iterator held across a write: its advantages are stale
            return self._make_batch({name: rows_at(column, index) for name, column in current.items()})

        iterator = EpochIterator(self.capacity, self._live(make_batch), **options,
                                 generator=self._iterator_generator(self._device), lock=self._ring.lock)
        return self._track_epochs(iterator, "minibatches", **minibatches_call(options))

    def _iterator_rows(self, method: str, arguments: Mapping[str, Any], size: int,
                       fields: Mapping[str, torch.Tensor]) -> int:
        rows = saved_iterator_rows(method, arguments, size, fields, num_envs=self._num_envs, capacity=self.capacity)
        return super()._iterator_rows(method, arguments, size, fields) if rows is None else rows

    def _sequence_minibatches(self, batch_size: int | None, num_minibatches: int | None, n_epochs: int,
                              shuffle: bool, drop_last: bool) -> EpochIterator[SequenceBatch]:
        """``minibatches(sequences=True)``: minibatches of whole padded trajectories."""
        self._ring.flush()
        hidden_names = () if self._hidden is None else leaf_names("hidden_state", self._hidden)
        trajectories = self._following_rewrites(lambda: PaddedTrajectories.of_rollout(
            deliver(dict(self._ring.leaves) | self._attached, self._device), self._num_envs, first_step=hidden_names),
            units=len)
        # Validate over the trajectories before the epoch generator draws: a refused call changes nothing.
        options = check_epoch_options(len(trajectories()), batch_size=batch_size, num_batches=num_minibatches,
                                      n_epochs=n_epochs, drop_last=drop_last, shuffle=shuffle,
                                      unit="trajectories in the rollout")

        def make_sequences(index: torch.Tensor) -> SequenceBatch:
            current = trajectories()  # first: episode ends rewritten are refused by name
            self._require_ready("minibatches")
            return sequence_batch(*current.select(index), obs=self._obs, hidden=self._hidden,
                                  extra_names=(*self._extra_specs, *self._attached))

        iterator = EpochIterator(len(trajectories()), self._live(make_sequences), **options,
                                 generator=self._iterator_generator(self._device), lock=self._ring.lock)
        self._track_epochs(cast(Any, iterator), "minibatches", **minibatches_call(options), sequences=True)
        return iterator

    def num_batches(self, batch_size: int, drop_last: bool = False) -> int:
        """Minibatches per epoch for ``batch_size`` over the full rollout.

        Example:
            >>> RolloutBuffer(4, 2, obs_shape=(3,), action_shape=()).num_batches(3)
            3
        """
        return len(batch_bounds(self.capacity, batch_size=batch_size, drop_last=as_flag("drop_last", drop_last)))

    def _extra_state(self) -> dict[str, Any]:
        return {**super()._extra_state(), "attached": dict(self._attached), "advantages_ready": self.advantages_ready}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self._attached = {name: tensor.to(self._storing_device).clone() for name, tensor in state["attached"].items()}
        super()._load_extra_state(state)
        self._advantages_at = self._change_marks() if state["advantages_ready"] else None  # the rows just loaded

    def _require_ready(self, what: str) -> None:
        if not self.is_full:
            raise RolloutIncompleteError(f"{what}: the rollout holds {self.steps} of {self._num_steps} steps")
        if not self.advantages_ready:
            raise RolloutIncompleteError(f"{what}: the advantages are not computed for the rollout as stored (rows "
                                         f"written since, through buffer.torchrl too, make them stale); call "
                                         f"compute_returns_and_advantages() (or extend with a GAE-transformed "
                                         f"rollout, or set_extras advantage/returns) first")

    def _batch(self, index: torch.Tensor, weight: torch.Tensor | None = None) -> RolloutBatch:
        columns = self._ring.gather(index)
        columns.update({name: rows_at(tensor, index) for name, tensor in self._attached.items()})
        return self._make_batch(deliver(columns, self._device))

    def _make_batch(self, columns: dict[str, torch.Tensor]) -> RolloutBatch:
        extras = {name: columns[name] for name in (*self._extra_specs, *self._attached)}
        hidden = None if self._hidden is None else self._hidden.assemble("hidden_state", columns)
        return RolloutBatch(self._obs.assemble("obs", columns), columns.get("privileged_obs"), columns["action"],
                            columns["reward"], columns["terminated"], columns["truncated"], columns["value"],
                            columns["log_prob"], columns["advantage"], columns["returns"], extras, hidden)
