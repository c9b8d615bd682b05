"""Reading a Minari dataset for [`from_minari`][rlbuf.offline.from_minari] a chunk of episodes at a time,
each field straight into one array of the chunk.

A [`Chunk`][rlbuf._minari_chunks.Chunk] holds consecutive episodes in one array per field: every
episode's ``T + 1`` observations in turn, then its ``T`` actions, rewards and flags in turn. Its
episodes are views of those arrays, checked a field at a time where the reader checked their shapes
(``columns_valid``), else (or where that fails, to name the episode) one by one (``check_episode``),
and its rows for the buffer come out of them with one copy a field: ``obs`` and ``next_obs`` are
each episode's first and last ``T`` observations. The arrays are reused: two sets, one filled while
the buffer copies the rows of the other, so what an import holds beside its buffer is two chunks,
whatever the dataset's size, and the allocator is not asked for new memory chunk after chunk.

How each backend is read:

* **HDF5** (Minari's layout: a group ``episode_{id}`` of datasets ``observations``, a group of them
  for a ``Dict`` space, ``actions``, ``rewards``, ``terminations``, ``truncations``, optional
  ``infos/<key>``, and the attribute ``seed``): each dataset's shape and type are compared with its
  rows of the chunk (HDF5 would convert another type silently), then h5py's low-level ``read``
  writes it into those rows (a view of the chunk's array), naming the memory type it made once
  (``_Hdf5Reader``). An episode whose fields disagree with its spaces or each other is read as it
  is into a chunk of its own, whose check names the problem.
* **Arrow** (a directory ``<id>`` of Arrow IPC files an episode): read by
  [`rlbuf._minari_arrow`][rlbuf._minari_arrow] (infos too), then copied into the chunk.
* **Anything else** (JPEG-encoded images): Minari's own reader (``storage.get_episodes``), which
  decodes them.

Seeds (and options, where asked) come from the HDF5 attribute or Minari's ``get_episode_metadata``.
This module, ``rlbuf._minari_arrow``, ``rlbuf._minari_read`` and ``rlbuf._minari_write`` are rlbuf's seam
to Minari; the layouts read here are pinned against Minari's reader by ``tests/test_offline_readers.py``.

Example:
    >>> episode = {"id": 4, "observations": np.arange(3.0), "actions": np.zeros(2), "rewards": np.ones(2),
    ...            "terminations": np.array([False, True]), "truncations": np.zeros(2, bool), "infos": {}}
    >>> chunk = Chunk.of([episode, {**episode, "id": 5}], _Arrays())
    >>> observations, steps, _ = chunk.joined([()], [])
    >>> observations[()].tolist(), chunk.rows     # each episode's T + 1 observations in turn
    ([0.0, 1.0, 2.0, 0.0, 1.0, 2.0], 4)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from rlbuf._minari_arrow import arrow_episodes
from rlbuf._minari_damage import damaged, linked, readable, too_large
from rlbuf._minari_read import Key, Spaces, episode_seed, leaf_label, minari_module
from rlbuf.errors import ShapeError

STEP_FIELDS = ("actions", "rewards", "terminations", "truncations")


class _Arrays:
    """Arrays kept from chunk to chunk: ``take`` gives the first ``rows`` rows of one that fits."""

    def __init__(self) -> None:
        self.held: dict[str, np.ndarray[Any, Any]] = {}

    def take(self, name: str, rows: int, shape: tuple[int, ...], dtype: Any) -> np.ndarray[Any, Any]:
        held = self.held.get(name)
        if held is None or held.shape[1:] != shape or held.dtype != dtype:
            held = self.held[name] = np.empty((rows, *shape), dtype)
        elif len(held) < rows:  # a quarter more: chunks of episodes of varying lengths reallocate rarely
            held = self.held[name] = np.empty((rows + rows // 4, *shape), dtype)
        return held[:rows]


@dataclass
class Chunk:
    """Consecutive episodes of a dataset (see the module's docstring).

    Attributes:
        ids, seeds, options: per episode (``options`` ``None`` unless asked for).
        lengths: the number of steps ``T`` of each episode.
        arrays: the reused arrays its fields are (or will be) views of; its rows for the buffer too.
        columns: ``(observations, steps, infos)`` once in ``arrays``: per leaf path of the observation
            space, every episode's ``T + 1`` rows in turn; ``actions``, ``rewards``, ``terminations``,
            ``truncations``, every episode's ``T`` rows in turn; per info key, ``T + 1`` rows an episode.
        source: the episodes as dicts, for a chunk not read into ``arrays`` yet (``joined`` copies them).
        shaped: whether every field of every episode has the shape and dtype its spaces and steps set
            (the HDF5 reader checks them before it reads): then ``columns_valid`` can check its values.
    """

    ids: list[int]
    seeds: list[Any]
    options: list[Any]
    lengths: np.ndarray[Any, Any]
    arrays: _Arrays
    columns: tuple[dict[Key, np.ndarray[Any, Any]], dict[str, np.ndarray[Any, Any]],
                   dict[str, np.ndarray[Any, Any]]] | None = None
    source: Sequence[Mapping[str, Any]] | None = None
    shaped: bool = False

    @classmethod
    def of(cls, episodes: Sequence[Mapping[str, Any]], arrays: _Arrays) -> Chunk:
        """A chunk of episodes given as dicts (as ``MinariStorage.get_episodes`` gives them, with ``id``,
        ``seed`` and ``options``), copied into ``arrays`` only by ``joined``, once they are checked."""
        lengths = np.array([len(np.atleast_1d(episode.get("rewards", ()))) for episode in episodes], np.int64)
        return cls([int(episode["id"]) for episode in episodes], [episode.get("seed") for episode in episodes],
                   [episode.get("options") for episode in episodes], lengths, arrays, source=episodes)

    @property
    def rows(self) -> int:
        """Its number of steps (rows of the buffer)."""
        return int(self.lengths.sum())

    @functools.cached_property
    def starts(self) -> list[int]:
        """The first step of each episode in the chunk's step columns (summed once, not per episode)."""
        return [0, *np.cumsum(self.lengths).tolist()]

    def episode(self, number: int, *, structured: bool) -> Mapping[str, Any]:
        """Episode ``number`` as ``check_episode`` takes it (views of the chunk's arrays)."""
        if self.source is not None:  # its options as the chunk holds them (read from the metadata, where asked)
            return {**self.source[number], "options": self.options[number]}
        assert self.columns is not None
        observations, steps, infos = self.columns
        length = int(self.lengths[number])
        start = self.starts[number]
        first = start + number
        tree: Any = {path: leaf[first:first + length + 1] for path, leaf in observations.items()}
        if not structured:
            tree = tree[()]
        else:
            nested: dict[str, Any] = {}
            for path, leaf in tree.items():
                node = nested
                for key in path[:-1]:
                    node = node.setdefault(key, {})
                node[path[-1]] = leaf
            tree = nested
        return {"id": self.ids[number], "seed": self.seeds[number], "options": self.options[number],
                "observations": tree, **{name: array[start:start + length] for name, array in steps.items()},
                "infos": {key: array[first:first + length + 1] for key, array in infos.items()}}

    def joined(self, paths: Sequence[Key], info_keys: Sequence[str]) -> tuple[Any, Any, Any]:
        """Its columns (episodes given as dicts are copied into ``arrays`` here: check them first)."""
        if self.columns is None:
            assert self.source is not None
            values = [{("observations", path): _leaf(episode["observations"], path) for path in paths}
                      | {(name, ()): np.asarray(episode[name]) for name in STEP_FIELDS}
                      | {("infos", (key,)): np.asarray(episode["infos"][key]) for key in info_keys}
                      for episode in self.source]
            out = {}
            for field, first in values[0].items():
                if len(values) == 1 and first.flags.writeable:
                    out[field] = first
                    continue
                out[field] = self.arrays.take("/".join((field[0], *field[1])),
                                              sum(len(value[field]) for value in values), first.shape[1:],
                                              first.dtype)
                np.concatenate([value[field] for value in values], out=out[field])
            self.columns = ({path: out["observations", path] for path in paths},
                            {name: out[name, ()] for name in STEP_FIELDS},
                            {key: out["infos", (key,)] for key in info_keys})
            self.source = None  # what it read is freed: the columns are copies
        return self.columns


def _leaf(tree: Any, path: Key) -> np.ndarray[Any, Any]:
    for key in path:
        tree = tree[key]
    return np.asarray(tree)


def _signature(episode: Mapping[str, Any], paths: Sequence[Key], info_keys: Sequence[str]) -> Any:
    """What episodes of one chunk share, each field's dtype and row shape; ``None`` for an episode that
    is not even arrays of the fields (it goes alone: its check names the problem)."""
    try:
        leaves = [_leaf(episode["observations"], path) for path in paths]
        leaves += [episode[name] for name in STEP_FIELDS] + [episode["infos"][key] for key in info_keys]
    except (KeyError, TypeError, IndexError):
        return None
    if not all(isinstance(leaf, np.ndarray) and leaf.ndim for leaf in leaves):
        return None
    return [(leaf.dtype, leaf.shape[1:]) for leaf in leaves]


def _grouped(episodes: Iterator[dict[str, Any]], paths: Sequence[Key], info_keys: Sequence[str],
             steps_per_chunk: int) -> Iterator[Chunk]:
    """Chunks of about ``steps_per_chunk`` steps of episodes given as dicts, alternating two sets of arrays."""
    arrays = (_Arrays(), _Arrays())
    group: list[dict[str, Any]] = []
    signature: Any = None
    steps = made = 0
    for episode in episodes:
        mine = _signature(episode, paths, info_keys)
        if group and (mine is None or mine != signature):
            yield Chunk.of(group, arrays[made % 2])
            group, steps, made = [], 0, made + 1
        group.append(episode)
        signature = mine
        steps += len(episode["rewards"]) if mine is not None else steps_per_chunk
        if steps >= steps_per_chunk:
            yield Chunk.of(group, arrays[made % 2])
            group, steps, made = [], 0, made + 1
    if group:
        yield Chunk.of(group, arrays[made % 2])


# -- HDF5 -------------------------------------------------------------------------------------------------


@dataclass
class _Opened:
    """An HDF5 episode's datasets, opened, in ``_Hdf5Reader.fields`` order: ``(dataset, shape, type)``."""

    id: int
    seed: Any
    datasets: list[tuple[Any, tuple[int, ...], Any]]

    @property
    def steps(self) -> int:
        return int(self.datasets[-1][1][0])


def _hdf5_tree(group: Any, name: str, paths: Sequence[Key], episode: int, h5py: Any, max_rows: int,
               row_bytes: Mapping[Key, int]) -> Any:
    """A field of an HDF5 episode read as it is stored (an array, or a tree of them for ``paths``), in native
    byte order; a dataset ``too_large`` (``rlbuf._minari_damage``) is refused before anything is allocated for it."""
    def read(path: Key) -> np.ndarray[Any, Any]:
        where = "/".join((name, *path))
        try:
            dataset = h5py.h5d.open(group, where.encode())
        except KeyError as error:
            if linked(group, where, h5py):  # there, but its object cannot be read
                raise damaged(f"episode {episode}: {leaf_label(name, path)}: the dataset {where!r} cannot be "
                              f"read ({error})") from None
            raise ShapeError(f"episode {episode}: {leaf_label(name, path)}: expected the dataset {where!r} in "
                             f"the episode's group, found {sorted(map(str, h5py.Group(group)))}; save every field of "
                             f"the episode") from None
        problem = too_large(dataset, max_rows, row_bytes.get(path))
        if problem:
            raise damaged(f"episode {episode}: {leaf_label(name, path)}: the dataset {where!r} says {problem}")
        out = np.empty(dataset.shape, dataset.dtype.newbyteorder("="))  # HDF5 converts a big-endian file's
        dataset.read(h5py.h5s.ALL, h5py.h5s.ALL, out)
        return out

    if list(paths) == [()]:
        return read(())
    tree: dict[str, Any] = {}
    for path in paths:
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = read(path)
    return tree


def _hdf5_seed(group: Any, h5py: Any) -> Any:
    """The episode's ``seed`` attribute as it is stored (``None`` without one)."""
    try:
        attribute = h5py.h5a.open(group, b"seed")
    except KeyError:
        return None
    return _stored_value(attribute)


def _stored_value(attribute: Any) -> Any:
    """An HDF5 attribute's one value, of its stored type and shape."""
    value = np.empty(attribute.shape, attribute.dtype)
    attribute.read(value)
    return value.item()


def hdf5_episode(file: Any, episode: int, spaces: Spaces, info_keys: Sequence[str] | bool, h5py: Any,
                 max_rows: int) -> dict[str, Any]:
    """One HDF5 episode read as it is stored, as ``MinariStorage.get_episodes`` gives it, with its seed
    (``info_keys=True``: every info; no field of more than ``max_rows`` rows)."""
    group = _episode_group(file, episode, h5py)
    if info_keys is True:
        keys = list(h5py.Group(group)["infos"]) if "infos" in h5py.Group(group) else []
    else:
        keys = list(info_keys or ())
    return {"id": episode, "seed": _hdf5_seed(group, h5py), "options": None,
            "observations": _hdf5_tree(group, "observations", [path for path, _ in spaces.obs], episode, h5py,
                                       max_rows, {path: _row_bytes(space) for path, space in spaces.obs}),
            **{name: _hdf5_tree(group, name, [()], episode, h5py, max_rows,
                                {(): _row_bytes(spaces.action) if name == "actions" else 8}) for name in STEP_FIELDS},
            "infos": _hdf5_tree(group, "infos", [(key,) for key in keys], episode, h5py, max_rows, {}) if keys else {}}


def _episode_group(file: Any, episode: int, h5py: Any) -> Any:
    """The HDF5 group of ``episode`` (``episode_{id}``), opened.

    Raises:
        DatasetError: naming the episode, when its group is missing (deleted) or damaged.
    """
    try:
        return h5py.h5g.open(file.id, b"episode_%d" % episode)
    except (KeyError, ValueError) as error:
        raise damaged(f"episode {episode}: {file.filename}: its group episode_{episode} cannot be opened "
                      f"({error})") from None


def _row_bytes(space: Any) -> int:
    return int(math.prod(space.shape) * np.dtype(space.dtype).itemsize)


_METADATA_CACHE = 1 << 18
"""Bytes of HDF5 metadata (object headers, B-tree nodes) cached while reading: with HDF5's default
(2 MB, growing to 32 MB), reading the 6,000 objects of 1,000 episodes left about 35 MB of the process's
memory taken; with 256 KB, about 4 MB, at the same speed (every object is read once)."""


def _hdf5_file(dataset: Any, h5py: Any) -> Any:
    """The dataset's HDF5 file, opened to read with a small metadata cache.

    Raises:
        DatasetError: the file is missing, truncated or no HDF5 file.
    """
    path = Path(dataset.storage.data_path) / "main_data.hdf5"
    try:
        file = h5py.File(path, "r")
    except OSError as error:
        raise damaged(f"{path}: cannot be read as the dataset's HDF5 file ({error})") from None
    config = file.id.get_mdc_config()
    config.set_initial_size = True
    config.initial_size = config.min_size = config.max_size = _METADATA_CACHE
    file.id.set_mdc_config(config)
    return file


class _Hdf5Reader:
    """Reads episodes of one HDF5 file into chunks, through h5py's low-level API.

    What costs is per call, not per byte (1,000 steps of 17 float64 are 136 KB), and h5py releases
    the GIL around each call, a hand-over to the thread filling the buffer: a read that names no
    memory type makes h5py build one from the array's dtype first (0.2 ms an episode of five
    fields), and each ``get_space`` or ``dtype`` makes another object. So every expected type is
    made once, each dataset is opened by its path from the file (no group object to open and
    close), its shape and type asked for once, and each read names its memory type and writes
    the whole dataset (``h5s.ALL``: no space object kept) straight into the episode's rows of the
    chunk's array; the seed is read as one int64 where its type and size say so. Rewards and
    infos may be of any number type: a chunk's episodes share their first episode's (``same_kind``).
    """

    def __init__(self, file: Any, spaces: Spaces, info_keys: Sequence[str], h5py: Any, max_steps: int) -> None:
        self.file, self.h5py, self.max_steps = file, h5py, max_steps
        self.mtypes: dict[np.dtype[Any], Any] = {}
        # Per field: (rows beyond the steps, row shape, numpy dtype); None where any is allowed (rewards
        # are one number a step, of any number type; infos one row per observation of any shape).
        fields: list[tuple[tuple[str, Key], tuple[int, Any, Any]]] = [
            *((("observations", path), (1, tuple(space.shape), np.dtype(space.dtype))) for path, space in spaces.obs),
            *((("infos", (key,)), (1, None, None)) for key in info_keys),
            (("actions", ()), (0, tuple(spaces.action.shape), np.dtype(spaces.action.dtype))),
            (("terminations", ()), (0, (), np.dtype(bool))), (("truncations", ()), (0, (), np.dtype(bool))),
            (("rewards", ()), (0, (), None))]  # last: ``_Opened.steps``
        self.fields = [field for field, _ in fields]
        self.names = ["/".join((name, *path)).encode() for name, path in self.fields]
        self.expected = [(extra, shape, dtype, None if dtype is None else self.mtype(dtype))
                         for _, (extra, shape, dtype) in fields]
        self.numbers = (h5py.h5t.INTEGER, h5py.h5t.FLOAT)
        self.int64, self.seed = self.mtype(np.dtype(np.int64)), np.empty((), np.int64)

    def mtype(self, dtype: np.dtype[Any]) -> Any:
        """The HDF5 memory type of a numpy dtype, made once."""
        if dtype not in self.mtypes:
            self.mtypes[dtype] = self.h5py.h5t.py_create(dtype)
        return self.mtypes[dtype]

    def open(self, episode: int) -> _Opened | None:
        """The episode's datasets, opened, or ``None`` when its group or a field is missing or cannot be
        opened (``hdf5_episode`` then names which), or a field does not fit its space (shape, type) or
        the other fields' steps."""
        h5d, fid, group = self.h5py.h5d, self.file.id, b"episode_%d/" % episode
        datasets = []
        try:  # by path from the file: no object (two calls) for the group
            for name in self.names:
                dataset = h5d.open(fid, group + name)
                datasets.append((dataset, dataset.shape, dataset.get_type()))
        except (KeyError, ValueError):
            return None
        steps = datasets[-1][1][0] if len(datasets[-1][1]) == 1 else -1
        if steps > self.max_steps:  # more than the whole dataset: read alone, its sizes checked before any read
            return None
        for (_, shape, kind), (extra, row_shape, _, mtype) in zip(datasets, self.expected, strict=True):
            if shape[:1] != (steps + extra,) or (row_shape is not None and shape[1:] != row_shape):
                return None
            if not (kind.get_class() in self.numbers if mtype is None else kind.equal(mtype)):
                return None
        return _Opened(episode, self.episode_seed(group), datasets)

    def episode_seed(self, group: bytes) -> Any:
        """The ``seed`` attribute of the group at path ``group``; Minari's (one int64) read without a new type
        or space (its 8 bytes: one value, as the general read's ``item()`` takes it)."""
        try:
            attribute = self.h5py.h5a.open(self.file.id, b"seed", obj_name=group)
        except KeyError:
            return None
        if attribute.get_type().equal(self.int64) and attribute.get_storage_size() == self.seed.nbytes:
            attribute.read(self.seed, self.int64)
            return int(self.seed)
        return _stored_value(attribute)

    def same_kind(self, first: _Opened, other: _Opened) -> bool:
        """Whether ``other``'s rewards and infos have the types and row shapes of ``first``'s (one chunk)."""
        return all(mine[1][1:] == theirs[1][1:] and mine[2].equal(theirs[2])
                   for mine, theirs, expected in zip(first.datasets, other.datasets, self.expected, strict=True)
                   if expected[3] is None)

    def fill(self, opened: Sequence[_Opened], paths: Sequence[Key], info_keys: Sequence[str], arrays: _Arrays
             ) -> Chunk:
        """Read episodes of one kind into one chunk: each dataset straight into its rows of the chunk's array."""
        lengths = np.array([episode.steps for episode in opened], np.int64)
        steps = int(lengths.sum())
        out: dict[tuple[str, Key], np.ndarray[Any, Any]] = {}
        for number, (field, (extra, _, dtype, _)) in enumerate(zip(self.fields, self.expected, strict=True)):
            _, shape, kind = opened[0].datasets[number]
            dtype = kind.dtype.newbyteorder("=") if dtype is None else dtype  # HDF5 converts a big-endian file's
            array = out[field] = arrays.take(self.names[number].decode(), steps + extra * len(opened),
                                             tuple(shape[1:]), dtype)
            mtype, row, every = self.mtype(dtype), 0, self.h5py.h5s.ALL
            for episode in opened:
                dataset, shape, _ = episode.datasets[number]
                if shape[0]:  # the whole dataset into its rows (shape checked by ``open``)
                    dataset.read(every, every, array[row:row + shape[0]], mtype)
                row += shape[0]
        return Chunk([episode.id for episode in opened], [episode.seed for episode in opened],
                     [None] * len(opened), lengths, arrays,
                     columns=({path: out["observations", path] for path in paths},
                              {name: out[name, ()] for name in STEP_FIELDS},
                              {key: out["infos", (key,)] for key in info_keys}), shaped=True)


def _hdf5_chunks(dataset: Any, ids: Sequence[int], spaces: Spaces, info_keys: Sequence[str],
                 steps_per_chunk: int) -> Iterator[Chunk]:
    h5py = minari_module("h5py")
    paths = [path for path, _ in spaces.obs]
    arrays = (_Arrays(), _Arrays())
    group: list[_Opened] = []
    steps = made = 0
    with _hdf5_file(dataset, h5py) as file:
        reader = _Hdf5Reader(file, spaces, info_keys, h5py, int(dataset.total_steps))
        for episode in ids:
            opened = reader.open(episode)
            if group and (opened is None or not reader.same_kind(group[0], opened)):
                yield reader.fill(group, paths, info_keys, arrays[made % 2])
                group, steps, made = [], 0, made + 1
            if opened is None:  # read as it is stored, alone: its check names what is wrong
                yield Chunk.of([hdf5_episode(file, episode, spaces, info_keys, h5py, reader.max_steps + 1)],
                               arrays[made % 2])
                made += 1
                continue
            group.append(opened)
            steps += opened.steps
            if steps >= steps_per_chunk:
                yield reader.fill(group, paths, info_keys, arrays[made % 2])
                group, steps, made = [], 0, made + 1
        if group:
            yield reader.fill(group, paths, info_keys, arrays[made % 2])


def _minari_episodes(dataset: Any, ids: Sequence[int]) -> Iterator[dict[str, Any]]:
    storage = dataset.storage
    for episode, metadata in zip(storage.get_episodes(ids), storage.get_episode_metadata(ids), strict=True):
        yield {**episode, "seed": metadata.get("seed"), "options": metadata.get("options")}


def reader(dataset: Any, spaces: Spaces) -> str:
    """Which reader ``dataset_chunks`` uses: ``"hdf5"``, ``"arrow"`` or ``"minari"`` (JPEG-encoded images)."""
    is_image_space = minari_module("minari.dataset.minari_storage").is_image_space
    images = any(is_image_space(space) for space in [*(space for _, space in spaces.obs), spaces.action])
    if images and dataset.storage.jpeg_encoding:
        return "minari"
    return "hdf5" if dataset.storage.FORMAT == "hdf5" else "arrow"


def first_episode(dataset: Any, spaces: Spaces, infos: bool | Sequence[str]) -> dict[str, Any]:
    """The dataset's first episode as it is stored, every info included for ``infos=True`` (to find the
    info keys to store before reading the rest)."""
    ids = [int(next(iter(dataset.episode_indices)))]
    kind = reader(dataset, spaces)
    with readable(dataset):
        if kind == "hdf5":
            h5py = minari_module("h5py")
            with _hdf5_file(dataset, h5py) as file:
                episode = hdf5_episode(file, ids[0], spaces, infos or [], h5py, int(dataset.total_steps) + 1)
            return {**episode, "options": next(iter(dataset.storage.get_episode_metadata(ids))).get("options")}
        return next(arrow_episodes(dataset, ids, spaces, infos) if kind == "arrow" else _minari_episodes(dataset, ids))


def dataset_chunks(dataset: Any, spaces: Spaces, steps_per_chunk: int, info_keys: Sequence[str] = (),
                   options: bool = False) -> Iterator[Chunk]:
    """The dataset's episodes in order, in chunks of about ``steps_per_chunk`` steps (an episode is
    never split), their seeds included, and with ``options`` their reset options (as Minari's
    ``get_episode_metadata`` reads them). Two chunks are in memory at a time: a chunk's arrays are
    reused by the chunk after the next."""
    ids = [int(i) for i in dataset.episode_indices]
    paths = [path for path, _ in spaces.obs]
    kind = reader(dataset, spaces)
    if kind == "hdf5":
        chunks = _hdf5_chunks(dataset, ids, spaces, info_keys, steps_per_chunk)
    else:
        episodes = (arrow_episodes(dataset, ids, spaces, list(info_keys)) if kind == "arrow"
                    else _minari_episodes(dataset, ids))
        chunks = _grouped(episodes, paths, info_keys, steps_per_chunk)
    with readable(dataset):
        if not options or kind != "hdf5":
            yield from chunks
            return
        metadata = iter(dataset.storage.get_episode_metadata(ids))
        for chunk in chunks:
            chunk.options = [next(metadata).get("options") for _ in chunk.ids]
            yield chunk


def chunk_rows(chunk: Chunk, spaces: Spaces, *, exact_reward: bool, episode_fields: bool = True,
               infos: Sequence[str] = (), options: Sequence[Mapping[str, np.ndarray[Any, Any]]] = (),
               obs_dtype: np.dtype[Any] | None = None, action_dtype: np.dtype[Any] | None = None) -> TensorDict:
    """The rows of a checked chunk, in order, as a TorchRL tensordict for ``ReplayBuffer.extend``.

    Row ``t`` of an episode: ``observation = obs[t]``, ``("next", "observation") = obs[t + 1]``, the
    step's action, reward and flags; with ``episode_fields``, ``episode_id`` and ``episode_seed``;
    with ``exact_reward``, ``dataset_reward``: the reward in the dataset's own dtype; for each key of
    ``infos``, ``info_<key> = infos[key][t]`` and ``next_info_<key> = infos[key][t + 1]``; ``options``:
    each episode's option fields (``check_options``), on each of its rows; ``obs_dtype``, ``action_dtype``:
    the dtypes a flat observation and the action are cast to (uint16 and uint32, which torch does not
    store). The tensors are views of the chunk's reused arrays: extend the buffer with them before the
    chunk after the next is read.
    """
    paths = [path for path, _ in spaces.obs]
    observations, steps, episode_infos = chunk.joined(paths, infos)
    rows, lengths, arrays = chunk.rows, chunk.lengths, chunk.arrays

    def shifted(name: str, values: np.ndarray[Any, Any], shift: int, dtype: np.dtype[Any] | None = None
                ) -> torch.Tensor:
        """Each episode's ``T`` rows of ``values`` (``T + 1`` an episode) from its row ``shift``, in ``dtype``."""
        out = arrays.take(name, rows, values.shape[1:], dtype or values.dtype)
        start = 0
        for number, length in enumerate(lengths.tolist()):
            out[start:start + length] = values[start + number + shift:start + number + shift + length]
            start += length
        return torch.from_numpy(out)

    def nest(shift: int) -> Any:
        leaves = {path: shifted(f"rows/{shift}/" + "/".join(path), observations[path], shift, obs_dtype)
                  for path in paths}
        if not spaces.structured:
            return leaves[()]
        tree: dict[str, Any] = {}
        for path, leaf in leaves.items():
            node = tree
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = leaf
        return tree

    rewards = steps["rewards"]
    reward = arrays.take("rows/reward", rows, (), np.dtype(np.float32))
    np.copyto(reward, rewards, casting="unsafe")
    fields: dict[str, Any] = {
        "observation": nest(0),
        "action": torch.from_numpy(steps["actions"] if action_dtype is None else steps["actions"].astype(action_dtype)),
        "next": {"observation": nest(1), "reward": torch.from_numpy(reward),
                 "terminated": torch.from_numpy(steps["terminations"]),
                 "truncated": torch.from_numpy(steps["truncations"])},
    }
    if episode_fields:
        fields["episode_id"] = torch.from_numpy(np.repeat(np.array(chunk.ids, np.int64), lengths))
        fields["episode_seed"] = torch.from_numpy(np.repeat(
            np.array([episode_seed(seed, episode) for seed, episode in zip(chunk.seeds, chunk.ids, strict=True)],
                     np.int64), lengths))
    if exact_reward:
        fields["dataset_reward"] = torch.from_numpy(rewards)
    for key in infos:
        fields[f"info_{key}"] = shifted(f"rows/info/{key}", episode_infos[key], 0)
        fields[f"next_info_{key}"] = shifted(f"rows/next_info/{key}", episode_infos[key], 1)
    for name in options[0] if options else ():
        fields[name] = torch.from_numpy(np.concatenate([
            np.broadcast_to(values[name], (length, *values[name].shape))
            for values, length in zip(options, lengths.tolist(), strict=True)]))
    return TensorDict(fields, batch_size=[rows])


def step_bytes(spaces: Spaces) -> int:
    """Bytes one step takes in the dataset (its observation and action), to size chunks.

    Example:
        >>> import gymnasium as gym
        >>> step_bytes(Spaces.of(gym.spaces.Box(-1, 1, (17,), np.float64), gym.spaces.Box(-1, 1, (6,))))
        170
    """
    leaves = [space for _, space in spaces.obs] + [spaces.action]
    return int(sum(math.prod(space.shape) * np.dtype(space.dtype).itemsize for space in leaves)) + 10
