"""Python's protocols on buffers and batches: what each does, or the call it names instead.

A buffer is a resource, not a sequence: ``len``, ``bool``, ``==`` (identity) and ``hash`` work;
indexing, iteration, ``next``, ``in`` and numpy conversion are refused with the call to use
(``sample_by_index``, ``sample_all``, ``sample``, ``epochs``), since TorchRL's ``rb[i]`` reads a storage
position, not the ``i``-th oldest row; copies are refused (``copy_refusal``). A mixer
(``MixerProtocols``) refuses the same, and ``len``. A batch is a value: rows are selected with
``batch[2:5]``, ``batch[index]`` or a mask, ``batch.to(device)`` moves it, ``==`` compares
contents, copies and pickles hold the same; an ``int`` index (it would drop the batch dim), a key,
``next``, numpy conversion and iteration (SB3's field order differs from rlbuf's) are refused, every
refusal an ``UnsupportedOperationError``.

Example:
    >>> import torch
    >>> from rlbuf import ReplayBuffer
    >>> buf = ReplayBuffer(8, obs_shape=(1,), action_shape=(), seed=0)
    >>> for r in range(4):
    ...     buf.add(torch.zeros(1), 0.0, float(r), torch.zeros(1), False, truncated=False)
    >>> buf.sample_all()[1:3].reward.tolist()
    [1.0, 2.0]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn, SupportsIndex, TypeVar

import numpy as np
import torch
from tensordict import TensorDictBase

from rlbuf.errors import NotPicklableError, StoredIndexError, UnsupportedOperationError

_Batch = TypeVar("_Batch")
_RING = {
    "rows": "buffer.sample_all()",  # one batch of every row, oldest first
    "every": "buffer.sample_all()",
    "by_position": "buffer.sample_by_index(i) reads storage positions (batch.index, TorchRL's rb[i]), ",
    "epochs": "buffer.epochs(batch_size=...)",
    "draw": "buffer.sample(batch_size) draws a batch",
    "field": "buffer.sample_all().{key} holds every stored row's",
    "write": "rows are written by add() or extend(td), every field checked",
    "delete": "clear() empties the buffer, the oldest rows are overwritten first",
    "owner": "buffer", "held": "its storage, lock and sampler belong", "workers": "buffer.torchrl",
}
"""What a ring buffer's refusals name; ``_FIXES`` holds what another kind names instead."""
_FIXES: dict[str, dict[str, str]] = {
    "ReplayBuffer": {"write": f"{_RING['write']}; priorities by update_priority()"},
    "DistillationBuffer": {},
    "RolloutBuffer": {
        "rows": "buffer.get_all_data()", "every": "buffer.get_all_data()", "epochs": "buffer.minibatches(batch_size=...)",
        "draw": "", "field": "buffer.view({key!r}) is its [num_steps, num_envs, ...] tensor",
        "write": "steps are written by add() or extend(td), every field checked; advantages by "
                 "compute_returns_and_advantages() or set_extras()",
        "delete": "clear() empties the buffer for the next rollout"},
    "MixedReplay": {
        "rows": "mixed.online.sample_all()",
        "every": "mixed.offline.sample_all() and mixed.online.sample_all() each",
        "by_position": "", "epochs": "", "draw": "mixed.sample(batch_size) draws a mixed batch",
        "field": "mixed.sample(batch_size).{key} (or each buffer's sample_all().{key})",
        "write": "rows are written to the online buffer by mixed.online.add() or extend(td); the offline one is "
                 "read-only",
        "delete": "mixed.online.clear() empties the online buffer; the offline one is read-only",
        "owner": "mixed", "held": "its buffers' storages, locks and samplers belong", "workers": "mixed.online.torchrl"},
    "RemoteReplayBufferHandle": {
        "by_position": "", "epochs": "", "write": f"{_RING['write']}; priorities by update_priority()",
        "delete": "the oldest rows are overwritten first"},
    "ReplayService": {
        "rows": "service.sample_all()", "every": "service.sample_all()", "by_position": "", "epochs": "",
        "draw": "service.sample(batch_size) draws a batch", "field": "service.sample_all().{key} holds every stored row's",
        "write": "rows are written by service.extend(td) or a writer's add() (service.writer()), every field "
                 "checked; priorities by update_priority()",
        "delete": "the oldest rows are overwritten first"},
}
"""A buffer kind (by class name, its nearest along the MRO) -> the calls its refusals name instead of a ring
buffer's; only rlbuf's classes are listed: a class not found (a user's own subclass) takes its base's."""


def _fixes(owner: object) -> dict[str, str]:
    """The calls ``owner``'s refusals name: its kind's, else the nearest base kind's, else a ring buffer's."""
    for klass in type(owner).__mro__:
        if klass.__name__ in _FIXES:
            return {**_RING, **_FIXES[klass.__name__]}
    return _RING


