"""A replay buffer's row layouts: the stored fields, and the writer of each layout, chosen once.

[`replay_specs`][rlbuf._replay_layout.replay_specs] and [`stored_obs`][rlbuf._replay_layout.stored_obs]
decide what a row stores (the compact layout stores ``next_obs`` once, and one frame of a stack).

A [`ReplayWriter`][rlbuf._replay_layout.ReplayWriter] turns the fields of ``add`` and
``extend`` into the ring's input fields for the buffer's layout (one tensor per observation;
a dict observation or a hidden state split into leaves; the compact layout, whose frames pass
through each env's stream) and hands them to the ring's one pipeline: every field read and
checked by its [`RowReader`][rlbuf.spec.RowReader], then written and committed under the lock.
``env_mask`` reads every row, then writes the rows it keeps.

Example:
    >>> import torch
    >>> from rlbuf import ReplayBuffer
    >>> buf = ReplayBuffer(8, obs_shape={"a": (2,)}, action_shape=(), num_envs=2)
    >>> buf._writer.add({"a": torch.zeros(2, 2)}, torch.zeros(2), torch.ones(2), {"a": torch.ones(2, 2)},
    ...                 torch.tensor([False, True]), torch.zeros(2, dtype=torch.bool), None, {}, None)
    True
    >>> len(buf)
    2
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torchrl.data import RandomSampler
from torchrl.data.replay_buffers.samplers import Sampler

from rlbuf._bounds import Bounds
from rlbuf._compact import CompactLayout, layout_options
from rlbuf._compact_dict import DictInputs, followed_path, ring_values, stored_options
from rlbuf._dtypes import dtype_options, extra_field_dtypes
from rlbuf._episodes import env_ids_of
from rlbuf._fields import check_given_done, done_flag, extra_specs, refuse_padding, truncated_from
from rlbuf._obs import (
    Layout,
    Leaf,
    Path,
    as_shape,
    hidden_state_key,
    hidden_state_layout,
    leaf_name,
    read_td,
)
from rlbuf._relabeller import Relabeller
from rlbuf._ring import RowRing
from rlbuf._sizing import row_bytes
from rlbuf._streams import PaddingType
from rlbuf._sumtree import SumTreeSampler
from rlbuf.errors import CheckpointError, ConfigError, ShapeError
from rlbuf.spec import (
    ExtraFields,
    FieldSpec,
    NotStaged,
    RowReader,
    as_array,
    as_flag,
    as_tensordict,
    positive_int,
)


def replay_specs(obs_shape: Any, action_shape: tuple[int, ...], obs_dtype: Any,
                 action_dtype: torch.dtype, extra_fields: ExtraFields | None, *,
                 next_obs: bool = True, action_range: Any = None) -> tuple[FieldSpec, ...]:
    """The stored fields of a replay buffer, in TorchRL keys (one per leaf of a dict observation;
    ``next_obs=False``: the compact layout).

    Example:
        >>> [s.describe() for s in replay_specs((3,), (1,), torch.float32, torch.float32, None)][:3]
        ['obs: (3,) float32', 'action: (1,) float32', 'reward: () float32']
    """
    obs = Layout.parse(obs_shape, obs_dtype)
    specs = [
        *obs.specs("obs", "observation"),
        FieldSpec("action", "action", action_shape, action_dtype, bounds=Bounds.parse(action_range, action_shape)),
        FieldSpec("reward", ("next", "reward"), (), torch.float32, finite=True, trailing_one=True),
        *(obs.specs("next_obs", ("next", "observation")) if next_obs else []),
        FieldSpec("terminated", ("next", "terminated"), (), torch.bool, trailing_one=True),
        FieldSpec("truncated", ("next", "truncated"), (), torch.bool, trailing_one=True),
        FieldSpec("done", ("next", "done"), (), torch.bool, trailing_one=True),
    ]
    reserved = {"next_obs": "the next observation of every batch", "discount": "an attribute of every batch",
                "env_mask": "an argument of add()"}
    return (*specs, *extra_specs(extra_fields, specs, reserved))


def stored_obs(obs: Layout, obs_shape: Any, obs_dtype: Any, hidden_state_shape: Any, *, frame_stack: int,
               padding_type: PaddingType, n_step: int, gamma: float, compact: bool | None,
               compact_key: Any = None, hindsight: bool = False) -> tuple[bool, Any, Any, Path | None]:
    """Whether the layout is compact, the shape and dtype stored per observation (one frame with
    ``frame_stack > 1``; a dict observation's shapes and dtypes when not compact), and the path of the
    key a compact buffer of dict observations follows frame by frame (else ``None``). A ``hindsight``
    buffer follows each env's episodes itself: its n-step transitions need no compact layout.

    Raises:
        ConfigError: the compact layout asked for with hidden states or hindsight, ``compact_key``
            where no dict observation is compact, or invalid compact-layout options.

    Example:
        >>> obs = Layout.parse({"image": (4, 8, 8), "state": (3,)}, {"image": torch.uint8})
        >>> stored_obs(obs, None, None, None, frame_stack=4, padding_type="reset", n_step=1, gamma=0.99,
        ...            compact=None)
        (True, (8, 8), torch.uint8, ('image',))
    """
    if hindsight and (compact is True or frame_stack != 1):
        raise ConfigError(f"hindsight: relabels whole transitions, not the compact layout's; got compact={compact!r}, "
                          f"frame_stack={frame_stack!r} (leave both out)")
    n_step = 1 if hindsight else n_step
    asked = compact is True or frame_stack != 1 or n_step != 1
    if asked and hidden_state_shape is not None:
        raise ConfigError("compact, frame_stack, n_step: the compact layout stores no hidden states; got "
                          "hidden_state_shape (build the buffer with compact=False, frame_stack=1, n_step=1)")
    followed: Path | None = None
    if obs.structured and asked:
        followed = followed_path(obs, compact_key, frame_stack=frame_stack)
        single: Leaf | None = next(leaf for leaf in obs.leaves if leaf.path == followed)
    elif compact_key is not None:
        why = ("this buffer is not compact (pass frame_stack, n_step or compact=True)" if obs.structured
               else "only for dict observations")
        raise ConfigError(f"compact_key={compact_key!r}: names the key of a dict observation that the compact "
                          f"layout stores frame by frame; {why}")
    else:
        single = None if obs.structured else obs.leaves[0]
    option = "obs_shape" if followed is None else leaf_name("obs_shape", followed)
    compact = layout_options(() if single is None else single.shape, frame_stack=frame_stack,
                             padding_type=padding_type, n_step=n_step, gamma=gamma, compact=compact, option=option)
    if single is None:
        return compact, obs_shape, obs_dtype, None
    return compact, single.shape[1:] if frame_stack > 1 else single.shape, single.dtype, followed


def compact_dict_specs(obs: Layout, path: Path, frame_shape: tuple[int, ...], frame_dtype: torch.dtype,
                       action_shape: tuple[int, ...], action_dtype: torch.dtype, extra_fields: ExtraFields | None, *,
                       action_range: Any = None) -> tuple[FieldSpec, ...]:
    """The stored fields of a compact buffer of dict observations: the followed key's frame in ``obs`` (an int32
    size when compressed), every other key in ``obs`` and ``next_obs`` (see [`rlbuf._compact_dict`][rlbuf._compact_dict]).

    Example:
        >>> obs = Layout.parse({"image": (4, 8, 8), "state": (3,)}, {"image": torch.uint8})
        >>> [s.describe() for s in compact_dict_specs(obs, ("image",), (8, 8), torch.uint8, (), torch.int64, None)]
        ['obs["image"]: (8, 8) uint8', 'obs["state"]: (3,) float32', 'action: () int64', 'reward: () float32', 'next_obs["state"]: (3,) float32', 'terminated: () bool', 'truncated: () bool', 'done: () bool']
    """
    shapes, dtypes = stored_options(obs, path, frame_shape, frame_dtype)
    specs = replay_specs(shapes, action_shape, dtypes, action_dtype, extra_fields, action_range=action_range)
    followed_next = leaf_name("next_obs", path)
    return tuple(spec for spec in specs if spec.name != followed_next)


def stored_specs(obs: Layout, followed: Path | None, stored_shape: Any, stored_dtype: Any,
                 action_shape: tuple[int, ...], action_dtype: torch.dtype, extra_fields: ExtraFields | None, *,
                 compact: bool, compressed: bool, action_range: Any = None) -> tuple[FieldSpec, ...]:
    """The ring's fields of a replay buffer's layout (``stored_shape``, ``stored_dtype``, ``followed``: what
    [`stored_obs`][rlbuf._replay_layout.stored_obs] says); ``compressed``: each frame as its int32 size in the
    ring (the frames live in the compact layout's log).

    Example:
        >>> obs = Layout.parse((4, 8, 8), torch.uint8)
        >>> [s.describe() for s in stored_specs(obs, None, (8, 8), torch.uint8, (), torch.int64, None, compact=True,
        ...                                     compressed=True)][:2]
        ['obs: () int32', 'action: () int64']
    """
    frame_shape, frame_dtype = ((), torch.int32) if compressed else (stored_shape, stored_dtype)
    if followed is None:
        return replay_specs(frame_shape, action_shape, frame_dtype, action_dtype, extra_fields, next_obs=not compact,
                            action_range=action_range)
    return compact_dict_specs(obs, followed, frame_shape, frame_dtype, action_shape, action_dtype, extra_fields,
                              action_range=action_range)


_PER_ALPHA, _PER_BETA = 0.6, 0.4


def replay_sampler(capacity: int, prioritized: Any, alpha: float | None, beta: float | None) -> tuple[bool, Sampler]:
    """Whether sampling is prioritized, and its sampler: a sum tree (``alpha``, ``beta``), or uniform.

    Raises:
        ConfigError: ``alpha`` or ``beta`` without ``prioritized=True``, or invalid values.

    Example:
        >>> replay_sampler(10, False, None, None)[0]
        False
        >>> replay_sampler(10, False, 0.5, None)
        Traceback (most recent call last):
        ...
        rlbuf.errors.ConfigError: alpha=0.5: only used by prioritized replay; pass prioritized=True, or leave them out for uniform sampling
    """
    prioritized = as_flag("prioritized", prioritized)
    if not prioritized and (alpha is not None or beta is not None):
        given = ", ".join(f"{k}={v}" for k, v in (("alpha", alpha), ("beta", beta)) if v is not None)
        raise ConfigError(f"{given}: only used by prioritized replay; pass prioritized=True, or leave them out "
                          f"for uniform sampling")
    if not prioritized:
        return False, RandomSampler()
    return True, SumTreeSampler(positive_int("capacity", capacity), alpha=_PER_ALPHA if alpha is None else alpha,
                                beta=_PER_BETA if beta is None else beta)


def repr_options(specs: Sequence[FieldSpec], *, prioritized: bool, compact: CompactLayout | None) -> str:
    """The layout part of a replay buffer's repr, with ``bytes_per_transition``'s estimate from the stored fields."""
    layout = "" if compact is None else f", compact=True, frame_stack={compact.frame_stack}, n_step={compact.n_step}"
    size = row_bytes([(s.shape, s.dtype.itemsize) for s in specs], prioritized=prioritized,
                     compact=compact is not None, frame_stack=1 if compact is None else compact.frame_stack)
    if compact is not None and compact.log is not None:
        # Measured: the frames' compressed bytes (final ones too) per stored row, and 16 bytes of offset,
        # size and checksum.
        log = compact.log
        rows = min(log.count, log.capacity)
        layout += f", compression={log.codec.name!r}"
        size += 16 + ((log.stored_bytes + compact.streams.finals.stored_bytes) / rows if rows else 0)
        if not rows:  # no frame compressed yet: their size is not known
            return f", prioritized={prioritized}{layout}, bytes_per_transition~{human_bytes(size)} + compressed frames"
    return f", prioritized={prioritized}{layout}, bytes_per_transition~{human_bytes(size)}"


def transition_bytes(*, obs_shape: Any, action_shape: Any, obs_dtype: Any, action_dtype: torch.dtype,
                     extra_fields: ExtraFields | None, prioritized: bool, frame_stack: int, n_step: int,
                     compact: bool | None, hidden_state_shape: Any, episode_length: float | None,
                     compact_key: Any = None) -> float:
    """Estimated bytes of one stored transition (see ``ReplayBuffer.bytes_per_transition``).

    Example:
        >>> transition_bytes(obs_shape=(4,), action_shape=(), obs_dtype=None, action_dtype=torch.int64,
        ...                  extra_fields=None, prioritized=False, frame_stack=1, n_step=1, compact=False,
        ...                  hidden_state_shape=None, episode_length=None)
        47.0
    """
    obs_dtype, action_dtype = dtype_options(obs_dtype, action_dtype)  # "uint8" too, as the constructor takes
    extra_fields = extra_field_dtypes(extra_fields)
    obs = Layout.parse(obs_shape, obs_dtype)
    compact, stored, stored_dtype, followed = stored_obs(obs, obs_shape, obs_dtype, hidden_state_shape,
                                                         frame_stack=frame_stack, padding_type="reset", n_step=n_step,
                                                         gamma=0.99, compact=compact, compact_key=compact_key)
    specs = stored_specs(obs, followed, stored, stored_dtype, as_shape(action_shape, "action_shape"), action_dtype,
                         extra_fields, compact=compact, compressed=False)
    if hidden_state_shape is not None:
        specs = (*specs, *hidden_state_layout(hidden_state_shape).specs("hidden_state", hidden_state_key))
    # Kept aside per ended episode: the final frame of the followed observation (a dict's others are row fields).
    final_obs = 0.0 if obs.structured and followed is None else math.prod(stored) * stored_dtype.itemsize
    return row_bytes([(s.shape, s.dtype.itemsize) for s in specs], prioritized=as_flag("prioritized", prioritized),
                     compact=compact, frame_stack=frame_stack, final_obs_bytes=final_obs,
                     episode_length=episode_length)


def human_bytes(count: float) -> str:
    for unit in ("B", "kB", "MB"):
        if count < 1000:
            return f"{count:.4g} {unit}"
        count /= 1000
    return f"{count:.4g} GB"


class ReplayWriter:
    """The writer of a replay buffer's rows, for its layout.

    Args:
        ring: the buffer's ring.
        num_envs: rows per ``add``.
        obs: the observation's layout (one tensor, or the leaves of a dict).
        hidden: the hidden state's layout, if stored.
        extra_names: the declared extra fields, in order.
        compact: the compact layout, if ``next_obs`` is stored once.
        relabeller: a hindsight buffer's relabelling, which checks and indexes every row written.
    """

    def __init__(self, ring: RowRing, *, num_envs: int, obs: Layout, hidden: Layout | None,
                 extra_names: Sequence[str], compact: CompactLayout | None,
                 relabeller: Relabeller | None = None) -> None:
        self.ring = ring
        self.relabeller = relabeller
        self.num_envs = num_envs
        self.obs = obs
        self.hidden = hidden
        self.extra_names = tuple(extra_names)
        self.compact = compact
        # A compact buffer of dict observations: its followed key goes through the streams, the others to the ring.
        self.dict_inputs = None if compact is None or not obs.structured else DictInputs(obs, compact.path)
        self._other_readers: list[tuple[str, RowReader]] | None = None  # a compact add's readers of other fields

    def add(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any,
            hidden_state: Any, extras: Mapping[str, Any], env_mask: Any) -> bool:
        """Store one env step (the rows of the envs in ``env_mask``, if given); extras and hidden
        states are checked by name already.

        Returns:
            Whether the rows of each env are still ``num_envs`` apart (every env's row stored).
        """
        extra_values = tuple(extras[name] for name in self.extra_names) if self.extra_names else ()
        ring, compact = self.ring, self.compact
        if compact is not None:
            if self.dict_inputs is not None:
                return self._add_compact_dict(obs, action, reward, next_obs, terminated, truncated, extras, env_mask)
            if env_mask is not None:
                others = {"action": action, "reward": reward, **dict(zip(self.extra_names, extra_values, strict=True))}
                return self._add_compact_envs(obs, next_obs, terminated, truncated, others, env_mask)
            # Every env's row, read as the ring's add reads it (one env's: one read and one assignment per field).
            compact.write(obs, next_obs, terminated, truncated, compact.all_envs,
                          lambda frames, done, cut: ring.prepared((frames, action, reward, done, cut, *extra_values),
                                                                  self.num_envs))
            return True
        if self.obs.structured or self.hidden is not None:
            hidden = () if self.hidden is None else self.hidden.split("hidden_state", hidden_state)
            values: tuple[Any, ...] = (*self.obs.split("obs", obs), action, reward, *self.obs.split("next_obs", next_obs),
                                       terminated, truncated, *extra_values, *hidden)
        else:
            values = (obs, action, reward, next_obs, terminated, truncated, *extra_values)
        if env_mask is None:
            if self.relabeller is None:
                ring.add(values, self.num_envs)
            else:
                self.relabeller.add(values)
            return True
        keep = self.checked_env_mask(env_mask)
        rows = self._kept_rows(ring.input_specs, values, keep)
        kept = int(keep.sum())
        if kept and self.relabeller is not None:
            self.relabeller.write(rows, np.flatnonzero(keep))
        elif kept:
            ring.write_checked(rows, kept)
        return kept in (0, self.num_envs)

    def _add_compact_dict(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any,
                          extras: Mapping[str, Any], env_mask: np.ndarray[Any, Any] | None) -> bool:
        """``add`` of a compact buffer of dict observations: the followed key through the streams, every other
        key a field of the row (see [`rlbuf._compact_dict`][rlbuf._compact_dict])."""
        compact, ring, inputs = self.compact, self.ring, self.dict_inputs
        assert compact is not None and inputs is not None
        followed, followed_next, values = inputs.split(obs, next_obs)
        values.update(action=action, reward=reward)
        values.update((name, extras[name]) for name in self.extra_names)
        if env_mask is not None:
            return self._add_compact_envs(followed, followed_next, terminated, truncated, values, env_mask)
        specs, field = ring.input_specs, compact.field
        compact.write(followed, followed_next, terminated, truncated, compact.all_envs,
                      lambda frames, done, cut: ring.prepared(ring_values(specs, {
                          **values, field: frames, "terminated": done, "truncated": cut}), self.num_envs))
        return True

    def _add_compact_envs(self, obs: Any, next_obs: Any, terminated: Any, truncated: Any, others: Mapping[str, Any],
                          keep: np.ndarray[Any, Any]) -> bool:
        """Read every row once, then pass the rows of the envs in ``keep`` (checked ``env_mask``) through the
        compact layout's streams (an env left out continues its stream with its next kept row) into the ring;
        ``others``: the values of the ring's other input fields, by name."""
        compact, ring, n = self.compact, self.ring, self.num_envs
        assert compact is not None
        obs_rows, next_rows = compact.read_rows("obs", obs, n), compact.read_rows("next_obs", next_obs, n)
        terminated_np, truncated_np = compact.read_flags("terminated", terminated, n)[1], compact.read_flags(
            "truncated", truncated, n)[1]
        if self._other_readers is None:  # kept: a spec's hash costs microseconds
            fixed = (compact.field, "terminated", "truncated")
            self._other_readers = [(spec.name, ring.reader(spec, n)) for spec in ring.input_specs
                                   if spec.name not in fixed]
        rows = {name: _read_rows(reader, others[name]) for name, reader in self._other_readers}
        kept = int(keep.sum())
        if kept:  # numpy on the CPU: a tensor's boolean indexing costs ~10x more per frame stack
            rows = {name: value[keep] if isinstance(value, np.ndarray) else value[torch.from_numpy(keep).to(value.device)]
                    for name, value in rows.items()}
            # The kept rows as read: not read again (the flags as their readers return them are these bools).
            done, cut, field = terminated_np[keep], truncated_np[keep], compact.field
            compact.write_rows(obs_rows[keep], next_rows[keep], done, done, cut, cut, compact.all_envs[keep],
                               lambda frames, done, cut: ring.prepared(ring_values(ring.input_specs, {
                                   **rows, field: frames, "terminated": done, "truncated": cut}), kept, given="read"))
        return kept in (0, n)

    def checked_env_mask(self, env_mask: Any) -> np.ndarray[Any, Any]:
        """``env_mask`` as ``[num_envs]`` numpy bools (the array itself where it is one already).

        Raises:
            ShapeError: not one bool per env.
            DtypeError, DeviceError: not numbers at all (strings, objects, a meta tensor).
        """
        n = self.num_envs
        if type(env_mask) is np.ndarray and env_mask.dtype == np.bool_ and env_mask.shape == (n,):
            return env_mask  # the usual mask, ``~ended``: no conversion
        keep = as_array("env_mask", env_mask)
        if n == 1 and keep.shape == ():  # one env's mask, its env dim left out as add allows
            keep = keep.reshape(1)
        if keep.dtype.kind != "b" or keep.shape != (n,):
            raise ShapeError(f"env_mask: expected {n} bools (one per env), got {keep.dtype} of shape {keep.shape}")
        return keep

    def _kept_rows(self, specs: Sequence[FieldSpec], values: Sequence[Any],
                   keep: np.ndarray[Any, Any]) -> dict[str, torch.Tensor]:
        """Read all ``num_envs`` rows of each value with its reader; return the rows ``keep`` marks, by name."""
        rows = self.ring.read_tensors(specs, values, self.num_envs)
        # numpy on the CPU: a tensor's boolean indexing costs ~10x more per frame stack
        return {name: torch.from_numpy(tensor.numpy()[keep]) if tensor.is_cpu
                else tensor[torch.from_numpy(keep).to(tensor.device)] for name, tensor in rows.items()}

    def extend(self, td: Any, *, per_env: bool,
               before_write: Callable[[dict[str, torch.Tensor]], None] | None = None) -> bool:
        """Store a TensorDict in TorchRL layout, every batch dim flattened row-major.

        Args:
            td: the TensorDict.
            per_env: the caller needs batch size ``(num_envs, T)`` (a buffer with stats).
            before_write: called with the input fields by name, shaped ``[*batch_size, ...]``,
                once they are read and before anything is stored (a buffer's statistics).

        Returns:
            Whether the rows of each env stay ``num_envs`` apart.

        Raises:
            ShapeError: ``td`` is not a TensorDict, or is not ``(num_envs, T)`` where needed.
        """
        read = self.read_extend(td, per_env=per_env)
        lead, rows, flat = read.lead, read.rows, read.flat
        if before_write is not None:
            before_write({name: value.reshape(*lead, *value.shape[1:]) for name, value in flat.items()})
        ring, compact = self.ring, self.compact
        if read.columns is None:  # a compact layout: its frames come from the streams' check
            assert compact is not None
            obs, next_obs = self._compact_obs(td, lead, rows)
            compact.write(obs, next_obs, flat["terminated"], flat["truncated"], compact.env_ids_of(lead),
                          lambda frames, done, cut: ring.prepared(ring_values(ring.input_specs, {
                              **flat, compact.field: frames, "terminated": done, "truncated": cut}), rows,
                              given="extend"))
        elif self.relabeller is not None and read.env_ids is not None:
            self.relabeller.write(read.columns, read.env_ids)
        else:
            ring.write_checked(read.columns, rows)
        return read.interleaved

    def read_extend(self, td: Any, *, per_env: bool) -> ExtendRows:
        """The rows of an ``extend``, each field read by its reader; nothing stored. Every check of a layout of
        whole transitions (``columns``); a compact layout's frames and the rows beside them are checked as they
        are stored (they follow each env's stream).

        Raises:
            ShapeError, DtypeError, NonFiniteError, MissingFieldError ...: as ``extend``.
        """
        td = as_tensordict(td)
        refuse_padding(td)
        rows = int(td.batch_size.numel())
        lead = tuple(td.batch_size)
        # Rows of one env stay num_envs apart (what sample_sequences reads) only for [..., num_envs] batches
        # (one step of each env, [num_envs, 1], too), and an empty batch moves nothing. With one env, a batch
        # of two dims over 1 is a collector's [envs, T]: several envs' steps, which no stream of one env is.
        steps = tuple(size for size in lead if size != 1)
        interleaved = rows == 0 or (len(steps) <= 1 if self.num_envs == 1 else (
            bool(steps) and steps[-1] == self.num_envs and not env_major(lead, self.num_envs)))
        ring, compact = self.ring, self.compact
        env_ids = None if self.relabeller is None else env_ids_of(lead, self.num_envs,
                                                                  "a hindsight buffer follows each env's episodes")
        tensors: dict[str, torch.Tensor] = {}
        for spec in ring.specs:
            if spec.name in ("truncated", "done") or (compact is not None and spec.name == compact.field):
                continue
            tensors[spec.name] = read_td(td, spec, lead)
        tensors["truncated"] = truncated_from(td, lead, tensors["terminated"])
        check_given_done(done_flag(td, ("next", "done"), lead), tensors["terminated"].reshape(lead), tensors["truncated"])
        if per_env and not (len(lead) == 2 and lead[0] == self.num_envs):
            raise ShapeError(f"td: a buffer with stats needs batch size ({self.num_envs}, T) to tell envs "
                             f"apart, got {lead}")
        flat = {name: value.reshape(rows, *ring.by_name[name].shape) for name, value in tensors.items()}
        columns = None if compact is not None else ring.read_tensors(
            ring.input_specs, [flat[spec.name] for spec in ring.input_specs], rows)
        return ExtendRows(lead, rows, interleaved, flat, columns, env_ids)

    def check_extend(self, td: Any, *, per_env: bool) -> None:
        """Every check of ``extend`` that needs no stream, nothing stored: ``read_extend``'s and, in a compact
        layout, the readers' of the frames and of the fields beside them (a Ray shard's, before its limiter
        holds a batch).

        Raises:
            ShapeError, DtypeError, NonFiniteError, MissingFieldError ...: as ``extend``.
        """
        read, compact = self.read_extend(td, per_env=per_env), self.compact
        if compact is not None:
            specs = [spec for spec in self.ring.input_specs if spec.name != compact.field]
            self.ring.read_tensors(specs, [read.flat[spec.name] for spec in specs], read.rows)
            for spec, stacks in zip((compact.obs_spec, compact.next_obs_spec), self._compact_obs(td, read.lead, read.rows),
                                    strict=True):
                self.ring.reader(spec, read.rows).tensor(stacks)

    def _compact_obs(self, td: Any, lead: tuple[int, ...], rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A compact layout's ``obs`` and ``next_obs`` of an ``extend`` as given, ``[rows, *shape]`` each."""
        assert self.compact is not None
        obs, next_obs = (read_td(td, spec, lead).reshape(rows, *spec.shape)
                         for spec in (self.compact.obs_spec, self.compact.next_obs_spec))
        return obs, next_obs


class ExtendRows(NamedTuple):
    """What [`ReplayWriter.read_extend`][rlbuf._replay_layout.ReplayWriter.read_extend] read of an ``extend``."""

    lead: tuple[int, ...]  # the batch size
    rows: int
    interleaved: bool  # the rows of each env stay num_envs apart
    flat: dict[str, torch.Tensor]  # the input fields as given, [rows, *shape]
    columns: dict[str, torch.Tensor] | None  # the same, checked by their readers (None: a compact layout)
    env_ids: Any  # each row's env (a hindsight buffer), else None


def saved_sampler_options(options: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's options as the constructor takes them: older versions recorded ``alpha`` and ``beta`` for uniform
    buffers too (0.6 and 0.4 by default), which the constructor refuses now; values no sum tree takes rlbuf never wrote.

    Example:
        >>> saved_sampler_options({"prioritized": False, "alpha": 0.6, "beta": 0.4})
        {'prioritized': False, 'alpha': None, 'beta': None}
    """
    if options.get("prioritized", False):
        return options
    for name in ("alpha", "beta"):  # before 0.2 any a prioritized buffer takes was recorded, unused
        value = options.get(name)
        if value is not None and (type(value) not in (int, float) or not 0 <= value < math.inf):
            raise CheckpointError(f"options: a uniform buffer with {name}={value!r}, which rlbuf never writes (none, "
                                  f"or a number >= 0 that older versions recorded unused)")
    return {**options, "alpha": None, "beta": None}


def env_major(lead: tuple[int, ...], num_envs: int) -> bool:
    """Whether an ``extend`` batch of ``lead`` holds its envs' steps env by env: a collector's ``[num_envs, T]``,
    read so even when ``T == num_envs``, and with leading or trailing dims of size 1 (``[num_envs, T, 1]``; a
    ``[T, 1, num_envs]`` is one step of each env at a time).

    Example:
        >>> env_major((4, 4), 4), env_major((10, 4), 4), env_major((4, 1), 4), env_major((1, 4, 4, 1), 4)
        (True, False, False, True)
        >>> env_major((4, 1, 4), 4)
        False
    """
    first, last = 0, len(lead)
    while first < last and lead[first] == 1:
        first += 1
    while last > first and lead[last - 1] == 1:
        last -= 1
    return last - first == 2 and lead[first] == num_envs


def _read_rows(reader: RowReader, value: Any) -> np.ndarray[Any, Any] | torch.Tensor:
    """``value`` read and checked by ``reader``: numpy rows ``[rows, *shape]``, or a tensor off the CPU."""
    try:
        return np.asarray(reader.read(value)).reshape(reader.row_shape)
    except NotStaged:  # a tensor on the storing device
        return reader.tensor(value)
