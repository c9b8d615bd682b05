"""Writing episodes to a Minari dataset for [`to_minari`][rlbuf.offline.to_minari], images losslessly.

By default Minari JPEG-encodes (lossy) every observation and action of an *image space* (a
``uint8`` ``Box`` of shape ``(H >= 32, W >= 32[, C])`` bounded by 0 and 255). rlbuf writes with
``create_dataset_from_buffers(..., jpeg_encoding=False)`` (Minari 0.5.4's public option, kept in
the dataset's metadata, which Minari's reader follows): every array is stored as it is, in both
backends, so images come back byte for byte. This module and ``rlbuf._minari_read`` are rlbuf's
one seam to Minari; it uses Minari's public functions only.

Example:
    >>> import numpy as np
    >>> space_of(np.zeros((2, 64, 64, 3), np.uint8))
    Box(0, 255, (64, 64, 3), uint8)
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from gymnasium import spaces as gym_spaces

from rlbuf._minari_options import checked_options, options_out
from rlbuf._minari_read import Spaces, check_episode, check_infos, is_seed, minari_module
from rlbuf.errors import ConfigError, DtypeError


def space_of(rows: np.ndarray[Any, Any], bounds: Any = None) -> Any:
    """A gymnasium space for rows shaped ``[N, *shape]``: ``Discrete`` for an int scalar with ``bounds``,
    else a ``Box`` bounded by the dtype (0-255 for ``uint8``, unbounded for floats).

    Raises:
        ConfigError: a dtype no ``Box`` holds (bool): pass the space.

    Example:
        >>> space_of(np.zeros((5, 3))), space_of(np.zeros(5, np.int64), bounds=(0, 3))
        (Box(-inf, inf, (3,), float64), Discrete(4))
    """
    shape, dtype = tuple(rows.shape[1:]), rows.dtype
    if bounds is not None and shape == () and dtype.kind in "iu":
        low, high = (int(np.min(bound)) for bound in bounds)
        return gym_spaces.Discrete(high - low + 1, start=low)
    if dtype.kind == "f":
        return gym_spaces.Box(-np.inf, np.inf, shape, dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return gym_spaces.Box(int(info.min), int(info.max), shape, dtype)
    raise ConfigError(f"observation_space, action_space: no Box holds dtype {dtype}; pass the space to to_minari")


def observation_space_of(tree: Any) -> Any:
    """The space of an observation tree (an array of rows, or a nested mapping of them)."""
    if isinstance(tree, Mapping):
        return gym_spaces.Dict({key: observation_space_of(value) for key, value in tree.items()})
    return space_of(tree)


def cast_to_space(tree: Any, space: Any, label: str) -> Any:
    """An observation or action tree in its space's dtypes (a cast that loses nothing), keys as the space's.

    Raises:
        DtypeError: a cast that would lose values (float64 rows for a float32 space, int64 rows beyond
            2**53 for a float64 one, int rows outside an int space's range).
        ShapeError: a key of the space missing from the rows.
    """
    if isinstance(space, gym_spaces.Dict):
        if not isinstance(tree, Mapping) or set(tree) != set(space.spaces):
            found = sorted(tree) if isinstance(tree, Mapping) else type(tree).__name__
            raise ConfigError(f"{label}: the space has the keys {sorted(space.spaces)}, the rows {found}; pass "
                              f"the space the rows were stored with")
        return {key: cast_to_space(tree[key], sub, f'{label}["{key}"]') for key, sub in space.spaces.items()}
    value = np.asarray(tree)
    if value.dtype == space.dtype:
        return value
    if not np.can_cast(value.dtype, space.dtype, "safe") and not _ints_within(value, space.dtype):
        raise DtypeError(f"{label}: the rows are {value.dtype}, the space is {space.dtype}, which cannot hold "
                         f"them exactly; pass a space of dtype {value.dtype}")
    inexact = _inexact_integer(value, space.dtype)
    if inexact is not None:
        raise DtypeError(f"{label}: the rows are {value.dtype}, the space is {space.dtype}, which holds integers "
                         f"exactly only within +-2**{np.finfo(space.dtype).nmant + 1}; got {inexact}; pass a space "
                         f"of dtype {value.dtype}")
    return value.astype(space.dtype)


def _ints_within(value: np.ndarray[Any, Any], dtype: np.dtype[Any]) -> bool:
    """Whether ``value`` holds integers that int dtype ``dtype`` holds too (int32 rows of a uint16 space:
    ``from_minari`` stores uint16 widened, as torch does not store it).

    Example:
        >>> _ints_within(np.array([0, 65535], np.int32), np.dtype(np.uint16))
        True
    """
    if value.dtype.kind not in "iu" or dtype.kind not in "iu":
        return False
    info = np.iinfo(dtype)
    return value.size == 0 or bool(info.min <= value.min() and value.max() <= info.max)


def _inexact_integer(value: np.ndarray[Any, Any], dtype: np.dtype[Any]) -> int | None:
    """An integer of ``value`` outside the range where float ``dtype`` holds every integer exactly, or ``None``.

    numpy calls int64 to float64 a safe cast, yet float64's 53-bit mantissa rounds 2**53 + 1.

    Example:
        >>> _inexact_integer(np.array([2**53, -2**53 - 1]), np.dtype(np.float64))
        -9007199254740993
        >>> _inexact_integer(np.array([2**31 - 1], np.int32), np.dtype(np.float64)) is None
        True
    """
    if value.dtype.kind not in "iu" or dtype.kind != "f":
        return None
    digits = np.finfo(dtype).nmant + 1
    if np.iinfo(value.dtype).bits - (value.dtype.kind == "i") <= digits:
        return None
    outside = (value > 2**digits) | (value < -(2**digits)) if value.dtype.kind == "i" else value > 2**digits
    return int(value[outside][0]) if outside.any() else None


def checked_episodes(episodes: Iterable[Mapping[str, Any]], spaces: Spaces) -> list[dict[str, Any]]:
    """Every episode in the spaces' dtypes, checked (all of them, before anything is written).

    Raises:
        ShapeError, DtypeError, NonFiniteError, OutOfRangeError, StreamError: as ``check_episode``.
        MissingFieldError: an episode without one of the fields.
        ConfigError: ``options`` that are not a dict of str keys.
    """
    from rlbuf.errors import MissingFieldError, OutOfRangeError

    out: list[dict[str, Any]] = []
    for number, episode in enumerate(episodes):
        missing = [name for name in ("observations", "actions", "rewards", "terminations", "truncations")
                   if name not in episode]
        if missing:
            raise MissingFieldError(f"episode {number}: {', '.join(missing)}: expected the fields observations "
                                    f"(T + 1, the final one last), actions, rewards, terminations, truncations "
                                    f"(optional: seed, options, infos), got {sorted(episode)}")
        infos = {key: _as_numpy(value) for key, value in (episode.get("infos") or {}).items()}
        seed = episode.get("seed")
        if seed is not None and not is_seed(seed):
            raise OutOfRangeError(f"episode {number}: seed: expected an int in [0, 2**63) (what a reset takes and "
                                  f"Minari reads back), got {seed!r}; pass that episode's reset seed, or none")
        # An int: Minari writes an Arrow episode's seed with json.dumps, which takes no numpy integer.
        checked = {"id": number, "seed": None if seed is None else int(seed), "infos": infos,
                   "options": checked_options(episode.get("options"), number),
                   "observations": cast_to_space(_as_numpy(episode["observations"]), spaces.observation_space,
                                                 f"episode {number}: observations"),
                   "actions": cast_to_space(_as_numpy(episode["actions"]), spaces.action_space,
                                            f"episode {number}: actions"),
                   **{name: _as_numpy(episode[name]) for name in ("rewards", "terminations", "truncations")}}
        steps = check_episode(checked, spaces)
        if out or infos:
            check_infos(checked, sorted(out[0]["infos"] if out else infos), steps, out[0] if out else checked)
        out.append(checked)
    return out


def _as_numpy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _as_numpy(sub) for key, sub in value.items()}
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def _infos_out(infos: Mapping[str, np.ndarray[Any, Any]], data_format: str) -> dict[str, Any] | None:
    """Infos as Minari's writer takes them: Arrow reads a 1-D array back only if it was given as a list
    (Minari 0.5.4 decodes the shape of an array column from an empty string otherwise)."""
    if not infos:
        return None
    return {key: list(value) if data_format == "arrow" and value.ndim == 1 else value for key, value in infos.items()}


def write_dataset(dataset_id: str, episodes: list[dict[str, Any]], spaces: Spaces, data_format: str,
                  metadata: Mapping[str, Any]) -> Any:
    """Create the Minari dataset ``dataset_id`` from checked episodes; on failure, nothing is left behind.

    Raises:
        ConfigError: a malformed id, an id already taken, or an unknown ``data_format``.
    """
    minari = minari_module()
    episode_buffer = minari_module("minari.data_collector").EpisodeBuffer
    parse_dataset_id = minari_module("minari.dataset.minari_dataset").parse_dataset_id
    get_dataset_path = minari_module("minari.storage.datasets_root_dir").get_dataset_path

    if data_format not in ("hdf5", "arrow"):
        raise ConfigError(f"data_format: expected 'hdf5' or 'arrow', got {data_format!r}")
    try:
        parse_dataset_id(dataset_id)
    except ValueError as error:
        raise ConfigError(f"dataset_id {dataset_id!r}: expected (namespace/)name-v(version), e.g. "
                          f"'rlbuf/pendulum-v0' (a namespace has at least 2 characters)") from error
    path = get_dataset_path(dataset_id)
    if path.exists():
        raise ConfigError(f"dataset_id {dataset_id!r}: {path} exists already; delete it "
                          f"(minari.delete_dataset({dataset_id!r})) or choose another id or version")
    buffers = (episode_buffer(seed=episode["seed"], options=options_out(episode["options"], data_format),
                             observations=episode["observations"], actions=episode["actions"],
                             rewards=episode["rewards"], terminations=episode["terminations"],
                             truncations=episode["truncations"], infos=_infos_out(episode["infos"], data_format))
               for episode in episodes)
    try:
        with warnings.catch_warnings():
            # Minari's reminders of the metadata it was not given (author, code_permalink ...).
            warnings.filterwarnings("ignore", category=UserWarning, module=r"minari\.")
            return minari.create_dataset_from_buffers(dataset_id, buffers, observation_space=spaces.observation_space,
                                                      action_space=spaces.action_space, data_format=data_format,
                                                      jpeg_encoding=False, **metadata)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