class BufferProtocols:
    """Indexing, iteration, ``next``, ``in`` and numpy conversion of a buffer, each refused with the call to use."""

    __slots__ = ()

    def _ways(self) -> str:
        """How to read this buffer's rows: all of them, by storage position, in passes."""
        fixes = _fixes(self)
        passes = f"{fixes['epochs']} visits every row once per epoch" if fixes["epochs"] else fixes["draw"]
        return f"{fixes['by_position']}{fixes['every']} holds every row, oldest first, as a typed batch; {passes}"

    def __getitem__(self, key: object) -> NoReturn:
        cls, fixes = type(self).__name__, _fixes(self)
        if isinstance(key, str):
            raise UnsupportedOperationError(f"{cls}[{key!r}]: a buffer is not read by key; "
                                            f"{fixes['field'].format(key=key)}")
        raise UnsupportedOperationError(
            f"{cls}[{shown_key(key)}]: a buffer is not indexed by position (once the ring wraps, storage position i is "
            f"not the i-th oldest row); {self._ways()}; slice a batch for rows: {fixes['rows']}[-10:]")

    def __setitem__(self, key: object, value: object) -> NoReturn:
        raise UnsupportedOperationError(f"{type(self).__name__}[{shown_key(key)}] = ...: {_fixes(self)['write']}")

    def __delitem__(self, key: object) -> NoReturn:
        raise UnsupportedOperationError(f"del {type(self).__name__}[{shown_key(key)}]: rows are not deleted one by one; "
                                        f"{_fixes(self)['delete']}")

    def __iter__(self) -> NoReturn:
        raise UnsupportedOperationError(f"iter({type(self).__name__}): a buffer hands out rows in batches, not "
                                        f"one by one; {self._ways()}")

    def __next__(self) -> NoReturn:
        fixes = _fixes(self)
        ways = [fixes["draw"], f"it = {fixes['epochs']} is one: next(it) is its next batch" if fixes["epochs"] else ""]
        raise UnsupportedOperationError(f"next({type(self).__name__}): a buffer is no iterator; "
                                        f"{'; '.join(way for way in ways if way)}")

    def __reversed__(self) -> NoReturn:
        raise UnsupportedOperationError(f"reversed({type(self).__name__}): a buffer hands out rows in batches, not "
                                        f"one by one; {self._ways()}; {_fixes(self)['rows']}[-10:] holds the newest rows")

    def __contains__(self, item: object) -> bool:
        fixes = _fixes(self)
        by_position = "0 <= i < len(buffer) says whether storage position i holds a row, and " if fixes[
            "by_position"] else ""
        raise UnsupportedOperationError(f"`in` {type(self).__name__}: a buffer is not searched by value; {by_position}"
                                        f"({fixes['rows']}.obs == x) compares every stored obs")

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray[Any, Any]:
        """numpy's view of a buffer: one object (``np.array([buf], dtype=object)``), never an array of rows."""
        if (held := held_as_object(self, dtype)) is not None:
            return held
        raise UnsupportedOperationError(f"np.asarray({type(self).__name__}): a buffer is no array; convert a "
                                        f"field of its rows: np.asarray({_fixes(self)['rows']}.obs)")


def copy_refusal(owner: object) -> NotPicklableError:
    """The error of ``pickle``, ``torch.save`` or ``copy`` of a buffer or mixer: the calls that copy it instead.

    Example:
        >>> copy_refusal(object())  # doctest: +ELLIPSIS
        NotPicklableError('object: cannot be pickled or copied (pickle, torch.save, copy.deepcopy): ...')
    """
    cls, fixes = type(owner).__name__, _fixes(owner)
    owned = fixes["owner"]
    return NotPicklableError(
        f"{cls}: cannot be pickled or copied (pickle, torch.save, copy.deepcopy): {fixes['held']} to this process; "
        f"for a copy on disk use {owned}.save(path) and {cls}.load(path), in memory {owned}.state_dict() and "
        f"load_state_dict(state) on a {cls} built with the same options; send {fixes['workers']} to worker processes")


class MixerProtocols(BufferProtocols):
    """A mixer's own protocols: no ``len`` (it holds no rows of its own), always true, never copied."""

    __slots__ = ()

    def __len__(self) -> NoReturn:
        raise UnsupportedOperationError(f"len({type(self).__name__}): a mixer holds no rows of its own; "
                                        f"len(mixed.offline) and len(mixed.online) count each buffer's")

    def __bool__(self) -> bool:
        return True  # it draws from its offline rows, which are read-only and never empty

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        raise copy_refusal(self)


