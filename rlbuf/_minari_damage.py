"""What a damaged Minari dataset looks like to its readers (``rlbuf._minari_chunks``, ``rlbuf.offline``),
and its refusal as a ``DatasetError``.

h5py, pyarrow and Minari's own readers raise their own errors for damaged files (``OSError``,
``KeyError``, ``RuntimeError``, ``ValueError``, ``TypeError``: a corrupted object, a file cut short,
metadata that is no JSON); ``readable`` reports them as one rlbuf error, naming the dataset's files.
An HDF5 dataset's shape is allocated before it is read, so ``too_large`` judges it first.

Example:
    >>> from types import SimpleNamespace
    >>> data = SimpleNamespace(id="ns/d-v0", storage=SimpleNamespace(data_path="/data"))
    >>> with readable(data):
    ...     raise OSError("truncated file")
    Traceback (most recent call last):
    ...
    rlbuf.errors.DatasetError: dataset 'ns/d-v0': its files in /data cannot be read (OSError: truncated file); re-create the dataset (or load it again from its source)
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

from rlbuf.errors import DatasetError, RlbufError

READ_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError)
"""What h5py, pyarrow and Minari's readers raise for damaged files."""


def damaged(problem: str) -> DatasetError:
    """The ``DatasetError`` for ``problem`` (what is wrong, and where), with its one fix.

    Example:
        >>> str(damaged("episode 3: its files cannot be read"))
        'episode 3: its files cannot be read; re-create the dataset (or load it again from its source)'
    """
    return DatasetError(f"{problem}; re-create the dataset (or load it again from its source)")


@contextlib.contextmanager
def readable(dataset: Any) -> Iterator[None]:
    """Errors of h5py, pyarrow or Minari's readers for damaged files (a corrupted object or chunk, a file cut
    short, metadata that is no JSON) as a ``DatasetError``; rlbuf's own errors as they are."""
    try:
        yield
    except RlbufError:
        raise
    except READ_ERRORS as error:
        raise damaged(f"dataset {dataset.id!r}: its files in {dataset.storage.data_path} cannot be read "
                      f"({type(error).__name__}: {error})") from None


def too_large(dataset: Any, max_rows: int, row_bytes: int | None) -> str:
    """What is wrong with allocating an HDF5 dataset's shape before reading it (``""``: nothing): more than
    ``max_rows`` rows (the dataset's steps + 1); uncompressed (as Minari writes them), more bytes than the
    file stores for it; compressed (missing chunks read as zeros), rows of more than 8 x ``row_bytes`` (its
    space's row: room for any dtype) where the space is known. Each would be allocated and zero-filled first."""
    shape, size = dataset.shape, math.prod(dataset.shape) * dataset.dtype.itemsize
    if shape and shape[0] > max_rows:
        return f"{shape[0]:,} rows, more than the dataset's {max_rows - 1:,} steps (+ 1)"
    if dataset.get_create_plist().get_nfilters() == 0:
        stored = dataset.get_storage_size()
        return f"{shape} ({size:,} bytes) but holds {stored:,} bytes in the file" if size > stored else ""
    if row_bytes is not None and size > max_rows * max(8 * row_bytes, 64):
        return f"{shape} ({size:,} bytes), more than {max_rows:,} rows of its space could need"
    return ""


def linked(group: Any, where: str, h5py: Any) -> bool:
    """Whether ``group`` links to ``where``, or cannot tell (its own structure is damaged)."""
    try:
        return where in h5py.Group(group)
    except READ_ERRORS:
        return True
