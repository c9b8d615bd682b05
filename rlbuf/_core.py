"""The ring of rows every rlbuf buffer stores: validation, cheap adds, writing, gathering.

TorchRL owns the storage, the writer's cursor and the sampler. rlbuf owns the fast paths:

* A small add is validated field by field (shape, dtype, device, finiteness) and only then
  written, with one numpy assignment per field (several times cheaper than a torch one),
  straight into the storage at the position after the pending rows. Each field's check is a
  reader built once per buffer: a tensor or array of the stored dtype and shape passes in a
  few attribute reads, anything else goes through the full checked conversion. The one-row
  add is generated per buffer with its loop over fields unrolled; it checks tensors and
  arrays of the stored dtype and shape inline and copies CPU tensors by address
  (``rlbuf._row_copy``), without ``Tensor.numpy()``. TorchRL's
  bookkeeping (cursor, write count, length, sampler) is brought up to date in one step when
  anything reads the buffer. A rejected add writes nothing.
* Bulk writes (``extend``, large adds) copy each field into the storage with one slice
  assignment and then update the same bookkeeping exactly as
  ``TensorDictReplayBuffer.extend`` would; a test proves both paths leave identical state.
* Gathers use ``index_select`` on cached leaf views (about 4x faster than ``tensor[idx]``),
  or numpy ``take`` for large rows such as images (fewer page faults on big outputs).

The TorchRL buffer handed to users (``buffer.torchrl``) commits the pending rows before any
of its own reads and writes, so TorchRL code sees every row rlbuf accepted.
"""

from __future__ import annotations

import contextlib
import linecache
import math
import os
import sys
import textwrap
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.context import get_spawning_popen
from multiprocessing.reduction import ForkingPickler
from typing import Any, NamedTuple, Protocol, TypeVar

import numpy as np
import torch
import torch.multiprocessing
from tensordict import is_tensor_collection
from torchrl.data import TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import Sampler

from rlbuf import _torchrl
from rlbuf.errors import (
    BatchSizeError,
    DtypeError,
    EmptyBufferError,
    MissingFieldError,
    ShapeError,
    StoredIndexError,
)
from rlbuf.spec import (
    FieldSpec,
    all_finite,
    as_array,
    check_finite_rows,
    numpy_dtype_or_none,
    positive_int,
    short_repr,
)
from rlbuf.storage import BuiltStorage, available_ram, remove_when_collected, row_bytes

_BLOCK_ROWS = 256
_SHARED_MEMORY_DIR = "/dev/shm"  # where torch's file_system sharing strategy keeps its files on Linux
# Batches above this size are checked against the memory free now: one that cannot fit would only
# fail later, inside torch (or get the process killed).
_SMALL_BATCH_BYTES = 64 * 2**20
CapturedT = TypeVar("CapturedT")
_WIDE_ROW_BYTES = 4096
_CPU = torch.device("cpu")


class FlushingReplayBuffer(TensorDictReplayBuffer):  # type: ignore[misc]
    """TorchRL's ``TensorDictReplayBuffer`` that first commits rlbuf's pending rows.

    Every public read or write of TorchRL's API takes the buffer's lock, commits the owner's
    pending rows and runs TorchRL's own method, all under that one lock: a collector or loss
    holding ``buffer.torchrl`` sees exactly what the rlbuf facade holds, and its writes never
    interleave with rlbuf's (one commit protocol for both).
    """

    # A weak reference: a reference cycle would leave tensors to the garbage collector, and
    # torch 2.13 aborts (THPVariable_clear) when it clears some of them.
    _flush_owner: weakref.ReferenceType[RowRing] | None = None

    def _owner(self) -> RowRing | None:
        return self._flush_owner() if self._flush_owner is not None else None

    def _locked(self, method: Callable[..., Any], *args: Any, rewrites: bool = False, **kwargs: Any) -> Any:
        with _torchrl.replay_lock(self):
            owner = self._owner()
            if owner is not None:
                owner.flush()
                # Rows changed without a write count: a snapshot in progress re-copies them all.
                if rewrites:
                    owner.generation += 1
            return method(*args, **kwargs)

    def __len__(self) -> int:
        return int(self._locked(super().__len__))

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        return self._locked(super().sample, *args, **kwargs)

    def extend(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        return self._locked(super().extend, _with_done(data, self.storage), *args, **kwargs)

    def add(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        return self._locked(super().add, _with_done(data, self.storage), *args, **kwargs)

    def __getitem__(self, index: Any) -> Any:
        return self._locked(super().__getitem__, index)

    def __setitem__(self, index: Any, value: Any) -> None:
        self._locked(super().__setitem__, index, value, rewrites=True)

    def update_priority(self, *args: Any, **kwargs: Any) -> Any:
        return self._locked(super().update_priority, *args, **kwargs)

    def empty(self, *args: Any, **kwargs: Any) -> Any:
        return self._locked(super().empty, *args, rewrites=True, **kwargs)

    def state_dict(self) -> Any:
        return self._locked(super().state_dict)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._locked(super().load_state_dict, *args, rewrites=True, **kwargs)

    def dumps(self, path: Any) -> Any:
        return self._locked(super().dumps, path)

    def loads(self, path: Any) -> Any:
        return self._locked(super().loads, path, rewrites=True)

    def __getstate__(self) -> dict[str, Any]:
        # Pickled for a worker process: commit pending rows, put RAM storage in shared memory
        # (so workers write where the learner reads) and let the owner re-derive its numpy views
        # of the moved memory. The worker gets no owner: it writes through TorchRL directly.
        # The sharing strategy is set first, so memory moves into shared memory once, not twice.
        _prepare_process_sharing()
        spawning = get_spawning_popen() is not None
        owner = self._owner()
        if owner is not None and spawning:
            owner.flush()
            owner.share_storage()
        state = dict(super().__getstate__())
        if spawning:
            _unlink_shared_files_with(self, state)
        # The learner's own: its owner, and the shared files it unlinks when collected.
        for name in ("_flush_owner", "_rlbuf_shared_files", "_rlbuf_unlink_shared_files"):
            state.pop(name, None)
        return state


def _with_done(data: Any, storage: Any) -> Any:
    """``data`` with ``("next", "done")`` derived from terminated | truncated when the storage keeps
    a done flag and the incoming tensordict has none (TorchRL would leave stale values there)."""
    keys = _torchrl.storage_keys(storage) or ()
    if not is_tensor_collection(data) or ("next", "done") not in keys or data.get(("next", "done"), None) is not None:
        return data
    terminated = data.get(("next", "terminated"), None)
    if terminated is None:
        return data
    truncated = data.get(("next", "truncated"), None)
    done = terminated.to(torch.bool) if truncated is None else terminated.to(torch.bool) | truncated.to(torch.bool)
    data = data.copy()
    data.set(("next", "done"), done)
    return data


def _unlink_shared_files_with(rb: FlushingReplayBuffer, state: Mapping[str, Any]) -> None:
    """Unlink the ``/dev/shm`` files of the tensors ``state`` sends to a worker when ``rb`` is collected.

    torch frees such a file when the last process holding it frees the tensor, but worker
    processes seldom free what they received before they exit, so the files would stay until
    the learner exits. Removing a name keeps every mapping valid: workers still running keep
    writing where the learner reads; only new workers could no longer receive the buffer.

    Each file gets one extra reference here, so torch's own count never drops to zero in this
    process: torch then never unlinks the file itself (it aborts when the name is already gone).
    """
    tensors = _torchrl.pickled_cpu_tensors(state)
    files: set[str] = rb.__dict__.setdefault("_rlbuf_shared_files", set())
    for tensor in tensors:
        with contextlib.suppress(RuntimeError):  # a storage torch cannot share by file name: nothing to unlink
            tensor.share_memory_()  # type: ignore[no-untyped-call]  # what pickling does next; no-op when shared
            storage = tensor.untyped_storage()
            name = os.fsdecode(storage._share_filename_cpu_()[1])
            if name not in files:
                storage._shared_incref()  # type: ignore[no-untyped-call]
                files.add(name)
    if files and "_rlbuf_unlink_shared_files" not in rb.__dict__:
        rb.__dict__["_rlbuf_unlink_shared_files"] = weakref.finalize(rb, _unlink_shared_files, files)


def _unlink_shared_files(files: set[str]) -> None:
    for name in files:
        with contextlib.suppress(OSError):  # already gone: torch's manager removes them when the learner exits
            os.unlink(_SHARED_MEMORY_DIR + name)


def _rebuild_generator(device: str, state: bytes) -> torch.Generator:
    generator = torch.Generator(device=device)
    generator.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))
    return generator


