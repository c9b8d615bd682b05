"""A Minari dataset for [`from_minari`][rlbuf.offline.from_minari]: opened (never downloaded), its spaces, and
its episodes checked one by one.

An episode of ``T`` steps holds ``T + 1`` observations (the final one last), ``T`` actions, rewards,
``terminations`` and ``truncations``. [`check_episode`][rlbuf._minari_read.check_episode] refuses anything else
with a message that names the episode, the field, what was expected, what was received and the fix.
``rlbuf._minari_chunks`` reads the episodes (a chunk at a time) and makes their rows.

This module, ``rlbuf._minari_chunks`` and ``rlbuf._minari_write`` are rlbuf's seam to Minari.

Example:
    >>> import gymnasium as gym
    >>> import numpy as np
    >>> spaces = Spaces.of(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(3))
    >>> episode = {"id": 0, "observations": np.zeros((3, 2), np.float32), "actions": np.array([0, 2]),
    ...            "rewards": np.ones(2), "terminations": np.array([False, True]),
    ...            "truncations": np.array([False, False])}
    >>> check_episode(episode, spaces)
    2
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces as gym_spaces

from rlbuf._bounds import Bounds
from rlbuf._minari_damage import damaged
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
    # Minari's rule for its root, read without creating the directory as get_dataset_path() does.
    root = Path(os.environ.get("MINARI_DATASETS_PATH") or Path.home() / ".minari" / "datasets")
    for data in (path / "data", path, *((root / dataset / "data",) if isinstance(dataset, str) else ())):
        if (data / "metadata.json").is_file():
            try:  # Minari's own reader of the dataset's metadata.json: its errors, for one that is damaged
                return minari.MinariDataset(data)
            except (OSError, ValueError, TypeError, KeyError, AssertionError, MemoryError) as error:
                raise damaged(f"dataset {str(dataset)!r}: {data / 'metadata.json'} cannot be read as a Minari "
                              f"dataset's ({type(error).__name__}: {error})") from None
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
    dtype = np.dtype(space.dtype)
    if dtype.kind == "u" and dtype.itemsize > 1 and (path or dtype.itemsize == 8):
        # torch stores no unsigned int wider than uint8; a Box of observations or actions loads into WIDER_INT's.
        raise ConfigError(f"{leaf_label(name, path)}: a space of dtype {dtype}, which no buffer stores (torch has "
                          f"no unsigned int wider than uint8; only uint16 and uint32 {name} outside a Dict load, "
                          f"widened to int32 and int64); use a space of a signed dtype")
    return [(path, space)]


WIDER_INT = {np.dtype(np.uint16): np.dtype(np.int32), np.dtype(np.uint32): np.dtype(np.int64)}
"""The signed dtype that holds every value of an unsigned one torch does not store."""


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
            ConfigError: a space rlbuf cannot store (``Tuple``, ``Text``, a ``Dict`` of actions, uint64,
                a uint16 or uint32 leaf of a ``Dict`` ...).
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
        encoded = (" of objects, one a row (an Arrow column of variable-length lists or structs reads so; and the "
                   "HDF5 writer of Minari 0.5.3 and older JPEG-encoded uint8 arrays of 2 or 3 dims a row even when "
                   "their space was no image space: write such data again with Minari >= 0.5.4 or "
                   "rlbuf.offline.to_minari, which store it raw)") if value.dtype == object else ""
        raise ShapeError(f"episode {episode}: {label}: expected shape {shape} ({steps} steps), got {value.shape}"
                         f"{encoded}; save the episode with {rows} rows of the space's shape {tuple(space.shape)}")
    if value.dtype != space.dtype:
        raise DtypeError(f"episode {episode}: {label}: expected dtype {space.dtype} (the space's), got "
                         f"{value.dtype}; save the dataset with arrays of its spaces' dtypes, or declare the space "
                         f"with dtype {value.dtype}")
    refused = _refused_row(value, space)
    if refused is None:
        return
    why, step = refused
    if why == "nan":
        raise NonFiniteError(f"episode {episode}: {label}: NaN at row {step} (no Box space contains NaN); "
                             f"fix or drop the episode (dataset.filter_episodes) before importing it")
    if why == "infinite":
        raise NonFiniteError(f"episode {episode}: {label}: an infinity at row {step}, where its space is "
                             f"bounded (low {space.low.min()}, high {space.high.max()}); fix or drop the "
                             f"episode (dataset.filter_episodes) before importing it")
    low, high = _integer_range(space)  # type: ignore[misc]
    raise OutOfRangeError(f"episode {episode}: {label}: expected values in [{low.min()}, {high.max()}] "
                          f"(the space's), got {value[step].tolist()} at row {step}; fix or drop the "
                          f"episode before importing it")


def _refused_row(value: np.ndarray[Any, Any], space: Any) -> tuple[str, int] | None:
    """The first row of ``value`` (of the space's dtype) that its space refuses and why (``"nan"``;
    ``"infinite"``: an infinity where a ``Box`` is bounded; ``"range"``: outside a discrete space), else ``None``."""
    if value.dtype.kind == "f":
        with np.errstate(over="ignore", invalid="ignore"):
            total = value.sum()  # finite: no NaN and no infinity in any row (one pass, no mask)
        if not np.isfinite(total):
            nan = np.isnan(value)
            if nan.any():
                return "nan", int(np.argwhere(nan)[0][0])
            if isinstance(space, gym_spaces.Box):  # an infinity where the space is bounded (finite values: as given)
                infinite = ((value == np.inf) & np.isfinite(space.high)) | ((value == -np.inf) & np.isfinite(space.low))
                if infinite.any():
                    return "infinite", int(np.argwhere(infinite)[0][0])
    integers = _integer_range(space)
    if integers is not None:
        low, high = integers
        outside = (value < low) | (value > high)
        if outside.any():
            return "range", int(np.argwhere(outside)[0][0])
    return None


def _integer_range(space: Any) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] | None:
    """The lowest and highest value a discrete space (an integer ``Box``, ``MultiBinary``) holds, else ``None``."""
    bounds = Bounds.of_space(space)
    if bounds is None:
        return None
    return tuple(np.asarray(side).reshape(space.shape if np.ndim(side) else ())  # type: ignore[return-value]
                 for side in (bounds.low, bounds.high))


def check_episode(episode: Mapping[str, Any], spaces: Spaces) -> int:
    """Check one episode (a dict as ``MinariStorage.get_episodes`` yields it) against the dataset's spaces.

    Returns:
        Its number of steps ``T``.

    Raises:
        ShapeError: lengths that disagree, a missing final observation, a shape not the space's.
        DtypeError: a dtype not the space's (flags: bool; rewards: a number).
        NonFiniteError: NaN in an observation or action, an infinity where its Box is bounded, a reward that is
            not finite (as float32).
        OutOfRangeError: a value outside its discrete space (``Discrete``, ``MultiDiscrete``, ``MultiBinary``, an
            integer ``Box``).
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
    with np.errstate(over="ignore"):  # a float64 beyond float32's range is refused below, not warned of
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


