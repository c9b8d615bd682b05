"""The compact layout of a ReplayBuffer: rows without ``next_obs``, transitions rebuilt when sampled.

Each row stores one observation (with ``frame_stack=k``: the newest frame of the stack) and
the step's action, reward and flags; ``rlbuf._streams`` follows each env's stream to find a
row's older frames and its next rows, and ``rlbuf._nstep`` turns those into n-step rewards
and discounts. What ``sample`` returns is exactly what a buffer storing whole transitions
(with ``reward``/``discount`` of the n-step target) would return.

Example:
    >>> import torch
    >>> from rlbuf import ReplayBuffer
    >>> buf = ReplayBuffer(8, obs_shape=(2, 1), action_shape=(), frame_stack=2, seed=0)
    >>> for t in range(3):
    ...     buf.add(torch.tensor([[max(t - 1.0, 0.0)], [t]]), 0.0, 1.0, torch.tensor([[t], [t + 1.0]]), False, truncated=False)
    >>> buf.sample_all().obs[:, :, 0].tolist()    # the third row waits for the row after it
    [[0.0, 0.0], [0.0, 1.0]]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from rlbuf._codec import Codec
from rlbuf._complete_rows import NOTHING_COMPLETE, draw_among_complete
from rlbuf._episodes import env_ids_of
from rlbuf._frames import CompressedFinals, FrameLog
from rlbuf._nstep import nstep_discount, nstep_return
from rlbuf._obs import leaf_name
from rlbuf._ring import RowRing, check_field_names
from rlbuf._stream_check import streams_problem
from rlbuf._streams import Chain, PaddingType, Streams
from rlbuf._sumtree import SumTreeSampler
from rlbuf.errors import (
    CheckpointError,
    ConfigError,
    EmptyBufferError,
    PriorityError,
    StoredIndexError,
)
from rlbuf.spec import FieldSpec, NotStaged, RowReader, positive_int
from rlbuf.storage import available_ram

MAX_FRAME_STACK = 1024
"""The largest ``frame_stack`` (frames per stacked observation) a buffer takes."""
MAX_N_STEP = 10_000
"""The largest ``n_step`` a buffer takes (a sample reads ``n_step`` rows per transition)."""

# Draws of rows that turn out incomplete are replaced by new draws for this many rounds; those still incomplete
# then are drawn among the complete rows alone (rlbuf._complete_rows), which finds them first.
_REDRAW_ROUNDS = 16
# One env's flag as the kernels read it (never written: the kernels only read flags).
_ONE_FLAG = {False: np.zeros(1, np.bool_), True: np.ones(1, np.bool_)}
_COMPUTED = ("reward", "terminated", "truncated", "done", "discount")

Draw = Callable[[int], tuple[torch.Tensor, torch.Tensor | None]]
# A compact write's store: ``store(frames, terminated, truncated)`` reads and checks the ring's other fields, writes
# nothing, and returns the call that writes the rows (``RowRing.prepared``).
Store = Callable[[np.ndarray[Any, Any], Any, Any], Callable[[], None]]


class CompactLayout:
    """Writes steps into a ring of single observations and rebuilds sampled transitions.

    Args:
        ring: the buffer's ring (its ``obs`` field holds one frame per row).
        obs_shape: one observation as added (``(k, *frame)`` with ``frame_stack=k``).
        obs_dtype: the stored observation dtype.
        num_envs: envs whose steps are added.
        frame_stack: frames per observation.
        padding_type: how an episode's first stack is padded (``"reset"`` or ``"zero"``).
        n_step: steps per transition at most.
        gamma: the discount of the n-step return.
        extra_names: the buffer's extra fields.
        codec: how frames are compressed (the ring's ``obs`` field then holds each row's
            compressed size, and a [`FrameLog`][rlbuf._frames.FrameLog] the frames), or ``None``.
        path: for dict observations, the key followed frame by frame (its ring field is
            ``obs["image"]``); ``()`` for a single tensor.
        row_leaves: ``(obs field, next_obs field)`` of a dict observation's other keys, stored whole
            with each row: a sample reads ``obs`` at the sampled row and ``next_obs`` at the last row
            of its n steps (see [`rlbuf._compact_dict`][rlbuf._compact_dict]).
    """

    def __init__(self, ring: RowRing, obs_shape: tuple[int, ...], obs_dtype: torch.dtype, *, num_envs: int,
                 frame_stack: int, padding_type: PaddingType, n_step: int, gamma: float,
                 extra_names: Sequence[str], codec: Codec | None = None, path: tuple[str, ...] = (),
                 row_leaves: Sequence[tuple[str, str]] = ()) -> None:
        table_bytes = ring.capacity * (frame_stack + 2) * 8 + num_envs * math.prod(obs_shape) * obs_dtype.itemsize
        if table_bytes > available_ram():
            raise ConfigError(f"frame_stack: the stream tables of {ring.capacity} rows with frame_stack={frame_stack} "
                              f"need {table_bytes} bytes, but only {available_ram()} bytes of RAM are available")
        self.ring = ring
        self.frame_stack = frame_stack
        self.n_step = n_step
        self.gamma = gamma
        self.extra_names = tuple(extra_names)
        self.path = path
        self.field, self.next_field = leaf_name("obs", path), leaf_name("next_obs", path)  # the ring's frame field
        self.row_leaves = tuple(row_leaves)
        self.obs_spec = FieldSpec(self.field, ("observation", *path) if path else "observation", obs_shape, obs_dtype)
        self.next_obs_spec = FieldSpec(self.next_field, ("next", "observation", *path), obs_shape, obs_dtype)
        self.known = (self.field, self.next_field, *_COMPUTED, "action", *self.extra_names,
                      *(name for pair in self.row_leaves for name in pair))
        self.streams = Streams(ring.capacity, num_envs, obs_shape, obs_dtype, frame_stack=frame_stack,
                               padding_type=padding_type, n_step=n_step, storing_device=ring.storing_device,
                               names=(self.field, self.next_field))
        self.all_envs = np.arange(num_envs, dtype=np.int64)  # one row of every env, in env order (never written)
        self.frame_shape = obs_shape[1:] if frame_stack > 1 else obs_shape
        self.log = None if codec is None else FrameLog(ring.capacity, self.frame_shape, obs_dtype, codec)
        if self.log is not None:
            self.streams.finals = CompressedFinals(self.log)
        self._sampled: tuple[torch.Tensor, Chain] | None = None
        self._powers = np.array([gamma**i for i in range(n_step + 1)])  # gamma**i as rlbuf._nstep takes it
        self._readers: dict[tuple[str, int], RowReader] = {}
        if isinstance(ring.rb.sampler, SumTreeSampler):  # sample keeps complete transitions: weights over them
            ring.rb.sampler.drawable = self.complete_at

    # -- writing -----------------------------------------------------------------------------
    def write(self, obs: Any, next_obs: Any, terminated: Any, truncated: Any, env_ids: npt.NDArray[np.int64],
              store: Store) -> None:
        """Check steps against their envs' streams, store them with ``store(frames, terminated, truncated)``
        (which reads and checks the other fields, writing nothing, and returns the call that writes the ring; the
        flags as their readers read them), and link them.

        Raises:
            ShapeError, DtypeError, DeviceError, MissingFieldError, StreamError: before anything
                is stored (a stack that does not continue its stream first, whatever else is refused).
        """
        rows = len(env_ids)
        obs_rows, next_rows = self.read_rows("obs", obs, rows), self.read_rows("next_obs", next_obs, rows)
        done, terminated_np = self.read_flags("terminated", terminated, rows)
        cut, truncated_np = self.read_flags("truncated", truncated, rows)
        self.write_rows(obs_rows, next_rows, done, terminated_np, cut, truncated_np, env_ids, store)

    def write_rows(self, obs_rows: np.ndarray[Any, Any], next_rows: np.ndarray[Any, Any], done: Any,
                   terminated_np: npt.NDArray[np.bool_], cut: Any, truncated_np: npt.NDArray[np.bool_],
                   env_ids: npt.NDArray[np.int64], store: Store) -> None:
        """``write`` of rows their readers read already (``read_rows``, ``read_flags``: each flag as read, and as
        numpy bools)."""
        ring, streams = self.ring, self.streams
        rows = len(env_ids)
        frames = obs_rows[:, -1] if self.frame_stack > 1 else obs_rows
        with ring.lock:
            first, size = ring.counts()
            size = min(size + rows, ring.capacity)  # once stored: a write stores ``rows`` rows or none
            streams.check(obs_rows, next_rows, env_ids, terminated_np, truncated_np)  # a broken stack refused first
            if self.log is None:
                # Recorded once written: a write that fails (out of memory, a device error) leaves the streams as
                # they were.
                store(frames, done, cut)()
                streams.record(env_ids, first, next_rows, terminated_np, truncated_np, write_count=first + rows,
                               size=size)
                return
            # Compressed and placed first (a larger arena allocated if needed); appended once stored.
            packed = self.log.compress(frames)
            at = self.log.place(packed)
            store(packed.lengths.astype(np.int32), done, cut)()
            self.log.append(first, packed, at)
            # Recorded before a dictionary is trained: a training that fails (out of memory) leaves the stored rows
            # linked (their final frames recompressed with the rest once one is trained).
            streams.record(env_ids, first, next_rows, terminated_np, truncated_np, write_count=first + rows, size=size)
            if self.log.training_due(len(packed.blobs)):
                self._train_dictionary()

    def cut(self, env_ids: npt.NDArray[np.int64]) -> None:
        """End the open episode of each of ``env_ids`` at its newest stored row, as a time limit would
        (see [`ReplayBuffer.truncate_episodes`][rlbuf.ReplayBuffer.truncate_episodes])."""
        ring = self.ring
        with ring.rewriting("truncate_episodes"):
            positions = self.streams.cut(env_ids, ring.write_count - len(ring))
            ring.mark_truncated(positions)

    def _train_dictionary(self) -> None:
        """Compress the stored frames again with a dictionary trained on them; their new sizes into the ring."""
        assert self.log is not None
        with self.ring.rewriting("add"):
            old = self.log.codec
            positions = self.log.train()
            if positions is not None:
                self.streams.finals.recompress(old)
                sizes = torch.from_numpy(self.log.length[positions].astype(np.int32))
                leaf = self.ring.leaves[self.field]
                leaf[torch.from_numpy(positions).to(leaf.device)] = sizes.to(leaf.device)

    def read_flags(self, name: str, value: Any, rows: int) -> tuple[Any, npt.NDArray[np.bool_]]:
        """``rows`` flags of field ``name`` as its reader read them (a Python bool for one env), and as
        numpy bools for the stream kernels."""
        reader = self._readers.get((name, rows)) or self._reader(name, rows)
        try:
            read = reader.read(value)
        except NotStaged:  # a tensor on the storing device
            read = reader.tensor(value).cpu().numpy()
        if read is True or read is False:
            return read, _ONE_FLAG[read]
        return read, np.ascontiguousarray(read, np.bool_).reshape(rows)

    def read_rows(self, name: str, value: Any, rows: int) -> np.ndarray[Any, Any]:
        """``rows`` rows of field ``name`` (``obs`` or ``next_obs``), checked by its reader: C-contiguous numpy
        rows of the stored dtype, on the CPU."""
        reader = self._readers.get((name, rows)) or self._reader(name, rows)
        read: np.ndarray[Any, Any]
        try:
            read = reader.read(value)
        except NotStaged:  # a tensor on the storing device
            read = reader.tensor(value).cpu().numpy()
        if type(read) is not np.ndarray or read.dtype != reader.spec.np_dtype or not read.flags.c_contiguous:
            read = np.ascontiguousarray(read, reader.spec.np_dtype)
        return read if read.shape == reader.row_shape else read.reshape(reader.row_shape)  # (a third of the time)

    def _reader(self, name: str, rows: int) -> RowReader:
        """The ring's reader of ``rows`` rows of field ``name``, kept by name (a spec's hash costs microseconds)."""
        spec = {"obs": self.obs_spec, "next_obs": self.next_obs_spec}.get(name) or self.ring.by_name[name]
        reader = self._readers[(name, rows)] = self.ring.reader(spec, rows)
        return reader

    def env_ids_of(self, lead: tuple[int, ...]) -> npt.NDArray[np.int64]:
        """The env of each row of a tensordict of batch size ``lead``, flattened row-major.

        Raises:
            ShapeError: a batch size that does not tell envs apart.
        """
        return env_ids_of(lead, len(self.all_envs), "a buffer that stores next_obs once follows each env's stream")

    def clear(self) -> None:
        """Forget every stream (the ring is cleared by its owner)."""
        self.streams.clear()
        if self.log is not None:
            self.log.clear()
        self._sampled = None

    # -- reading -----------------------------------------------------------------------------
    def walk(self, positions: npt.NDArray[np.int64]) -> Chain:
        """The rows of the transitions at ``positions`` (the ring must be flushed)."""
        return self.streams.walk(positions, write_count=self.ring.write_count, size=len(self.ring))

    def complete_at(self, position: int) -> bool:
        """Whether the row at ``position`` holds a complete transition now."""
        return bool(self.walk(np.array([position], np.int64)).complete[0])

    def draw(self, batch_size: int, draw: Draw) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``batch_size`` positions of complete transitions from ``draw``, redrawing incomplete ones, and
        drawing the draws still incomplete after some rounds among the complete transitions alone.

        Either way the distribution is that of ``draw`` restricted to complete transitions (uniform, or
        proportional to priority), whatever the incomplete rows hold: a slot's last draw is from it, and
        whether a slot gets there depends only on its own earlier (rejected) draws.

        Raises:
            EmptyBufferError: no transition is complete yet.
        """
        generator = self.ring.generator
        state = generator.get_state()  # a refused sample leaves the random state as it was
        try:
            return self._draw_complete(batch_size, draw)
        except (EmptyBufferError, PriorityError):
            generator.set_state(state)
            raise

    def _draw_complete(self, batch_size: int, draw: Draw) -> tuple[torch.Tensor, torch.Tensor | None]:
        index, weight = draw(batch_size)
        chain = self.walk(index.cpu().numpy())
        for round_ in range(_REDRAW_ROUNDS + 1):  # the last round's draws are all complete
            missing = ~chain.complete
            if not missing.any():
                break
            count = int(missing.sum())
            # Incomplete rows hold most of the mass (or rows): the rest drawn among the complete rows alone.
            more, more_weight = draw(count) if round_ < _REDRAW_ROUNDS else draw_among_complete(self, count)
            where = torch.from_numpy(missing).to(index.device)
            index[where] = more
            if weight is not None and more_weight is not None:
                weight[where] = more_weight
            chain.merge(missing, self.walk(more.cpu().numpy()))
        self._sampled = (index, chain)
        return index, weight

    def complete_index(self) -> torch.Tensor:
        """Positions of every complete transition, oldest first.

        Raises:
            EmptyBufferError: none is complete yet.
        """
        with self.ring.lock:
            index = self.ring.chronological_index()
            complete = self.walk(index.cpu().numpy()).complete
        if not complete.any():
            raise EmptyBufferError(NOTHING_COMPLETE)
        return index[torch.from_numpy(complete).to(index.device)]

    def columns(self, index: torch.Tensor, names: Sequence[str] | None) -> dict[str, torch.Tensor]:
        """The batch columns of the transitions at ``index``, on the storing device.

        Raises:
            StoredIndexError: a transition that is not complete.
            MissingFieldError: an unknown field name.
        """
        if names is not None:
            check_field_names(names, self.known, "fields")
        with self.ring.lock:  # the streams and the rows they point to, from one consistent state
            return self._columns(index, names)

    def _columns(self, index: torch.Tensor, names: Sequence[str] | None) -> dict[str, torch.Tensor]:
        self.ring.flush()
        chain = self.chain_of(index)
        columns = self.columns_but_frames(index, chain)
        columns[self.field], columns[self.next_field] = self._stacks(index, chain)
        if names is None:
            return columns
        return {name: columns[name] for name in names}

    def chain_of(self, index: torch.Tensor) -> Chain:
        """The walk of the transitions at ``index``: the one ``draw`` just made for it, else walked now
        (the ring flushed, its lock held).

        Raises:
            StoredIndexError: a transition that is not complete.
        """
        sampled, self._sampled = self._sampled, None
        chain = sampled[1] if sampled is not None and sampled[0] is index else self.walk(index.cpu().numpy())
        if not chain.complete.all():
            position = int(index[torch.from_numpy(~chain.complete).to(index.device)][0])
            raise StoredIndexError(
                f"index: the transition at position {position} is not complete: the observations after it "
                f"(up to n_step={self.n_step}) are not added yet, or the oldest frames of its stack "
                f"(frame_stack={self.frame_stack}) were overwritten")
        return chain

    def columns_but_frames(self, index: torch.Tensor, chain: Chain) -> dict[str, torch.Tensor]:
        """The batch columns of the complete transitions at ``index`` (walked: ``chain``) but the followed
        frames: what ``columns`` builds beside the stacks, and what a Ray shard sends beside each distinct
        frame ([`rlbuf._compact_wire`][rlbuf._compact_wire]). Call with the ring's lock held."""
        ring, device, leaves = self.ring, index.device, self.row_leaves
        one_step = self.n_step == 1
        columns = ring.gather(index, ["action", *self.extra_names,
                                      *(name for pair in leaves for name in (pair if one_step else pair[:1]))])
        start = self.frame_stack - 1
        if leaves and not one_step:  # next_obs of a dict's other keys: of the last of the transition's rows
            last = chain.rows[np.arange(len(chain.steps)), start + chain.steps - 1]
            columns.update(ring.gather(torch.from_numpy(last).to(device), [pair[1] for pair in leaves]))
        with ring.reading_arrays() as arrays:  # a CPU storage: n-step targets by a compiled loop over its views
            if arrays is not None:
                columns["reward"], columns["discount"] = self.streams.nstep_from(arrays["reward"], chain, self._powers)
        terminated = torch.from_numpy(chain.terminated).to(device)
        columns["terminated"] = terminated
        columns["truncated"] = torch.from_numpy(chain.truncated).to(device)
        columns["done"] = torch.from_numpy(chain.ended).to(device)
        if "reward" not in columns:
            steps = torch.from_numpy(chain.steps).to(device)
            rows = torch.from_numpy(chain.rows[:, start:start + self.n_step].reshape(-1)).to(device)
            rewards = ring.gather(rows, ["reward"])["reward"].view(len(index), self.n_step)
            columns["reward"] = nstep_return(rewards, steps, self.gamma)
            columns["discount"] = nstep_discount(steps, terminated, self.gamma)
        return columns

    def _stacks(self, index: torch.Tensor, chain: Chain) -> tuple[torch.Tensor, torch.Tensor]:
        """``obs`` and ``next_obs`` of the followed frames: on a CPU storage of raw frames by a compiled loop over
        its numpy view, decoded straight into the batch from compressed ones, else gathered frame by frame."""
        ring, log, field, device, streams = self.ring, self.log, self.field, index.device, self.streams
        if log is not None:
            both = log.stacks(chain, streams.finals, self.frame_stack, streams.padding_type == "zero").to(device)
            return both[0], both[1]
        with ring.reading_arrays() as arrays:
            if arrays is not None:
                return streams.stacks_from(arrays[field], chain)

        def frames(positions: npt.NDArray[np.int64]) -> torch.Tensor:
            return ring.gather(torch.from_numpy(positions).to(device), [field])[field]

        return streams.stacks(self.frame_shape, chain, frames)

    @property
    def nbytes(self) -> int:
        """Bytes of the stream tables, the final observations and the compressed frames (allocated)."""
        streams = self.streams
        tables = (streams.back, streams.next, streams.terminated, streams.truncated, streams.final_slot, streams.env,
                  streams.last)
        held: int = sum(table.nbytes for table in tables) + streams.expected.nbytes + streams.finals.nbytes
        return held + (0 if self.log is None else self.log.nbytes)

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The buffer's extra state of this layout: the stream bookkeeping, and the compressed frames."""
        state = {"streams": self.streams.state_dict()}
        if self.log is not None:
            state["frames"] = self.log.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any], *, write_count: int, size: int) -> None:
        """Restore a ``state_dict`` checked by ``state_problem`` (with the ring's rows already loaded)."""
        if self.log is not None:  # first: the final observations are decoded with its codec
            # Checked frame by frame by the load's check of this very state (state_problem).
            self.log.adopt(self.log.loaded(state["frames"], self.ring.leaves[self.field][:size], write_count=write_count,
                                           verify=False))
        self.streams.load_state_dict(state["streams"])

    def state_problem(self, state: Mapping[str, Any], fields: Mapping[str, torch.Tensor], *, write_count: int,
                      size: int) -> str:
        """``""`` when ``state`` holds the stream tables of the stored ``fields`` (see
        [`streams_problem`][rlbuf._stream_check.streams_problem]) and frames that decompress, else why not."""
        if self.log is None:
            stored = fields[self.field]

            def frames(positions: npt.NDArray[np.int64]) -> torch.Tensor:
                return stored.cpu().index_select(0, torch.from_numpy(positions))
        else:
            try:
                log = self.log.loaded(state["frames"], fields[self.field], write_count=write_count)
            except CheckpointError as error:
                return str(error)

            def frames(positions: npt.NDArray[np.int64]) -> torch.Tensor:
                return torch.from_numpy(log.take(positions))
        tables = state["streams"]
        reason = streams_problem(self.streams, tables, terminated=fields["terminated"], truncated=fields["truncated"],
                                 frames=frames, frame_shape=self.frame_shape, write_count=write_count, size=size,
                                 env_required=self.log is not None)
        if reason or self.log is None:
            return reason
        final_slot = tables["final_slot"].numpy()
        problem: str = self.streams.finals.frames_problem(tables["finals"], final_slot[final_slot >= 0], log.codec)
        return problem


