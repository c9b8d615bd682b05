"""Offline → online: batches drawn from a dataset buffer and a live buffer in a set ratio, seeded, saved as a pair.

[`MixedReplay`][rlbuf.mixing.MixedReplay] samples each batch from two
[`ReplayBuffer`][rlbuf.ReplayBuffer]s with their own ``sample`` (so prioritized replay, n-step
returns and frame stacks of each apply unchanged) and joins the two typed batches into one
[`MixedBatch`][rlbuf.mixing.MixedBatch]: offline rows first, then online rows, with a
``from_online`` mask. Writes go to the buffers themselves; the offline one is read-only while mixing.

Example:
    >>> import torch
    >>> from rlbuf import ReplayBuffer
    >>> offline = ReplayBuffer(100, obs_shape=(2,), action_shape=(), seed=0)   # e.g. from_minari(...)
    >>> online = ReplayBuffer(100, obs_shape=(2,), action_shape=(), prioritized=True, seed=0)
    >>> for buffer in (offline, online):
    ...     buffer.add(torch.zeros(2), 0.0, 1.0, torch.zeros(2), False, truncated=False)
    >>> mixed = MixedReplay(offline, online, offline_fraction=0.25, seed=0)
    >>> batch = mixed.sample(8)
    >>> batch.from_online.tolist()
    [False, False, True, True, True, True, True, True]
    >>> mixed.update_priority(batch, torch.rand(8))   # the online rows' go to the online buffer
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import numbers
import re
import secrets
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

import torch
from tensordict import TensorDict

from rlbuf._buffer import refuse_foreign_options
from rlbuf._convert import as_array, as_int, positive_int, stored_positions
from rlbuf._keywords import keywords_checked, loader
from rlbuf._manifest import plain_file_bytes
from rlbuf._mix_pair import check_pair
from rlbuf._priorities import priorities
from rlbuf._protocols import MixerProtocols
from rlbuf.batches import ReplayBatch
from rlbuf.checkpoint import load_state, save_state
from rlbuf.errors import (
    BatchSizeError,
    CheckpointError,
    ConfigError,
    EmptyBufferError,
    PriorityError,
    RlbufError,
    StoredIndexError,
)
from rlbuf.replay import ReplayBuffer
from rlbuf.storage import DeviceLike

Split = Literal["exact", "binomial"]
_SPLITS: tuple[str, ...] = get_args(Split)
_KIND = "MixedReplay"
_MIXER_DIR = "mixer"
_PART = re.compile(r"\.?(offline|online)-([0-9a-f]{12})(\..*)?")
_OPTIONS = ("offline_fraction", "split", "min_online", "seed")
_STATE_KEYS = {"kind", "options", "generator", "parts", "offline", "online"}
MixedReplayT = TypeVar("MixedReplayT", bound="MixedReplay")


@dataclass(slots=True, frozen=True, eq=False, repr=False)
class MixedBatch(ReplayBatch):
    """A [`ReplayBatch`][rlbuf.ReplayBatch] drawn from two buffers: the offline rows first, then the online rows.

    Every field is the two buffers' batches joined row-wise; ``index`` holds each row's position
    in its own buffer (so priorities go through [`MixedReplay.update_priority`][rlbuf.mixing.MixedReplay.update_priority],
    never one buffer's) and ``weight`` the weight its own buffer gave it (ones if uniform).

    Attributes:
        from_online: ``[B]`` bool, True for the rows drawn from the online buffer.

    Example:
        >>> buffers = [ReplayBuffer(10, obs_shape=(1,), action_shape=(), seed=0) for _ in range(2)]
        >>> for reward, buffer in enumerate(buffers):
        ...     buffer.add(torch.zeros(1), 0.0, float(reward), torch.zeros(1), False, truncated=False)
        >>> batch = MixedReplay(*buffers, seed=0).sample(4)
        >>> batch.reward.tolist(), batch.from_online.tolist()
        ([0.0, 0.0, 1.0, 1.0], [False, False, True, True])
    """

    from_online: torch.Tensor = field(kw_only=True)

    def to_tensordict(self) -> TensorDict:
        """The batch in TorchRL layout, as [`ReplayBatch.to_tensordict`][rlbuf.ReplayBatch.to_tensordict], with ``"from_online"``.

        Example:
            >>> batch = MixedBatch(*(torch.zeros(2),) * 10, from_online=torch.tensor([False, True]))
            >>> batch.to_tensordict()["from_online"].tolist()
            [False, True]
        """
        return ReplayBatch.to_tensordict(self).set("from_online", self.from_online)


def _join(values: list[Any]) -> Any:
    """The values of one batch field joined row-wise (tensors, TensorDicts, extras by name, or ``None``)."""
    if values[0] is None or len(values) == 1:
        return values[0]
    if isinstance(values[0], dict):
        return {name: torch.cat([value[name] for value in values]) for name in values[0]}
    return torch.cat(values)


def _mixed(offline: ReplayBatch | None, online: ReplayBatch | None) -> MixedBatch:
    """The two batches as one, offline rows first (either may be ``None``: no rows of it)."""
    parts = [(batch, flag) for batch, flag in ((offline, False), (online, True)) if batch is not None]
    values = {item.name: _join([getattr(batch, item.name) for batch, _ in parts]) for item in dataclasses.fields(ReplayBatch)}
    from_online = torch.cat([torch.full((len(batch),), flag, device=batch.reward.device) for batch, flag in parts])
    return MixedBatch(**values, from_online=from_online)


def _generator_problem(saved: Any) -> str:
    """Why ``saved`` is no state of a CPU generator (``""``: it is one)."""
    size = torch.Generator().get_state().numel()
    if (not isinstance(saved, torch.Tensor) or saved.dtype != torch.uint8 or saved.dim() != 1
            or saved.device.type != "cpu" or saved.numel() != size):
        got = f"{saved.dtype} {tuple(saved.shape)}" if isinstance(saved, torch.Tensor) else type(saved).__name__
        return f"generator: expected a CPU generator state (uint8, ({size},)), got {got}"
    try:
        torch.Generator().set_state(saved.clone())
    except RuntimeError as error:
        return f"generator: not a valid generator state ({error})"
    return ""


def _checked_fraction(value: Any, error: type[RlbufError] = ConfigError) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) <= 1.0:
        raise error(f"offline_fraction: expected a number in [0, 1], got {value!r}")
    return float(value)


def _reachable_min_online(min_online: int, online: ReplayBuffer, error: type[RlbufError] = ConfigError) -> None:
    """Refuse a ``min_online`` past the online buffer's capacity: it never holds that many, every batch stays offline."""
    if min_online > online.capacity:
        raise error(f"min_online: expected at most {online.capacity} (the online buffer's capacity), got {min_online}; "
                    "the online buffer never holds more, so every batch would come from the offline buffer")


_OFFLINE_SHARE = ("rlbuf's name is offline_fraction, as TorchRL's OfflineToOnlineReplayBuffer's: the share of each "
                  "batch drawn from the offline buffer")
_FOREIGN_OPTIONS = {
    **dict.fromkeys(("ratio", "mix_ratio", "mixing_ratio", "offline_ratio"), _OFFLINE_SHARE),
    **dict.fromkeys(("online_fraction", "online_ratio"),
                    "pass offline_fraction=1 - online_fraction: rlbuf names the offline buffer's share of each batch"),
    **dict.fromkeys(("online_capacity", "online_storage"), "build the online ReplayBuffer and pass it: "
                                                           "MixedReplay(offline, online)"),
    "batch_size": "pass it to sample(batch_size)",
}
"""Other libraries' keywords for a mixer of offline and online replay -> what ``MixedReplay`` takes instead."""


def _manifest_digest(part: Path) -> str:
    """The SHA-256 of a part's manifest, read as a load reads it (a plain file: never a link's target or a pipe)."""
    return hashlib.sha256(plain_file_bytes(part / "manifest.json")).hexdigest()


def _saved_part(part: Path) -> dict[str, Any]:
    """A part just saved: the counters its manifest holds (writers may have added since), its directory, its digest."""
    manifest = (part / "manifest.json").read_bytes()  # read once; no data file read again
    return {**{key: value for key, value in json.loads(manifest)["state"].items() if key in ("size", "write_count")},
            "directory": part.name, "manifest_sha256": hashlib.sha256(manifest).hexdigest()}


class MixedReplay(MixerProtocols):
    """Batches from an offline (dataset) buffer and an online (live) buffer, ``offline_fraction`` of each batch offline.

    Each buffer samples its part with its own ``sample`` and generator; the split of each batch is
    drawn from the mixer's own generator, so seeded buffers and a seeded mixer fed the same data draw
    the same batches. The mixer sets the offline buffer's ``read_only`` (its writes refused; lifted, a
    changed row or write count is refused at every ``sample`` and ``save``). Until the online buffer
    holds ``min_online`` rows, every row of a batch comes from the offline buffer (``batch.from_online``).

    Args:
        offline: the dataset buffer (not empty).
        online: the buffer your envs add to; its batches must hold the same fields, shapes and dtypes.
        offline_fraction: the share of each batch drawn offline, in ``[0, 1]``; settable (annealing).
        split: ``"exact"``: ``floor(f * B)`` or ``ceil(f * B)`` offline rows, the latter with probability
            ``f * B - floor(f * B)`` (exactly ``f * B`` when that is whole, ``f * B`` on average);
            ``"binomial"``: ``Binomial(B, f)`` offline rows, as if each row picked its buffer by a coin.
        min_online: online rows needed before any batch row is drawn online (at most the online buffer's capacity).
        seed: seeds the mixer's generator (the buffers keep their own seeds).

    Raises:
        ConfigError: not two distinct ``ReplayBuffer``s, a different ``gamma``, or invalid options.
        MissingFieldError: a batch field of one buffer only (the message names it).
        ShapeError: a batch field of another shape.
        DtypeError: a batch field of another dtype.
        DeviceError: batches delivered on different devices.
        EmptyBufferError: the offline buffer is empty.

    Example:
        >>> offline = ReplayBuffer(100, obs_shape=(2,), action_shape=(), seed=0)
        >>> offline.add(torch.zeros(2), 0.0, 0.0, torch.zeros(2), False, truncated=False)
        >>> online = ReplayBuffer(100, obs_shape=(3,), action_shape=())
        >>> MixedReplay(offline, online)
        Traceback (most recent call last):
        ...
        rlbuf.errors.ShapeError: obs: expected shape (2,) (the offline buffer's), got (3,) in the online buffer
    """

    def __init__(self, offline: ReplayBuffer, online: ReplayBuffer, *, offline_fraction: float = 0.5,
                 split: Split = "exact", min_online: int = 1, seed: int | None = None, **foreign: Any) -> None:
        refuse_foreign_options(MixedReplay.__init__, foreign, hints=_FOREIGN_OPTIONS)  # not a buffer's hints
        fraction = _checked_fraction(offline_fraction)
        if split not in _SPLITS:
            raise ConfigError(f"split: expected one of {list(_SPLITS)}, got {split!r}")
        self._min_online = positive_int("min_online", min_online)
        self._seed = secrets.randbits(62) if seed is None else as_int("seed", seed, minimum=0, maximum=2**63 - 1)
        check_pair(offline, online)
        _reachable_min_online(self._min_online, online)
        self._offline, self._online, self._offline_fraction, self._split = offline, online, fraction, split
        self._generator = torch.Generator().manual_seed(self._seed)
        self._offline_marks = offline._change_marks()
        offline.read_only = True  # its writes refused from now on, before they change anything

    @property
    def offline(self) -> ReplayBuffer:
        """The offline (dataset) buffer: read-only while mixing."""
        return self._offline

    @property
    def online(self) -> ReplayBuffer:
        """The online buffer: add to it as to any ``ReplayBuffer``."""
        return self._online

    @property
    def offline_fraction(self) -> float:
        """The share of each batch drawn offline; set it between samples to anneal towards online data.

        Raises:
            ConfigError: a value outside ``[0, 1]`` (the fraction is left as it was).

        Example:
            >>> buffers = [ReplayBuffer(10, obs_shape=(1,), action_shape=()) for _ in range(2)]
            >>> buffers[0].add(torch.zeros(1), 0.0, 0.0, torch.zeros(1), False, truncated=False)
            >>> mixed = MixedReplay(*buffers, offline_fraction=0.5)
            >>> mixed.offline_fraction = 0.5 * max(0.0, 1 - 250 / 1000)   # linear annealing: step 250 of 1000
            >>> mixed.offline_fraction
            0.375
        """
        return self._offline_fraction

    @offline_fraction.setter
    def offline_fraction(self, value: float) -> None:
        self._offline_fraction = _checked_fraction(value)

    @property
    def split(self) -> Split:
        """How each batch is split: ``"exact"`` or ``"binomial"`` (see the class)."""
        return self._split

    def __repr__(self) -> str:
        return (f"MixedReplay(offline_fraction={self._offline_fraction}, split={self._split!r}, "
                f"offline={len(self._offline)} rows, online={len(self._online)} rows, min_online={self._min_online})")

    def _offline_count(self, batch_size: int) -> int:
        """Offline rows of the next batch, drawn from the mixer's generator (one draw per batch)."""
        fraction = self._offline_fraction
        if self._split == "binomial":
            total, share = torch.tensor([float(batch_size)]), torch.tensor([fraction])
            return int(torch.binomial(total, share, generator=self._generator).item())
        uniform = float(torch.rand((), dtype=torch.float64, generator=self._generator))
        expected = fraction * batch_size
        low = math.floor(expected + 1e-9)  # 0.3 * 10 is 3.0000000000000004: whole, no extra row
        return low + int(uniform < expected - low)

    def _require_read_only(self) -> None:
        """Refuse an offline buffer changed since mixing began, had its ``read_only`` been lifted."""
        if (marks := self._offline._change_marks()) != self._offline_marks:
            (rows, writes, rewrites), (rows_now, writes_now, rewrites_now) = self._offline_marks, marks
            raise ConfigError(f"offline: the offline buffer is read-only while mixing, but it changed ({rows} rows, {writes} "
                              f"writes and {rewrites} rewrites when mixing began, {rows_now}, {writes_now} and {rewrites_now} "
                              "now); add to the online buffer, or build a new MixedReplay over the changed dataset")

    @keywords_checked
    def sample(self, batch_size: int) -> MixedBatch:
        """Draw ``batch_size`` transitions: the split from the mixer's generator, each part from its buffer's ``sample``.

        Returns:
            A [`MixedBatch`][rlbuf.mixing.MixedBatch]: offline rows first; ``from_online`` marks the others.

        Raises (checks come first; a part its buffer refuses puts the mixer's and the online buffer's generators
        back, and the online part is drawn first, so an online buffer refusing leaves the offline one's as it was):
            BatchSizeError: ``batch_size`` is not a positive int.
            ConfigError: the offline buffer changed while mixing.
            EmptyBufferError: the online buffer is empty and the offline fraction is 0 (nothing to draw from).

        Example:
            >>> offline = ReplayBuffer(100, obs_shape=(1,), action_shape=(), seed=0)
            >>> online = ReplayBuffer(100, obs_shape=(1,), action_shape=(), seed=1)
            >>> offline.add(torch.zeros(1), 0.0, 0.0, torch.zeros(1), False, truncated=False)
            >>> mixed = MixedReplay(offline, online, offline_fraction=0.5, seed=0)
            >>> mixed.sample(4).from_online.tolist()   # the online buffer is empty: all offline
            [False, False, False, False]
            >>> online.add(torch.ones(1), 0.0, 1.0, torch.ones(1), False, truncated=False)
            >>> mixed.sample(4).reward.tolist()
            [0.0, 0.0, 1.0, 1.0]
        """
        batch_size = positive_int("batch_size", batch_size, BatchSizeError)
        self._require_read_only()
        online_ready = len(self._online) >= self._min_online
        if not online_ready and self._offline_fraction == 0.0:
            raise EmptyBufferError(f"sample: offline_fraction is 0 and the online buffer holds {len(self._online)} rows "
                                   f"(min_online={self._min_online}); add online data first")
        before, online_before = self._generator.get_state(), self._online._ring.generator.get_state()
        offline_rows = self._offline_count(batch_size) if online_ready else batch_size
        try:  # online first: a live buffer may refuse (compact, no complete transition yet) before the dataset draws
            online = self._online.sample(batch_size - offline_rows) if offline_rows < batch_size else None
            offline = self._offline.sample(offline_rows) if offline_rows else None
        except BaseException:  # the dataset refused (or the online part): both generators as they were
            self._generator.set_state(before)
            self._online._ring.generator.set_state(online_before)
            raise
        return _mixed(offline, online)

    def update_priority(self, batch: MixedBatch | Any, priority: Any, *, from_online: Any = None) -> None:
        """Set the priorities of a batch's rows (e.g. ``|TD error|``), each in the buffer it came from.

        A row's priority goes to its buffer if that buffer is prioritized; a uniform buffer's rows have none to
        set, theirs are checked and left out (the same call works while batches are all offline). All checked first.

        Args:
            batch: the [`MixedBatch`][rlbuf.mixing.MixedBatch] sampled, or its ``index``.
            priority: one value per row of the batch.
            from_online: with an index only: the batch's ``from_online`` mask.

        Raises:
            PriorityError: neither buffer is prioritized, ``from_online`` missing or not one bool per
                row, a one-buffer ``ReplayBatch``, or priorities of the wrong length, negative or not finite.
            StoredIndexError: an index that is no 1-D array of positions, or a position outside what its buffer stores.

        Example:
            >>> offline = ReplayBuffer(10, obs_shape=(1,), action_shape=(), seed=0)
            >>> online = ReplayBuffer(10, obs_shape=(1,), action_shape=(), prioritized=True, seed=0)
            >>> for buffer in (offline, online, online):
            ...     buffer.add(torch.zeros(1), 0.0, 0.0, torch.zeros(1), False, truncated=False)
            >>> mixed = MixedReplay(offline, online, seed=0)
            >>> mixed.update_priority([0, 0, 1], [9.0, 0.0, 1.0], from_online=torch.tensor([False, True, True]))
            >>> online.sample(3).index.tolist()     # row 0 of online has priority 0 now
            [1, 1, 1]
        """
        if isinstance(batch, MixedBatch) and from_online is None:
            index, mask = batch.index, batch.from_online
        elif isinstance(batch, MixedBatch) or from_online is None:
            raise PriorityError("from_online: pass a MixedBatch alone, or its index with from_online=batch.from_online "
                                "(an index alone does not say which buffer each row came from)")
        elif isinstance(batch, ReplayBatch):
            raise PriorityError("batch: a ReplayBatch of one buffer (its own sample), not a MixedBatch; give its "
                                "priorities to that buffer's update_priority, or pass the MixedBatch mixed.sample gave")
        else:  # arrays and lists as every index is read; a tensor stays where it is (a CUDA index)
            index, mask = (value if isinstance(value, torch.Tensor) else torch.tensor(as_array(name, value, error))
                           for name, value, error in (("index", batch, StoredIndexError),
                                                      ("from_online", from_online, PriorityError)))
        if index.dim() != 1:
            raise StoredIndexError(f"index: expected one position per row (1-D), got shape {tuple(index.shape)}")
        if mask.dtype != torch.bool or tuple(mask.shape) != tuple(index.shape):
            raise PriorityError(f"from_online: expected {tuple(index.shape)} bools (one per row), got "
                                f"{mask.dtype} {tuple(mask.shape)}")
        if not (self._offline.prioritized or self._online.prioritized):
            raise PriorityError("update_priority: neither buffer is prioritized (build one with prioritized=True)")
        values = priorities(priority, index.numel())
        updates = [(buffer, stored_positions(index[rows.to(index.device)], len(buffer), buffer.storing_device),
                    values[rows.cpu()]) for buffer, rows in ((self._offline, ~mask), (self._online, mask))
                   if buffer.prioritized and bool(rows.any())]
        for buffer, _, part in updates:  # each part's (p + eps) ** alpha too: neither buffer changes if one refuses
            buffer._ring.rb.sampler.check_priority(part)
        for buffer, positions, part in updates:
            buffer.update_priority(positions, part)

    def _mixer_state(self, offline: Mapping[str, Any], online: Mapping[str, Any]) -> dict[str, Any]:
        """Options, generator and the counters of the parts' states; the offline buffer checked unchanged first."""
        parts = {name: {"size": part["size"], "write_count": part["write_count"]}
                 for name, part in (("offline", offline), ("online", online))}
        self._require_read_only()
        return {"kind": _KIND, "options": {"offline_fraction": self._offline_fraction, "split": self._split,
                                           "min_online": self._min_online, "seed": self._seed},
                "generator": self._generator.get_state(), "parts": parts}

    def state_dict(self) -> dict[str, Any]:
        """The mixer's options and generator, and both buffers' ``state_dict()``, as plain values and tensors.

        Raises:
            ConfigError: the offline buffer changed while mixing.

        Example:
            >>> buffers = [ReplayBuffer(10, obs_shape=(1,), action_shape=(), seed=0) for _ in range(2)]
            >>> buffers[0].add(torch.zeros(1), 0.0, 0.0, torch.zeros(1), False, truncated=False)
            >>> state = MixedReplay(*buffers, seed=0).state_dict()
            >>> state["options"]["offline_fraction"], state["offline"]["size"], state["online"]["size"]
            (0.5, 1, 0)
        """
        offline, online = self._offline.state_dict(), self._online.state_dict()
        return {**self._mixer_state(offline, online), "offline": offline, "online": online}

    @staticmethod
    def _checked_options(state: Any) -> dict[str, Any]:
        """The options of a state whose mixer part is what ``state_dict`` writes (else ``CheckpointError``)."""
        if not isinstance(state, Mapping) or state.get("kind") != _KIND:
            found = state.get("kind") if isinstance(state, Mapping) else type(state).__name__
            raise CheckpointError(f"state: holds a {found}, not a {_KIND}")
        if unknown := sorted(str(key) for key in set(state) - _STATE_KEYS - {"versions"}):
            raise CheckpointError(f"state: {unknown} are not parts of a {_KIND} state")
        options = state.get("options")
        if not isinstance(options, Mapping) or set(options) != set(_OPTIONS):
            raise CheckpointError(f"state: options must hold exactly {list(_OPTIONS)}, got {options!r}")
        _checked_fraction(options["offline_fraction"], CheckpointError)
        if options["split"] not in _SPLITS:
            raise CheckpointError(f"split: expected one of {list(_SPLITS)}, got {options['split']!r}")
        for name, minimum in (("min_online", 1), ("seed", 0)):
            as_int(name, options[name], minimum=minimum, maximum=2**63 - 1, error=CheckpointError)
        if reason := _generator_problem(state.get("generator")):
            raise CheckpointError(f"state: {reason}")
        parts = state.get("parts")
        if not isinstance(parts, Mapping) or set(parts) != {"offline", "online"} or not all(map(
                lambda part: isinstance(part, Mapping), parts.values())):
            raise CheckpointError("state: parts must hold the 'offline' and 'online' counters")
        return dict(options)

    @staticmethod
    def _check_part(state: Mapping[str, Any], name: str, buffer_state: Mapping[str, Any]) -> None:
        """Refuse a part whose counters are not those the mixer recorded (a swapped or stale part)."""
        recorded, found = state["parts"][name], {key: buffer_state.get(key) for key in ("size", "write_count")}
        if set(recorded) - {"directory", "manifest_sha256"} != set(found) or any(
                type(recorded[key]) is not int or type(found[key]) is not int or recorded[key] != found[key]
                for key in found):  # ints both: a tensor's != is no bool
            raise CheckpointError(f"{name}: the buffer holds size {found['size']} and write count {found['write_count']}, "
                                  f"the mixer was saved with {dict(recorded)} (a swapped or stale part)")

    def _restore(self, options: Mapping[str, Any], generator: torch.Tensor) -> None:
        self._offline_fraction, self._split = float(options["offline_fraction"]), options["split"]
        self._min_online, self._seed = int(options["min_online"]), int(options["seed"])
        self._generator.set_state(generator.clone())
        self._offline_marks = self._offline._change_marks()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a ``state_dict`` into this mixer and its two buffers (built with the same options).

        Everything is checked first: the mixer's part here, each buffer's part by its own
        ``load_state_dict``; a refused state leaves the mixer and both buffers as they were.

        Raises:
            CheckpointError: another kind of state, an option out of range, a generator state of
                the wrong size, parts that are not the ones the mixer recorded, or a part its
                buffer refuses.

        Example:
            >>> buffers = [ReplayBuffer(10, obs_shape=(1,), action_shape=(), seed=0) for _ in range(4)]
            >>> for buffer in buffers:
            ...     buffer.add(torch.zeros(1), 0.0, 0.0, torch.zeros(1), False, truncated=False)
            >>> mixed, copy = MixedReplay(*buffers[:2], seed=0), MixedReplay(*buffers[2:], seed=1)
            >>> copy.load_state_dict(mixed.state_dict())
            >>> torch.equal(copy.sample(16).from_online, mixed.sample(16).from_online)
            True
        """
        options = self._checked_options(state)
        _reachable_min_online(options["min_online"], self._online, CheckpointError)
        checked = {}
        for name, buffer in (("offline", self._offline), ("online", self._online)):  # both checked, then loaded
            if not isinstance(part := state.get(name), Mapping) or part.get("data") is False:
                raise CheckpointError(f"state: {name} must be that buffer's state_dict() with its rows")
            self._check_part(state, name, part)
            checked[name] = buffer._check(part)
        self._online._require_writable("load_state_dict")
        self._online._restore_checked(state["online"], checked["online"])
        self._offline.read_only = False  # the mixer's own restore of its dataset
        try:
            self._offline._restore_checked(state["offline"], checked["offline"])
        finally:
            self._offline.read_only = True
        self._restore(options, state["generator"])

    def check_valid(self) -> tuple[bool, str]:
        """Check both buffers' invariants and that the offline buffer did not change: ``(True, "")`` or ``(False, reason)``.

        Example:
            >>> buffers = [ReplayBuffer(10, obs_shape=(1,), action_shape=()) for _ in range(2)]
            >>> buffers[0].add(torch.zeros(1), 0.0, 0.0, torch.zeros(1), False, truncated=False)
            >>> mixed = MixedReplay(*buffers)
            >>> buffers[0].read_only = False  # lifted by hand, then written to
            >>> buffers[0].add(torch.zeros(1), 0.0, 0.0, torch.zeros(1), False, truncated=False)
            >>> mixed.check_valid()[1].startswith("offline: the offline buffer is read-only")
            True
        """
        for name, buffer in (("offline", self._offline), ("online", self._online)):
            valid, reason = buffer.check_valid()
            if not valid:
                return False, f"{name}: {reason}"
        try:
            self._require_read_only()
        except ConfigError as error:
            return False, str(error)
        return True, ""

    def save(self, path: str | Path) -> None:
        """Write a checkpoint directory: each buffer saved by its own ``save``, then the mixer's state.

        ``path/offline-<token>`` and ``path/online-<token>`` are the buffers' checkpoints, ``path/mixer`` the mixer's
        (options, generator, the parts' names, counters and manifest checksums), written last and atomically: a save
        killed at any point leaves the previous pair whole. Earlier parts are removed after. One save at a time per path.

        Raises:
            ConfigError: the offline buffer changed while mixing.
            CheckpointError: ``path`` holds something else than a mixed checkpoint, or a save failed.

        Example:
            >>> import os, tempfile
            >>> buffers = [ReplayBuffer(10, obs_shape=(1,), action_shape=(), seed=0) for _ in range(2)]
            >>> buffers[0].add(torch.zeros(1), 0.0, 0.0, torch.zeros(1), False, truncated=False)
            >>> mixed, path = MixedReplay(*buffers, seed=0), os.path.join(tempfile.mkdtemp(), "mixed")
            >>> mixed.save(path)
            >>> torch.equal(MixedReplay.load(path).sample(8).index, mixed.sample(8).index)
            True
        """
        root = Path(path)
        if root.exists() and (not root.is_dir() or (any(root.iterdir()) and not (root / _MIXER_DIR).is_dir())):
            raise CheckpointError(f"{root}: exists and is not a mixed checkpoint (no {_MIXER_DIR}/ inside); "
                                  "save to a new or empty directory")
        self._require_read_only()
        token = uuid.uuid4().hex[:12]
        for name, buffer in (("offline", self._offline), ("online", self._online)):
            buffer.save(root / f"{name}-{token}")
        parts = {name: _saved_part(root / f"{name}-{token}") for name in ("offline", "online")}
        save_state({**self._mixer_state(parts["offline"], parts["online"]), "parts": parts}, root / _MIXER_DIR)
        for entry in root.iterdir():  # parts of earlier or killed saves: the mixer names only this save's
            match = _PART.fullmatch(entry.name)
            if match is not None and match.group(2) != token:
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()

    @loader
    @classmethod
    def load(cls: type[MixedReplayT], path: str | Path, *, device: DeviceLike | None = None,
             storing_device: DeviceLike | None = None, reward_fn: Any = None) -> MixedReplayT:
        """Rebuild the mixer and both buffers from ``save``; the next batches equal the original's.

        Args:
            path: a directory written by ``save``.
            device: training device for both buffers instead of the saved ones.
            storing_device: storing device for both buffers instead of the saved ones.
            reward_fn: the hindsight reward function of a buffer that relabels goals (see ``ReplayBuffer.load``).

        Raises:
            CheckpointError: a missing or damaged part, an option out of range, a generator state of the wrong
                size, parts not the ones the mixer was saved with (swapped, replaced), or buffers that do not mix.

        Example:
            >>> import tempfile
            >>> MixedReplay.load(tempfile.mkdtemp())  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            rlbuf.errors.CheckpointError: ...: not a MixedReplay checkpoint directory (no mixer/ in it)
        """
        root = Path(path)
        try:
            found = (root / _MIXER_DIR).exists(), root.exists()
        except OSError as error:  # a name too long, a directory without permission
            raise CheckpointError(f"{root}: unreadable ({error.strerror})") from None
        if not found[0]:  # named as the path given, not as its missing mixer/ directory
            problem = ("does not exist (expected a MixedReplay checkpoint directory: check the path)"
                       if not found[1] else "not a MixedReplay checkpoint directory (no mixer/ in it)")
            raise CheckpointError(f"{root}: {problem}")
        try:
            state = load_state(root / _MIXER_DIR, kind=_KIND)
            options = cls._checked_options(state)
            buffers = []
            for name in ("offline", "online"):
                part = state["parts"][name]
                directory = part.get("directory")
                if not isinstance(directory, str) or not re.fullmatch(f"{name}-[0-9a-f]{{12}}", directory):
                    raise CheckpointError(f"{name}: the part's directory {directory!r} is not one a save writes")
                if (root / directory).is_symlink() or not (root / directory / "manifest.json").is_file() or (
                        _manifest_digest(root / directory) != part.get("manifest_sha256")):
                    raise CheckpointError(f"{name}: {directory}/ is not the checkpoint the mixer was saved with "
                                          "(missing, swapped, replaced or a link)")
                buffer = ReplayBuffer.load(root / directory, device=device, storing_device=storing_device,
                                           reward_fn=reward_fn)
                cls._check_part(state, name, buffer.state_dict(data=False))
                buffers.append(buffer)
            _reachable_min_online(options["min_online"], buffers[1], CheckpointError)
            try:
                mixed = cls(buffers[0], buffers[1], offline_fraction=options["offline_fraction"],
                            split=options["split"], min_online=options["min_online"], seed=options["seed"])
            except RlbufError as error:  # the pair refused: the buffers no longer mix
                raise CheckpointError(f"the two buffers do not mix: {error}") from error
            mixed._restore(options, state["generator"])
            return mixed
        except CheckpointError as error:
            raise CheckpointError(f"{root}: {error}" if str(root) not in str(error) else str(error)) from error
