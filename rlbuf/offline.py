"""Offline data: Minari datasets into a [`ReplayBuffer`][rlbuf.ReplayBuffer] and back out, exactly.

[`from_minari`][rlbuf.offline.from_minari] reads a local Minari dataset (HDF5 or Arrow) a chunk of
episodes at a time, checks every episode of the chunk and hands the chunk to the buffer's one write
path (``extend``). [`to_minari`][rlbuf.offline.to_minari] rebuilds the episodes of a buffer (or takes
a list of them) and writes them with ``minari.create_dataset_from_buffers``. Minari → rlbuf → Minari
→ rlbuf is the identity, byte for byte, for every episode: observations (the final one included),
actions, rewards, ``terminations`` and ``truncations`` as they are, episode boundaries and seeds,
and infos and reset options where asked. It needs Minari 0.5.4 or newer (``rlbuf[offline]``).

Design:

* **Rows.** An episode of ``T`` steps has ``T + 1`` observations; row ``t`` holds ``obs[t]``,
  ``next_obs = obs[t + 1]`` and the step's own flags: the last row of a truncated episode keeps its
  real final observation (never zeroed, never ``truncated = done``), so a timeout still bootstraps.
* **Episode ids and seeds are fields.** With ``exact=True`` (the default) every row stores
  ``episode_id`` and ``episode_seed`` (``int64``; ``-1``: reset without a seed), and, when the
  dataset's rewards are not ``float32`` (Minari's are usually ``float64``, and ``batch.reward`` is
  ``float32``), ``dataset_reward`` in the dataset's dtype. Fields, not a side table: they follow
  their rows through sampling (``batch.extras``), the ring, the compact layout and checkpoints
  (``save``/``load``), which a table beside the buffer would not; they cost 16 to 24 bytes a row.
  ``exact=False`` stores the plain transition only (boundaries still survive: they are the flags).
  Infos, where asked (``infos=True`` or a list of keys), are fields too: ``info_<key>`` at ``obs``
  and ``next_info_<key>`` at ``next_obs`` (a Minari episode has one info per observation). So are
  reset options, where asked (``options=True`` or a list of keys): ``option_<key>``, the episode's
  value on each of its rows, as its seed; a string's UTF-8 bytes as ``str_option_<key>``
  (``rlbuf._minari_options``).
* **Refused, never half-loaded.** An inconsistent episode is refused with the error of its kind
  (``ShapeError``: lengths that disagree, a missing final observation, a shape not the space's;
  ``DtypeError``; ``NonFiniteError``: NaN in an observation or action, a reward that is not finite;
  ``OutOfRangeError``: a discrete value outside its space; ``StreamError``: an end flag before the
  last step, or a last step neither terminated nor truncated), naming the episode, the field, what
  was expected, what was received and the fix. ``from_minari`` then closes the buffer it was
  filling and returns nothing; ``to_minari`` checks every episode before it writes a byte, and
  removes what it wrote if Minari fails.
* **Episodes of a buffer.** ``to_minari`` splits each env's rows (a buffer with ``num_envs > 1``
  must have been filled a whole step at a time, as ``add`` and the ``Recorder`` do) at every
  ``terminated | truncated`` row. The newest episode of an env is skipped while it has not ended,
  and the oldest one once the ring has overwritten rows (its start may be gone): only complete
  episodes are written. Consecutive rows of an episode must chain (``obs`` of one is ``next_obs`` of
  the one before), or the export is refused.
* **Images, losslessly.** Minari JPEG-encodes image observations by default; ``to_minari`` writes
  with its ``jpeg_encoding=False``: every array raw (see ``rlbuf._minari_write``).

Example:
    >>> import os, tempfile
    >>> import gymnasium as gym
    >>> import numpy as np
    >>> os.environ["MINARI_DATASETS_PATH"] = tempfile.mkdtemp()
    >>> episode = {"observations": np.arange(8, dtype=np.float32).reshape(4, 2), "actions": np.array([0, 1, 0]),
    ...            "rewards": np.array([1.0, 0.5, 2.0]), "terminations": np.array([False, False, False]),
    ...            "truncations": np.array([False, False, True]), "seed": 3}
    >>> dataset = to_minari([episode], "rlbuf/doctest-v0", observation_space=gym.spaces.Box(-9, 9, (2,)),
    ...                     action_space=gym.spaces.Discrete(2))
    >>> buffer = from_minari(dataset, seed=0)
    >>> len(buffer), buffer.sample_all().next_obs[-1].tolist()   # the final observation, kept
    (3, [6.0, 7.0])
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
import torch
from tensordict import TensorDictBase

from rlbuf._convert import numpy_dtype_or_none
from rlbuf._dtypes import as_dtype
from rlbuf._minari_chunks import (
    Chunk,
    chunk_rows,
    dataset_chunks,
    first_episode,
    reader,
    step_bytes,
)
from rlbuf._minari_damage import damaged, readable
from rlbuf._minari_options import check_options, option_paths, row_options, text_widths
from rlbuf._minari_read import (
    NO_SEED,
    WIDER_INT,
    Spaces,
    check_episode,
    check_infos,
    columns_valid,
    info_keys,
    open_dataset,
)
from rlbuf._minari_write import checked_episodes, observation_space_of, space_of, write_dataset
from rlbuf.errors import ConfigError, DtypeError, ShapeError, StreamError
from rlbuf.replay import ReplayBuffer

__all__ = ["from_minari", "to_minari"]

_T = TypeVar("_T")

_SET_BY_DATASET = ("observation_space", "action_space", "obs_shape", "action_shape", "extra_fields")
_METADATA = ("env", "eval_env", "algorithm_name", "author", "author_email", "code_permalink", "ref_min_score",
             "ref_max_score", "expert_policy", "num_episodes_average_score", "description", "requirements")
_CHUNK_BYTES = 1 << 19  # dataset bytes read at a time (two chunks' arrays, 2.6 x that, are in memory)
# Twice that from Arrow files: a chunk's fixed cost there is larger (1.3 x the import time at 512 KB).
_ARROW_CHUNK_SCALE = 2


def _torch_dtype(dtype: Any) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype)).dtype


def _stored_dtype(option: str, dtype: np.dtype[Any], given: Any) -> tuple[Any, np.dtype[Any] | None]:
    """The ``obs_dtype`` or ``action_dtype`` to build the buffer with for a space of ``dtype`` (``given``, else
    the space's own), and the dtype to cast the dataset's rows to first: torch stores no uint16 or uint32
    (``None``: no cast).

    Raises:
        ConfigError: a uint16 or uint32 space without ``option``, naming the dtype that holds it.
        DtypeError: ``option`` a dtype that does not hold every value of the space's.
    """
    if dtype not in WIDER_INT:
        return (_torch_dtype(dtype) if given is None else given), None
    wider, field = _torch_dtype(WIDER_INT[dtype]), "observations" if option == "obs_dtype" else "actions"
    if given is None:
        raise ConfigError(f"{option}: the dataset's {field} are {dtype}, which torch does not store; pass "
                          f"{option}={wider} (it holds every {dtype} value)")
    resolved = as_dtype(option, given)
    target = numpy_dtype_or_none(resolved) if isinstance(resolved, torch.dtype) else None
    if target is None or not np.can_cast(dtype, target, "safe"):
        raise DtypeError(f"{option}={given}: does not hold every {dtype} value of the dataset's {field}; pass "
                         f"{option}={wider}")
    return given, target


def from_minari(dataset: Any, *, exact: bool = True, infos: bool | Sequence[str] = False,
                options: bool | Sequence[str] = False, **buffer_options: Any) -> ReplayBuffer:
    """Load a local Minari dataset into a new [`ReplayBuffer`][rlbuf.ReplayBuffer], every episode checked.

    Args:
        dataset: a ``minari.MinariDataset``, the id of a dataset in the local Minari root
            (``MINARI_DATASETS_PATH``, else ``~/.minari/datasets``) or a dataset's directory. Never downloaded.
        exact: store ``episode_id``, ``episode_seed`` and (for rewards that are not float32)
            ``dataset_reward`` with every row, so that [`to_minari`][rlbuf.offline.to_minari] writes the
            dataset back byte for byte. ``False``: the plain transitions only.
        infos: store infos (arrays of numbers, one row per observation) as extra fields
            ``info_<key>`` (at ``obs``) and ``next_info_<key>`` (at ``next_obs``): ``True`` for every
            such key of the first episode, or a list of keys. ``to_minari`` writes them back.
        options: store each episode's reset ``options`` (numbers, bools and arrays of them) on its
            rows as fields ``option_<key>`` (nested keys joined by ``__``), strings as ``str_option_<key>``
            (UTF-8 bytes, zero-padded to the dataset's longest): ``True`` for every option (every episode
            must have the same ones), or a list of top-level keys. ``to_minari`` writes them back as each
            episode's ``options``.
        **buffer_options: the [`ReplayBuffer`][rlbuf.ReplayBuffer] options: ``capacity`` (default: the
            dataset's steps; more leaves room to add online, with ``exact=False``: an exact buffer's ``add``
            needs its extra fields too), ``storage="memmap"`` for datasets larger than
            RAM, ``compact=True`` (observations stored once), ``frame_stack``, ``n_step``, ``device``,
            ``seed``, ``prioritized`` ... Observation and action dtypes default to the spaces' own
            (``obs_dtype=torch.float32`` stores a float64 dataset in half the memory, inexactly). Observations
            or actions of uint16 or uint32 (depth images), which torch does not store, need
            ``obs_dtype=torch.int32`` or ``torch.int64`` (``action_dtype=`` likewise): a dtype that holds them.

    Returns:
        The buffer, holding every step of the dataset in episode order.

    Raises:
        ConfigError: a dataset that is not local, a space rlbuf cannot store, an option the dataset sets
            (``observation_space``, ``extra_fields`` ...), a ``capacity`` below the dataset's steps, or
            uint16 or uint32 observations or actions without the dtype to store them in.
        ShapeError, DtypeError, NonFiniteError, OutOfRangeError, StreamError: an inconsistent episode
            (see the module's docstring), or episodes whose steps are not the metadata's ``total_steps``
            (``ShapeError``); no buffer is returned.
        MissingFieldError: an option asked for that an episode lacks (options of other kinds, shapes or
            dtypes than the first episode's: ``DtypeError``, ``ShapeError``).

    Example:
        >>> import gymnasium as gym, numpy as np, os, tempfile
        >>> os.environ["MINARI_DATASETS_PATH"] = tempfile.mkdtemp()
        >>> _ = to_minari([{"observations": np.zeros((3, 2), np.float32), "actions": np.zeros((2, 1), np.float32),
        ...                 "rewards": np.ones(2), "terminations": np.array([False, True]),
        ...                 "truncations": np.array([False, False])}], "rlbuf/tiny-v0")
        >>> buffer = from_minari("rlbuf/tiny-v0", capacity=100)
        >>> len(buffer), sorted(buffer.sample_all().extras)
        (2, ['dataset_reward', 'episode_id', 'episode_seed'])
    """
    data = open_dataset(dataset)
    spaces = Spaces.of(data.observation_space, data.action_space)
    given = [name for name in _SET_BY_DATASET if name in buffer_options]
    if given:
        raise ConfigError(f"{', '.join(given)}: set by the dataset (its spaces, and the fields exact= asks for); "
                          f"leave them out")
    total, episodes = _count(data, "total_steps"), _count(data, "total_episodes")
    capacity = buffer_options.pop("capacity", total)
    if total == 0:
        raise ConfigError(f"dataset {data.id!r}: holds no steps")
    if episodes == 0:
        raise damaged(f"dataset {data.id!r}: metadata.json: total_episodes: expected the episodes of its {total} "
                      f"steps, got none")
    if isinstance(capacity, int) and capacity < total:
        raise ConfigError(f"capacity={capacity}: below the dataset's {total} steps, whose oldest would be "
                          f"overwritten; pass capacity >= {total} (or leave it out)")
    probe = first_episode(data, spaces, infos)
    keys = info_keys(probe, infos)
    check_infos(probe, keys, check_episode(probe, spaces), probe)
    paths = option_paths(probe.get("options"), options, probe["id"])
    # What later episodes are checked against: the first one's info shapes and dtypes, and its options.
    reference = {"infos": {key: probe["infos"][key] for key in keys}, "options": probe.get("options")}
    # A string option's field is as wide as its longest value: a first pass over every episode's options.
    with readable(data):
        widths = text_widths(data.storage.get_episode_metadata([int(i) for i in data.episode_indices]), paths, probe)
    option_fields = check_options(probe, paths, options is True, reference, widths)
    reward_dtype = probe["rewards"].dtype
    exact_reward = exact and reward_dtype != np.float32
    extra_fields: dict[str, Any] = {}
    if exact:
        extra_fields = {"episode_id": ((), torch.int64), "episode_seed": ((), torch.int64)}
    if exact_reward:
        extra_fields["dataset_reward"] = ((), _torch_dtype(reward_dtype))
    for key in keys:
        value = probe["infos"][key]
        extra_fields[f"info_{key}"] = extra_fields[f"next_info_{key}"] = (value.shape[1:], _torch_dtype(value.dtype))
    for name, value in option_fields.items():
        extra_fields[name] = (value.shape, _torch_dtype(value.dtype))
    del probe
    casts: dict[str, np.dtype[Any] | None] = {"obs_dtype": None}
    for option, space in (("obs_dtype", None if spaces.structured else spaces.obs[0][1]),
                          ("action_dtype", spaces.action)):
        if space is not None:
            buffer_options[option], casts[option] = _stored_dtype(option, np.dtype(space.dtype),
                                                                  buffer_options.get(option))
    buffer = ReplayBuffer(capacity, observation_space=data.observation_space, action_space=data.action_space,
                          extra_fields=extra_fields or None, **buffer_options)

    def _check_reward_dtype(episode: int, dtype: np.dtype[Any]) -> None:
        if exact and dtype != reward_dtype:  # float32 first too: a float64 one would round
            raise DtypeError(f"episode {episode}: rewards: expected dtype {reward_dtype} (as the first episode's), "
                             f"got {dtype}; save every episode's rewards with one dtype")

    def rows(chunk: Chunk) -> TensorDictBase:
        found = []
        valid = False
        if chunk.shaped:  # read straight into its columns (HDF5): their values checked a field at a time first
            observations, steps, _ = chunk.joined([path for path, _ in spaces.obs], keys)
            valid = columns_valid(observations, steps, chunk.lengths, spaces)
        if valid and not keys and not options:  # nothing left to check episode by episode
            _check_reward_dtype(chunk.ids[0], steps["rewards"].dtype)  # a shaped chunk's episodes share it
        else:  # episode by episode: where the chunk fails, check_episode names the first episode that does
            for number in range(len(chunk.ids)):
                episode = chunk.episode(number, structured=spaces.structured)
                length = int(chunk.lengths[number]) if valid else check_episode(episode, spaces)
                check_infos(episode, keys, length, reference)
                found.append(check_options(episode, paths, options is True, reference, widths))
                _check_reward_dtype(episode["id"], episode["rewards"].dtype)
        return chunk_rows(chunk, spaces, exact_reward=exact_reward, episode_fields=exact, infos=keys,
                          options=found if option_fields else (), obs_dtype=casts["obs_dtype"],
                          action_dtype=casts["action_dtype"])

    try:
        if buffer.compact and buffer.num_envs != 1:
            raise ConfigError(f"num_envs={buffer.num_envs}: a compact buffer chains each env's steps, and a "
                              f"dataset is one stream of episodes; leave num_envs out (or use compact=False)")
        stored = 0
        chunk_bytes = _CHUNK_BYTES * (_ARROW_CHUNK_SCALE if reader(data, spaces) == "arrow" else 1)
        chunks = dataset_chunks(data, spaces, max(1, chunk_bytes // step_bytes(spaces)), keys,
                                options=bool(options))
        for td in _ahead(map(rows, chunks)):
            stored += int(td.batch_size[0])
            if stored > total:
                break
            buffer.extend(td)
        if stored != total:
            raise ShapeError(f"dataset {data.id!r}: total_steps: expected the {total} steps its metadata says, got "
                             f"{'more' if stored > total else stored} in its episodes; fix the metadata (or "
                             f"re-create the dataset) before importing it")
    except BaseException:
        buffer.close()
        raise
    return buffer


def _count(data: Any, name: str) -> int:
    """The dataset's ``total_steps`` or ``total_episodes`` as its metadata.json says.

    Raises:
        DatasetError: not a count (Minari's own reading of it fails, or gives a negative number).
    """
    try:
        value = getattr(data, name)
    except (ValueError, TypeError, KeyError) as error:
        value = error
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
        raise damaged(f"dataset {data.id!r}: metadata.json: {name}: expected a count (an int >= 0), got {value!r}")
    return int(value)


_DONE = object()


def _ahead(items: Iterator[_T]) -> Iterator[_T]:
    """The items of ``items``, the next one made in a worker thread while the caller uses this one.

    Reading and checking a chunk (h5py, numpy) overlaps with the buffer copying the one before
    (torch's copies release the GIL). The iterator is only ever advanced by one thread at a time.
    """
    with ThreadPoolExecutor(1, thread_name_prefix="rlbuf-from-minari") as worker:
        future = worker.submit(next, items, _DONE)
        while True:
            item = future.result()
            if item is _DONE:
                return
            future = worker.submit(next, items, _DONE)
            yield item  # type: ignore[misc]


def to_minari(source: ReplayBuffer | Sequence[Mapping[str, Any]], dataset_id: str, *, data_format: str = "hdf5",
              observation_space: Any = None, action_space: Any = None, **metadata: Any) -> Any:
    """Write a buffer's complete episodes, or a list of episodes, as a new local Minari dataset.

    Args:
        source: a [`ReplayBuffer`][rlbuf.ReplayBuffer] (its rows as ``sample_all`` gives them; compact
            layouts too), or a list of episodes: dicts of ``observations`` (``T + 1`` rows, the final one last; a dict
            of arrays for dict observations), ``actions``, ``rewards``, ``terminations``, ``truncations``
            (``T`` rows each), an optional ``seed`` and optional ``infos`` (a dict of arrays of numbers,
            ``T + 1`` rows each); a buffer's ``info_<key>`` and ``next_info_<key>`` fields are written as infos.
        dataset_id: the new dataset's id, ``(namespace/)name-v(version)``; it is written to the Minari root
            (``MINARI_DATASETS_PATH``, else ``~/.minari/datasets``).
        data_format: ``"hdf5"`` or ``"arrow"``.
        observation_space: the dataset's observation space (pass the source dataset's to keep its
            bounds); default: derived from the rows (an unbounded ``Box`` for floats, 0-255 for ``uint8``).
        action_space: the same for actions (default: ``Discrete`` for a buffer with a discrete action range).
        **metadata: Minari's dataset metadata, as ``minari.create_dataset_from_buffers`` takes it
            (``algorithm_name``, ``author``, ``author_email``, ``code_permalink``, ``description``, ``env``,
            ``eval_env``, ``requirements``, ``ref_min_score``, ``ref_max_score`` ...).

    Returns:
        The new ``minari.MinariDataset``.

    Raises:
        ConfigError: an unknown metadata key or format, a malformed or taken id, a buffer whose env
            streams cannot be told apart, a space that does not match the rows, or no complete episode.
        ShapeError, DtypeError, NonFiniteError, OutOfRangeError, StreamError, MissingFieldError: an
            inconsistent episode; nothing is written.

    Example:
        >>> import gymnasium as gym, numpy as np, os, tempfile
        >>> os.environ["MINARI_DATASETS_PATH"] = tempfile.mkdtemp()
        >>> buffer = ReplayBuffer(10, obs_shape=(1,), action_space=gym.spaces.Discrete(2))
        >>> for t in range(4):   # one episode of 3 steps, then one not finished
        ...     buffer.add(np.array([t], np.float32), 1, 0.5, np.array([t + 1], np.float32), t == 2, truncated=False)
        >>> dataset = to_minari(buffer, "rlbuf/from-buffer-v0")
        >>> dataset.total_episodes, dataset.action_space
        (1, Discrete(2))
    """
    unknown = sorted(set(metadata) - set(_METADATA))
    if unknown:
        raise ConfigError(f"{', '.join(unknown)}: not Minari dataset metadata; expected some of {list(_METADATA)}")
    if isinstance(source, ReplayBuffer):
        episodes, action_bounds = _buffer_episodes(source), _action_bounds(source)
    elif isinstance(source, Sequence) and not isinstance(source, (str, bytes)):
        episodes, action_bounds = [dict(episode) for episode in source], None
    else:
        raise ConfigError(f"source: expected a ReplayBuffer or a list of episode dicts, got {type(source).__name__}")
    if not episodes:
        raise ConfigError("source: holds no complete episode (a buffer's unfinished newest episode is not "
                          "written); finish an episode first")
    if observation_space is None:
        observation_space = observation_space_of(_rows(episodes[0]["observations"]))
    if action_space is None:
        action_space = space_of(np.asarray(_rows(episodes[0]["actions"])), action_bounds)
    spaces = Spaces.of(observation_space, action_space)
    return write_dataset(dataset_id, checked_episodes(episodes, spaces), spaces, data_format, metadata)


def _rows(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _rows(sub) for key, sub in value.items()}
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def _action_bounds(buffer: ReplayBuffer) -> tuple[Any, Any] | None:
    bounds = next(spec.bounds for spec in buffer.fields if spec.name == "action")
    return None if bounds is None else (bounds.low, bounds.high)


def _numpy_tree(value: Any) -> Any:
    if isinstance(value, TensorDictBase):
        return {key: _numpy_tree(value.get(key)) for key in value.keys()}  # noqa: SIM118 (iterating gives rows)
    return value.detach().cpu().numpy()


def _take(tree: Any, rows: np.ndarray[Any, Any]) -> Any:
    if isinstance(tree, dict):
        return {key: _take(sub, rows) for key, sub in tree.items()}
    return tree[rows]


def _append(tree: Any, last: Any) -> Any:
    if isinstance(tree, dict):
        return {key: _append(sub, last[key]) for key, sub in tree.items()}
    return np.concatenate([tree, last[None]])


def _leaves(tree: Any) -> list[np.ndarray[Any, Any]]:
    return [leaf for sub in tree.values() for leaf in _leaves(sub)] if isinstance(tree, dict) else [tree]


def _buffer_episodes(buffer: ReplayBuffer) -> list[dict[str, Any]]:
    """The complete episodes of a buffer's rows, per env stream, oldest first (see the module's rules).

    Raises:
        ConfigError: a buffer with ``num_envs > 1`` whose rows were not written a whole step at a time, or of
            ``n_step > 1`` (its rows are n-step transitions).
        StreamError: consecutive rows of an episode that do not chain (``obs`` is not the previous ``next_obs``).
        EmptyBufferError: nothing is stored.
    """
    n_step = int(buffer._options.get("n_step") or 1)
    if n_step > 1:
        raise ConfigError(f"source: a buffer of n_step={n_step} gives n-step transitions (each reward summed over up "
                          f"to {n_step} steps, next_obs up to {n_step} steps on), not the steps a dataset holds; "
                          f"export from a buffer of n_step=1 fed the same steps (from_minari without n_step), or "
                          f"pass the episodes as a list")
    batch = buffer.sample_all()
    state = buffer.state_dict(data=False)
    count, capacity, size = int(state["write_count"]), int(state["capacity"]), int(state["size"])
    num_envs = buffer.num_envs
    if num_envs > 1 and not buffer._rows_interleaved():
        raise ConfigError(f"source: a buffer of num_envs={num_envs} whose rows were not all written a whole step "
                          f"at a time (add with env_mask, as the Recorder does for NEXT_STEP envs, or extend of "
                          f"env-major batches), so its env streams cannot be told apart; record SAME_STEP envs "
                          f"(or one env), or pass the episodes as a list")
    position = batch.index.cpu().numpy().astype(np.int64)
    written = count - 1 - ((count - 1 - position) % capacity)  # when each row was written
    obs, next_obs = _numpy_tree(batch.obs), _numpy_tree(batch.next_obs)
    action = batch.action.cpu().numpy()
    extras = {name: value.cpu().numpy() for name, value in batch.extras.items()}
    reward = extras.get("dataset_reward", batch.reward.cpu().numpy())
    terminated, truncated = batch.terminated.cpu().numpy(), batch.truncated.cpu().numpy()
    ended = terminated | truncated
    found: list[tuple[int, dict[str, Any]]] = []
    for env in range(num_envs):
        rows = np.flatnonzero(written % num_envs == env)
        rows = rows[np.argsort(written[rows], kind="stable")]
        ends = np.flatnonzero(ended[rows])
        starts = np.concatenate([[0], ends[:-1] + 1])
        if count > size and len(ends):
            starts, ends = starts[1:], ends[1:]  # the oldest episode's first steps may be overwritten
        for start, end in zip(starts, ends, strict=True):
            steps = rows[start:end + 1]
            _check_chain(obs, next_obs, steps, position, env)
            seed = int(extras["episode_seed"][steps[0]]) if "episode_seed" in extras else NO_SEED
            infos = {name.removeprefix("info_"): np.concatenate([value[steps], extras["next_" + name][steps[-1:]]])
                     for name, value in extras.items() if name.startswith("info_") and "next_" + name in extras}
            found.append((int(written[steps[0]]), {
                "observations": _append(_take(obs, steps), _last(next_obs, int(steps[-1]))),
                "actions": action[steps], "rewards": reward[steps], "terminations": terminated[steps],
                "truncations": truncated[steps], "seed": None if seed == NO_SEED else seed, "infos": infos,
                "options": row_options(extras, int(steps[0]))}))
    return [episode for _, episode in sorted(found, key=lambda pair: pair[0])]


def _last(tree: Any, row: int) -> Any:
    if isinstance(tree, dict):
        return {key: _last(sub, row) for key, sub in tree.items()}
    return tree[row]


def _check_chain(obs: Any, next_obs: Any, steps: np.ndarray[Any, Any], position: np.ndarray[Any, Any],
                 env: int) -> None:
    if len(steps) < 2:
        return
    for now, before in zip(_leaves(_take(obs, steps[1:])), _leaves(_take(next_obs, steps[:-1])), strict=True):
        same = (now == before).reshape(len(now), -1).all(axis=1)
        if not same.all():
            step = int(np.argmin(same))
            raise StreamError(f"source: rows at positions {position[steps[step]]} and {position[steps[step + 1]]} "
                              f"(env {env}) are not consecutive steps of one episode: the obs of the second is "
                              f"not the next_obs of the first, and neither ended the episode; export a buffer "
                              f"that holds every step of each episode in order, with every end marked")
