"""EpochIterator: minibatches that cover every stored row exactly once per epoch.

Shared by every buffer (``buffer.epochs(...)``, ``RolloutBuffer.minibatches(...)``). The
permutation of each epoch is drawn on the device the rows are gathered on, with the buffer's
own generator. The iterator knows how many batches are left (``len``), and its
``state_dict()`` records the epoch, the position and the permutation, so a run checkpointed
mid-epoch resumes at the next batch.

``n_epochs=0`` means no epochs at all: every batch is drawn at random, with replacement,
forever (iteration-based training).

Example:
    >>> import torch
    >>> seen = []
    >>> it = EpochIterator(10, lambda index: index, batch_size=4, n_epochs=2,
    ...                    generator=torch.Generator().manual_seed(0))
    >>> len(it)
    6
    >>> for index in it:
    ...     seen.append(index)
    >>> [len(i) for i in seen]
    [4, 4, 2, 4, 4, 2]
    >>> sorted(torch.cat(seen[:3]).tolist()) == list(range(10))
    True
"""

from __future__ import annotations

import contextlib
import functools
import reprlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any, Generic, NoReturn, ParamSpec, SupportsIndex, TypeVar

import torch

from rlbuf._keywords import keywords_checked
from rlbuf.errors import (
    BatchSizeError,
    CheckpointError,
    EmptyBufferError,
    NotPicklableError,
    RlbufError,
    StoredIndexError,
)
from rlbuf.spec import as_flag, as_int, positive_int

BatchT = TypeVar("BatchT")
_P = ParamSpec("_P")
_R = TypeVar("_R")

_SPELLINGS = {
    "minibatches": "minibatches(batch_size={n}) for minibatches of {n} rows, or "
                   "minibatches(num_minibatches={n}) for {n} minibatches per epoch",
    "epochs": "epochs(batch_size={n}) for minibatches of {n} rows, or "
              "epochs(batch_size=..., n_epochs={n}) for {n} passes over the stored rows",
}
"""Method name -> the keyword spellings its refusal of a positional size offers (``{n}``: the size given)."""