def held_as_object(owner: object, dtype: Any) -> np.ndarray[Any, Any] | None:
    """``owner`` in a 0-d object array where numpy asks for ``dtype=object`` (``np.array([a, b], dtype=object)``
    holds buffers and batches as objects), else ``None``: the caller's ``__array__`` refuses.

    Example:
        >>> held_as_object("a batch", object).item(), held_as_object("a batch", None)
        ('a batch', None)
    """
    if dtype is None or np.dtype(dtype) != np.dtype(object):
        return None
    held = np.empty((), dtype=object)
    held[()] = owner
    return held


class RowCount(int):
    """``buffer.size``: an ``int``; calling it, as SB3's ``size()``, is refused with what it counted there.

    Example:
        >>> RowCount(8)()
        Traceback (most recent call last):
        ...
        rlbuf.errors.UnsupportedOperationError: buffer.size(): size is a property, the rows stored (len(buffer)), not a method; SB3's size() counted steps per env: len(buffer) // buffer.num_envs
    """

    __slots__ = ()

    def __call__(self) -> NoReturn:
        raise UnsupportedOperationError("buffer.size(): size is a property, the rows stored (len(buffer)), not a "
                                        "method; SB3's size() counted steps per env: len(buffer) // buffer.num_envs")


def field_values(batch: Any) -> dict[str, Any]:
    """The batch's set fields by name (a batch from ``sample_by_index(fields=...)`` lacks the others)."""
    missing = object()
    values = {item.name: getattr(batch, item.name, missing) for item in dataclasses.fields(batch)}
    return {name: value for name, value in values.items() if value is not missing}


def shown_key(key: object) -> str:
    """``key`` as it was written between brackets (``1:3``, not ``slice(1, 3, None)``)."""
    if isinstance(key, slice):
        parts = ["" if part is None else repr(part) for part in (key.start, key.stop, key.step)]
        return ":".join(parts if key.step is not None else parts[:2])
    return repr(key)


def row_index(batch: Any, key: object) -> Any:
    """``key`` as an index of ``batch``'s rows (a slice or a ``[K]`` integer tensor), checked, or a refusal.

    Raises:
        UnsupportedOperationError: an ``int`` (it would drop the batch dim), a slice with a step ≤ 0,
            a float, or an index of more than one dim.
        StoredIndexError: a row outside the batch, or a mask of the wrong length.
    """
    name = type(batch).__name__
    shown = f"{name}[{shown_key(key)}]"
    if isinstance(key, (bool, np.bool_)) or key is None or key is Ellipsis:
        raise UnsupportedOperationError(f"{shown}: rows are selected by a slice, integer positions or a bool mask")
    if isinstance(key, (int, np.integer)) or (isinstance(key, torch.Tensor) and key.dim() == 0):
        raise UnsupportedOperationError(
            f"{shown}: an int index would drop the batch dim (len() and every [B] field with it); "
            f"batch[{int(key)}:{int(key) + 1 or ''}] is a batch of that one row, batch.obs[{int(key)}] one field of it")
    if isinstance(key, slice):
        if key.step is not None and (not isinstance(key.step, int) or key.step <= 0):
            raise UnsupportedOperationError(f"{shown}: a slice's step must be a positive int (torch's slices are "
                                            f"forward only); batch[torch.arange(len(batch) - 1, -1, -1)] reverses")
        return key
    rows = len(batch)  # a fields= batch's too: the rows of any field it holds
    try:
        index = torch.as_tensor(np.asarray(key, dtype=np.int64 if len(key) == 0 else None)
                                if isinstance(key, Sequence) else key)
    except (TypeError, ValueError, RuntimeError):
        raise UnsupportedOperationError(f"{shown}: rows are selected by a slice, integer positions or a bool mask; "
                                        f"got {type(key).__name__}") from None
    if index.dim() != 1 or not (index.dtype == torch.bool or not (index.is_floating_point() or index.is_complex())):
        raise UnsupportedOperationError(f"{shown}: rows are selected by a 1-d tensor of integer positions or a bool "
                                        f"mask; got dtype {index.dtype}, shape {tuple(index.shape)}")
    if index.dtype == torch.bool:
        if index.numel() != rows:
            raise StoredIndexError(f"{shown}: a mask of {index.numel()} values for a batch of {rows} rows")
        return index.nonzero().squeeze(-1)
    index = index.to(torch.int64)
    if index.numel() and (int(index.min()) < -rows or int(index.max()) >= rows):
        outside = int(index[(index < -rows) | (index >= rows)][0])
        raise StoredIndexError(f"{shown}: row {outside} is outside the batch's {rows} rows")
    return index


