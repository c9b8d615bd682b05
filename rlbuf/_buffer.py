"""RingBuffer: what every buffer shares (options, sizes, devices, reads, epochs, keyword hints).

A subclass builds its field specs and sampler, calls ``RingBuffer._setup``, and turns
gathered columns into its typed batch in ``RingBuffer._make_batch``. The state half
(``state_dict``, ``check_valid``, ``load_state_dict``, ``save``, ``load``) is
[`BufferState`][rlbuf._state.BufferState].
"""

from __future__ import annotations

import dataclasses
import inspect
import secrets
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, NoReturn, Self, SupportsIndex, TypeVar, cast

import torch
from torchrl.data import TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import Sampler

from rlbuf._delivery import deliver
from rlbuf._fields import check_names
from rlbuf._keywords import foreign_method
from rlbuf._protocols import BufferProtocols, RowCount, copy_refusal, rebuilt
from rlbuf._ring import RowRing
from rlbuf._state import BufferState
from rlbuf._sumtree import SumTreeSampler
from rlbuf.epochs import EpochIterator, batch_bounds, check_epoch_options, sizes_by_keyword
from rlbuf.errors import (
    ConfigError,
    EmptyBufferError,
    MissingFieldError,
    RlbufError,
    StoredIndexError,
)
from rlbuf.spec import FieldSpec, RowReader, as_flag, as_int, positive_int
from rlbuf.stats import EpisodeStats
from rlbuf.storage import DeviceLike, StorageKind, build_storage, resolve_device

BatchT = TypeVar("BatchT")
T = TypeVar("T")



# Constructor keywords users bring from SB3, cpprb or TorchRL, and what rlbuf takes instead.
FOREIGN_OPTIONS = {
    "buffer_size": "rlbuf's name is capacity",
    "max_size": "rlbuf's name is capacity",
    "size": "rlbuf's name is capacity",
    "n_envs": "rlbuf's name is num_envs",
    "n_steps": "rlbuf's name is num_steps",
    "handle_timeout_termination": "always on in rlbuf: pass truncated= to add() and the timeout bootstraps",
    "optimize_memory_usage": "rlbuf's ReplayBuffer takes compact=True (next_obs stored once); for frame stacks "
                             "(FrameStackObservation) pass frame_stack=k, which stores each frame once",
    "gamma": "pass gamma to compute_returns_and_advantages() (ReplayBuffer: gamma goes with n_step)",
    "gae_lambda": "pass gae_lambda to compute_returns_and_advantages()",
    "env_dict": "declare obs_shape=/action_shape= (or observation_space=/action_space=) and extra_fields=",
    "storage_device": "rlbuf's name is storing_device",
    "batch_size": "pass it to sample(batch_size) (TorchRL's buffers take it when built)",
    "stats_tracker": "rlbuf's name is stats (an EpisodeStats)",
    "dtype": "rlbuf takes obs_dtype= and action_dtype=",
}
"""Foreign constructor keyword -> what to pass instead (unless ``FOREIGN_OPTIONS_OF`` answers for the class)."""

_ROLLOUT_SIZE = "rlbuf's name is num_steps (steps per env; SB3's buffer_size is num_steps too)"
_NO_RETURNS = "a DistillationBuffer stores no rewards or returns (obs and expert_action only)"
FOREIGN_OPTIONS_OF = {
    "RolloutBuffer": {
        "buffer_size": _ROLLOUT_SIZE,
        "max_size": _ROLLOUT_SIZE,
        "size": _ROLLOUT_SIZE,
        "capacity": "rlbuf's RolloutBuffer takes num_steps (steps per env) and num_envs; it holds num_steps * num_envs rows",
        "handle_timeout_termination": "always on in rlbuf: pass truncated= and bootstrap_value= to add()",
        "batch_size": "pass it to minibatches(batch_size=...) (or num_minibatches=)",
        "num_privileged_obs": "rlbuf takes privileged_obs_shape=(num_privileged_obs,); leave it out for none",
    },
    "ReplayBuffer": {
        "n_steps": "rlbuf's ReplayBuffer has no num_steps (a RolloutBuffer option); n_step= sets n-step returns",
        "gae_lambda": "GAE is RolloutBuffer's: compute_returns_and_advantages(gamma=, gae_lambda=)",
    },
    "DistillationBuffer": {
        "n_steps": "rlbuf's name is capacity (rows; a DistillationBuffer keeps no steps per env)",
        "gamma": _NO_RETURNS,
        "gae_lambda": _NO_RETURNS,
        "handle_timeout_termination": "a DistillationBuffer stores no episode ends (obs and expert_action only)",
    },
}
"""Class name -> foreign constructor keyword -> what that class takes instead."""


