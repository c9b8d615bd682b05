"""A buffer's state: ``state_dict``, ``check_valid``, ``load_state_dict``, ``save`` and ``load``.

One load check: every part of a state (options, counters, rows, sampler, extra state such as
the compact layout's stream tables, iterator, generators) is checked against the buffer by
``BufferState._check`` (with the invariants of [`rlbuf._invariants`][rlbuf._invariants])
before anything changes, so a refused state leaves the buffer exactly as it was;
``check_valid()`` runs the same check on the buffer's own state.

Example:
    >>> import torch
    >>> from rlbuf import ReplayBuffer
    >>> buf = ReplayBuffer(8, obs_shape=(1,), action_shape=(), seed=0)
    >>> buf.add(torch.zeros(1), 0.0, 1.0, torch.zeros(1), False, truncated=False)
    >>> state = buf.state_dict()
    >>> state["cursor"] = 5
    >>> ReplayBuffer(8, obs_shape=(1,), action_shape=()).load_state_dict(state)
    Traceback (most recent call last):
    ...
    rlbuf.errors.CheckpointError: state: size 1, cursor 5, write count 1 do not fit capacity 8 (expected size min(write count, capacity) = 1 and cursor write count % capacity = 1)
"""

from __future__ import annotations

import copy
import inspect
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, cast

import torch

from rlbuf import _torchrl
from rlbuf._invariants import (
    extra_problem,
    fields_problem,
    generator_problem,
    options_problem,
    refusing,
    rows_problem,
    same_json,
    sampler_problem,
    steps_problem,
    tensors_problem,
    with_binary_range,
)
from rlbuf._keywords import loader
from rlbuf._manifest_state import counts_problem, saved_count
from rlbuf._ring import RowRing
from rlbuf._row_sinks import RowCopies, RowSink, snapshot
from rlbuf._stats_state import checked_state
from rlbuf.checkpoint import RowFiles, load_state, save_state
from rlbuf.epochs import EpochIterator
from rlbuf.errors import CheckpointError, ConfigError
from rlbuf.stats import EpisodeStats
from rlbuf.storage import DeviceLike, check_batch_memory

BufferT = TypeVar("BufferT", bound="BufferState")
NOT_OPTIONS = ("self", "__class__", "stats", "scratch_dir", "observation_space", "action_space", "foreign", "positional")
_ITERATOR_METHODS = ("epochs", "minibatches")
_STATE_KEYS = {"kind", "options", "capacity", "sampler_kind", "spec", "data", "size", "cursor", "write_count", "fields",
               "rng", "sampler", "iterator", "extra", "versions"}  # versions: added by load_state


class MetadataOnlyWarning(UserWarning):
    """A checkpoint saved with ``data=False`` was loaded: the buffer is empty."""


def option_to_json(value: Any) -> Any:
    """A constructor option as JSON (dtypes as ``"dtype:float32"``, devices as strings).

    Example:
        >>> option_to_json({"obs_dtype": torch.uint8, "obs_shape": (3,)})
        {'obs_dtype': 'dtype:uint8', 'obs_shape': [3]}
    """
    if isinstance(value, torch.dtype):
        return "dtype:" + str(value).removeprefix("torch.")
    if isinstance(value, torch.device):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): option_to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [option_to_json(v) for v in value]
    return value


def _option_from_json(value: Any) -> Any:
    if isinstance(value, str) and value.startswith("dtype:"):
        dtype = getattr(torch, value.removeprefix("dtype:"), None)
        if not isinstance(dtype, torch.dtype):
            raise CheckpointError(f"options: unknown dtype {value!r}")
        return dtype
    if isinstance(value, dict):
        return {k: _option_from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_option_from_json(v) for v in value]
    return value


class Checked(NamedTuple):
    """What the load check returns: the counters, and whether the generators were saved on another device type."""

    size: int
    cursor: int
    write_count: int
    rng_moved: bool


