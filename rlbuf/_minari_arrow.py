"""Reading the episodes of a Minari dataset in its Arrow format (a directory ``<id>`` of Arrow IPC
files and a ``metadata.json`` an episode), for [`rlbuf._minari_chunks`][rlbuf._minari_chunks].

Each episode's files are read with one plain ``read`` each, into bytes that pyarrow reads the
record batches from and that the numpy columns are views of: freed once the chunk is copied out
of them. (A memory map of each file costs 1.5 × this read for episodes of 1,000 steps, and
pyarrow's own allocator would keep what it read, chunk after chunk.) The record batches are read
as they are: a Table and its ChunkedArrays cost more than the read. ``metadata.json`` (the seed
and options) is read the same way: Minari's ``get_episode_metadata`` reads this very file, through
``pathlib`` calls that cost 4 × the read. A file that is missing, truncated or not what Minari
writes, or whose record batches do not validate (pyarrow reads them unchecked otherwise: a damaged
buffer length crashed the process), is a ``DatasetError`` naming the episode.

Example:
    >>> import pyarrow as pa
    >>> batch = pa.RecordBatch.from_pydict({"x": pa.array([[1.0, 2.0], [3.0, 4.0]], pa.list_(pa.float64(), 2))})
    >>> import gymnasium as gym
    >>> arrow_column(batch.column("x"), gym.spaces.Box(0, 9, (2,)), pa).tolist()
    [[1.0, 2.0], [3.0, 4.0]]
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Collection, Iterator, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces as gym_spaces

from rlbuf._minari_damage import damaged
from rlbuf._minari_read import Spaces, minari_module


def arrow_column(column: Any, space: Any, pa: Any) -> Any:
    """A column of an Arrow record batch as numpy: fixed-size lists reshaped to the space's shape, structs
    (``Dict`` spaces) as dicts of them; views of the batch where Arrow's layout allows."""
    if isinstance(space, gym_spaces.Dict):
        return {key: arrow_column(column.field(key), sub, pa) for key, sub in space.spaces.items()}
    if isinstance(column, pa.FixedSizeListArray):
        size = math.prod(space.shape)
        # Without null lists the values are the child's slice (flatten(), a compute call, costs 30 us).
        values = (column.values.slice(column.offset * size, len(column) * size) if column.null_count == 0
                  else column.flatten()).to_numpy(zero_copy_only=False)
        return values.reshape(len(column), *space.shape) if values.size == len(column) * size else values
    return column.to_numpy(zero_copy_only=False)


def _concatenated(parts: Sequence[Any]) -> Any:
    """One column from its parts (one per record batch): the part itself, or a copy of them joined."""
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], dict):
        return {key: _concatenated([part[key] for part in parts]) for key in parts[0]}
    return np.concatenate(parts)


def arrow_infos(column: Any, keys: Collection[str] | None) -> dict[str, Any]:
    """An episode's ``infos`` column (a struct of one field a key, ``T + 1`` rows) as Minari's reader
    decodes it: each field stacked into one array, shaped by the field's ``shape`` metadata.

    Args:
        column: the column, its record batches joined (Minari's reader pairs episodes and batches one to
            one, which misreads an episode stored in several).
        keys: the keys to decode (``None``: all of them).

    Example:
        >>> import pyarrow as pa
        >>> column = pa.StructArray.from_arrays([pa.array([1, 2, 3]), pa.array(["a", "b", "c"])], ["k", "s"])
        >>> arrow_infos(column, ["k"])
        {'k': array([1, 2, 3])}
    """
    infos = {}
    for number, field in enumerate(column.type):
        if keys is None or field.name in keys:
            value = np.stack(column.field(number).to_numpy(zero_copy_only=False))
            if field.metadata is not None and b"shape" in field.metadata:
                # "" for rows of one number (Minari's own decode fails on it; its writer wrote them so)
                shape = tuple(int(size) for size in field.metadata[b"shape"].split(b",") if size)
                value = value.reshape(len(value), *shape)
            infos[field.name] = value
    return infos


def arrow_episodes(dataset: Any, ids: Sequence[int], spaces: Spaces, infos: bool | Sequence[str] = False
                   ) -> Iterator[dict[str, Any]]:
    """Episodes of an Arrow dataset (Minari's layout: every column ``T + 1`` rows, the steps' padded by
    one), as ``MinariStorage.get_episodes`` gives them, with their seeds and options, and the ``infos``
    asked for (``True``: all of them; a list: those keys).

    Raises:
        DatasetError: an episode's files are missing, truncated, or not Arrow files of its columns,
            or its ``metadata.json`` is not a JSON object.
    """
    pa, ipc = minari_module("pyarrow"), minari_module("pyarrow.ipc")
    root = str(dataset.storage.data_path)
    spaces_of = {"observations": spaces.observation_space, "actions": spaces.action_space,
                 "rewards": None, "terminations": None, "truncations": None}
    keys = None if infos is True else list(infos or ())
    for episode in ids:
        directory = os.path.join(root, str(episode))
        try:
            meta, columns, decoded = _read_episode(directory, spaces_of, keys, pa, ipc)
        except (OSError, ValueError, KeyError, pa.ArrowException) as error:
            raise damaged(f"episode {episode}: its files in {directory} cannot be read as Minari's Arrow "
                          f"episode ({type(error).__name__}: {error})") from None
        yield {"id": episode, "seed": meta.get("seed"), "options": meta.get("options"),
               "observations": columns.pop("observations"),
               **{name: column[:-1] for name, column in columns.items()}, "infos": decoded}


def _read_episode(directory: str, spaces_of: dict[str, Any], keys: list[str] | None, pa: Any, ipc: Any
                  ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """An episode directory's metadata, its columns (``T + 1`` rows each) and the infos of ``keys``
    (``None``: all)."""
    meta = json.loads(_read(os.path.join(directory, "metadata.json")))
    if not isinstance(meta, dict) or not isinstance(meta.get("options", {}), (dict, type(None))):
        raise ValueError(f"metadata.json: expected an object whose options are an object, got {str(meta)[:80]}")
    files = sorted(name for name in os.listdir(directory) if not name.startswith(("_", ".")) and name != "metadata.json")
    if not files:
        raise FileNotFoundError("no Arrow file")
    readers = [ipc.open_file(pa.py_buffer(_read(os.path.join(directory, name)))) for name in files]
    batches = [reader.get_batch(number) for reader in readers for number in range(reader.num_record_batches)
               ] or [pa.RecordBatch.from_pylist([], schema=readers[0].schema)]
    for batch in batches:  # pyarrow reads a damaged file's buffers unchecked (a crash of the process, not an error)
        batch.validate(full=True)  # 4 us an episode of 1,000 steps
    columns = {name: _concatenated([arrow_column(batch.column(name), space, pa) for batch in batches])
               for name, space in spaces_of.items()}
    wanted = keys is None or bool(keys)
    infos = arrow_infos(pa.concat_arrays([batch.column("infos") for batch in batches]), keys) if wanted and (
        "infos" in batches[0].schema.names) else {}
    return meta, columns, infos


def _read(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()