def sizes_by_keyword(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """Refuse sizes given by position to ``minibatches`` or ``epochs``, with the keyword spellings that say what they mean.

    ``minibatches(4)`` reads as four minibatches and ``epochs(4)`` as four epochs, but a
    positional size was the batch size: a CleanRL port writing ``minibatches(args.num_minibatches)``
    silently ran many times more optimizer steps. Sizes are keywords, so the call says which.

    The message offers both spellings with the size given (4 if it is no positive int).

    Raises:
        BatchSizeError: (from the decorated method) anything but ``self`` given by position.
        MissingFieldError: a keyword it does not take (see ``keywords_checked``).

    Example:
        >>> class Buffer:
        ...     @sizes_by_keyword
        ...     def minibatches(self, *, batch_size: int) -> int:
        ...         return batch_size
        >>> Buffer().minibatches(batch_size=8)
        8
        >>> Buffer().minibatches(8)
        Traceback (most recent call last):
        rlbuf.errors.BatchSizeError: minibatches: expected sizes by keyword, got minibatches(8); write minibatches(batch_size=8) for minibatches of 8 rows, or minibatches(num_minibatches=8) for 8 minibatches per epoch
    """

    name = method.__name__
    spellings = _SPELLINGS[name]
    method = keywords_checked(method)  # and another library's keyword is answered with rlbuf's

    @functools.wraps(method)
    def keywords_only(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        if len(args) > 1:  # args[0] is self
            first = args[1]
            n = first if isinstance(first, int) and not isinstance(first, bool) and first > 0 else 4
            given = ", ".join(reprlib.repr(value) for value in args[1:])
            raise BatchSizeError(f"{name}: expected sizes by keyword, got {name}({given}); write "
                                 + spellings.format(n=n))
        return method(*args, **kwargs)

    return keywords_only


def batch_bounds(size: int, *, batch_size: int | None = None, num_batches: int | None = None,
                 drop_last: bool = False, unit: str = "rows stored") -> list[tuple[int, int]]:
    """Start and stop of each batch in one epoch over ``size`` rows.

    Give ``batch_size`` (the last batch may be smaller unless ``drop_last``) or
    ``num_batches`` (exactly that many batches, sizes differing by at most one, every row
    covered). ``unit`` names what ``size`` counts in messages.

    Raises:
        BatchSizeError: neither or both given, a non-positive value, or more than ``size``.

    Example:
        >>> batch_bounds(10, batch_size=4)
        [(0, 4), (4, 8), (8, 10)]
        >>> batch_bounds(10, num_batches=3)
        [(0, 4), (4, 7), (7, 10)]
    """
    if (batch_size is None) == (num_batches is None):
        raise BatchSizeError("give exactly one of batch_size and num_minibatches")
    if size <= 0:
        raise EmptyBufferError("cannot iterate over an empty buffer: add data first")
    if batch_size is not None:
        batch_size = positive_int("batch_size", batch_size, BatchSizeError)
        if batch_size > size:
            raise BatchSizeError(f"batch_size: expected at most {size} (the {unit}), got {batch_size}")
        stops = list(range(batch_size, size + 1, batch_size))
        if size % batch_size and not drop_last:
            stops.append(size)
        return [(stop - batch_size if stop % batch_size == 0 else stop - size % batch_size, stop) for stop in stops]
    assert num_batches is not None
    num_batches = positive_int("num_minibatches", num_batches, BatchSizeError)
    if num_batches > size:
        raise BatchSizeError(f"num_minibatches: expected at most {size} (the {unit}), got {num_batches}")
    base, extra = divmod(size, num_batches)
    bounds, start = [], 0
    for i in range(num_batches):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def check_epoch_options(size: int, *, batch_size: int | None = None, num_batches: int | None = None,
                        n_epochs: int = 1, drop_last: bool = False, shuffle: bool = True,
                        unit: str = "rows stored") -> dict[str, Any]:
    """Validate an iterator's options over ``size`` rows (or another ``unit``) and return them normalised.

    Buffers call it before drawing the iterator's generator, so a refused call changes nothing.

    Raises:
        BatchSizeError, EmptyBufferError, ConfigError: the field named.

    Example:
        >>> check_epoch_options(10, batch_size=4, n_epochs=2)
        {'batch_size': 4, 'num_batches': None, 'n_epochs': 2, 'drop_last': False, 'shuffle': True}
    """
    n_epochs = as_int("n_epochs", n_epochs, minimum=0)
    options: dict[str, Any] = {"batch_size": batch_size, "num_batches": num_batches, "n_epochs": n_epochs,
                               "drop_last": as_flag("drop_last", drop_last), "shuffle": as_flag("shuffle", shuffle)}
    if n_epochs == 0:
        # Random batches with replacement: any positive size, drawn over the rows stored now.
        if batch_size is None or num_batches is not None:
            raise BatchSizeError("n_epochs=0 draws random batches: give batch_size (and not num_minibatches)")
        options["batch_size"] = positive_int("batch_size", batch_size, BatchSizeError)
        if size <= 0:
            raise EmptyBufferError("cannot draw from an empty buffer: add data first")
        return options
    batch_bounds(size, batch_size=batch_size, num_batches=num_batches, drop_last=options["drop_last"], unit=unit)
    if batch_size is not None:
        options["batch_size"] = positive_int("batch_size", batch_size, BatchSizeError)
    else:
        options["num_batches"] = positive_int("num_minibatches", num_batches, BatchSizeError)
    return options


class EpochIterator(Generic[BatchT], Iterator[BatchT]):
    """Iterates minibatches over ``size`` rows for ``n_epochs`` epochs.

    Args:
        size: rows covered by each epoch, or a callable read at the start of every epoch
            (so an epoch covers the rows present when it starts).
        make_batch: turns a long tensor of row positions into a batch.
        batch_size: rows per batch (or give ``num_batches``).
        num_batches: batches per epoch (or give ``batch_size``).
        n_epochs: passes over the data; ``0`` = random batches with replacement, forever.
        drop_last: drop the last, smaller batch of each epoch.
        shuffle: draw a fresh permutation each epoch (else rows in storage order).
        generator: the random generator (its device is where permutations are drawn).
        lock: held while the iterator moves on and while its state is read: a buffer's lock, so a
            save in another thread finds the iterator between two batches (none: not shared).

    Raises:
        BatchSizeError, EmptyBufferError, ConfigError: invalid sizes.

    Example:
        >>> it = EpochIterator(5, lambda index: index.tolist(), batch_size=2, shuffle=False,
        ...                    generator=torch.Generator())
        >>> len(it), it.next_batch()
        (3, [0, 1])
        >>> state = it.state_dict()
        >>> list(it)
        [[2, 3], [4]]
        >>> it.load_state_dict(state)
        >>> it.next_batch()
        [2, 3]
    """

    def __init__(
        self,
        size: int | Callable[[], int],
        make_batch: Callable[[torch.Tensor], BatchT],
        *,
        batch_size: int | None = None,
        num_batches: int | None = None,
        n_epochs: int = 1,
        drop_last: bool = False,
        shuffle: bool = True,
        generator: torch.Generator,
        lock: AbstractContextManager[Any] | None = None,
    ) -> None:
        self._size_of: Callable[[], int] = size if callable(size) else (lambda: size)
        self._fixed_size = not callable(size)
        self._size = self._size_of()
        options = check_epoch_options(self._size, batch_size=batch_size, num_batches=num_batches, n_epochs=n_epochs,
                                      drop_last=drop_last, shuffle=shuffle)
        batch_size, num_batches, n_epochs = options["batch_size"], options["num_batches"], options["n_epochs"]
        drop_last, shuffle = options["drop_last"], options["shuffle"]
        self._split: dict[str, Any] = {"batch_size": batch_size, "num_batches": num_batches, "drop_last": drop_last}
        self._bounds = [(0, batch_size)] if n_epochs == 0 else batch_bounds(self._size, **self._split)
        self._make_batch = make_batch
        self._n_epochs = n_epochs
        self._shuffle = shuffle
        self._generator = generator
        self._device = generator.device
        self._epoch = 0
        self._position = 0
        self._permutation: torch.Tensor | None = None
        self._lock = lock if lock is not None else contextlib.nullcontext()

    @property
    def batches_per_epoch(self) -> int:
        """Batches in one epoch."""
        return len(self._bounds)

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to (0-based)."""
        return self._epoch

    def __len__(self) -> int:
        """Batches left to iterate.

        Raises:
            TypeError: with ``n_epochs=0`` there is no end.
        """
        if self._n_epochs == 0:
            raise TypeError("an EpochIterator with n_epochs=0 never ends and has no length")
        return (self._n_epochs - self._epoch) * len(self._bounds) - self._position

    def __iter__(self) -> EpochIterator[BatchT]:
        return self

    def __next__(self) -> BatchT:
        with self._lock:  # the draw, the batch and the move on as one step (the buffer's lock is re-entrant)
            return self._next()

    def _next(self) -> BatchT:
        if self._n_epochs == 0:
            size = self._size_of()
            if size <= 0:
                raise EmptyBufferError("cannot draw from an empty buffer: add data first")
            index = torch.randint(0, size, (self._bounds[0][1],), generator=self._generator, device=self._device)
            return self._make_batch(index)
        if self._epoch >= self._n_epochs:
            raise StopIteration
        if self._permutation is None:
            if self._position == 0:
                self._start_epoch()
            self._permutation = (
                torch.randperm(self._size, generator=self._generator, device=self._device)
                if self._shuffle else torch.arange(self._size, device=self._device)
            )
        elif reason := self._rows_removed():
            raise StoredIndexError(reason)
        start, stop = self._bounds[self._position]
        batch = self._make_batch(self._permutation[start:stop])
        self._position += 1
        if self._position == len(self._bounds):
            self._epoch += 1
            self._position = 0
            self._permutation = None
        return batch

    def _start_epoch(self) -> None:
        size = self._size_of()
        if size != self._size:
            self._bounds = batch_bounds(size, **self._split)
            self._size = size

    def _rows_removed(self) -> str:
        """Why the running epoch can give no batch: fewer rows stored than it covers (``""``: it can give one)."""
        if self._permutation is None or self._fixed_size or (rows := self._size_of()) >= self._size:
            return ""
        return (f"epochs: the buffer holds {rows} rows now, the running epoch covers {self._size}: it was cleared or "
                "loaded after this iterator was made, or emptied through buffer.torchrl.empty(); make a new one")

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        """Refuse ``pickle``, ``torch.save`` and ``copy``/``copy.deepcopy`` of the iterator: a copy would draw from
        the generator it shares with its original, or not draw at all (its buffer stays in this process).

        Example:
            >>> import copy
            >>> copy.copy(EpochIterator(4, list, batch_size=2, generator=torch.Generator()))  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            rlbuf.errors.NotPicklableError: EpochIterator: cannot be pickled or copied (pickle, torch.save, copy...
        """
        raise NotPicklableError(
            "EpochIterator: cannot be pickled or copied (pickle, torch.save, copy.copy, copy.deepcopy): it draws "
            "from its buffer's rows and generator in this process; it.state_dict() holds its place (epoch, position, "
            "permutation, generator state) for it.load_state_dict(state) on an iterator made with the same options, "
            "and buffer.save(path) keeps buffer.current_epochs")

    def next_batch(self) -> BatchT:
        """The next batch.

        Raises:
            StopIteration: every epoch is done.
        """
        return self.__next__()

    def state_dict(self) -> dict[str, Any]:
        """Epoch, position, permutation and generator state: enough to resume at the next batch."""
        with self._lock:
            return {
                "size": self._size, "epoch": self._epoch, "position": self._position,
                "n_epochs": self._n_epochs, **self._split,
                "permutation": None if self._permutation is None else self._permutation.cpu().clone(),
                "generator": self._generator.get_state(),
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a [`state_dict`][rlbuf.EpochIterator.state_dict] taken from an iterator with the same options.

        Raises:
            CheckpointError: the state belongs to an iterator over other sizes or epochs.
        """
        known = {"size", "epoch", "position", "n_epochs", *self._split, "permutation", "generator"}
        if not isinstance(state, Mapping) or set(state) != known:
            keys = sorted(state, key=repr) if isinstance(state, Mapping) else type(state).__name__
            raise CheckpointError(f"epoch iterator: a state of keys {sorted(known)} expected, got {keys}")
        for key, mine in (("n_epochs", self._n_epochs), *self._split.items()):
            if type(state[key]) is not type(mine) or state[key] != mine:  # 2.0 for 2, 0 for False: not written so
                raise CheckpointError(f"epoch iterator: {key} is {mine!r} here but {state[key]!r} in the saved state")
        # Everything is checked, and the generator's state tried on a copy, before anything is assigned.
        try:
            size = as_int("size", state.get("size"), minimum=0)
            epoch = as_int("epoch", state.get("epoch"), minimum=0)
            position = as_int("position", state.get("position"), minimum=0)
            # Every position the iterator will read must index a row it runs over.
            rows = self._size_of()
            if size > rows or (self._fixed_size and size != rows):
                raise CheckpointError(f"size: {size} rows, but this iterator runs over {rows}")
            bounds = batch_bounds(size, **self._split) if self._n_epochs else self._bounds
            if position >= len(bounds):
                raise CheckpointError(f"position: {position} is past the {len(bounds)} batches of an epoch")
            permutation = state.get("permutation")
            if self._n_epochs and (epoch > self._n_epochs or (epoch == self._n_epochs and position)):
                raise CheckpointError(f"epoch: {epoch} (position {position}) is past the {self._n_epochs} epochs")
            if self._n_epochs and position and permutation is None:
                raise CheckpointError(f"permutation: missing at position {position} of an epoch")
            if permutation is not None and not (
                    isinstance(permutation, torch.Tensor) and permutation.dtype == torch.int64
                    and tuple(permutation.shape) == (size,)
                    and torch.equal(permutation.sort().values.cpu(), torch.arange(size))):
                raise CheckpointError(f"permutation: expected each of 0..{size - 1} once (int64, shape ({size},))")
            if permutation is not None and not self._shuffle and not torch.equal(permutation.cpu(), torch.arange(size)):
                raise CheckpointError("permutation: an iterator without shuffle runs in storage order, 0..n-1")
            torch.Generator(device=self._device).set_state(state["generator"])
        except (RlbufError, KeyError, TypeError, RuntimeError) as error:
            raise CheckpointError(f"epoch iterator: {error}") from error
        self._size, self._bounds, self._epoch, self._position = size, bounds, epoch, position
        self._permutation = None if permutation is None else permutation.to(self._device)
        self._generator.set_state(state["generator"])