class BufferState:
    """The state half of every buffer (``RingBuffer`` mixes it in); not used directly."""

    _ring: RowRing
    _options: dict[str, Any]
    _stats: EpisodeStats | None = None
    _epoch_generator: torch.Generator
    _storing_device: torch.device
    _device: torch.device
    _current_epochs: EpochIterator[Any] | None = None
    _current_epochs_call: tuple[str, dict[str, Any]] | None = None
    _num_envs: int
    _fills_by_whole_steps: bool = False
    """Rows come ``num_envs`` at a time and the ring never wraps (a rollout): the load check
    refuses a size that is no whole number of steps and a write count above the capacity."""

    if TYPE_CHECKING:
        def clear(self) -> None: ...

    def _require_writable(self, call: str) -> None:
        """``ReadOnlyError`` for the write ``call`` while the buffer is read-only (see ``read_only``)."""
        self._ring.rb._rlbuf_require_writable(call)

    # -- hooks of the buffer kinds -------------------------------------------------------------
    @classmethod
    def _options_from_checkpoint(cls, options: dict[str, Any]) -> dict[str, Any]:
        """The saved constructor options as this version takes them (older checkpoints may differ)."""
        return options

    @classmethod
    def _options_to_build(cls, options: dict[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
        """The checkpoint's options as the constructor takes them, with what ``load`` was given
        (a function, which no checkpoint holds)."""
        return options

    def _record_options(self, arguments: Mapping[str, Any]) -> None:
        """Keep the constructor arguments (JSON form) so a checkpoint can rebuild this buffer."""
        self._options = {k: option_to_json(v) for k, v in arguments.items() if k not in NOT_OPTIONS}

    def _extra_state(self) -> dict[str, Any]:
        return {"stats": None if self._stats is None else self._stats.state_dict()}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        if self._stats is not None and state.get("stats") is not None:
            self._stats.load_state_dict(state["stats"])

    def _iterator_rows(self, method: str, arguments: Mapping[str, Any], size: int,
                       fields: Mapping[str, torch.Tensor]) -> int:
        """Rows a saved iterator runs over (``fields``: the state's validated columns)."""
        return size if method == "epochs" else self._ring.capacity

    # -- taking the state ----------------------------------------------------------------------
    def _snapshot(self, sink: RowSink | None, *, data: bool) -> dict[str, Any]:
        """The state of one write count (see [`snapshot`][rlbuf._row_sinks.snapshot]): rows into ``sink``."""
        ring = self._ring

        def capture() -> dict[str, Any]:
            return copy.deepcopy(self._unrowed_state(data=data))

        taken = snapshot(ring, sink if data else None, capture)
        return {**self._header(data), "size": taken.size, "cursor": taken.cursor,
                "write_count": taken.write_count, "fields": dict(taken.rows), **taken.captured}

    def _header(self, data: bool) -> dict[str, Any]:
        ring = self._ring
        # A copy: what a caller does to a state dict must not change the buffer's options.
        return {"kind": type(self).__name__, "options": copy.deepcopy(self._options), "capacity": ring.capacity,
                "sampler_kind": type(ring.rb.sampler).__name__, "spec": [spec.to_json() for spec in ring.specs],
                "data": data}

    def _unrowed_state(self, *, data: bool) -> dict[str, Any]:
        """Generators, sampler, iterator and extra state (call with the ring's lock held)."""
        ring = self._ring
        iterator = None
        extra = self._extra_state() if data else {}
        # An iterator that can give no batch now is not kept: one over rows emptied through buffer.torchrl (refilled
        # or not), or rollout minibatches whose advantages a write made stale (the load would refuse either).
        if data and self._current_epochs is not None and self._current_epochs_call is not None and len(ring) and (
                self._current_epochs_call[0] != "minibatches" or extra.get("advantages_ready")) and (
                not self._current_epochs._rows_removed()):
            method, arguments = self._current_epochs_call
            iterator = {"method": method, "arguments": dict(arguments), "state": self._current_epochs.state_dict()}
        return {
            "rng": {"sample": ring.generator.get_state(), "epochs": self._epoch_generator.get_state()},
            "sampler": ring.rb.sampler.state_dict() if data else {},
            "iterator": iterator,
            "extra": extra,
        }

    def state_dict(self, *, data: bool = True) -> dict[str, Any]:
        """Everything needed to continue exactly: options, data, cursor, RNG, sampler, iterator.

        A consistent snapshot of one write count, also while other threads or worker
        processes write: field tensors are copies (rows written during the call are copied
        again under the buffer's lock). Values are JSON types or tensors.

        Args:
            data: include the stored rows (``False``: options and counters only).

        Example:
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=())
            >>> buf.add(torch.zeros(1), 0.0, 1.0, torch.zeros(1), False, truncated=False)
            >>> state = buf.state_dict()
            >>> state["kind"], state["size"], state["fields"]["reward"].tolist()
            ('ReplayBuffer', 1, [1.0])
            >>> buf.state_dict(data=False)["fields"]
            {}
        """
        return self._snapshot(RowCopies(), data=data)

    def _checked_counts(self, state: Mapping[str, Any]) -> tuple[int, int, int]:
        """``state``'s size, cursor and write count, refused (``CheckpointError``) where they cannot be this buffer's."""
        capacity = self._ring.capacity
        size, cursor, count = (saved_count(state, key) for key in ("size", "cursor", "write_count"))
        _raise_if("state", counts_problem(size=size, cursor=cursor, write_count=count, capacity=capacity))
        if self._fills_by_whole_steps:
            _raise_if("state", steps_problem(size=size, write_count=count, num_envs=self._num_envs, capacity=capacity))
        return size, cursor, count

    # -- the one check -------------------------------------------------------------------------
    def check_valid(self) -> tuple[bool, str]:
        """Check this buffer's invariants: ``(True, "")``, or ``(False, reason)``.

        The same check every load runs on a saved state: counters fit each other and the
        capacity, rows are finite where they must be and derived fields equal what they derive
        from, priorities match the stored rows, stream tables are those of the stored rows,
        statistics, iterator and generators are valid.

        Example:
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=())
            >>> buf.add(torch.zeros(1), 0.0, 1.0, torch.zeros(1), False, truncated=False)
            >>> buf.check_valid()
            (True, '')
        """
        ring = self._ring
        with ring.lock:
            ring.flush()
            with _torchrl.write_lock(ring.rb):
                size, cursor, count = ring.counters()
                state = {**self._header(True), "size": size, "cursor": cursor, "write_count": count,
                         "fields": {name: leaf[:size] for name, leaf in ring.leaves.items()},
                         **self._unrowed_state(data=True)}
                try:
                    self._check(state)
                except CheckpointError as error:
                    return False, str(error)
        return True, ""

    def _check(self, state: Any) -> Checked:
        """Check every part of a ``state_dict`` against this buffer; change nothing.

        Raises:
            CheckpointError: naming the first inconsistency found.
        """
        ring = self._ring
        if not isinstance(state, Mapping):
            raise CheckpointError(f"state: expected a mapping, got {type(state).__name__}")
        if state.get("kind") != type(self).__name__:
            raise CheckpointError(f"state: holds a {state.get('kind')}, not a {type(self).__name__}")
        unknown = sorted(str(key) for key in set(state) - _STATE_KEYS)
        if unknown:
            raise CheckpointError(f"state: {unknown} are not parts of a buffer's state")
        _raise_if("state", tensors_problem(state))
        saved_options = state.get("options")
        if isinstance(saved_options, dict):
            saved_options = type(self)._options_from_checkpoint(dict(saved_options))
        mine = [spec.to_json() for spec in ring.specs]
        saved_options, saved_specs = with_binary_range(saved_options, state.get("spec"), self._options, mine)
        # Options first: an option that differs (compression=) names itself, where the specs it sets would not.
        _raise_if("state", options_problem(saved_options, self._options))
        if not same_json(saved_specs, mine):
            raise CheckpointError(f"state: fields {saved_specs} differ from this buffer's {mine}")
        if not same_json(state.get("capacity"), ring.capacity):
            raise CheckpointError(f"state: capacity {state.get('capacity')}, this buffer's is {ring.capacity}")
        sampler = type(ring.rb.sampler).__name__
        if state.get("sampler_kind") != sampler:
            raise CheckpointError(f"state: sampled by a {state.get('sampler_kind')}, this buffer by a {sampler}")
        size, cursor, count = self._checked_counts(state)
        if state.get("data", True) is not True:
            if state.get("data") is not False:
                raise CheckpointError(f"state: data must be true or false, got {state.get('data')!r}")
            if any(state.get(key) for key in ("fields", "sampler", "extra")) or state.get("iterator") is not None:
                raise CheckpointError("state: data is false (options and counters only), yet it holds rows, a "
                                      "sampler, extra tables or an iterator, which rlbuf writes only with the data")
            return Checked(size, cursor, count, self._check_rng(state.get("rng")))
        _raise_if("state", fields_problem(ring.specs, state.get("fields"), size))
        fields = cast(Mapping[str, torch.Tensor], state["fields"])
        _raise_if("state", rows_problem(ring.specs, fields, derives_done="done" in ring.derived))
        self._check_sampler(state.get("sampler"), size)
        self._check_extra(state.get("extra"), fields, size, count)
        self._check_iterator(state.get("iterator"), size, fields, state["extra"])
        return Checked(size, cursor, count, self._check_rng(state.get("rng")))

    def _check_sampler(self, saved: Any, size: int) -> None:
        sampler = self._ring.rb.sampler
        if not isinstance(saved, Mapping):  # TorchRL's uniform sampler would load anything, holding nothing
            raise CheckpointError(f"sampler state: expected the table a sampler writes, got {type(saved).__name__}")
        trial = copy.deepcopy(sampler)
        refusing("sampler state", trial.load_state_dict, saved)
        own, loaded = sampler.state_dict(), trial.state_dict()
        if "_sample_list" in loaded:  # as saved: TorchRL's load reads drop_last 'x' as True, _ran_out 7 as True
            loaded = {key: saved.get(key) for key in loaded}
        if "max_priority" in loaded:  # as saved: the sampler reads a negative one as "none set"
            loaded = {**loaded, "max_priority": saved["max_priority"], "max_priority_index": saved["max_priority_index"]}
        _raise_if("sampler state", sampler_problem(loaded, size=size, alpha=own.get("alpha"), eps=own.get("eps"),
                                                          drop_last=own.get("drop_last")))

    def _check_extra(self, extra: Any, fields: Mapping[str, torch.Tensor], size: int, count: int) -> None:
        """The extra state is what this buffer writes: its statistics and the compact layout's streams."""
        ring = self._ring
        _raise_if("state", extra_problem(extra, self._extra_state(), capacity=ring.capacity,
                                         field_names=list(ring.by_name)))
        for name in ("advantage", "returns") if extra.get("advantages_ready") is True else ():  # a rollout's: finite
            if name in fields and not bool(torch.isfinite(fields[name]).all()):  # (not in their specs: old checkpoints)
                raise CheckpointError(f"state: field {name!r} holds non-finite values, computed advantages never do")
        for name in extra.get("attached", {}):  # as set_extras would take them
            if problem := self._attached_name_problem(name, ring):
                raise CheckpointError(f"state: attached extra {problem}")
        if "interleaved" in self._extra_state() and extra.get("interleaved", True) and count % self._num_envs:
            raise CheckpointError(f"state: extra state 'interleaved' is true (every add held all {self._num_envs} envs) "
                                  f"but the write count {count} is no multiple of num_envs")
        saved_stats = extra.get("stats")
        if self._stats is not None and saved_stats is None:
            raise CheckpointError("state: it holds no episode statistics, and this buffer's EpisodeStats would go on "
                                  "with episodes of another run; load it into a buffer built without stats=")
        if self._stats is not None and saved_stats is not None:
            refusing("stats state", checked_state, saved_stats, self._stats.num_envs, self._stats.window)
            trial = copy.deepcopy(self._stats)
            refusing("stats state", trial.load_state_dict, saved_stats)
        _raise_if("state", self._layout_problem(extra, fields, size=size, count=count))

    @staticmethod
    def _attached_name_problem(name: Any, ring: RowRing) -> str:
        """Why ``name`` cannot be an attached extra (a rollout's ``set_extras``); other buffers attach none."""
        return ""

    def _layout_problem(self, extra: Mapping[str, Any], fields: Mapping[str, torch.Tensor], *, size: int,
                        count: int) -> str:
        """What the layout's own tables in ``extra`` contradict in the stored rows (``""``: nothing)."""
        return ""

    def _check_iterator(self, iterator: Any, size: int, fields: Mapping[str, torch.Tensor],
                        extra: Mapping[str, Any]) -> None:
        """Build the saved iterator on the side (a throwaway generator) to check its state, and refuse one its
        method would not make of the saved state (the load makes it again, after the rows are in)."""
        if iterator is None:
            return
        if not isinstance(iterator, Mapping) or iterator.get("method") not in _ITERATOR_METHODS:
            method = iterator.get("method") if isinstance(iterator, Mapping) else iterator
            raise CheckpointError(f"state: unknown iterator method {method!r}")
        if iterator["method"] == "epochs" and "streams" in extra:
            raise CheckpointError("state: an epochs() iterator of a compact buffer, whose epochs() is refused")
        if iterator["method"] == "minibatches" and not extra.get("advantages_ready"):
            raise CheckpointError("state: a minibatches() iterator of a rollout whose advantages are not computed, "
                                  "whose minibatches() is refused")
        arguments, saved = iterator.get("arguments"), iterator.get("state")
        if not isinstance(arguments, Mapping) or not isinstance(saved, Mapping):
            raise CheckpointError("state: the iterator needs 'arguments' and 'state' tables")
        method = getattr(self, iterator["method"], None)
        if method is None:
            raise CheckpointError(f"state: a {type(self).__name__} has no {iterator['method']}()")
        written = {"batch_size", "n_epochs", "shuffle", "drop_last"} | (
            {"num_minibatches"} if iterator["method"] == "minibatches" else set())
        if set(iterator) != {"method", "arguments", "state"} or written - set(arguments):
            raise CheckpointError(f"state: the iterator must hold 'method', 'arguments' (with {sorted(written)}) and "
                                  f"'state', as rlbuf writes it")
        known = set(inspect.signature(method).parameters)
        if set(arguments) - known:
            raise CheckpointError(f"state: iterator arguments {sorted(set(arguments) - known)} are not arguments of "
                                  f"{iterator['method']}()")
        split = {("num_batches" if key == "num_minibatches" else key): value for key, value in arguments.items()
                 if key != "sequences"}
        if type(arguments.get("sequences", False)) is not bool:  # as minibatches() reads it (as_flag)
            raise CheckpointError(f"state: iterator argument sequences={arguments['sequences']!r}, not True or False")
        if split.get("n_epochs") == 0 and "batch_size" in split:  # drawn with replacement: minibatches() checks memory
            refusing("iterator state", check_batch_memory, split["batch_size"], self._ring.row_bytes)
        rows = self._iterator_rows(iterator["method"], arguments, size, fields)
        device = self._storing_device if iterator["method"] == "epochs" else self._device
        # epochs() runs over the rows stored when each epoch starts: a saved epoch may hold fewer.
        trial = refusing("iterator state", EpochIterator, (lambda: rows) if iterator["method"] == "epochs" else rows,
                         lambda index: index, **split, generator=torch.Generator(device=device))
        saved = dict(saved)
        reason, moved = generator_problem(saved.get("generator"), torch.Generator(device=device), "of the iterator")
        _raise_if("state", reason)
        if moved:  # saved on another device type: load_state_dict warns and reseeds
            saved["generator"] = trial.state_dict()["generator"]
        refusing("iterator state", trial.load_state_dict, saved)

    def _check_rng(self, rng: Any) -> bool:
        """Whether the generator states were saved on another device type (they are checked otherwise)."""
        if not isinstance(rng, Mapping) or set(rng) != {"sample", "epochs"}:
            raise CheckpointError("state: rng must hold 'sample' and 'epochs' generator states (uint8 tensors)")
        moved = False
        for what, own in (("sample", self._ring.generator), ("epochs", self._epoch_generator)):
            reason, other_device = generator_problem(rng[what], own, what)
            _raise_if("state", reason)
            moved = moved or other_device
        return moved

    # -- loading -------------------------------------------------------------------------------
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a ``state_dict`` taken from a buffer with the same fields and capacity.

        Every part is checked first (see [`check_valid`][rlbuf.ReplayBuffer.check_valid]: the
        same check): a refused state leaves the buffer exactly as it was.

        Raises:
            CheckpointError: another kind of buffer, other fields or options, or inconsistent values.

        Example:
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=(), seed=0)
            >>> buf.add(torch.zeros(1), 0.0, 1.0, torch.zeros(1), False, truncated=False)
            >>> copy = ReplayBuffer(10, obs_shape=(1,), action_shape=())
            >>> copy.load_state_dict(buf.state_dict())
            >>> len(copy), copy.sample_all().reward.tolist()
            (1, [1.0])
        """
        self._require_writable("load_state_dict")
        self._restore_checked(state, self._check(state))

    def _restore_checked(self, state: Mapping[str, Any], checked: Checked) -> None:
        """``load_state_dict`` of a ``state`` that ``_check`` returned ``checked`` for (a pair's two buffers are both
        checked before either loads: [`MixedReplay`][rlbuf.mixing.MixedReplay])."""
        ring = self._ring
        if state.get("data") is False:
            self.clear()
            return
        with ring.lock:
            # What could still fail (a move to the storing device) happens before clear(); a column
            # that requires grad must not attach the storage to its graph.
            with torch.no_grad():
                sources = {name: state["fields"][name].to(leaf.device) for name, leaf in ring.leaves.items()}
                self.clear()
                for name, leaf in ring.leaves.items():
                    leaf[:checked.size].copy_(sources[name])
            rb = ring.rb
            with _torchrl.write_lock(rb):
                _torchrl.set_counts(rb, cursor=checked.cursor, write_count=checked.write_count, size=checked.size)
            rb.sampler.load_state_dict(state["sampler"])
            ring.generation += 1
            # Under the same lock: an add must find the rows and the layout's tables of one state.
            self._load_extra_state(dict(state["extra"]))
            # The iterator and the generators too: a snapshot must not find one state's rows with another's draws.
            rng_moved = checked.rng_moved
            iterator = state.get("iterator")
            if iterator is not None:
                made = getattr(self, iterator["method"])(**iterator["arguments"])
                saved, own = dict(iterator["state"]), made.state_dict()["generator"]
                # A generator state saved on another device type (CUDA vs CPU) has another size.
                moved = saved["generator"].numel() != own.numel()
                made.load_state_dict({**saved, "generator": own} if moved else saved)
                rng_moved = rng_moved or moved
            if not checked.rng_moved:
                self._epoch_generator.set_state(state["rng"]["epochs"])
                ring.generator.set_state(state["rng"]["sample"])
        if rng_moved:
            warnings.warn("state: the random generators were saved on another device type; sampling goes on "
                          "from this buffer's own seed, so it will not repeat the original's draws",
                          RuntimeWarning, stacklevel=3)  # the caller of load_state_dict

    def save(self, path: str | Path, *, data: bool = True, keep_spare: bool = False) -> None:
        """Write a checkpoint directory at ``path`` (atomically; see [`rlbuf.checkpoint`][rlbuf.checkpoint]).

        Args:
            path: the checkpoint directory (replaced whole if it already is one).
            data: include the stored rows; ``False`` saves the options (and, for
                ``rlbuf inspect``, the counts) only: loading it gives an empty buffer.
            keep_spare: keep the replaced version as ``.<name>.spare`` for the next save to
                rewrite in place: twice the disk, for disks where allocating blocks is slow
                (see [`remove_spare`][rlbuf.checkpoint.remove_spare]).

        Raises:
            CheckpointError: the disk is full, or ``path`` is something else than a checkpoint.

        Example:
            >>> import os, tempfile
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=())
            >>> buf.add(torch.zeros(1), 0.0, 1.0, torch.zeros(1), False, truncated=False)
            >>> path = os.path.join(tempfile.mkdtemp(), "ckpt")
            >>> buf.save(path)
            >>> os.path.isdir(path)
            True
        """
        def checked_state(files: RowFiles) -> dict[str, Any]:
            # Counters load would refuse (a buffer broken by a bug) must not replace a good checkpoint.
            state = self._snapshot(files, data=data)
            self._checked_counts(state)
            return state

        save_state(checked_state, path, keep_spare=keep_spare)

    @loader
    @classmethod
    def load(cls: type[BufferT], path: str | Path, *, device: DeviceLike | None = None,
             storing_device: DeviceLike | None = None) -> BufferT:
        """Rebuild a buffer from a checkpoint; the next samples and batches equal the original's.

        Args:
            path: a directory written by ``save``.
            device: training device to use instead of the saved one.
            storing_device: storing device to use instead of the saved one.

        Raises:
            CheckpointError: a missing, truncated, corrupted, wrong-version or wrong-kind
                checkpoint (checked before any tensor is read), or one whose state is not
                what rlbuf writes (see [`load_state_dict`][rlbuf.ReplayBuffer.load_state_dict]).

        Example:
            >>> import os, tempfile
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=(), seed=0)
            >>> buf.add(torch.zeros(1), 0.0, 1.0, torch.zeros(1), False, truncated=False)
            >>> path = os.path.join(tempfile.mkdtemp(), "ckpt")
            >>> buf.save(path)
            >>> restored = ReplayBuffer.load(path)
            >>> len(restored), torch.equal(restored.sample(4).index, buf.sample(4).index)
            (1, True)
        """
        return cls._load_checked(path, device=device, storing_device=storing_device, given={})

    @classmethod
    def _load_checked(cls: type[BufferT], path: str | Path, *, device: DeviceLike | None,
                      storing_device: DeviceLike | None, given: Mapping[str, Any]) -> BufferT:
        """``load``, with what the caller gives that a checkpoint cannot hold (see ``_options_to_build``)."""
        try:
            return cls._load(path, device=device, storing_device=storing_device, given=given)
        except CheckpointError as error:
            raise CheckpointError(f"{path}: {error}" if str(path) not in str(error) else str(error)) from error
        except Exception as error:  # a damaged checkpoint may fail anywhere; only CheckpointError escapes
            raise CheckpointError(f"{path}: cannot load: {type(error).__name__}: {error}") from error

    @classmethod
    def _load(cls: type[BufferT], path: str | Path, *, device: DeviceLike | None,
              storing_device: DeviceLike | None, given: Mapping[str, Any]) -> BufferT:
        state = load_state(path, kind=cls.__name__)
        options = _option_from_json(state["options"])
        accepted = set(inspect.signature(cls.__init__).parameters) - {"self", *NOT_OPTIONS}
        if not isinstance(options, dict) or set(options) - accepted:
            unknown = sorted(set(options) - accepted) if isinstance(options, dict) else options
            raise CheckpointError(f"options {unknown} are not options of {cls.__name__}")
        options = cls._options_to_build(cls._options_from_checkpoint(options), given)
        if device is not None:
            options["device"] = device
        if storing_device is not None:
            options["storing_device"] = storing_device
        extra = state.get("extra")
        saved_stats = extra.get("stats") if isinstance(extra, Mapping) else None
        if isinstance(saved_stats, Mapping):
            if type(saved_stats.get("window")) is not int or type(saved_stats.get("num_envs")) is not int:
                raise CheckpointError(f"stats state: window and num_envs must be ints, got {saved_stats.get('window')!r} "
                                      f"and {saved_stats.get('num_envs')!r}")
            options["stats"] = refusing("stats state", lambda: EpisodeStats(
                int(saved_stats["num_envs"]), window=int(saved_stats["window"]),
                metrics=saved_stats.get("metric_modes") or None))
        try:
            buffer = cls(**options)
        except (TypeError, ValueError, ConfigError) as error:
            raise CheckpointError(f"cannot rebuild the buffer from its options: {error}") from error
        buffer.load_state_dict(state)
        if not state.get("data", True):
            warnings.warn(f"{path}: saved with data=False (options and counters only): the loaded buffer is empty; "
                          f"the original held {state['size']} rows", MetadataOnlyWarning, stacklevel=3)
        return buffer


def _raise_if(what: str, reason: str) -> None:
    if reason:
        raise CheckpointError(f"{what}: {reason}")