def refuse_foreign_options(owner: Callable[..., Any], given: Mapping[str, Any], positional: Sequence[Any] = (), *,
                           hints: Mapping[str, str] | None = None) -> None:
    """Raise [`ConfigError`][rlbuf.ConfigError] for keywords ``owner`` does not take, with the rlbuf name, and
    [`MissingFieldError`][rlbuf.errors.MissingFieldError] (also a ``TypeError``, as Python's own) for
    arguments by position past its own (SB3's ``ReplayBuffer(size, observation_space, action_space)``).
    ``hints``: foreign keyword -> what to pass instead (by default a buffer's: ``FOREIGN_OPTIONS`` and the
    class's ``FOREIGN_OPTIONS_OF``).

    Example:
        >>> def build(capacity: int, *positional: object, **foreign: object) -> None:
        ...     refuse_foreign_options(build, foreign, positional)
        >>> build(10, buffer_size=10)
        Traceback (most recent call last):
        ...
        rlbuf.errors.ConfigError: buffer_size: not an option of build; rlbuf's name is capacity
        >>> build(10, n_envs=2, storage_device="cpu")
        Traceback (most recent call last):
        ...
        rlbuf.errors.ConfigError: n_envs: not an option of build; rlbuf's name is num_envs; also storage_device: not an option of build; rlbuf's name is storing_device
        >>> build(10, "space")
        Traceback (most recent call last):
        ...
        rlbuf.errors.MissingFieldError: build: got 2 arguments by position, it takes 1 (capacity); pass the others by keyword (observation_space=, action_space= ...: SB3's buffers take them by position)
    """
    cls = owner.__qualname__.split(".")[0]
    if positional:
        parameters = inspect.signature(owner).parameters.values()
        own = [p.name for p in parameters if p.kind == p.POSITIONAL_OR_KEYWORD and p.name != "self"]
        raise MissingFieldError(
            f"{cls}: got {len(own) + len(positional)} arguments by position, it takes {len(own)} ({', '.join(own)}); "
            "pass the others by keyword (observation_space=, action_space= ...: SB3's buffers take them by position)")
    if hints is None:
        hints = {**FOREIGN_OPTIONS, **FOREIGN_OPTIONS_OF.get(cls, {})}
    # All at once: an SB3 constructor ported whole brings four of them, which one at a time took four runs.
    foreign = [f"{name}: not an option of {cls}; {hints[name]}" for name in given if name in hints]
    if foreign:
        raise ConfigError("; also ".join(foreign))
    if given:
        known = [p.name for p in inspect.signature(owner).parameters.values()
                 if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        raise ConfigError(f"{', '.join(given)}: not {'an option' if len(given) == 1 else 'options'} of {cls}; "
                          f"it takes {known}")


def done_of(columns: Mapping[str, Any]) -> Any:
    """``terminated | truncated`` (bool tensors, or numpy views of a CPU storage): the derived ``done``
    column of every buffer that stores both.

    Example:
        >>> done_of({"terminated": torch.tensor([True, False]), "truncated": torch.tensor([False, False])})
        tensor([ True, False])
    """
    return columns["terminated"] | columns["truncated"]


class RingBuffer(BufferProtocols, BufferState, Generic[BatchT]):
    """Shared machinery of the ring buffers; not used directly."""

    _batch_type: type[BatchT]
    _cleared = 0  # clear() calls (a load clears first): an iterator made before one refuses its next batch

    def _attach_stats(self, stats: EpisodeStats | None, num_envs: int) -> None:
        if stats is not None and stats.num_envs != num_envs:
            raise ConfigError(f"stats: built for {stats.num_envs} envs, this buffer has num_envs={num_envs}")
        self._stats = stats

    if not TYPE_CHECKING:  # a type checker keeps refusing unknown attributes

        def __getattr__(self, name: str) -> Any:
            """Only for a name the buffer lacks: Python's ``AttributeError``, naming rlbuf's method where ``name``
            is another library's (``buffer.reset()``: use ``clear()``)."""
            raise foreign_method(type(self).__name__, name)

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        """Refuse ``pickle``, ``torch.save`` and ``copy``/``copy.deepcopy`` of the buffer, before anything
        changes (pickling ``buffer.torchrl`` switches torch's sharing strategy; this never gets there).

        Example:
            >>> import pickle
            >>> from rlbuf import ReplayBuffer
            >>> pickle.dumps(ReplayBuffer(8, obs_shape=(2,), action_shape=()))  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            rlbuf.errors.NotPicklableError: ReplayBuffer: cannot be pickled or copied (pickle, torch.save, copy.deepcopy)...
        """
        raise copy_refusal(self)

    @property
    def stats(self) -> EpisodeStats | None:
        """The episode statistics this buffer feeds with every step added, if any."""
        return self._stats

    def _planned_stats(self, reward: Any, terminated: Any, truncated: Any, *, env_mask: Any = None,
                       metrics: Mapping[str, Any] | None = None) -> Callable[[], None] | None:
        """The statistics' check of one step, and what records it once the rows are stored (``None``: no stats).

        ``metrics``: name -> ``[num_envs]`` values, as [`EpisodeStats.update`][rlbuf.EpisodeStats.update]
        takes them (every metric the statistics declare, at every step). A value the statistics
        refuse is first read by this buffer's own readers, so a value both refuse is named in
        the buffer's words, as without statistics.
        """
        if self._stats is None:
            if metrics is not None:
                raise ConfigError("metrics: this buffer keeps no episode statistics to feed them to; build it with "
                                  "stats=EpisodeStats(num_envs, metrics={'name': 'sum' or 'last'})")
            return None
        try:
            return self._stats.planned_update(reward, terminated, truncated, env_mask=env_mask, metrics=metrics)
        except RlbufError:
            self._check_step(reward, terminated, truncated, env_mask)
            raise

    def _check_step(self, reward: Any, terminated: Any, truncated: Any, env_mask: Any) -> None:
        """Read a step's reward and flags as this buffer stores them (raises what the buffer refuses)."""
        ring = self._ring
        for name, value in (("reward", reward), ("terminated", terminated), ("truncated", truncated)):
            if value is not None and name in ring.by_name:
                RowReader(ring.by_name[name], self._num_envs, ring.accepted_devices).tensor(value)

    def _feed_stats_from_rollout(self, reward: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor) -> None:
        """Feed ``[num_envs, T]`` (time last) tensors to the stats, one step at a time."""
        if self._stats is None:
            return
        for t in range(reward.shape[1]):
            self._stats.update(reward[:, t], terminated[:, t], truncated[:, t])


    def _setup(
        self,
        specs: Sequence[FieldSpec],
        capacity: int,
        sampler: Sampler,
        *,
        num_envs: int,
        storage: StorageKind,
        scratch_dir: str | Path | None,
        storing_device: DeviceLike,
        device: DeviceLike | None,
        seed: int | None,
        derived: Mapping[str, Callable[[Mapping[str, torch.Tensor]], torch.Tensor]] | None = None,
    ) -> None:
        check_names(specs)
        self._num_envs = positive_int("num_envs", num_envs)
        # The epoch generator is seeded with seed + 1: both seeds must be valid torch seeds.
        checked_seed = None if seed is None else as_int("seed", seed, minimum=0, maximum=2**63 - 2)
        if positive_int("capacity", capacity) < num_envs:
            raise ConfigError(f"capacity: expected at least num_envs={num_envs} rows (one add), got {capacity}")
        self._storage_kind = storage
        self._storing_device = resolve_device(storing_device, name="storing_device")
        self._device = resolve_device(device, name="device", default=self._storing_device)
        # CPU rows for a CUDA learner are gathered into page-locked memory: one host copy, not two.
        self._pinned_delivery = self._storing_device.type == "cpu" and self._device.type == "cuda"
        built = build_storage(storage, capacity, specs, storing_device=self._storing_device, scratch_dir=scratch_dir)
        self._seed = secrets.randbits(62) if checked_seed is None else checked_seed
        generator = torch.Generator(device=self._storing_device).manual_seed(self._seed)
        self._ring = RowRing(specs, built, sampler, rows_per_add=num_envs, storing_device=self._storing_device,
                             generator=generator, derived=derived, whole_steps=self._fills_by_whole_steps)
        self._epoch_generator = torch.Generator().manual_seed(self._seed + 1)

    # -- sizes and devices -----------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._ring)

    @property
    def size(self) -> int:
        """Rows stored now (same as ``len(buffer)``)."""
        return RowCount(len(self._ring))  # an int that answers SB3's size() with the fix

    @property
    def capacity(self) -> int:
        """Rows the buffer holds at most; the oldest are overwritten first."""
        return self._ring.capacity

    @property
    def is_full(self) -> bool:
        """Whether the next add overwrites the oldest row."""
        return len(self._ring) == self._ring.capacity

    @property
    def num_envs(self) -> int:
        """Rows per ``add``."""
        return self._num_envs

    @property
    def read_only(self) -> bool:
        """Whether every write is refused with ``ReadOnlyError`` before it changes anything: ``add``,
        ``extend``, ``clear``, ``load_state_dict``, the layout's own writes and those through
        ``buffer.torchrl``. Reads, sampling and priority updates go on. ``False`` when built;
        [`MixedReplay`][rlbuf.mixing.MixedReplay] sets it on its offline buffer. It is this
        process's guard: checkpoints do not keep it, and a ``buffer.torchrl`` already sent to a
        worker process keeps the value it was sent with.

        Example:
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=())
            >>> buf.read_only = True
            >>> buf.clear()  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            rlbuf.errors.ReadOnlyError: clear: this buffer is read-only (read_only=True: a dataset, ...
        """
        return self._ring.rb._rlbuf_read_only

    @read_only.setter
    def read_only(self, value: bool) -> None:
        self._ring.rb._rlbuf_read_only = as_flag("read_only", value)

    def _change_marks(self) -> tuple[int, int, int]:
        """Rows, writes and rewrites (``clear``, ``truncate_episodes``, rows set in place, loads): any change moves one."""
        return len(self._ring), self._ring.write_count, self._ring.generation

    @property
    def nbytes(self) -> int:
        """Bytes the buffer holds: its storage (every row's fields, allocated for ``capacity`` rows) and
        its layout's own tables (PER's sum tree; the compact layout's streams, final observations and
        compressed frames).

        Example:
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(10, obs_shape=(3,), action_shape=())
            >>> buf.nbytes   # 10 rows: obs and next_obs 12 bytes each, action and reward 4, three flags 1
            350
        """
        return sum(leaf.numel() * leaf.element_size() for leaf in self._ring.leaves.values()) + self._layout_nbytes()

    def _layout_nbytes(self) -> int:
        """Bytes of the layout's tables beside the storage."""
        return 0

    @property
    def storing_device(self) -> torch.device:
        """Where rows are stored."""
        return self._storing_device

    @property
    def device(self) -> torch.device:
        """Where batches are delivered."""
        return self._device

    @property
    def fields(self) -> tuple[FieldSpec, ...]:
        """The stored fields (name, TorchRL key, shape, dtype)."""
        return self._ring.specs

    @property
    def torchrl(self) -> TensorDictReplayBuffer:
        """The underlying TorchRL ``TensorDictReplayBuffer`` (for collectors, losses, Ray).

        It sees every row added through rlbuf, and what it writes rlbuf sees. Once handed out,
        every later add is committed at once, so its ``storage`` and ``writer`` are current too
        when read directly (e.g. by a TorchRL buffer built over the same storage).

        Example:
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=())
            >>> buf.add(torch.zeros(1), 0.0, 1.0, torch.zeros(1), False, truncated=False)
            >>> len(buf.torchrl), buf.torchrl[0]["next", "reward"].tolist()
            (1, [1.0])
        """
        return self._ring.hand_out()

    def _repr_options(self) -> str:
        return ""

    def __repr__(self) -> str:
        fields = ", ".join(self._field_descriptions())
        return (f"{type(self).__name__}(size={len(self)}/{self.capacity}, storage={self._storage_kind}, "
                f"storing_device={self._storing_device}, device={self._device}{self._repr_options()}, "
                f"fields=[{fields}])")

    def _field_descriptions(self) -> list[str]:
        """The stored fields as the repr lists them."""
        return [spec.describe() for spec in self._ring.specs]

    # -- lifecycle -------------------------------------------------------------------------
    def clear(self) -> None:
        """Remove every row (and priorities); capacity and options stay.

        An iterator from ``epochs()``/``minibatches()`` is forgotten (it is not checkpointed).

        Example:
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=())
            >>> buf.add(torch.zeros(1), 0.0, 1.0, torch.zeros(1), False, truncated=False)
            >>> buf.clear()
            >>> len(buf), buf.capacity
            (0, 10)
        """
        self._require_writable("clear")
        self._ring.clear()
        self._current_epochs = self._current_epochs_call = None
        self._cleared += 1  # every iterator made before refuses its next batch (see _live)

    def close(self) -> None:
        """Release the storage's scratch directory if rlbuf created it (memmap)."""
        self._ring.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading ---------------------------------------------------------------------------
    def _make_batch(self, columns: dict[str, torch.Tensor]) -> BatchT:
        raise NotImplementedError

    def _gather(self, index: torch.Tensor, names: Sequence[str] | None = None, *,
                pinned: bool = False) -> dict[str, torch.Tensor]:
        """The columns at storage positions ``index`` (a buffer that rebuilds fields overrides it);
        with ``pinned``, gathered into page-locked memory where the layout allows."""
        if names is not None:
            self._ring.check_field_names(names)
        return self._ring.gather(index, names, pinned=pinned)

    def _readable_index(self) -> torch.Tensor:
        """Positions ``sample_all`` returns, oldest first: every stored row unless overridden."""
        return self._ring.chronological_index()

    def _batch(self, index: torch.Tensor, weight: torch.Tensor | None = None) -> BatchT:
        return self._delivered(self._gather(index, pinned=self._pinned_delivery), index, weight)

    def _delivered(self, columns: dict[str, torch.Tensor], index: torch.Tensor, weight: torch.Tensor | None) -> BatchT:
        """The typed batch of gathered ``columns`` (rows at ``index``), on the training device."""
        columns["index"] = index
        if weight is not None:
            columns["weight"] = weight
        return self._make_batch(deliver(columns, self._device))

    def sample_all(self) -> BatchT:
        """Every stored row, oldest first.

        Raises:
            EmptyBufferError: nothing is stored.

        Example:
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(3, obs_shape=(1,), action_shape=())
            >>> for r in range(5):
            ...     buf.add(torch.zeros(1), 0.0, float(r), torch.zeros(1), False, truncated=False)
            >>> buf.sample_all().reward.tolist()
            [2.0, 3.0, 4.0]
        """
        with self._ring.lock:  # the rows listed are the rows gathered, whatever other threads add
            if len(self._ring) == 0:
                raise EmptyBufferError("sample_all: the buffer is empty; add data first")
            return self._batch(self._readable_index())

    def _index_weight(self, index: torch.Tensor) -> torch.Tensor | None:
        """The importance weights ``sample`` would give the rows at ``index`` now (``None``: uniform)."""
        ring = self._ring
        if not isinstance(ring.rb.sampler, SumTreeSampler):
            return None
        with ring.lock:
            ring.flush()  # the sum tree reads TorchRL's committed state
            return ring.rb.sampler.weights(ring.rb.storage, index).to(torch.float32)

    def sample_by_index(self, index: Any, fields: Sequence[str] | None = None) -> BatchT:
        """The rows at storage positions ``index`` (e.g. ``batch.index``), as the buffer's typed batch.

        A prioritized buffer's batch holds the importance weights ``sample`` would give these
        rows now (same ``beta``, same normalisation); a uniform buffer's, all ones.

        Args:
            index: positions in ``[0, len(buffer))``: an int, a sequence or a tensor.
            fields: gather only these stored fields. The batch then holds only them: other
                attributes are absent (reading one raises ``AttributeError``), stored fields
                that are not batch attributes (``done``, ``bootstrap_value``) are in ``extras``,
                and ``len()`` counts the rows of any field it holds.

        Raises:
            StoredIndexError: a position outside what is stored.
            MissingFieldError: an unknown field name.

        Example:
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=())
            >>> for r in range(4):
            ...     buf.add(torch.zeros(1), 0.0, float(r), torch.zeros(1), False, truncated=False)
            >>> buf.sample_by_index([3, 1]).reward.tolist()
            [3.0, 1.0]
            >>> only = buf.sample_by_index(2, fields=["reward"])
            >>> type(only).__name__, only.reward.tolist(), hasattr(only, "obs")
            ('ReplayBatch', [2.0], False)
        """
        positions = self._ring.as_index(index)
        if fields is None:
            return self._batch(positions, self._index_weight(positions))
        columns = deliver(self._gather(positions, fields), self._device)
        attributes = {item.name for item in dataclasses.fields(cast(Any, self._batch_type))} - {"extras"}
        return rebuilt(self._batch_type, {**{name: columns[name] for name in attributes & set(columns)},
                                          "extras": {name: column for name, column in columns.items()
                                                     if name not in attributes}})

    @sizes_by_keyword
    def epochs(self, *, batch_size: int, n_epochs: int = 1, drop_last: bool = False,
               shuffle: bool = True) -> EpochIterator[BatchT]:
        """Minibatches that visit every stored row once per epoch, delivered on ``device``.

        Each epoch covers the rows stored when it starts (rows added during an epoch join
        the next one; in a full ring they may replace a row of the running epoch at the
        same position). ``n_epochs=0`` draws random batches with replacement, forever.

        Sizes are keywords: ``epochs(4)`` is refused, as it reads like four epochs.

        Raises:
            BatchSizeError: ``batch_size`` ≤ 0, larger than what is stored, or given by position.
            EmptyBufferError: nothing is stored.

        Example:
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=(), seed=0)
            >>> for _ in range(5):
            ...     buf.add(torch.zeros(1), 0.0, 0.0, torch.zeros(1), False, truncated=False)
            >>> [len(batch) for batch in buf.epochs(batch_size=2, n_epochs=2)]
            [2, 2, 1, 2, 2, 1]
        """
        self._ring.flush()
        # Validate before the epoch generator draws the iterator's seed: a refused call changes nothing.
        options = check_epoch_options(len(self._ring), batch_size=batch_size, n_epochs=n_epochs,
                                      drop_last=drop_last, shuffle=shuffle)
        self._ring.require_rows(options["batch_size"], without_replacement=False)
        iterator = EpochIterator(lambda: len(self._ring), self._live(self._batch), **options,
                                 generator=self._iterator_generator(self._storing_device), lock=self._ring.lock)
        options.pop("num_batches")
        return self._track_epochs(iterator, "epochs", **options)

    def _live(self, make_batch: Callable[[torch.Tensor], Any]) -> Callable[[torch.Tensor], Any]:
        """``make_batch`` of an iterator made now, refusing once the buffer is cleared or loaded (its rows are gone)."""
        made_at = self._cleared

        def batch(index: torch.Tensor) -> Any:
            if self._cleared != made_at:
                raise StoredIndexError("epochs: the buffer was cleared or loaded after this iterator was made, so the "
                                       "rows it iterates are gone; make a new one (after a load: buffer.current_epochs "
                                       "resumes the saved one)")
            return make_batch(index)
        return batch

    def _following_rewrites(self, build: Callable[[], T], *, units: Callable[[T], int] | None = None) -> Callable[[], T]:
        """``build()`` now, and again once stored rows are rewritten (a rollout's advantages or extras set again):
        an iterator's batches then hold what the buffer holds, as one resumed from a checkpoint does, whether its
        columns are the storage's own or copies (on the training device, padded trajectories). ``units``: what the
        iterator counts in a build (trajectories), which a rebuild must keep."""
        built: list[Any] = [self._ring.generation, build()]
        expected = None if units is None else units(built[1])

        def current() -> T:
            if built[0] != self._ring.generation:
                built[1] = None  # the old copy freed before the new one is made (a failed build: made again)
                built[:] = [self._ring.generation, build()]
                if units is not None and units(built[1]) != expected:
                    raise StoredIndexError(f"epochs: the rollout's episode ends were rewritten after this iterator "
                                           f"was made (through buffer.torchrl): {units(built[1])} trajectories now, "
                                           f"it iterates {expected}; make a new one")
            return cast(T, built[1])
        return current

    def _track_epochs(self, iterator: EpochIterator[BatchT], method: str, **arguments: Any) -> EpochIterator[BatchT]:
        with self._ring.lock:  # a save meanwhile finds the iterator and the call that made it together
            self._current_epochs = iterator
            self._current_epochs_call = (method, arguments)
        return iterator

    @property
    def current_epochs(self) -> EpochIterator[BatchT] | None:
        """The iterator made by the last ``epochs()``/``minibatches()`` call, saved with checkpoints.

        After ``load`` it is the restored iterator, resuming at the batch after the
        one the original had reached when it was saved.

        Example:
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=())
            >>> buf.add(torch.zeros(1), 0.0, 1.0, torch.zeros(1), False, truncated=False)
            >>> buf.current_epochs is None, buf.epochs(batch_size=1) is buf.current_epochs
            (True, True)
        """
        return self._current_epochs

    def _iterator_generator(self, device: torch.device) -> torch.Generator:
        """A fresh generator on ``device`` for one iterator, seeded from the buffer's epoch generator."""
        seed = int(torch.randint(0, 2**62, (1,), generator=self._epoch_generator))
        return torch.Generator(device=device).manual_seed(seed)

    def num_batches(self, batch_size: int, drop_last: bool = False) -> int:
        """Batches per epoch over what is stored now.

        Example:
            >>> import torch
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=())
            >>> for _ in range(5):
            ...     buf.add(torch.zeros(1), 0.0, 0.0, torch.zeros(1), False, truncated=False)
            >>> buf.num_batches(2), buf.num_batches(2, drop_last=True)
            (3, 2)
        """
        return len(batch_bounds(len(self._ring), batch_size=batch_size, drop_last=as_flag("drop_last", drop_last)))