def _reduce_generator(generator: torch.Generator) -> tuple[Any, tuple[str, bytes]]:
    # The state travels as bytes: sharing it as a tensor fails in spawned processes under torch 2.13.
    return _rebuild_generator, (str(generator.device), generator.get_state().numpy().tobytes())


def _prepare_process_sharing() -> None:
    """Make a buffer sendable to worker processes under torch 2.13.

    Generators go by value (torch cannot send one to a spawned process, and TorchRL's storage,
    writer and sampler all hold the buffer's generator), and tensors go through the
    ``file_system`` sharing strategy (the default ``file_descriptor`` one fails to rebuild some
    of TorchRL's small bookkeeping tensors in the child).
    """
    if torch.Generator not in ForkingPickler._extra_reducers:  # type: ignore[attr-defined]
        ForkingPickler.register(torch.Generator, _reduce_generator)
    if torch.multiprocessing.get_sharing_strategy() != "file_system":  # type: ignore[no-untyped-call]
        warnings.warn("rlbuf: switching torch.multiprocessing's sharing strategy to 'file_system' so this "
                      "buffer can be sent to worker processes (torch 2.13's 'file_descriptor' strategy fails "
                      "on TorchRL's storage bookkeeping)", RuntimeWarning, stacklevel=3)
        torch.multiprocessing.set_sharing_strategy("file_system")  # type: ignore[no-untyped-call]


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    """A plain-tensor view of a storage leaf (memmap subclasses add per-call overhead)."""
    return tensor.as_subclass(torch.Tensor) if type(tensor) is not torch.Tensor else tensor


def _writes_through(storing_device: torch.device) -> bool:
    """Whether adds are written straight into the storage (memory numpy can address, i.e. the CPU)
    rather than staged in a numpy block that one device copy per field commits."""
    return storing_device.type == "cpu"


class _FieldPlan(NamedTuple):
    """Everything the hot add path needs about one input field, computed once."""

    spec: FieldSpec
    row_shape: tuple[int, ...]
    single_shape: tuple[int, ...] | None
    np_dtype: np.dtype[Any]
    scalar_types: tuple[type, ...]


def _scalar_types(spec: FieldSpec) -> tuple[type, ...]:
    if spec.shape != ():
        return ()
    if spec.np_dtype.kind == "b":
        return (bool, np.bool_)
    if spec.np_dtype.kind in "iu":
        return (bool, int, np.bool_, np.integer)
    if not spec.finite:  # kinds never change: an int action or observation is refused by check_dtype
        return (float, np.floating)
    return (bool, int, float, np.bool_, np.integer, np.floating)


def check_strided(name: str, tensor: torch.Tensor) -> None:
    """Refuse a tensor without strided memory (sparse, mkldnn, nested): it holds no rows to copy.

    Raises:
        DtypeError: a layout other than strided, or a nested tensor.

    Example:
        >>> check_strided("obs", torch.zeros(3).to_sparse())
        Traceback (most recent call last):
        ...
        rlbuf.errors.DtypeError: obs: expected a dense (strided) tensor, got a sparse_coo one
    """
    if tensor.layout is not torch.strided or tensor.is_nested:
        layout = "nested" if tensor.is_nested else str(tensor.layout).removeprefix("torch.")
        raise DtypeError(f"{name}: expected a dense (strided) tensor, got a {layout} one")


class _NotStaged(Exception):
    """A value the staged add does not take (a tensor off the CPU): the add goes the tensor way."""


def checked_value(plan: _FieldPlan, value: Any) -> Any:
    """One field of a staged add, checked: an array of its rows, or a Python number for one scalar row.

    Every kind of input goes through here: tensors (CPU), arrays, lists and numbers. The
    readers of [`field_reader`][rlbuf._core.field_reader] take the common cases first and
    hand everything else to this function.

    Raises:
        ShapeError, DtypeError, NonFiniteError, MissingFieldError: the value does not fit the field.
        _NotStaged: a tensor off the CPU.

    Example:
        >>> spec = FieldSpec("reward", "reward", (), torch.float32, finite=True)
        >>> plan = _FieldPlan(spec, (1,), (), spec.np_dtype, _scalar_types(spec))
        >>> checked_value(plan, np.array([2.0]))
        2.0
    """
    spec = plan.spec
    if type(value) is np.ndarray:
        array = value
    elif isinstance(value, torch.Tensor):
        if not value.is_cpu:
            raise _NotStaged
        check_strided(spec.name, value)
        if numpy_dtype_or_none(value.dtype) is None:  # bfloat16, uint16 ...: the checked conversion decides
            array = _tensor_input(plan, value)
        else:
            try:
                array = value.numpy() if not value.requires_grad else value.detach().numpy()
            except RuntimeError:  # a negated view: the checked conversion resolves it
                array = _tensor_input(plan, value)
    elif plan.single_shape is not None and isinstance(value, plan.scalar_types):
        spec.check_scalar(value)  # type: ignore[arg-type]
        if spec.finite and not math.isfinite(value):  # type: ignore[arg-type]
            check_finite_rows(spec, np.asarray([value]))
        return value
    else:
        array = _other_input(plan, value)
    shape = array.shape
    if shape != plan.row_shape and shape != plan.single_shape:
        raise ShapeError(_shape_message(plan, shape))
    if array.dtype != plan.np_dtype:
        spec.check_dtype(array.dtype)
        if array.dtype.itemsize > plan.np_dtype.itemsize or array.dtype.kind != plan.np_dtype.kind:
            spec.check_range(array)
    if spec.finite and array.dtype.kind == "f" and not all_finite(array):
        check_finite_rows(spec, array.reshape(plan.row_shape[0], -1))
    if plan.single_shape == ():
        return array.item()
    return _zeros_and_ones(array) if plan.np_dtype.kind == "b" else array