def layout_options(obs_shape: tuple[int, ...], *, frame_stack: int, padding_type: str, n_step: int, gamma: float,
                   compact: bool | None, option: str = "obs_shape") -> bool:
    """Check a ReplayBuffer's layout options and return whether it is compact.

    Raises:
        ConfigError: an invalid or contradictory option.

    Example:
        >>> layout_options((4, 84, 84), frame_stack=4, padding_type="reset", n_step=1, gamma=0.99, compact=None)
        True
        >>> layout_options((4, 84, 84), frame_stack=3, padding_type="reset", n_step=1, gamma=0.99, compact=None)
        Traceback (most recent call last):
        ...
        rlbuf.errors.ConfigError: obs_shape: with frame_stack=3 the first dim holds the stack, expected (3, ...), got (4, 84, 84)
    """
    for name, value, limit in (("frame_stack", frame_stack, MAX_FRAME_STACK), ("n_step", n_step, MAX_N_STEP)):
        if positive_int(name, value) > limit:
            raise ConfigError(f"{name}: expected at most {limit} (rlbuf's limit: each sample walks {name} rows per "
                              f"transition), got {value}")
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not 0 <= gamma <= 1:
        raise ConfigError(f"gamma: expected a number in [0, 1], got {gamma!r}")
    if not isinstance(padding_type, str) or padding_type not in ("reset", "zero"):
        raise ConfigError(f"padding_type: expected 'reset' or 'zero' (gymnasium's FrameStackObservation modes), "
                          f"got {padding_type!r}")
    if frame_stack > 1 and (not obs_shape or obs_shape[0] != frame_stack):
        # SB3's VecFrameStack stacks image channels last: (84, 84, 4), which VecTransposeImage puts first.
        last = ("; a stack in the last dim (SB3's VecFrameStack) goes in stack first: wrap the VecEnv in "
                "VecTransposeImage, or transpose obs and next_obs" if obs_shape and obs_shape[-1] == frame_stack else "")
        raise ConfigError(f"{option}: with frame_stack={frame_stack} the first dim holds the stack, expected "
                          f"({frame_stack}, ...), got {obs_shape}{last}")
    if compact is None:
        return frame_stack > 1 or n_step > 1
    if not isinstance(compact, bool):
        raise ConfigError(f"compact: expected True, False or None, got {compact!r}")
    if not compact and (frame_stack > 1 or n_step > 1):
        raise ConfigError(f"compact: frame_stack={frame_stack} and n_step={n_step} follow each env's stream and need "
                          "compact=True (or None), got compact=False")
    return compact
