"""ReplayBuffer: the off-policy buffer (DQN, SAC, TD3), uniform or prioritized.

Example:
    >>> import torch
    >>> from rlbuf import ReplayBuffer
    >>> buf = ReplayBuffer(1000, obs_shape=(4,), action_shape=(), action_dtype=torch.int64,
    ...                    num_envs=2, seed=0)
    >>> for _ in range(10):
    ...     buf.add(obs=torch.randn(2, 4), action=torch.tensor([0, 1]), reward=torch.ones(2),
    ...             next_obs=torch.randn(2, 4), terminated=torch.tensor([False, True]),
    ...             truncated=torch.tensor([False, False]))
    >>> len(buf)
    20
    >>> batch = buf.sample(8)
    >>> target = batch.reward + 0.99 * (~batch.terminated) * torch.zeros(8)  # [8], no broadcast
    >>> target.shape
    torch.Size([8])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchrl.data import TensorDictReplayBuffer

from rlbuf._autoreset import ResetSteps, reset_steps
from rlbuf._buffer import done_of, refuse_foreign_options
from rlbuf._codec import frame_codec
from rlbuf._compact import CompactLayout, layout_options
from rlbuf._compact_dict import key_option, row_leaves
from rlbuf._convert import REQUIRED, as_num_envs, require
from rlbuf._keywords import keywords_checked, loader
from rlbuf._obs import (
    ObsDtype,
    ObsShape,
    as_shape,
    hidden_state_key,
    hidden_state_layout,
    record_layout,
)
from rlbuf._priorities import priorities
from rlbuf._relabeller import Relabeller, checked_reward_fn, recorded_options, with_reward_fn
from rlbuf._replay_add import ReplayWriting
from rlbuf._replay_layout import (
    ReplayWriter,
    replay_sampler,
    repr_options,
    saved_sampler_options,
    stored_obs,
    stored_specs,
    transition_bytes,
)
from rlbuf._streams import PaddingType
from rlbuf._sumtree import SumTreeSampler
from rlbuf.batches import ReplayBatch
from rlbuf.epochs import EpochIterator, sizes_by_keyword
from rlbuf.errors import (
    CheckpointError,
    ConfigError,
    PriorityError,
)
from rlbuf.hindsight import Hindsight
from rlbuf.sequences import ReplaySequenceBatch, sample_replay_sequences
from rlbuf.spaces import extra_field_dtypes, resolve_action_range, resolve_fields
from rlbuf.spec import ExtraFields
from rlbuf.stats import EpisodeStats
from rlbuf.storage import DeviceLike, StorageKind


class ReplayBuffer(ReplayWriting):
    """A ring buffer of transitions for off-policy RL, backed by TorchRL.

    Args:
        capacity: transitions kept; the oldest are overwritten first once full.
        obs_shape: shape of one observation; for dict observations a (nested) mapping of
            shapes, a TorchRL ``Composite`` spec or a gymnasium ``Dict`` space (see
            [structured observations](structured.md)): batches then give ``batch.obs`` as a ``TensorDict``.
        action_shape: shape of one action (``()`` for a discrete action index).
        num_envs: rows per [`add`][rlbuf.ReplayBuffer.add] (one per vectorised env).
        prioritized: prioritized experience replay (sum tree), with ``alpha`` and ``beta``.
        alpha: priority exponent (default 0.6); only with ``prioritized=True``.
        beta: importance-sampling exponent (default 0.4); only with ``prioritized=True``.
        storage: ``"memory"`` (RAM or GPU) or ``"memmap"`` (disk files, larger than RAM).
        scratch_dir: directory for memmap files (a temporary one, removed on close, by default).
        storing_device: where transitions are stored.
        device: where sampled batches are delivered (defaults to ``storing_device``).
        seed: seeds the buffer's own generator; sampling never touches the global RNG.
        extra_fields: ``{"name": (shape, dtype)}`` stored with every transition.
        observation_space: instead of ``obs_shape``/``obs_dtype``: a gymnasium space
            (``envs.single_observation_space``, a ``Dict`` space for dict observations) or a TorchRL
            spec (see [`rlbuf.spaces`][rlbuf.spaces]).
        action_space: instead of ``action_shape``/``action_dtype``: ``envs.single_action_space``
            or a TorchRL spec (a ``Discrete`` space stores an ``int64`` index).
        obs_dtype: stored observation dtype (``torch.uint8`` for images: 1 byte per value); for
            dict observations one dtype or a mapping by key. Unset: the spec's or space's dtype, else float32.
        action_dtype: stored action dtype, a torch dtype or its name (``"int64"``); default: the space's, else float32.
        action_range: ``(low, high)``, the actions allowed (ints, or one per element), refused outside
            with an ``OutOfRangeError``; default: a discrete ``action_space``'s range, else none.
        stats: an [`EpisodeStats`][rlbuf.EpisodeStats] fed with every step added (returns, lengths).
        frame_stack: ``k`` for stacked observations ``obs_shape=(k, *frame)`` (gymnasium's
            ``FrameStackObservation``, newest frame last): each frame is stored once and the
            stacks are rebuilt when sampled. Needs the compact layout.
        padding_type: how the env pads an episode's first stack: ``"reset"`` (its first
            frame repeated) or ``"zero"``, as in ``FrameStackObservation``.
        n_step: transitions of up to ``n_step`` steps: ``batch.reward`` is their discounted
            reward sum and ``batch.next_obs`` the observation they bootstrap from (never past
            an episode's end). Needs the compact layout, or ``hindsight``.
        gamma: the discount of n-step returns and of ``batch.discount``.
        compact: store ``next_obs`` once (it is the next row's ``obs`` of the same env; only
            observations that end an episode are kept aside), halving the memory of
            observations. Steps must then be added in each env's order, with every episode end
            marked. ``None``: compact when ``frame_stack > 1`` or ``n_step > 1``.
            See [Pixels and memory](pixels.md).
        compression: ``"zstd"`` or ``"lz4"``: the compact layout stores each frame compressed
            (bit-exact; decompressed when sampled), with a dictionary trained on the first frames:
            Atari frames take 20-80× less memory. ``None``: frames as they are. See
            [Pixels and memory](pixels.md#compressed-frames).
        compression_level: zstd's level (1-22, default 3) or lz4's high-compression level (1-12;
            default: lz4's fast mode).
        compact_key: with dict observations in the compact layout, the image key stored frame by
            frame (``"image"``, or a path of keys ``("sensors", "camera")``); the other keys are
            stored whole with every row. ``None``: the one ``uint8`` key whose frame has at least
            2 dims. See [Pixels and memory](pixels.md#dict-observations-with-an-image).
        hidden_state_shape: a recurrent policy's hidden state stored with every step, e.g.
            ``{"h": (layers, 256), "c": (layers, 256)}`` (float32, TorchRL's
            ``"recurrent_state_h"`` keys); [`sample_sequences`][rlbuf.ReplayBuffer.sample_sequences] gives it at each sequence start.
        hindsight: a [`Hindsight`][rlbuf.Hindsight]: ``sample`` relabels goals of a goal env's dict
            observations (``"observation"``, ``"achieved_goal"``, ``"desired_goal"``) with goals
            their episode reached. See [Hindsight](hindsight.md).

    Raises:
        ConfigError: contradictory or invalid options.

    Example:
        >>> buf = ReplayBuffer(100, obs_shape=(4, 84, 84), action_shape=(), obs_dtype=torch.uint8,
        ...                    action_dtype=torch.int64, frame_stack=4, n_step=3, seed=0)
        >>> buf
        ReplayBuffer(size=0/100, storage=memory, storing_device=cpu, device=cpu, prioritized=False, compact=True, frame_stack=4, n_step=3, bytes_per_transition~7.121 kB, fields=[obs: (84, 84) uint8, action: () int64, reward: () float32, terminated: () bool, truncated: () bool, done: () bool])
    """

    _batch_type = ReplayBatch

    def __init__(
        self,
        capacity: int = REQUIRED,
        *positional: Any,
        obs_shape: ObsShape | None = None,
        action_shape: Sequence[int] | int | None = None,
        num_envs: int = 1,
        prioritized: bool = False,
        alpha: float | None = None,
        beta: float | None = None,
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
        frame_stack: int = 1,
        padding_type: PaddingType = "reset",
        n_step: int = 1,
        gamma: float = 0.99,
        compact: bool | None = None,
        compression: str | None = None,
        compression_level: int | None = None,
        compact_key: str | Sequence[str] | None = None,
        hidden_state_shape: Sequence[int] | int | Mapping[str, Sequence[int] | int] | None = None,
        hindsight: Hindsight | None = None,
        **foreign: Any,
    ) -> None:
        refuse_foreign_options(ReplayBuffer.__init__, foreign, positional)
        require("ReplayBuffer(100_000, observation_space=envs.single_observation_space, action_space=envs.single_action_space, num_envs=envs.num_envs)", capacity=capacity)
        extra_fields = extra_field_dtypes(extra_fields)
        # A stack of frame_stack == num_envs frames starts with num_envs as a batched space does: no warning.
        obs_shape, obs_dtype, action_shape, action_dtype = resolve_fields(
            observation_space, obs_shape, obs_dtype, action_space, action_shape, action_dtype,
            num_envs=num_envs if frame_stack != num_envs else 1)
        action_range = resolve_action_range(action_space, action_range, action_shape)
        # Parsed before the options are recorded: a mapping nested too deep is refused by name first.
        self._hidden = None if hidden_state_shape is None else hidden_state_layout(hidden_state_shape)
        self._record_options(locals())
        self._obs = record_layout(self._options, obs_shape, obs_dtype)
        self._options["hindsight"] = recorded_options(hindsight, self._obs.leaves)
        as_num_envs(num_envs)  # the capacity (>= num_envs, in memory) is checked before any row is allocated
        # A hindsight buffer follows each env's episodes itself: its n-step transitions need no compact layout.
        if hindsight is not None:
            layout_options((), frame_stack=1, padding_type=padding_type, n_step=n_step, gamma=gamma, compact=None)
        compact, stored_obs_shape, obs_dtype, followed = stored_obs(
            self._obs, obs_shape, obs_dtype, hidden_state_shape, frame_stack=frame_stack, padding_type=padding_type,
            n_step=n_step, gamma=gamma, compact=compact, compact_key=compact_key, hindsight=hindsight is not None)
        if followed is not None:  # inferred or given: recorded as the key, which a checkpoint cross-checks
            self._options["compact_key"] = key_option(followed)
        codec = frame_codec(compression, compression_level, compact=compact, hindsight=hindsight is not None)
        self._gamma = float(gamma)
        self._attach_stats(stats, num_envs)
        # The sum tree checks alpha and beta: built here, before anything is allocated.
        prioritized, sampler = replay_sampler(capacity, prioritized, alpha, beta)
        self._prioritized = prioritized
        specs = stored_specs(self._obs, followed, stored_obs_shape, obs_dtype, as_shape(action_shape, "action_shape"),
                             action_dtype, extra_fields, compact=compact, compressed=codec is not None,
                             action_range=action_range)
        self._extra_specs = {s.name: s for s in specs if s.name in (extra_fields or {})}
        if self._hidden is not None:
            specs = (*specs, *self._hidden.specs("hidden_state", hidden_state_key))
        self._setup(specs, capacity, sampler, num_envs=num_envs, storage=storage, scratch_dir=scratch_dir,
                    storing_device=storing_device, device=device, seed=seed, derived={"done": done_of})
        self._set_interleaved(True)
        self._compact = None
        if compact:
            path = followed or ()
            single_obs = next(leaf for leaf in self._obs.leaves if leaf.path == path)
            self._compact = CompactLayout(
                self._ring, single_obs.shape, single_obs.dtype, num_envs=num_envs, frame_stack=frame_stack,
                padding_type=padding_type, n_step=n_step, gamma=self._gamma, extra_names=list(self._extra_specs),
                codec=codec, path=path, row_leaves=row_leaves(self._obs, path) if followed else ())
        # The layout's writer, chosen once; with one tensor per obs, no hidden state and no extra field
        # (plain), ``add`` hands the fields to the ring's add as they are.
        self._relabeller = None if hindsight is None else Relabeller(hindsight, self._ring, self._obs, num_envs,
                                                                       n_step=n_step, gamma=self._gamma)
        self._writer = ReplayWriter(self._ring, num_envs=num_envs, obs=self._obs, hidden=self._hidden,
                                    extra_names=list(self._extra_specs), compact=self._compact,
                                    relabeller=self._relabeller)
        self._plain = self._compact is None and not self._obs.structured and self._hidden is None and not self._extra_specs
        # truncated=False says it of every env (no time limit): one flag for every row.
        self._no_truncation: bool | np.ndarray[Any, Any] = False if num_envs == 1 else np.zeros(num_envs, np.bool_)
        # The reset-step watch compares observations as add takes them: a dict's every key, whole.
        self._resets: ResetSteps | None = reset_steps(self._ring, self._obs, None if self._obs.structured else self._compact, num_envs)
        names = [spec.name for spec in self._ring.input_specs]
        self._flag_at = (names.index("terminated"), names.index("truncated"))

    @property
    def compact(self) -> bool:
        """Whether ``next_obs`` is stored once (the compact layout; see the ``compact`` option)."""
        return self._compact is not None

    @property
    def torchrl(self) -> TensorDictReplayBuffer:
        """The underlying TorchRL ``TensorDictReplayBuffer`` (for collectors, losses, Ray).

        Raises:
            ConfigError: the buffer is compact: its rows hold no ``("next", "observation")``,
                and TorchRL code writing into it would bypass each env's stream.
        """
        if self._compact is not None:
            raise ConfigError("torchrl: this buffer stores next_obs once (compact layout), which TorchRL's own "
                              "reads and writes do not know; build it with compact=False (and frame_stack=1, "
                              "n_step=1) to hand it to TorchRL, or use its extend() and sample()")
        if self._relabeller is not None:
            raise ConfigError("torchrl: this buffer relabels goals (hindsight), which needs the env of every row; "
                              "TorchRL's writes do not say it: use its add() or extend() with batch size "
                              "(num_envs, T), and sample()")
        return self._ring.hand_out()

    def clear(self) -> None:
        """Remove every row, priority and open episode; capacity and options stay.

        Example:
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=(), compact=True)
            >>> buf.add(torch.zeros(1), 0.0, 1.0, torch.ones(1), False, truncated=False)
            >>> buf.clear()
            >>> buf.add(torch.zeros(1), 0.0, 1.0, torch.ones(1), False, truncated=False)   # a new stream: any obs may start it
            >>> len(buf)
            1
        """
        with self._ring.lock:  # an add between the ring's clear and the layout's would write to half a buffer
            super().clear()
            self._set_interleaved(True)
            if self._resets is not None:
                self._resets.clear()
            if self._compact is not None:
                self._compact.clear()
            if self._relabeller is not None:
                self._relabeller.clear()

    @sizes_by_keyword
    def epochs(self, *, batch_size: int, n_epochs: int = 1, drop_last: bool = False,
               shuffle: bool = True) -> EpochIterator[ReplayBatch]:
        """Minibatches that visit every stored row once per epoch (see ``RingBuffer.epochs``).

        Raises:
            ConfigError: the buffer is compact (its newest rows are not complete
                transitions yet): use ``sample``.

        Example:
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=(), seed=0)
            >>> buf.add(torch.zeros(1), 0.0, 1.0, torch.ones(1), False, truncated=False)
            >>> [len(batch) for batch in buf.epochs(batch_size=1)]
            [1]
        """
        if self._compact is not None:
            raise ConfigError("epochs: not available for a compact buffer (next_obs stored once, frame_stack or "
                              "n_step), whose newest rows are not complete transitions yet; use sample()")
        return super().epochs(batch_size=batch_size, n_epochs=n_epochs, drop_last=drop_last, shuffle=shuffle)

    def _extra_state(self) -> dict[str, Any]:
        state = {**super()._extra_state(), "interleaved": self._rows_interleaved()}
        if self._compact is not None:
            state.update(self._compact.state_dict())
        if self._relabeller is not None:
            state.update(self._relabeller.state_dict())
        return state

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self._set_interleaved(bool(state.get("interleaved", True)))
        super()._load_extra_state(state)
        if self._compact is not None:
            if not isinstance(state.get("streams"), dict):
                raise CheckpointError("state: a compact buffer's checkpoint must hold its streams, found none")
            self._compact.load_state_dict(state, write_count=self._ring.write_count, size=len(self._ring))
        if self._relabeller is not None:
            self._relabeller.load_state_dict(state)

    def _check_step(self, reward: Any, terminated: Any, truncated: Any, env_mask: Any) -> None:
        super()._check_step(reward, terminated, truncated, env_mask)
        if env_mask is not None:
            self._writer.checked_env_mask(env_mask)

    def _layout_problem(self, extra: Mapping[str, Any], fields: Mapping[str, torch.Tensor], *, size: int,
                        count: int) -> str:
        if self._relabeller is not None:
            return self._relabeller.state_problem(extra, fields, size=size, write_count=count)
        return "" if self._compact is None else self._compact.state_problem(extra, fields, write_count=count, size=size)

    @classmethod
    def _options_from_checkpoint(cls, options: dict[str, Any]) -> dict[str, Any]:
        return saved_sampler_options(options)

    @classmethod
    def _options_to_build(cls, options: dict[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
        return with_reward_fn(options, given.get("reward_fn"))

    @loader
    @classmethod
    def load(cls, path: str | Path, *, device: DeviceLike | None = None, storing_device: DeviceLike | None = None,
             reward_fn: Any = None) -> ReplayBuffer:
        """Rebuild a buffer from a checkpoint (see ``RingBuffer.load``); ``reward_fn``: the hindsight reward
        function of a buffer that relabels goals (no checkpoint holds one; ConfigError if not callable)."""
        return cls._load_checked(path, device=device, storing_device=storing_device,
                                 given={"reward_fn": checked_reward_fn(reward_fn)})

    @property
    def prioritized(self) -> bool:
        """Whether sampling follows priorities."""
        return self._prioritized

    @property
    def beta(self) -> float:
        """The importance-sampling exponent; anneal it towards 1 by setting it between samples.

        Raises:
            PriorityError: the buffer is not prioritized.

        Example:
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=(), prioritized=True, beta=0.4)
            >>> buf.beta = 0.7
            >>> buf.beta
            0.7
        """
        return float(self._sum_tree().beta)

    @beta.setter
    def beta(self, value: float) -> None:
        self._sum_tree().beta = value

    def _sum_tree(self) -> SumTreeSampler:
        sampler = self._ring.rb.sampler
        if not isinstance(sampler, SumTreeSampler):
            raise PriorityError("beta: this buffer is not prioritized (build it with prioritized=True)")
        return sampler

    def _layout_nbytes(self) -> int:
        tables = self._relabeller if self._relabeller is not None else self._compact
        return (self._sum_tree().nbytes if self._prioritized else 0) + (0 if tables is None else tables.nbytes)

    def _field_descriptions(self) -> list[str]:
        compact = self._compact
        log = None if compact is None else compact.log
        if compact is None or log is None:
            return super()._field_descriptions()
        frames = f"{compact.field}: {log.frame_shape} {str(log.dtype).removeprefix('torch.')} {log.codec.name}-compressed"
        return [frames if spec.name == compact.field else spec.describe() for spec in self._ring.specs]

    def _repr_options(self) -> str:
        options = repr_options(self._ring.specs, prioritized=self._prioritized, compact=self._compact)
        return options if self._relabeller is None else f"{options}, {self._relabeller.options.describe()}"

    @classmethod
    def bytes_per_transition(
        cls,
        *,
        obs_shape: ObsShape,
        action_shape: Sequence[int] | int,
        obs_dtype: ObsDtype | None = None,
        action_dtype: torch.dtype = torch.float32,
        extra_fields: ExtraFields | None = None,
        prioritized: bool = False,
        frame_stack: int = 1,
        n_step: int = 1,
        compact: bool | None = None,
        hidden_state_shape: Sequence[int] | int | Mapping[str, Sequence[int] | int] | None = None,
        episode_length: float | None = None,
        compression: str | None = None,
        compact_key: str | Sequence[str] | None = None,
    ) -> float:
        """Estimated bytes one stored transition takes, to size a buffer for a machine.

        Counts the stored fields (hidden states included), the priority tree, the stream
        bookkeeping of the compact layout and, given the mean ``episode_length``, the final
        observations kept aside (one per episode). Memory of a buffer is about ``capacity``
        times this (on disk with ``storage="memmap"``, except the priority tree, the stream
        bookkeeping and the final observations, which stay in RAM).

        Takes the constructor's options of the same names (``obs_shape`` is the whole stack with
        ``frame_stack > 1``), and ``episode_length``: the mean steps per episode (``None``: final
        observations not counted).

        Raises:
            ConfigError: invalid or contradictory options, or ``compression``: what compressed
                frames take depends on the frames, so it is measured, not estimated.

        Example:
            >>> atari = dict(obs_shape=(4, 84, 84), action_shape=(), obs_dtype=torch.uint8,
            ...              action_dtype=torch.int64)
            >>> ReplayBuffer.bytes_per_transition(**atari, compact=False)
            56463.0
            >>> ReplayBuffer.bytes_per_transition(**atari, frame_stack=4, episode_length=1000)
            7128.056
        """
        if compression is not None:
            raise ConfigError(f"compression={compression!r}: what compressed frames take depends on the frames: "
                              "fill a buffer with some of yours and read buffer.nbytes / len(buffer) (real Atari "
                              "frames: 200-420 bytes per transition with zstd, docs/pixels.md)")
        return transition_bytes(obs_shape=obs_shape, action_shape=action_shape, obs_dtype=obs_dtype,
                                action_dtype=action_dtype, extra_fields=extra_fields, prioritized=prioritized,
                                frame_stack=frame_stack, n_step=n_step, compact=compact,
                                hidden_state_shape=hidden_state_shape, episode_length=episode_length,
                                compact_key=compact_key)

    # -- reading -----------------------------------------------------------------------------
    @keywords_checked
    def sample(self, batch_size: int) -> ReplayBatch:
        """Draw ``batch_size`` transitions (with replacement), delivered on ``device``.

        Uniform, or proportional to ``priority ** alpha`` with importance weights when
        prioritized. Uses the buffer's own generator: identically seeded buffers fed the
        same data draw the same batches.

        Raises:
            BatchSizeError: ``batch_size`` is not a positive int.
            EmptyBufferError: nothing is stored.

        Example:
            >>> buf = ReplayBuffer(10, obs_shape=(3,), action_shape=(), seed=0)
            >>> buf.add(torch.zeros(3), 0.0, 1.0, torch.ones(3), False, truncated=False)
            >>> batch = buf.sample(4)
            >>> batch.obs.shape, batch.reward.tolist(), batch.weight.tolist()
            (torch.Size([4, 3]), [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0])
        """
        ring = self._ring
        with ring.lock:  # index, weights and rows from one consistent state, whatever other threads add
            batch_size = ring.require_rows(batch_size, without_replacement=False)
            if self._prioritized or self._compact is not None:
                ring.flush()  # the sum tree and the streams read TorchRL's committed state
            if self._compact is not None:
                return self._batch(*self._compact.draw(batch_size, self._draw))
            if self._relabeller is not None:
                state = ring.generator.get_state()
                try:
                    index, weight = self._draw(batch_size)
                    columns = self._gather(index, pinned=self._pinned_delivery)
                    self._relabeller.relabel(columns, index)
                    return self._delivered(columns, index, weight)
                except Exception:  # a reward_fn that failed or returned no rewards: no draw happened
                    ring.generator.set_state(state)
                    raise
            return self._batch(*self._draw(batch_size))

    def _draw(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Positions (and importance weights when prioritized) of ``batch_size`` stored rows."""
        ring = self._ring
        if self._prioritized:
            index, info = ring.rb.sampler.sample(ring.rb.storage, batch_size)
            return index, info["priority_weight"].to(torch.float32)
        return torch.randint(0, len(ring), (batch_size,), generator=ring.generator, device=self._storing_device), None

    def _gather(self, index: torch.Tensor, names: Sequence[str] | None = None, *,
                pinned: bool = False) -> dict[str, torch.Tensor]:
        if self._compact is None:
            return super()._gather(index, names, pinned=pinned)
        return self._compact.columns(index, names)

    def _readable_index(self) -> torch.Tensor:
        if self._compact is None:
            return super()._readable_index()
        return self._compact.complete_index()

    def _make_batch(self, columns: dict[str, torch.Tensor]) -> ReplayBatch:
        weight = columns.get("weight")
        if weight is None:
            weight = torch.ones(columns["index"].shape[0], device=columns["index"].device)
        extras = {name: columns[name] for name in self._extra_specs}
        discount = columns.get("discount")
        if discount is None:
            discount = torch.where(columns["terminated"], 0.0, self._gamma)
            if discount.dtype is not torch.float32:  # another default dtype set by the user
                discount = discount.to(torch.float32)
        obs = self._obs
        hidden = None if self._hidden is None else self._hidden.assemble("hidden_state", columns)
        return ReplayBatch(obs.assemble("obs", columns), columns["action"], columns["reward"],
                           obs.assemble("next_obs", columns),
                           columns["terminated"], columns["truncated"], columns["done"],
                           columns["index"], weight, discount, extras, hidden)

    @keywords_checked
    def sample_sequences(self, batch_size: int, length: int, *, burn_in: int = 0) -> ReplaySequenceBatch:
        """Draw ``batch_size`` sequences of ``burn_in + length`` consecutive steps of one env each.

        Starts are uniform over every stored step that has ``burn_in + length - 1`` steps of
        its env after it; a sequence never crosses the write cursor (no overwritten or stale
        rows). It may run on past an episode's end (into the env's next episode) so that every
        step, late or in a short episode, can be drawn: ``mask`` turns False after the end,
        ``is_first`` marks episode starts. Steps of one env are ``num_envs`` rows apart as
        ``add`` writes them; ``extend`` keeps that only for batches shaped
        ``(..., num_envs)`` (time first).

        Args:
            batch_size: sequences ``B``.
            length: steps per sequence after the burn-in.
            burn_in: leading steps for warming up a recurrent state.

        Returns:
            A [`ReplaySequenceBatch`][rlbuf.ReplaySequenceBatch] with ``[B, burn_in + length]`` fields.

        Raises:
            BatchSizeError: a size that is not a positive int (``burn_in``: negative), or
                fewer stored steps per env than ``burn_in + length``.
            EmptyBufferError: nothing is stored.
            ConfigError: rows were extended env-major (a collector's ``(num_envs, T)``, into a
                ``num_envs=1`` buffer too), so steps of one env are not ``num_envs`` rows apart.

        Example:
            >>> buf = ReplayBuffer(100, obs_shape=(1,), action_shape=(), num_envs=2, seed=0)
            >>> for t in range(10):
            ...     buf.add(torch.full((2, 1), float(t)), torch.zeros(2), torch.zeros(2),
            ...             torch.full((2, 1), t + 1.0), torch.tensor([t == 4, False]), truncated=False)
            >>> batch = buf.sample_sequences(4, 3, burn_in=2)
            >>> batch.obs.shape, batch.mask.shape
            (torch.Size([4, 5, 1]), torch.Size([4, 5]))
            >>> bool((batch.obs[:, 1:] - batch.obs[:, :-1] == 1).all())   # consecutive steps
            True
        """
        if self._compact is not None:
            raise ConfigError("sample_sequences: not available for a compact buffer (next_obs stored once, "
                              "frame_stack or n_step); build it with compact=False")
        columns, span = sample_replay_sequences(self._ring, batch_size, length, burn_in, num_envs=self._num_envs,
                                                interleaved=self._rows_interleaved, hidden=self._hidden,
                                                device=self._device)
        obs = self._obs
        hidden = None if self._hidden is None else self._hidden.assemble("hidden_state", columns)
        return ReplaySequenceBatch(obs.assemble("obs", columns, batch_dims=2), columns["action"], columns["reward"],
                                   obs.assemble("next_obs", columns, batch_dims=2), columns["terminated"],
                                   columns["truncated"], columns["done"], columns["mask"], columns["is_first"], hidden,
                                   columns["index"], span - int(length),
                                   {name: columns[name] for name in self._extra_specs})

    # -- priorities --------------------------------------------------------------------------
    def update_priority(self, index: Any, priority: Any) -> None:
        """Set the priorities of the transitions at ``index`` (e.g. ``|TD error|``).

        Raises:
            PriorityError: the buffer is not prioritized, lengths differ, or a priority is
                negative or not finite.
            StoredIndexError: a position outside what is stored.

        Example:
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=(), prioritized=True, seed=0)
            >>> for _ in range(4):
            ...     buf.add(torch.zeros(1), 0.0, 0.0, torch.zeros(1), False, truncated=False)
            >>> buf.update_priority([0, 1, 2, 3], [0.0, 0.0, 1.0, 0.0])
            >>> buf.sample(5).index.tolist()
            [2, 2, 2, 2, 2]
        """
        if not self._prioritized:
            raise PriorityError("update_priority: this buffer is not prioritized (build it with prioritized=True)")
        positions = self._ring.as_index(index)
        values = priorities(priority, positions.numel())
        self._ring.rb.update_priority(positions, values)