def _zeros_and_ones(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``array`` (bool) with bytes 0 or 1: a numpy copy keeps any other byte a bool may hold
    (a uint8 array viewed as bool), as the copy by address and torch's copy do not."""
    return array.view(np.uint8).astype(np.bool_)


def field_reader(plan: _FieldPlan) -> Callable[[Any], Any]:
    """The check of one field for the staged add, specialised once per buffer.

    A tensor or array of the stored dtype and shape is taken in a few attribute reads
    (one scalar row as a Python number via ``.item()``); anything else goes through
    [`checked_value`][rlbuf._core.checked_value], which decides for every input.

    Example:
        >>> spec = FieldSpec("obs", "observation", (2,), torch.float32)
        >>> read = field_reader(_FieldPlan(spec, (1, 2), (2,), spec.np_dtype, ()))
        >>> read(torch.ones(1, 2))
        array([[1., 1.]], dtype=float32)
        >>> read(np.ones((1, 3), np.float32))
        Traceback (most recent call last):
        ...
        rlbuf.errors.ShapeError: obs: expected shape (1, 2) or (2,), got (1, 3)
    """
    spec, np_dtype, dtype = plan.spec, plan.np_dtype, plan.spec.dtype
    row_shape, single_shape = plan.row_shape, plan.single_shape
    finite = spec.finite and np_dtype.kind == "f"
    boolean = np_dtype.kind == "b"
    ndarray, tensor, isfinite = np.ndarray, torch.Tensor, math.isfinite

    if single_shape == ():
        def read_number(value: Any) -> Any:
            kind = type(value)
            if kind is tensor:
                if not value.is_cpu or value.dtype is not dtype or value.dim() > 1:
                    return checked_value(plan, value)
                check_strided(spec.name, value)
                try:
                    number = value.item()
                except RuntimeError:  # not exactly one value
                    return checked_value(plan, value)
            elif kind is ndarray and value.dtype is np_dtype and value.size == 1 and value.ndim <= 1:
                number = value.item()
            else:
                return checked_value(plan, value)
            if finite and not isfinite(number):
                check_finite_rows(spec, np.asarray([number]))
            return number
        return read_number

    def read_array(value: Any) -> Any:
        kind = type(value)
        if kind is tensor:
            try:
                array = value.numpy()  # refuses (and the checked path then judges) GPU, grad, bfloat16, sparse ...
            except (TypeError, RuntimeError, NotImplementedError):
                return checked_value(plan, value)
        elif kind is ndarray:
            array = value
        else:
            return checked_value(plan, value)
        shape = array.shape
        if array.dtype is not np_dtype or (shape != row_shape and shape != single_shape) or (
                finite and not all_finite(array)):
            return checked_value(plan, value)  # the value as given: a tensor is judged as a tensor
        return _zeros_and_ones(array) if boolean else array
    return read_array


def raw_row_groups(specs: Sequence[FieldSpec]) -> tuple[tuple[int, ...], ...]:
    """Indices of the fields the one-row add may copy by address, in groups of one ``copy_rows`` call.

    Every field but those checked for finiteness, whose values are read anyway.

    Example:
        >>> raw_row_groups([FieldSpec("obs", "observation", (3,), torch.float32),
        ...                 FieldSpec("reward", ("next", "reward"), (), torch.float32, finite=True),
        ...                 FieldSpec("terminated", ("next", "terminated"), (), torch.bool)])
        ((0, 2),)
    """
    from rlbuf._row_copy import SLOTS  # imports numba: only a buffer that needs it does

    fields = [i for i, spec in enumerate(specs) if not (spec.finite and spec.np_dtype.kind == "f")]
    return tuple(tuple(fields[start:start + SLOTS]) for start in range(0, len(fields), SLOTS))


def raw_row_tables(targets: Sequence[np.ndarray], groups: Sequence[Sequence[int]]) -> tuple[np.ndarray, ...]:
    """For each group, the ``(address of row 0, bytes per row, is bool)`` table ``copy_rows`` writes by.

    Example:
        >>> target = np.zeros((4, 3), np.float32)
        >>> raw_row_tables([target], [(0,)])[0].tolist() == [[target.ctypes.data, 12, 0]]
        True
    """
    tables = []
    for group in groups:
        rows = []
        for i in group:
            target = targets[i]
            if target.ndim == 0 or not target.flags.c_contiguous:
                raise AssertionError(f"target {i} is not C-contiguous: its rows cannot be copied by address")
            # Not strides[0]: numpy keeps any stride for a dim of size 1 (a buffer of capacity 1).
            rows.append([target.ctypes.data, target.nbytes // target.shape[0], target.dtype.kind == "b"])
        tables.append(np.array(rows, dtype=np.int64))
    return tuple(tables)


# The one-row add with its loops over fields unrolled: calling each field's reader and writing
# each field by name saves 0.6-0.9 us per add against map() or a comprehension over the fields
# (six fields, benchmarks/add.py), a tenth or more of an add. A field in ``ring._raw_groups``
# given as a contiguous CPU tensor of its dtype and shape is checked inline and copied by its
# address, up to five in one ``copy_rows`` call: ``Tensor.numpy()`` alone costs more than the
# checks and the copy. ``p<i>`` is that address, or 0 when ``v<i>`` holds what the field's
# reader returned (then written by numpy); ``k<i>`` keeps the tensor's storage alive until the
# copy, even if another thread gives the tensor new storage meanwhile. ``ring`` is an
# argument, not a global: a reference cycle through the ring would leave its tensors to the
# garbage collector (see FlushingReplayBuffer._flush_owner).
_ONE_ROW_ADD = """\
def add_one_row(ring, values, rows):
    {values}, = values
    with lock:
        if rb.shared:
            return False
        try:
{reads}
        except NotStaged:
            return False
        pending = ring.pending
        if 0 < pending < pending_limit and write_through:
            position = (ring._pending_start + pending) % capacity
        else:
            position = ring._claim(1)
        {targets}, = ring._target_list
{writes}
        ring.pending += 1
        if ring.handed_out:
            ring.flush()
    return True
"""

# A field that may be copied by address: a plain CPU tensor of its dtype and shape, contiguous
# and not a negated view (``x.conj().imag`` holds the bytes of -x; so does ``torch._neg_view``
# of any dtype). ``k<i>`` keeps its storage alive until the copy, even if another thread gives
# the tensor new storage (``set_``) meanwhile. An array of the field's dtype and shape is taken
# inline too, as its reader would (a bool array of several values goes to its reader, which
# stores 0 or 1 whatever bytes it holds).
_CAPTURE = """\
try:
    if (v{i}.dtype is dtype{i} and v{i}.is_cpu
            and (v{i}.shape == shape{i} or v{i}.shape == single{i}){contiguous}{not_negated}):
        k{i} = v{i}.untyped_storage()
        p{i} = v{i}.data_ptr()
except RuntimeError:  # no strided storage (nested tensors, functorch wrappers): the reader judges
    p{i} = 0
if not p{i}:
    v{i} = read{i}(v{i})"""
_RAW_READ = """\
            p{i} = 0
            if type(v{i}) is Tensor:
{capture}
            else:
{take_array}"""
# A value other than a plain tensor, array or Python number may run the caller's code in its
# reader (a subclass's ``__torch_function__``, an ``__array__``), which may free or move the
# bytes of a tensor whose address was taken before: then ``late`` is set (``_READ``) and every
# address is taken again, with no caller's code left to run.
# Exact types whose check runs no code of the caller's (the common numpy scalars included: a
# gymnasium env's reward is often an ``np.float64``).
_RUNS_NO_CALLER_CODE = frozenset({torch.Tensor, float, int, bool, np.ndarray, np.bool_, np.float16, np.float32,
                                  np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8})
_TAKE_ARRAY = "type(v{i}) is ndarray and v{i}.dtype is np_dtype{i} and (v{i}.shape == shape{i} or v{i}.shape == single{i})"
_READ = """\
if type(v{i}) not in plain: late = True
v{i} = read{i}(v{i})"""
_TAKE_ROWS = """\
if not ({taken}):
{read}"""
_TAKE_NUMBER = """\
if {taken}:
    v{i} = v{i}.item()
else:
{read}"""
_RAW_AGAIN = """\
                if p{i}:
                    p{i} = 0
{capture}"""


# A finite number (the reward) of the field's dtype, as a tensor or an array: read inline. A value
# that is not finite goes to the reader, which raises the error naming it; so does a sparse or
# mkldnn tensor (``.item()`` would read it).
_NUMBER_READ = """\
            try:
                inline = ((type(v{i}) is Tensor and v{i}.dtype is dtype{i} and v{i}.is_cpu
                           and (v{i}.shape == shape{i} or v{i}.shape == single{i}) and v{i}.layout is strided)
                          or {taken})
            except RuntimeError:  # no strided storage (nested tensors, functorch wrappers): the reader judges
                inline = False
            if inline:
                n{i} = v{i}.item()
                v{i} = n{i} if isfinite(n{i}) else read{i}(v{i})
            else:
{read}"""


def one_row_adder(ring: RowRing) -> Callable[[RowRing, Sequence[Any], int], bool]:
    """``add_one_row(ring, values, rows=1)``: the staged add of one row, generated for the ring's fields.

    It checks every value (inline, or with its field's reader), then writes each one into
    the ring's target at the claimed position; it returns ``False`` (nothing done) when the
    add is not staged.

    The source is kept in ``linecache``, so tracebacks show its lines.

    Example:
        >>> from rlbuf import ReplayBuffer
        >>> buffer = ReplayBuffer(4, obs_shape=(2,), action_shape=())
        >>> source = "".join(linecache.getlines("<rlbuf one-row add of 6 fields>"))
        >>> "copy_rows(position, table0, p0, p1, p3, p4, p5)" in source
        True
    """
    from rlbuf._row_copy import SLOTS, copy_rows  # imports numba: only a buffer that needs it does

    plans = ring.plans
    source = _ONE_ROW_ADD.format(**_one_row_parts(plans, ring._raw_groups, SLOTS))
    filename = f"<rlbuf one-row add of {len(plans)} fields>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    # What never changes after construction is bound here (the targets move when memory is shared).
    namespace: dict[str, Any] = {"lock": ring.lock, "rb": ring.rb, "NotStaged": _NotStaged, "capacity": ring.capacity,
                                 "pending_limit": ring.pending_limit, "write_through": ring.write_through,
                                 "copy_rows": copy_rows, "Tensor": torch.Tensor, "ndarray": np.ndarray,
                                 "isfinite": math.isfinite, "plain": _RUNS_NO_CALLER_CODE,
                                 "strided": torch.strided}
    for i, (plan, read) in enumerate(zip(plans, ring._readers, strict=True)):
        namespace.update({f"read{i}": read, f"dtype{i}": plan.spec.dtype, f"np_dtype{i}": plan.np_dtype,
                          f"shape{i}": plan.row_shape, f"single{i}": plan.single_shape})
    exec(compile(source, filename, "exec"), namespace)  # our own template, no user text
    return namespace["add_one_row"]  # type: ignore[no-any-return]


def _capture(plan: _FieldPlan, i: int, indent: int) -> str:
    contiguous = "" if math.prod(plan.row_shape) == 1 else f" and v{i}.is_contiguous()"
    # Every dtype but bool has negated views (``torch._neg_view``); a bool's negation is itself.
    not_negated = "" if plan.np_dtype.kind == "b" else f" and not v{i}.is_neg()"
    return textwrap.indent(_CAPTURE.format(i=i, contiguous=contiguous, not_negated=not_negated), " " * indent)


def _one_row_parts(plans: Sequence[_FieldPlan], groups: Sequence[Sequence[int]], slots: int) -> dict[str, str]:
    pad = " " * 8
    raw = {i for group in groups for i in group}
    reads = ["            late = False"]
    for i, plan in enumerate(plans):
        read, taken = _READ.format(i=i), _TAKE_ARRAY.format(i=i)
        if i not in raw:
            number = plan.single_shape == () and plan.spec.finite and plan.np_dtype.kind == "f"
            reads.append(_NUMBER_READ.format(i=i, taken=taken, read=textwrap.indent(read, " " * 16)) if number
                         else textwrap.indent(read, " " * 12))
            continue
        if plan.single_shape == ():  # one scalar row goes in as a number
            take = _TAKE_NUMBER.format(i=i, taken=taken, read=textwrap.indent(read, " " * 4))
        elif plan.np_dtype.kind == "b":  # several bools: the reader stores 0 or 1 whatever the bytes
            take = read
        else:
            take = _TAKE_ROWS.format(taken=taken, read=textwrap.indent(read, " " * 4))
        reads.append(_RAW_READ.format(i=i, capture=_capture(plan, i, 16), take_array=textwrap.indent(take, " " * 16)))
    if raw:
        reads.append("            if late:")
        reads += [_RAW_AGAIN.format(i=i, capture=_capture(plans[i], i, 20)) for i in sorted(raw)]
    writes = [f"{pad}{', '.join(f'table{g}' for g in range(len(groups)))}, = ring._raw_tables"] if groups else []
    for g, group in enumerate(groups):
        addresses = ", ".join([f"p{i}" for i in group] + ["0"] * (slots - len(group)))
        writes += [f"{pad}if {' and '.join(f'p{i}' for i in group)}:",
                   f"{pad}    copy_rows(position, table{g}, {addresses})",
                   f"{pad}elif not ({' or '.join(f'p{i}' for i in group)}):",
                   *(f"{pad}    t{i}[position] = v{i}" for i in group),
                   f"{pad}else:",
                   f"{pad}    copy_rows(position, table{g}, {addresses})"]
        for i in group:
            writes += [f"{pad}    if not p{i}:", f"{pad}        t{i}[position] = v{i}"]
    writes += [f"{pad}t{i}[position] = v{i}" for i in range(len(plans)) if i not in raw]
    return {
        "values": ", ".join(f"v{i}" for i in range(len(plans))),
        "targets": ", ".join(f"t{i}" for i in range(len(plans))),
        "reads": "\n".join(reads),
        "writes": "\n".join(writes),
    }


class RowSink(Protocol):
    """Where a snapshot's rows go: copied without the lock, then patched under it."""

    def copy(self, leaves: Mapping[str, torch.Tensor], size: int) -> None:
        """Copy rows ``[0, size)`` of every leaf while writers may run."""

    def patch(self, leaves: Mapping[str, torch.Tensor], segments: Sequence[tuple[int, int]],
              size: int) -> Mapping[str, Any]:
        """Under the lock: re-copy ``segments``, keep ``size`` rows, return the rows of the snapshot."""


class RowCopies:
    """A [`RowSink`][rlbuf._core.RowSink] into fresh tensors (``state_dict``)."""

    def __init__(self) -> None:
        self.rows: dict[str, torch.Tensor] = {}

    def copy(self, leaves: Mapping[str, torch.Tensor], size: int) -> None:
        """Clone rows ``[0, size)`` of every leaf."""
        self.rows = {name: leaf[:size].clone() for name, leaf in leaves.items()}

    def patch(self, leaves: Mapping[str, torch.Tensor], segments: Sequence[tuple[int, int]],
              size: int) -> dict[str, torch.Tensor]:
        """Re-copy ``segments`` into the clones, grown or cut to ``size`` rows."""
        for name, leaf in leaves.items():
            rows = self.rows[name]
            if rows.shape[0] != size:
                resized = leaf.new_empty((size, *leaf.shape[1:]))
                kept = min(size, rows.shape[0])
                resized[:kept] = rows[:kept]
                rows = self.rows[name] = resized
            for start, stop in segments:
                rows[start:stop] = leaf[start:stop]
        return self.rows


class Snapshot(NamedTuple):
    """One write count's rows and counters, and what the caller captured under the same lock."""

    size: int
    cursor: int
    write_count: int
    rows: Mapping[str, Any]
    captured: Any


class RowRing:
    """A ring of ``capacity`` rows of ``specs`` in a TorchRL buffer, with cheap small adds.

    On a CPU storage an add is validated, then written straight into numpy views of the
    storage at the position after the pending rows; only TorchRL's bookkeeping (cursor,
    length, sampler) waits for ``flush``. On a GPU storage adds are copied into a numpy
    staging block that ``flush`` writes to the device in one copy per field.

    Args:
        specs: the stored fields, in order.
        built: the initialised TorchRL storage (see ``rlbuf.storage.build_storage``).
        sampler: the TorchRL sampler.
        rows_per_add: rows each add carries (``num_envs``).
        storing_device: where the storage lives.
        generator: the buffer's random generator (TorchRL's ``set_rng``).
        derived: fields computed from the others when rows are committed (e.g. ``done``
            from ``terminated | truncated``), never passed in by callers.
    """

    def __init__(
        self,
        specs: Sequence[FieldSpec],
        built: BuiltStorage,
        sampler: Sampler,
        *,
        rows_per_add: int,
        storing_device: torch.device,
        generator: torch.Generator,
        derived: Mapping[str, Callable[[Mapping[str, torch.Tensor]], torch.Tensor]] | None = None,
    ) -> None:
        self.specs = tuple(specs)
        self.derived = dict(derived or {})
        self.input_specs = tuple(s for s in self.specs if s.name not in self.derived)
        self.by_name = {spec.name: spec for spec in self.specs}
        self.row_bytes = row_bytes(self.specs)
        self.storing_device = storing_device
        self.generator = generator
        rb = FlushingReplayBuffer(storage=built.storage, sampler=sampler, batch_size=None, generator=generator)
        rb._flush_owner = weakref.ref(self)
        rb.set_rng(generator)
        self.rb = rb
        # TorchRL's own re-entrant buffer lock guards rlbuf's pending rows too, so adds, extends
        # and samples from several threads (rlbuf's or TorchRL's API) never interleave a row.
        self.lock = _torchrl.replay_lock(rb)
        self.capacity = int(built.storage.max_size)
        self.scratch_dir = built.scratch_dir
        # Tied to the TorchRL buffer: someone may keep `buffer.torchrl` after dropping the facade.
        self._remove_scratch = (
            remove_when_collected(rb, built.scratch_dir)
            if built.owns_scratch_dir and built.scratch_dir is not None else None
        )
        leaves = _torchrl.storage_leaves(built.storage)
        # Leaves viewed in user shape: a reward leaf of TorchRL shape [C, 1] is used as [C].
        self.leaves = {s.name: _plain(leaves.get(s.key)).view(self.capacity, *s.shape) for s in self.specs}
        self.write_through = _writes_through(storing_device)
        # Set once the TorchRL buffer is handed out: every add is then committed at once, so its
        # storage and writer (read directly, not only through the buffer's methods) are current.
        self.handed_out = False
        if self.write_through:
            self.pending_limit = self.capacity
        else:
            self.pending_limit = min(_BLOCK_ROWS, self.capacity) if rows_per_add <= _BLOCK_ROWS else 0
        # Fields a one-row add may copy from CPU tensors by address (see _RAW_READ).
        self._raw_groups = raw_row_groups(self.input_specs) if rows_per_add == 1 and self.pending_limit else ()
        if not self.write_through:
            self._set_targets({s.name: np.empty((self.pending_limit, *s.shape), s.np_dtype) for s in self.input_specs})
        self._derive_numpy_views()
        self.plans = tuple(
            _FieldPlan(s, (rows_per_add, *s.shape), s.shape if rows_per_add == 1 else None, s.np_dtype,
                       _scalar_types(s))
            for s in self.input_specs
        )
        self._readers = tuple(field_reader(plan) for plan in self.plans)  # of the add of several rows
        # ``RowRing._stage`` or its unrolled twin for one row; a function, not a bound method: see
        # one_row_adder. ``ReplayBuffer.add`` calls it directly, then ``add_unstaged`` if it declines.
        self.staged_add: Callable[[RowRing, Sequence[Any], int], bool] = (
            one_row_adder(self) if rows_per_add == 1 and self.pending_limit else RowRing._stage)
        self.pending = 0
        self._pending_start = 0
        self.generation = 0  # bumped when rows change without a write: clear, load, TorchRL's __setitem__
        self.accepted_devices: tuple[torch.device, ...] = (
            (storing_device,) if storing_device.type == "cpu" else (storing_device, _CPU)
        )

    def __del__(self) -> None:
        # Someone may keep `buffer.torchrl` after dropping the facade: commit what it accepted.
        # Not at interpreter exit: nobody reads any more, and torch 2.13 aborts (exit status
        # 134, THPVariable_clear) when tensors are made while modules are torn down.
        if getattr(self, "pending", 0) and not sys.is_finalizing():
            with contextlib.suppress(Exception):  # nothing may be raised from a finalizer
                self.flush()

    # -- state -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return min(_torchrl.size(self.rb) + self.pending, self.capacity)

    @property
    def cursor(self) -> int:
        """Storage position the next row goes to (pending rows included)."""
        return (_torchrl.cursor(self.rb) + self.pending) % self.capacity

    @property
    def write_count(self) -> int:
        """Rows ever written (pending rows included)."""
        return _torchrl.write_count(self.rb) + self.pending

    def close(self) -> None:
        """Remove the scratch directory rlbuf created, if any."""
        if self._remove_scratch is not None:
            self._remove_scratch()

    def share_storage(self) -> None:
        """Place a RAM storage in shared memory and mark the buffer shared across processes.

        Moving memory invalidates numpy views of it, so they are derived again.
        """
        storage = _torchrl.storage_leaves(self.rb.storage)
        if self.storing_device.type == "cpu" and not storage.is_memmap() and not storage.is_shared():
            storage.share_memory_()
        if not getattr(self.rb, "shared", False):
            self.rb.share()
        self._derive_numpy_views()

    def _set_targets(self, targets: dict[str, np.ndarray]) -> None:
        """Where staged rows go: ``targets`` by name, in field order, and by address (``copy_rows``)."""
        self.targets = targets
        self._target_list = [targets[s.name] for s in self.input_specs]
        self._raw_tables = raw_row_tables(self._target_list, self._raw_groups)

    def _derive_numpy_views(self) -> None:
        if self.write_through:
            self._set_targets({s.name: self.leaves[s.name].numpy() for s in self.input_specs})
        # Large CPU rows (images) gather faster with numpy's take: its big outputs fault in fewer pages.
        self._wide_rows = {
            s.name: self.leaves[s.name].numpy() for s in self.specs
            if self.write_through and self.leaves[s.name][0].numel() * self.leaves[s.name].element_size() >= _WIDE_ROW_BYTES
        }

    def clear(self) -> None:
        """Drop every row, pending or stored."""
        with self.lock:
            self.pending = 0
            self.rb.empty()

    def counters(self) -> tuple[int, int, int]:
        """``(size, cursor, write_count)`` of the committed rows; call with the locks held."""
        rb = self.rb
        return min(_torchrl.size(rb), self.capacity), _torchrl.cursor(rb), _torchrl.write_count(rb)

    def snapshot(self, sink: RowSink | None, capture: Callable[[], CapturedT]) -> Snapshot:
        """A consistent snapshot of one write count, without stopping writers for the whole copy.

        The rows are copied into ``sink`` while writers run; then, under the lock that every
        write takes (rlbuf's, TorchRL's and worker processes'), only the rows written since
        the copy began are copied again and ``capture()`` reads the rest of the state. When
        more than ``capacity`` rows were written meanwhile, or rows changed without a write
        (``clear``, a load, TorchRL's ``__setitem__``), every row is copied again.

        Args:
            sink: where the rows go (``None``: counters and ``capture()`` only).
            capture: called under the lock; its result is returned as ``captured``.
        """
        with self.lock:
            self.flush()
            with _torchrl.write_lock(self.rb):
                size, cursor, count = self.counters()
                generation = self.generation
        if sink is not None:
            sink.copy(self.leaves, size)
        with self.lock:
            self.flush()
            with _torchrl.write_lock(self.rb):
                new_size, new_cursor, new_count = self.counters()
                written = new_count - count
                if self.generation != generation or not 0 <= written < self.capacity or new_size < size:
                    segments = [(0, new_size)]
                else:
                    segments = [(cursor, min(cursor + written, self.capacity))]
                    if cursor + written > self.capacity:
                        segments.append((0, cursor + written - self.capacity))
                    segments = [(start, stop) for start, stop in segments if stop > start]
                rows = {} if sink is None else sink.patch(self.leaves, segments, new_size)
                return Snapshot(new_size, new_cursor, new_count, rows, capture())

    # -- writing ---------------------------------------------------------------------------
    def add(self, values: Sequence[Any], rows: int) -> None:
        """Validate and store one add of ``rows`` rows (``values`` in ``input_specs`` order).

        With one row per add, the leading row dim may be omitted. Nothing is written unless
        every value passes validation.

        The common add is staged (``staged_add``): each value is checked by its field's reader
        (see [`field_reader`][rlbuf._core.field_reader]) and written with one numpy assignment
        per field at the position after the pending rows; an add of one row checks CPU tensors
        inline and copies them by address instead (see
        [`one_row_adder`][rlbuf._core.one_row_adder]). It is not staged (the tensor way runs
        instead) for tensors off the CPU, an add larger than ``pending_limit``, or a buffer
        shared with writer processes (whose cursor moves under the shared lock only).
        """
        if not self.staged_add(self, values, rows):
            self.add_unstaged(values, rows)

    def add_unstaged(self, values: Sequence[Any], rows: int) -> None:
        """The tensor way of ``add``: each value checked as a tensor, then written with ``write_tensors``.

        A caller that has just called ``staged_add(ring, values, rows)``, which returned ``False``,
        calls this (``ReplayBuffer.add`` does, one call shorter than ``add``).
        """
        devices = self.accepted_devices
        self.write_tensors({spec.name: checked_rows(spec, value, rows, devices)
                            for spec, value in zip(self.input_specs, values, strict=True)}, rows)

    def _stage(self, values: Sequence[Any], rows: int) -> bool:
        """The staged add of several rows; ``False`` (nothing done) when it does not apply."""
        with self.lock:
            if rows > self.pending_limit or self.rb.shared:
                return False
            try:
                arrays = [read(value) for read, value in zip(self._readers, values, strict=True)]
            except _NotStaged:
                return False
            position = self._claim(rows)
            if position + rows <= self.capacity:
                for target, array in zip(self._target_list, arrays, strict=True):
                    target[position:position + rows] = array
            else:
                first = self.capacity - position
                for target, array in zip(self._target_list, arrays, strict=True):
                    target[position:] = array[:first]
                    target[:rows - first] = array[first:]
            self.pending += rows
            if self.handed_out:
                self.flush()  # TorchRL's storage and writer are read directly: keep them current
            return True

    def _claim(self, rows: int) -> int:
        """Where the next ``rows`` staged rows go (committing the pending ones when the stage is full).

        Call with the lock held, once the rows are validated; the caller adds ``rows`` to ``pending``.
        """
        pending = self.pending
        if pending + rows > self.pending_limit:
            self.flush()
            pending = 0
        if not self.write_through:
            return pending
        if pending == 0:
            self._pending_start = _torchrl.cursor(self.rb)
        return (self._pending_start + pending) % self.capacity

    def hand_out(self) -> TensorDictReplayBuffer:
        """The TorchRL buffer, current now and after every later add (see ``handed_out``)."""
        with self.lock:
            self.handed_out = True
            self.flush()
        return self.rb

    def flush(self) -> None:
        """Commit the pending rows: TorchRL's bookkeeping (and, on a GPU storage, the copy)."""
        if not self.pending:
            return
        with self.lock:
            n, self.pending = self.pending, 0
            if self.write_through:
                with _torchrl.write_lock(self.rb):  # not re-entrant when the buffer is shared across processes
                    self._commit(n)
            else:
                self.write({name: torch.from_numpy(target[:n]) for name, target in self.targets.items()}, n)

    def write_tensors(self, values: Mapping[str, torch.Tensor], rows: int) -> None:
        """Validate ``rows`` rows given as tensors and write them now (derived fields are computed)."""
        for spec in self.input_specs:
            spec.check_tensor(values[spec.name], (rows,), self.accepted_devices)
        with self.lock:
            self.flush()
            self.write(values, rows)

    def write(self, columns: Mapping[str, torch.Tensor], n: int) -> None:
        """Write ``n`` validated rows of the input fields at the cursor, oldest overwritten first.

        Keeps TorchRL's writer, storage and sampler bookkeeping exactly as its own
        ``extend`` would leave it.
        """
        rb = self.rb
        capacity = self.capacity
        with _torchrl.replay_lock(rb), _torchrl.write_lock(rb):
            if n > capacity:
                # Only the newest `capacity` rows survive; writing them in order keeps the cursor right.
                skipped = n - capacity
                _torchrl.skip_rows(rb, skipped, capacity)
                columns = {name: column[skipped:] for name, column in columns.items()}
                n = capacity
            cursor = _torchrl.cursor(rb)
            first = min(n, capacity - cursor)
            for name, column in columns.items():
                leaf = self.leaves[name]
                leaf[cursor:cursor + first].copy_(column[:first], non_blocking=True)
                if first < n:
                    leaf[:n - first].copy_(column[first:], non_blocking=True)
            self._commit(n)

    def _commit(self, n: int) -> None:
        """Derive computed fields over the ``n`` rows after the cursor and advance TorchRL's state."""
        rb, capacity = self.rb, self.capacity
        cursor = _torchrl.cursor(rb)
        if self.derived:
            segments = [(cursor, min(cursor + n, capacity))]
            if cursor + n > capacity:
                segments.append((0, cursor + n - capacity))
            for start, stop in segments:
                views = {name: leaf[start:stop] for name, leaf in self.leaves.items()}
                for name, derive in self.derived.items():
                    views[name].copy_(derive(views))
        # On the CPU whatever the storing device: TorchRL reads the last position with .item() and
        # the sum tree works in numpy, so a CUDA index would cost a sync and copies per commit.
        _torchrl.commit_rows(rb, torch.arange(cursor, cursor + n) % capacity, capacity)

    # -- reading ---------------------------------------------------------------------------
    def require_rows(self, batch_size: int, *, without_replacement: bool) -> int:
        """Check that ``batch_size`` rows can be drawn and return it as an int; flushes nothing.

        A batch that could not fit in this machine's memory is refused before anything is drawn.
        """
        batch_size = positive_int("batch_size", batch_size, BatchSizeError)
        size = len(self)
        if size == 0:
            raise EmptyBufferError("cannot sample from an empty buffer: add transitions first")
        if without_replacement and batch_size > size:
            raise BatchSizeError(f"batch_size: expected at most {size} (the rows stored), got {batch_size}")
        if batch_size * self.row_bytes > _SMALL_BATCH_BYTES:
            # The batch, its index and a copy on the way must fit in the memory free now.
            needed = batch_size * (self.row_bytes + 8) * 2
            available = available_ram()
            if needed > available:
                raise BatchSizeError(f"batch_size: {batch_size} rows need about {needed} bytes, more than the "
                                     f"{available} bytes of memory free now")
        return batch_size

    def as_index(self, index: Any) -> torch.Tensor:
        """Validate stored-row positions and return them as a long tensor on the storing device.

        Accepts an int, a sequence of ints, or an integer array or tensor (CPU or the storing
        device); anything else (``None``, a slice, floats, bools, ``2**64``) is refused.
        """
        values: torch.Tensor | np.ndarray[Any, Any]
        if isinstance(index, torch.Tensor) and index.device.type not in ("cpu", "meta"):
            if index.device != self.storing_device:
                raise StoredIndexError(f"index: expected a tensor on cpu or {self.storing_device}, "
                                       f"got one on {index.device}")
            values = index.detach()
            kind = "f" if values.is_floating_point() or values.is_complex() else "b" if values.dtype is torch.bool else "i"
        else:
            values = as_array("index", index, StoredIndexError)
            kind = values.dtype.kind
            if kind == "f" and values.size and isinstance(index, (int, list, tuple)) and bool(
                    (np.abs(values) >= 2**63).any()):  # Python ints too large for int64 came as floats
                raise StoredIndexError(f"index: expected positions in [0, {len(self)}), got {short_repr(index)}")
        count = values.numel() if isinstance(values, torch.Tensor) else values.size
        if kind not in "iu" and count:
            raise StoredIndexError(f"index: expected integer positions, got dtype {values.dtype}")
        size = len(self)
        if size == 0:
            raise EmptyBufferError("cannot read from an empty buffer: add transitions first")
        if count:
            low, high = int(values.min()), int(values.max())
            if low < 0 or high >= size:
                raise StoredIndexError(f"index: expected positions in [0, {size}), got values in [{low}, {high}]")
        if isinstance(values, np.ndarray):
            values = torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64))
        return values.reshape(-1).to(self.storing_device, torch.long)

    def chronological_index(self) -> torch.Tensor:
        """Storage positions of every stored row, oldest first."""
        self.flush()
        size = len(self)
        positions = torch.arange(size, device=self.storing_device)
        if size == self.capacity:
            positions = (positions + _torchrl.cursor(self.rb)) % self.capacity
        return positions

    def gather(self, index: torch.Tensor, names: Sequence[str] | None = None, *,
               pinned: bool = False) -> dict[str, torch.Tensor]:
        """The rows at ``index`` (storage positions) of the named fields; with ``pinned``, gathered
        straight into page-locked memory (CPU storage only), ready for a non-blocking copy to CUDA."""
        with self.lock:
            self.flush()
            # Writer processes of a shared buffer hold this lock while they write a row.
            with _torchrl.write_lock(self.rb):
                if pinned:
                    return {name: gather_rows(self.leaves[name], self._wide_rows.get(name), index, pin_memory=True)
                            for name in (names or self.leaves)}
                return self._select(index, names)

    def _select(self, index: torch.Tensor, names: Sequence[str] | None) -> dict[str, torch.Tensor]:
        leaves, wide = self.leaves, self._wide_rows
        if not wide:
            return {name: leaves[name].index_select(0, index) for name in (names or leaves)}
        positions = index.numpy()
        return {name: torch.from_numpy(wide[name].take(positions, axis=0)) if name in wide
                else leaves[name].index_select(0, index) for name in (names or leaves)}

    def check_field_names(self, names: Sequence[str]) -> None:
        """Raise [`MissingFieldError`][rlbuf.errors.MissingFieldError] for names that are not stored fields."""
        if isinstance(names, (str, bytes)) or not isinstance(names, (Sequence, set, frozenset)):
            raise MissingFieldError(f"fields: expected a list of field names, got {names!r}")
        unknown = [name for name in names if not isinstance(name, str) or name not in self.by_name]
        if unknown:
            raise MissingFieldError(f"fields: unknown {unknown}; stored fields are {list(self.by_name)}")


def gather_rows(leaf: torch.Tensor, wide: np.ndarray[Any, Any] | None, index: torch.Tensor, *,
                pin_memory: bool) -> torch.Tensor:
    """The rows of a CPU ``leaf`` at ``index``, in a new tensor (page-locked with ``pin_memory``).

    Gathering into the pinned tensor saves the copy that ``pin_memory()`` of a gathered batch
    costs. ``wide`` is the leaf's numpy view when its rows are large (numpy ``take`` is faster).

    Example:
        >>> leaf = torch.arange(12.0).view(6, 2)
        >>> gather_rows(leaf, None, torch.tensor([4, 1]), pin_memory=False).tolist()
        [[8.0, 9.0], [2.0, 3.0]]
    """
    out = torch.empty((index.numel(), *leaf.shape[1:]), dtype=leaf.dtype, pin_memory=pin_memory)
    if wide is not None:
        # Positions are validated already; "clip" lets numpy write into `out` unbuffered.
        np.take(wide, index.numpy(), axis=0, out=out.numpy(), mode="clip")
    else:
        torch.index_select(leaf, 0, index, out=out)
    return out


def _shape_message(plan: _FieldPlan, got: tuple[int, ...]) -> str:
    expected = str(plan.row_shape) + (f" or {plan.single_shape}" if plan.single_shape is not None else "")
    return f"{plan.spec.name}: expected shape {expected}, got {got}"


def _other_input(plan: _FieldPlan, value: Any) -> np.ndarray[Any, Any]:
    """Lists and scalars that the fast checks did not take, as arrays (or a specific error)."""
    if value is None:
        raise MissingFieldError(f"{plan.spec.name}: a value is required")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        plan.spec.check_scalar(value)  # a Python number too large for any numpy dtype is named here
    array = as_array(plan.spec.name, value)
    if array.dtype == np.float64 and plan.np_dtype.kind == "f":
        plan.spec.check_range(array)
        array = array.astype(plan.np_dtype)
    if array.shape == () and plan.single_shape is None:
        raise ShapeError(f"{plan.spec.name}: expected shape {plan.row_shape}, got a scalar {value!r}")
    return array


def _tensor_input(plan: _FieldPlan, value: torch.Tensor) -> np.ndarray[Any, Any]:
    """A CPU tensor whose dtype numpy lacks: bfloat16 into a float field exactly, anything else refused."""
    plan.spec.check_dtype(value.dtype)
    return as_array(plan.spec.name, value)


def as_rows(value: Any, shape: tuple[int, ...], rows: int) -> torch.Tensor:
    """``value`` as a tensor with its rows dim (one row may omit it); not checked here.

    Example:
        >>> as_rows(torch.zeros(3), (3,), 1).shape
        torch.Size([1, 3])
    """
    tensor = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    if rows == 1 and tuple(tensor.shape) == shape:
        tensor = tensor.unsqueeze(0)
    return tensor


def checked_rows(spec: FieldSpec, value: Any, rows: int, devices: tuple[torch.device, ...]) -> torch.Tensor:
    """``rows`` rows of ``spec`` from a tensor, array, list or number, checked (shape, dtype, device, values).

    One row may omit its batch dim. Non-tensors go through the checked conversion.

    Raises:
        MissingFieldError: ``value`` is None.
        ShapeError, DtypeError, DeviceError, NonFiniteError: it does not fit ``spec``.

    Example:
        >>> spec = FieldSpec("reward", "reward", (), torch.float32)
        >>> checked_rows(spec, [1.0, 2.0], 2, (torch.device("cpu"),)).tolist()
        [1.0, 2.0]
    """
    if value is None:
        raise MissingFieldError(f"{spec.name}: a value is required")
    if isinstance(value, torch.Tensor):
        check_strided(spec.name, value)
    tensor = as_rows(value if isinstance(value, torch.Tensor) else torch.from_numpy(
        np.ascontiguousarray(as_array(spec.name, value))), spec.shape, rows)
    spec.check_tensor(tensor, (rows,), devices)
    return tensor


def deliver(tensors: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """Move gathered tensors to the training device (pinned, non-blocking from CPU to CUDA)."""
    first = next(iter(tensors.values()))
    if first.device == device:
        return tensors
    pin = first.device.type == "cpu" and device.type == "cuda"
    return {name: (t.pin_memory() if pin and not t.is_pinned() else t).to(device, non_blocking=pin)
            for name, t in tensors.items()}


# Keywords users bring from other libraries (SB3, CleanRL, TorchRL), and what rlbuf takes instead.
_DONE_HINT = "pass terminated= and truncated= instead; done is derived (terminated | truncated)"
_INFO_HINT = ("rlbuf stores no info dicts: pass the final observation as next_obs, declare what else you need "
              "in extra_fields")
FOREIGN_NAMES = {
    "done": _DONE_HINT,
    "dones": _DONE_HINT,
    "observations": "rlbuf's name is obs",
    "observation": "rlbuf's name is obs",
    "actions": "rlbuf's name is action (expert_action in a DistillationBuffer)",
    "rewards": "rlbuf's name is reward",
    "next_observations": "rlbuf's name is next_obs (the final observation where an episode ended)",
    "next_observation": "rlbuf's name is next_obs (the final observation where an episode ended)",
    "terminals": "rlbuf's name is terminated",
    "timeouts": "rlbuf's name is truncated",
    "values": "rlbuf's name is value",
    "log_probs": "rlbuf's name is log_prob",
    "logprobs": "rlbuf's name is log_prob",
    "infos": _INFO_HINT,
    "info": _INFO_HINT,
    "episode_starts": "rlbuf derives episode starts from the previous step's terminated and truncated",
}
"""Foreign keyword -> what to pass instead, for the message of ``check_extras``."""


def check_extras(expected: Mapping[str, FieldSpec], given: Mapping[str, Any]) -> None:
    """Raise [`MissingFieldError`][rlbuf.errors.MissingFieldError] when extras are missing or unknown.

    A keyword from another library (``dones=``, ``rewards=``, ``log_probs=`` ...) is answered
    with the rlbuf name to use (see ``FOREIGN_NAMES``).

    Example:
        >>> check_extras({}, {"foo": 1})
        Traceback (most recent call last):
        ...
        rlbuf.errors.MissingFieldError: foo: not a field of this buffer (declare it in extra_fields); extra fields are []
        >>> check_extras({}, {"dones": 1})
        Traceback (most recent call last):
        ...
        rlbuf.errors.MissingFieldError: dones: not a field of this buffer; pass terminated= and truncated= instead; done is derived (terminated | truncated)
    """
    for name in given:
        if name not in expected:
            if name in FOREIGN_NAMES:
                raise MissingFieldError(f"{name}: not a field of this buffer; {FOREIGN_NAMES[name]}")
            raise MissingFieldError(f"{name}: not a field of this buffer (declare it in extra_fields); "
                                    f"extra fields are {sorted(expected)}")
    for name in expected:
        if name not in given:
            raise MissingFieldError(f"{name}: missing; this buffer stores it with every row")
