"""Reading a Minari dataset for [`from_minari`][rlbuf.offline.from_minari]: its spaces, its episodes checked one
by one, and the rows of a chunk of episodes as one TorchRL tensordict.

An episode of ``T`` steps holds ``T + 1`` observations (the final one last), ``T`` actions, rewards,
``terminations`` and ``truncations``. [`check_episode`][rlbuf._minari_read.check_episode] refuses anything else
with a message that names the episode, the field, what was expected, what was received and the fix;
[`chunk_rows`][rlbuf._minari_read.chunk_rows] turns checked episodes into rows: row ``t`` holds ``obs[t]``,
``next_obs = obs[t + 1]`` and the step's flags as they are.

This module and ``rlbuf._minari_write`` are rlbuf's one seam to Minari: besides Minari's public
reader, it reads the HDF5 layout of Minari 0.5 with h5py directly (pinned against Minari's reader by
``tests/test_offline.py``).

Example:
    >>> import gymnasium as gym
    >>> import numpy as np
    >>> spaces = Spaces.of(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(3))
    >>> episode = {"id": 0, "observations": np.zeros((3, 2), np.float32), "actions": np.array([0, 2]),
    ...            "rewards": np.ones(2), "terminations": np.array([False, True]),
    ...            "truncations": np.array([False, False])}
    >>> check_episode(episode, spaces)
    2
    >>> td = chunk_rows([episode], spaces, exact_reward=False)
    >>> td["next", "terminated"].tolist()
    [False, True]
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces as gym_spaces
from tensordict import TensorDict

from rlbuf.errors import (
    ConfigError,
    DtypeError,
    NonFiniteError,
    OutOfRangeError,
    ShapeError,
    StreamError,
)

Key = tuple[str, ...]
MINARI_VERSION = (0, 5, 4)
"""The oldest Minari rlbuf.offline works with (the ``offline`` extra's pin)."""
NO_SEED = -1
"""``episode_seed`` of an episode reset without a seed."""
_LEAF_SPACES = (gym_spaces.Box, gym_spaces.Discrete, gym_spaces.MultiDiscrete, gym_spaces.MultiBinary)


def minari_module(name: str = "minari") -> Any:
    """A module of Minari, an optional dependency (``pip install "rlbuf[offline]"``).

    Raises:
        ConfigError: Minari (or the backend it needs: h5py, pyarrow) is not installed, or a Minari older
            than 0.5.4 (whose writers have no ``jpeg_encoding``: images would be written lossily).

    Example:
        >>> minari_module().__name__
        'minari'
    """
    try:
        module = importlib.import_module(name)
    except ImportError as error:
        raise ConfigError(f"rlbuf.offline needs Minari with both backends: pip install \"rlbuf[offline]\" "
                          f"({error})") from error
    if name == "minari":
        version = tuple(int(part) for part in re.findall(r"\d+", module.__version__)[:3])
        if version < MINARI_VERSION:
            raise ConfigError(f"rlbuf.offline needs Minari >= {'.'.join(map(str, MINARI_VERSION))} (its writers' "
                              f"jpeg_encoding=False keeps images lossless), got {module.__version__}: "
                              f"pip install \"rlbuf[offline]\"")
    return module


def open_dataset(dataset: Any) -> Any:
    """A ``minari.MinariDataset`` for a dataset, a local dataset id or a path; never downloads.

    Raises:
        ConfigError: an id that is not in the local Minari root, or a path that holds no Minari dataset.

    Example:
        >>> open_dataset("nowhere/missing-v0")
        Traceback (most recent call last):
        ...
        rlbuf.errors.ConfigError: dataset 'nowhere/missing-v0': not a local Minari dataset ...
    """
    minari = minari_module()
    if isinstance(dataset, minari.MinariDataset):
        return dataset
    if not isinstance(dataset, (str, Path)):
        raise ConfigError(f"dataset: expected a minari.MinariDataset, a local dataset id or a path, "
                          f"got {type(dataset).__name__}")
    path = Path(dataset)
    for data in (path / "data", path):
        if (data / "metadata.json").is_file():
            return minari.MinariDataset(data)
    # Minari's rule for its root, read without creating the directory as get_dataset_path() does.
    root = Path(os.environ.get("MINARI_DATASETS_PATH") or Path.home() / ".minari" / "datasets")
    if isinstance(dataset, str) and (root / dataset / "data" / "metadata.json").is_file():
        return minari.load_dataset(dataset, download=False)
    raise ConfigError(f"dataset {str(dataset)!r}: not a local Minari dataset (looked in {root}, the Minari root "
                      f"MINARI_DATASETS_PATH or ~/.minari/datasets, and at that path); rlbuf never downloads: "
                      f"fetch it once with `minari download {dataset}` (or minari.download_dataset), or pass "
                      f"the dataset's directory")


def _leaves(space: Any, name: str, path: Key = ()) -> list[tuple[Key, Any]]:
    if isinstance(space, gym_spaces.Dict) and name == "observations":
        return [leaf for key, sub in space.spaces.items() for leaf in _leaves(sub, name, (*path, str(key)))]
    if not isinstance(space, _LEAF_SPACES):
        raise ConfigError(f"{name}: a {type(space).__name__} space cannot be stored in a ReplayBuffer; supported: Box, "
                          f"Discrete, MultiDiscrete, MultiBinary" + (" and Dict of them" if name == "observations"
                                                                    else ""))
    return [(path, space)]


def leaf_label(name: str, path: Key) -> str:
    """``observations["a"]["b"]``: a leaf of a Minari field, in messages.

    Example:
        >>> leaf_label("observations", ("camera",))
        'observations["camera"]'
    """
    return name + "".join(f'["{key}"]' for key in path)


@dataclass(frozen=True)
class Spaces:
    """A dataset's observation and action spaces, as leaves: ``(path, space)`` pairs."""

    observation_space: Any
    action_space: Any
    obs: tuple[tuple[Key, Any], ...]
    action: Any

    @classmethod
    def of(cls, observation_space: Any, action_space: Any) -> Spaces:
        """The leaves of both spaces.

        Raises:
            ConfigError: a space rlbuf cannot store (``Tuple``, ``Text``, a ``Dict`` of actions ...).
        """
        obs = tuple(_leaves(observation_space, "observations"))
        return cls(observation_space, action_space, obs, _leaves(action_space, "actions")[0][1])

    @property
    def structured(self) -> bool:
        """Whether observations are a (nested) dict."""
        return isinstance(self.observation_space, gym_spaces.Dict)


def _value(tree: Any, path: Key, episode: Any, name: str) -> np.ndarray[Any, Any]:
    for key in path:
        if not isinstance(tree, Mapping) or key not in tree:
            found = sorted(tree) if isinstance(tree, Mapping) else type(tree).__name__
            raise ShapeError(f"episode {episode}: {leaf_label(name, path)}: expected the key {key!r} of the "
                             f"Dict space, got {found}; save the dataset with every key of its space")
        tree = tree[key]
    if not isinstance(tree, np.ndarray):
        raise DtypeError(f"episode {episode}: {leaf_label(name, path)}: expected an array, got "
                         f"{type(tree).__name__}; save the dataset with arrays of its spaces' dtypes")
    return tree


def _check_leaf(value: np.ndarray[Any, Any], space: Any, rows: int, steps: int, label: str, episode: Any) -> None:
    shape = (rows, *space.shape)
    if value.shape != shape:
        if label.startswith("observations") and value.shape == (steps, *space.shape):
            raise ShapeError(f"episode {episode}: {label}: expected {rows} rows (one per step of its {steps} "
                             f"rewards, plus the final observation), got {steps}: the final observation is "
                             f"missing; save every episode with all T + 1 observations (Minari's DataCollector "
                             f"keeps the final one, of a truncated episode too)")
        encoded = (" of encoded bytes (the HDF5 writer of Minari 0.5.3 and older JPEG-encoded uint8 arrays of 2 "
                   "or 3 dims a row even when their space was no image space, and read the bytes back: write "
                   "such data again with Minari >= 0.5.4 or rlbuf.offline.to_minari, which store it raw)"
                   ) if value.dtype == object else ""
        raise ShapeError(f"episode {episode}: {label}: expected shape {shape} ({steps} steps), got {value.shape}"
                         f"{encoded}; save the episode with {rows} rows of the space's shape {tuple(space.shape)}")
    if value.dtype != space.dtype:
        raise DtypeError(f"episode {episode}: {label}: expected dtype {space.dtype} (the space's), got "
                         f"{value.dtype}; save the dataset with arrays of its spaces' dtypes, or declare the space "
                         f"with dtype {value.dtype}")
    if value.dtype.kind == "f":
        nan = np.isnan(value)
        if nan.any():
            step = int(np.argwhere(nan)[0][0])
            raise NonFiniteError(f"episode {episode}: {label}: NaN at row {step} (no Box space contains NaN); "
                                 f"fix or drop the episode (dataset.filter_episodes) before importing it")
    if isinstance(space, (gym_spaces.Discrete, gym_spaces.MultiDiscrete)):
        low = np.asarray(space.start)
        high = low + np.asarray(space.n if isinstance(space, gym_spaces.Discrete) else space.nvec) - 1
        outside = (value < low) | (value > high)
        if outside.any():
            step = int(np.argwhere(outside)[0][0])
            raise OutOfRangeError(f"episode {episode}: {label}: expected values in [{low.min()}, {high.max()}] "
                                  f"(the space's), got {value[step].tolist()} at row {step}; fix or drop the "
                                  f"episode before importing it")


def check_episode(episode: Mapping[str, Any], spaces: Spaces) -> int:
    """Check one episode (a dict as ``MinariStorage.get_episodes`` yields it) against the dataset's spaces.

    Returns:
        Its number of steps ``T``.

    Raises:
        ShapeError: lengths that disagree, a missing final observation, a shape not the space's.
        DtypeError: a dtype not the space's (flags: bool; rewards: a number).
        NonFiniteError: NaN in an observation or action, a reward that is not finite (as float32).
        OutOfRangeError: a discrete value outside its space.
        StreamError: an end flag before the last step, or a last step neither terminated nor truncated.

    Example:
        >>> import gymnasium as gym
        >>> spaces = Spaces.of(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(3))
        >>> check_episode({"id": 7, "observations": np.zeros((2, 2), np.float32), "actions": np.array([0, 2]),
        ...                "rewards": np.ones(2), "terminations": np.array([False, False]),
        ...                "truncations": np.array([False, True])}, spaces)
        Traceback (most recent call last):
        ...
        rlbuf.errors.ShapeError: episode 7: observations: expected 3 rows (one per step of its 2 rewards, plus the final observation), got 2: the final observation is missing; save every episode with all T + 1 observations (Minari's DataCollector keeps the final one, of a truncated episode too)
    """
    episode_id = episode.get("id")
    rewards = episode["rewards"]
    if not isinstance(rewards, np.ndarray) or rewards.ndim != 1:
        raise ShapeError(f"episode {episode_id}: rewards: expected one number per step (shape (T,)), got "
                         f"{getattr(rewards, 'shape', type(rewards).__name__)}; save rewards as a 1-D array")
    steps = len(rewards)
    if steps == 0:
        raise ShapeError(f"episode {episode_id}: rewards: expected at least one step, got an empty episode; "
                         f"drop it before importing")
    if rewards.dtype.kind not in "fiu":
        raise DtypeError(f"episode {episode_id}: rewards: expected numbers, got dtype {rewards.dtype}; save "
                         f"rewards as floats")
    flags = {}
    for name in ("terminations", "truncations"):
        flag = episode[name]
        if not isinstance(flag, np.ndarray) or flag.shape != (steps,):
            raise ShapeError(f"episode {episode_id}: {name}: expected shape ({steps},) (one per reward), got "
                             f"{getattr(flag, 'shape', type(flag).__name__)}; save one flag per step")
        if flag.dtype != np.bool_:
            raise DtypeError(f"episode {episode_id}: {name}: expected dtype bool, got {flag.dtype}; save the "
                             f"flags as bools")
        flags[name] = flag
    for path, space in spaces.obs:
        label = leaf_label("observations", path)
        _check_leaf(_value(episode["observations"], path, episode_id, "observations"), space, steps + 1, steps,
                    label, episode_id)
    _check_leaf(_value(episode["actions"], (), episode_id, "actions"), spaces.action, steps, steps, "actions",
                episode_id)
    finite = np.isfinite(rewards.astype(np.float32))
    if not finite.all():
        step = int(np.argmin(finite))
        raise NonFiniteError(f"episode {episode_id}: rewards: expected finite float32 values, got {rewards[step]} "
                             f"at step {step}; fix or drop the episode before importing it")
    ended = flags["terminations"] | flags["truncations"]
    if ended[:-1].any():
        step = int(np.argmax(ended[:-1]))
        name = "terminations" if flags["terminations"][step] else "truncations"
        raise StreamError(f"episode {episode_id}: {name}: expected no end before the last step {steps - 1}, got "
                          f"True at step {step}; an episode ends at its first flag: split it into two episodes")
    if not ended[-1]:
        raise StreamError(f"episode {episode_id}: terminations, truncations: expected the last step {steps - 1} "
                          f"to be terminated or truncated (a Minari episode is complete: its DataCollector marks "
                          f"an interrupted episode truncated), got neither; mark it truncated (the final "
                          f"observation then bootstraps) or drop the episode")
    return steps


def episode_seed(seed: Any, episode: Any) -> int:
    """An episode's seed as stored in ``episode_seed``: the seed, or ``NO_SEED`` for none.

    Raises:
        OutOfRangeError: a seed that is negative or does not fit an int64.

    Example:
        >>> episode_seed(None, 0), episode_seed(42, 1)
        (-1, 42)
    """
    if seed is None:
        return NO_SEED
    if isinstance(seed, (bool, float)) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**63:
        raise OutOfRangeError(f"episode {episode}: seed: expected an int in [0, 2**63), got {seed!r}; import "
                              f"with exact=False to leave seeds out")
    return int(seed)


def chunk_rows(episodes: Sequence[Mapping[str, Any]], spaces: Spaces, *, exact_reward: bool,
               episode_fields: bool = True, infos: Sequence[str] = (), options: Sequence[str] = ()) -> TensorDict:
    """The rows of checked episodes, in order, as a TorchRL tensordict for ``ReplayBuffer.extend``.

    Row ``t`` of an episode: ``observation = obs[t]``, ``("next", "observation") = obs[t + 1]``, the
    step's action, reward and flags; with ``episode_fields``, ``episode_id`` and ``episode_seed``;
    with ``exact_reward``, ``dataset_reward``: the reward in the dataset's own dtype; for each key of
    ``infos``, ``info_<key> = infos[key][t]`` and ``next_info_<key> = infos[key][t + 1]``; for each
    field of ``options``, the episode's value (``episode["option_fields"]``, see ``check_options``).
    """
    lengths = np.array([len(episode["rewards"]) for episode in episodes])
    rows = int(lengths.sum())

    def column(name: str) -> torch.Tensor:
        return torch.from_numpy(np.concatenate([episode[name] for episode in episodes]))

    def observations(path: Key, start: int, stop: int | None) -> torch.Tensor:
        return torch.from_numpy(np.concatenate([_value(episode["observations"], path, episode.get("id"),
                                                       "observations")[start:stop] for episode in episodes]))

    def nest(start: int, stop: int | None) -> Any:
        if not spaces.structured:
            return observations((), start, stop)
        tree: dict[str, Any] = {}
        for path, _ in spaces.obs:
            node = tree
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = observations(path, start, stop)
        return tree

    rewards = np.concatenate([episode["rewards"] for episode in episodes])
    fields: dict[str, Any] = {
        "observation": nest(0, -1),
        "action": torch.from_numpy(np.concatenate([episode["actions"] for episode in episodes])),
        "next": {"observation": nest(1, None), "reward": torch.from_numpy(rewards.astype(np.float32)),
                 "terminated": column("terminations"), "truncated": column("truncations")},
    }
    if episode_fields:
        ids = np.array([int(episode["id"]) for episode in episodes], np.int64)
        fields["episode_id"] = torch.from_numpy(np.repeat(ids, lengths))
        fields["episode_seed"] = torch.from_numpy(np.repeat(
            np.array([episode_seed(episode.get("seed"), episode["id"]) for episode in episodes], np.int64), lengths))
    if exact_reward:
        fields["dataset_reward"] = torch.from_numpy(rewards)
    for key in infos:
        fields[f"info_{key}"] = torch.from_numpy(np.concatenate([episode["infos"][key][:-1] for episode in episodes]))
        fields[f"next_info_{key}"] = torch.from_numpy(np.concatenate([episode["infos"][key][1:]
                                                                      for episode in episodes]))
    for name in options:
        fields[name] = torch.from_numpy(np.concatenate([np.broadcast_to(episode["option_fields"][name],
                                                                        (steps, *episode["option_fields"][name].shape))
                                                        for episode, steps in zip(episodes, lengths, strict=True)]))
    return TensorDict(fields, batch_size=[rows])


def info_keys(episode: Mapping[str, Any], infos: bool | Sequence[str]) -> list[str]:
    """The info keys to store: the flat numeric ones of the first episode (``True``) or the given ones.

    Raises:
        ConfigError: a key that is no identifier (it names a field).

    Example:
        >>> info_keys({"infos": {"success": np.zeros(3, bool), "name": ["a", "b", "c"]}}, True)
        ['success']
    """
    if infos is False:
        return []
    found = episode.get("infos") or {}
    keys = sorted(key for key, value in found.items() if isinstance(value, np.ndarray) and value.dtype.kind in "biuf"
                  ) if infos is True else list(infos)
    for key in keys:
        if not isinstance(key, str) or not key.isidentifier():
            raise ConfigError(f"infos: {key!r} is no identifier, so it cannot name the fields info_{key} and "
                              f"next_info_{key}; pass the keys to keep (infos=[...])")
    return keys


def check_infos(episode: Mapping[str, Any], keys: Sequence[str], steps: int, first: Mapping[str, Any]) -> None:
    """Check the requested infos of an episode: numbers, one row per observation, as the first episode's.

    Raises:
        ShapeError: a missing key, or not one row per observation (``T + 1``) of the first episode's shape.
        DtypeError: not numbers, or another dtype than the first episode's.
    """
    found = episode.get("infos") or {}
    for key in keys:
        value = found.get(key)
        label = f'episode {episode.get("id")}: infos["{key}"]'
        if not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf":
            raise DtypeError(f"{label}: expected an array of numbers (one per observation), got "
                             f"{type(value).__name__ if not isinstance(value, np.ndarray) else value.dtype}; "
                             f"import without it (infos=[...] with the other keys)")
        reference = first["infos"][key]
        if value.shape != (steps + 1, *reference.shape[1:]):
            raise ShapeError(f"{label}: expected shape {(steps + 1, *reference.shape[1:])} (one row per "
                             f"observation), got {value.shape}; import without it (infos=[...])")
        if value.dtype != reference.dtype:
            raise DtypeError(f"{label}: expected dtype {reference.dtype} (as the first episode's), got "
                             f"{value.dtype}; save every episode's info with one dtype")


def _hdf5_tree(group: Any, name: str, paths: Sequence[Key], episode: int, h5py: Any) -> Any:
    def read(path: Key) -> np.ndarray[Any, Any]:
        where = "/".join((name, *path))
        try:
            dataset = h5py.h5d.open(group.id, where.encode())
        except KeyError:
            raise ShapeError(f"episode {episode}: {leaf_label(name, path)}: expected the dataset {where!r} in "
                             f"the episode's group, found {sorted(group)}; save every field of the episode") from None
        out = np.empty(dataset.shape, dataset.dtype)
        dataset.read(h5py.h5s.ALL, h5py.h5s.ALL, out)
        return out

    if paths == [()]:
        return read(())
    tree: dict[str, Any] = {}
    for path in paths:
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = read(path)
    return tree


def _hdf5_episodes(dataset: Any, ids: Sequence[int], spaces: Spaces,
                   infos: bool | Sequence[str] = False) -> Iterator[dict[str, Any]]:
    """Episodes of an HDF5 dataset read with h5py's low-level calls (a third of the high-level calls' cost
    for Minari's small chunks), as ``MinariStorage.get_episodes`` gives them, with their seeds."""
    h5py = minari_module("h5py")
    paths = [path for path, _ in spaces.obs]
    with h5py.File(Path(dataset.storage.data_path) / "main_data.hdf5", "r") as file:
        for episode in ids:
            group = h5py.Group(h5py.h5g.open(file.id, f"episode_{episode}".encode()))
            seed = None
            if h5py.h5a.exists(group.id, b"seed"):
                attribute = h5py.h5a.open(group.id, b"seed")
                value = np.empty(attribute.shape, attribute.dtype)
                attribute.read(value)
                seed = int(value)
            keys = (list(group["infos"]) if "infos" in group else []) if infos is True else list(infos or ())
            yield {"id": episode, "seed": seed,
                   "observations": _hdf5_tree(group, "observations", paths, episode, h5py),
                   **{name: _hdf5_tree(group, name, [()], episode, h5py)
                      for name in ("actions", "rewards", "terminations", "truncations")},
                   "infos": _hdf5_tree(group, "infos", [(key,) for key in keys], episode, h5py) if keys else {}}


def _minari_episodes(dataset: Any, ids: Sequence[int]) -> Iterator[dict[str, Any]]:
    storage = dataset.storage
    for episode, metadata in zip(storage.get_episodes(ids), storage.get_episode_metadata(ids), strict=True):
        yield {**episode, "seed": metadata.get("seed"), "options": metadata.get("options")}


def _with_options(dataset: Any, ids: Sequence[int], episodes: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for episode, metadata in zip(episodes, dataset.storage.get_episode_metadata(ids), strict=True):
        yield {**episode, "options": metadata.get("options")}


def episode_chunks(dataset: Any, spaces: Spaces, steps_per_chunk: int, infos: bool | Sequence[str] = False,
                   options: bool = False) -> Iterator[list[dict[str, Any]]]:
    """The dataset's episodes in order (their ``seed`` included, and with ``options`` their reset
    options, as Minari's ``get_episode_metadata`` reads them), as lists of about ``steps_per_chunk`` steps.

    Only one chunk of episodes is in memory at a time. An HDF5 dataset without image spaces is read
    with h5py directly (Minari's layout: a group ``episode_{id}`` of datasets ``observations``, a group
    of them for a ``Dict`` space, ``actions``, ``rewards``, ``terminations``, ``truncations``, and the
    attribute ``seed``; ``tests/test_offline.py`` pins it against Minari's reader); others (JPEG-encoded
    images) through Minari's reader (``dataset.storage.get_episodes``), which decodes them.
    """
    ids = [int(i) for i in dataset.episode_indices]
    is_image_space = minari_module("minari.dataset.minari_storage").is_image_space
    images = any(is_image_space(space) for space in [*(space for _, space in spaces.obs), spaces.action])
    fast = dataset.storage.FORMAT == "hdf5" and not (images and dataset.storage.jpeg_encoding)
    episodes = _hdf5_episodes(dataset, ids, spaces, infos) if fast else _minari_episodes(dataset, ids)
    if fast and options:
        episodes = _with_options(dataset, ids, episodes)
    chunk: list[dict[str, Any]] = []
    steps = 0
    for episode in episodes:
        chunk.append(episode)
        steps += len(episode["rewards"])
        if steps >= steps_per_chunk:
            yield chunk
            chunk, steps = [], 0
    if chunk:
        yield chunk


def step_bytes(spaces: Spaces) -> int:
    """Bytes one step takes in the dataset (its observation and action), to size chunks.

    Example:
        >>> import gymnasium as gym
        >>> step_bytes(Spaces.of(gym.spaces.Box(-1, 1, (17,), np.float64), gym.spaces.Box(-1, 1, (6,))))
        170
    """
    leaves = [space for _, space in spaces.obs] + [spaces.action]
    return int(sum(int(np.prod(space.shape)) * np.dtype(space.dtype).itemsize for space in leaves)) + 10