def rebuilt(batch_type: type[_Batch], values: Mapping[str, Any]) -> _Batch:
    """A frozen batch of ``batch_type`` built field by field from ``values`` (some fields may be absent: a batch
    from ``sample_by_index(fields=...)``)."""
    batch: _Batch = object.__new__(batch_type)
    for name, value in values.items():
        object.__setattr__(batch, name, value)
    return batch


def reduced(batch: Any) -> tuple[Any, tuple[Any, ...]]:
    """``batch.__reduce__()``: copies and pickles rebuild the fields it holds (``rebuilt``), where a frozen slots
    dataclass's own state reads every field and raises for the ones a ``sample_by_index(fields=...)`` batch lacks.

    Example:
        >>> import copy
        >>> from rlbuf import ReplayBuffer
        >>> buf = ReplayBuffer(4, obs_shape=(2,), action_shape=(), seed=0)
        >>> buf.add(torch.ones(2), 0.0, 1.0, torch.zeros(2), False, truncated=False)
        >>> copy.deepcopy(buf.sample_by_index([0], fields=["reward"]))
        ReplayBatch(device=cpu, reward=[1] float32)
    """
    return rebuilt, (type(batch), field_values(batch))


def _mapped(batch: Any, change: Callable[[str, Any], Any]) -> Any:
    """``batch`` with ``change(field name, value)`` applied to each tensor and TensorDict (in dicts too)."""
    def each(name: str, value: Any) -> Any:
        if isinstance(value, (torch.Tensor, TensorDictBase)):
            return change(name, value)
        if isinstance(value, dict):
            return {key: each(name, column) for key, column in value.items()}
        return value  # None, burn_in

    return rebuilt(type(batch), {name: each(name, value) for name, value in field_values(batch).items()})


def select_rows(batch: Any, key: object, *, time_first: frozenset[str] = frozenset()) -> Any:
    """The rows ``key`` of ``batch``, as a batch of its type (fields in ``time_first`` hold rows on dim 1)."""
    index = row_index(batch, key)
    on_device: dict[torch.device, Any] = {}  # the index moved once per device, not once per field

    def rows(name: str, value: Any) -> Any:
        at = index
        if not isinstance(index, slice):
            at = on_device.get(value.device)
            if at is None:
                at = on_device[value.device] = index.to(value.device)
        return value[:, at] if name in time_first else value[at]

    return _mapped(batch, rows)


def moved(batch: Any, device: torch.device, *, non_blocking: bool) -> Any:
    """A new batch of ``batch``'s fields with every tensor on ``device``."""
    return _mapped(batch, lambda _, value: value.to(device, non_blocking=non_blocking))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.device == b.device and a.shape == b.shape and torch.equal(a, b))
    if isinstance(a, TensorDictBase) or isinstance(b, TensorDictBase):
        if not (isinstance(a, TensorDictBase) and isinstance(b, TensorDictBase)) or a.batch_size != b.batch_size:
            return False
        keys = set(a.keys(True, True))
        return keys == set(b.keys(True, True)) and all(_same(a.get(key), b.get(key)) for key in keys)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[key], b[key]) for key in a)
    return type(a) is type(b) and bool(a == b)


def same_batch(a: Any, b: Any) -> bool:
    """Whether two batches of one type hold the same fields, each of the same dtype, device, shape and values."""
    fields_a, fields_b = field_values(a), field_values(b)
    return fields_a.keys() == fields_b.keys() and all(_same(fields_a[name], fields_b[name]) for name in fields_a)


def refuse_iteration(batch: Any, call: str = "iter") -> NoReturn:
    """``iter(batch)``: a dataclass batch has no order to unpack in (SB3's samples unpack as NamedTuples)."""
    name = type(batch).__name__
    raise UnsupportedOperationError(
        f"{call}({name}): a batch is read by attribute (batch.obs, batch.action ...), not unpacked or iterated: "
        f"SB3's samples are NamedTuples unpacked in their own order (observations, actions, next_observations, "
        f"dones, rewards), which rlbuf's fields do not follow; batch[i:j] selects rows, batch.to_tensordict() "
        f"holds the fields at TorchRL's keys")


def refuse_next(batch: Any) -> NoReturn:
    """``next(batch)``: a batch is no iterator; the batches come from a buffer's iterator (``epochs``).

    Example:
        >>> refuse_next(object())  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        rlbuf.errors.UnsupportedOperationError: next(object): a batch is no iterator; ...
    """
    name = type(batch).__name__
    unpacks = "obs, expert_action = batch unpacks it; " if name == "DistillationBatch" else ""
    raise UnsupportedOperationError(
        f"next({name}): a batch is no iterator; it is read by attribute (batch.obs, batch.action ...); {unpacks}the "
        f"next batch comes from an iterator of batches: it = buffer.epochs(batch_size=...) (a rollout's "
        f"buffer.minibatches(...)), then next(it)")