def columns_valid(observations: Mapping[Key, np.ndarray[Any, Any]], steps: Mapping[str, np.ndarray[Any, Any]],
                  lengths: np.ndarray[Any, Any], spaces: Spaces) -> bool:
    """Whether ``check_episode`` passes every episode of consecutive episodes joined a field at a time,
    checked a field at a time: each episode's ``T + 1`` observations (per leaf path) and ``T`` actions,
    rewards and flags in turn, every episode's fields already known to have its spaces' shapes and dtypes
    and bool flags (the HDF5 reader checks them before it reads).

    ``False`` says that some episode may fail: check them one by one (``check_episode``) to name it.

    Example:
        >>> import gymnasium as gym
        >>> spaces = Spaces.of(gym.spaces.Box(-1, 1, (1,)), gym.spaces.Discrete(3))
        >>> flags = {"terminations": np.array([False, True, True]), "truncations": np.zeros(3, bool)}
        >>> columns = ({(): np.zeros((5, 1), np.float32)}, {"actions": np.array([0, 2, 1]), "rewards": np.ones(3),
        ...                                                  **flags})
        >>> columns_valid(*columns, np.array([2, 1]), spaces), columns_valid(*columns, np.array([1, 2]), spaces)
        (True, False)
    """
    rewards = steps["rewards"]
    if not len(lengths) or lengths.min() < 1 or rewards.dtype.kind not in "fiu":
        return False
    leaves = [(observations[path], space) for path, space in spaces.obs] + [(steps["actions"], spaces.action)]
    if any(_refused_row(value, space) is not None for value, space in leaves):
        return False
    with np.errstate(over="ignore"):
        if not np.isfinite(rewards.astype(np.float32).sum(dtype=np.float64)):
            return False
    ended = steps["terminations"] | steps["truncations"]
    last = np.cumsum(lengths) - 1
    return bool(ended[last].all()) and int(np.count_nonzero(ended)) == len(last)


def is_seed(seed: Any) -> bool:
    """Whether ``seed`` is one an episode may carry (what a reset takes and Minari reads back): an int in
    ``[0, 2**63)``, not a bool.

    Example:
        >>> is_seed(42), is_seed(-4), is_seed(True), is_seed(np.int64(7))
        (True, False, False, True)
    """
    return isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and bool(0 <= seed < 2**63)


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
    if not is_seed(seed):
        raise OutOfRangeError(f"episode {episode}: seed: expected an int in [0, 2**63), got {seed!r}; import "
                              f"with exact=False to leave seeds out")
    return int(seed)


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
