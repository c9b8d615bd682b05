"""from_minari refuses an inconsistent dataset by episode and field (lengths, shapes, ends, NaN,
dtypes, values outside their space, Minari 0.5.3's uint8 rows, damaged Arrow and HDF5 values) and
returns nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

minari = pytest.importorskip("minari")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
from _minari import (  # noqa: E402
    BOX,
    GOOD,
    _episode,
    _minari_dataset,
    _new_id,
    _rows,
    _with,
)
from minari.data_collector import EpisodeBuffer  # noqa: E402

import rlbuf.offline  # noqa: E402
from rlbuf import ReplayBuffer  # noqa: E402
from rlbuf.errors import (  # noqa: E402
    DatasetError,
    DtypeError,
    NonFiniteError,
    OutOfRangeError,
    ShapeError,
    StreamError,
)
from rlbuf.offline import from_minari, to_minari  # noqa: E402

pytestmark = pytest.mark.usefixtures("minari_root")  # every test in a temporary Minari root

INCONSISTENT = {
    "lengths": (_with(GOOD, actions=GOOD["actions"][:3]), ShapeError,
                r"episode 1: actions: expected shape \(4, 2\) \(4 steps\), got \(3, 2\)"),
    "final_obs": (_with(GOOD, observations=GOOD["observations"][:4]), ShapeError,
                  r"episode 1: observations: expected 5 rows .* got 4: the final observation is missing"),
    "shape": (_with(GOOD, observations=np.zeros((5, 4))), ShapeError,
              r"episode 1: observations: expected shape \(5, 3\) \(4 steps\), got \(5, 4\)"),
    "unfinished": (_with(GOOD, truncations=np.zeros(4, bool)), StreamError,
                   r"episode 1: terminations, truncations: expected the last step 3 to be terminated or truncated"),
    "early_end": (_with(GOOD, terminations=np.array([False, True, False, False])), StreamError,
                  r"episode 1: terminations: expected no end before the last step 3, got True at step 1"),
    "nan_obs": (_with(GOOD, observations=np.where(np.arange(5)[:, None] == 2, np.nan, GOOD["observations"])),
                NonFiniteError, r"episode 1: observations: NaN at row 2"),
    "nan_reward": (_with(GOOD, rewards=np.array([0.0, np.nan, 0.0, 0.0])), NonFiniteError,
                   r"episode 1: rewards: expected finite float32 values, got nan at step 1"),
    "dtype": (_with(GOOD, actions=GOOD["actions"].astype(np.float64)), DtypeError,
              r"episode 1: actions: expected dtype float32 \(the space's\), got float64"),
}


@pytest.mark.parametrize("case", sorted(INCONSISTENT))
def test_an_inconsistent_dataset_is_refused_by_name_and_nothing_is_returned(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bad, error, message = INCONSISTENT[case]
    dataset = _minari_dataset([GOOD, bad, GOOD])
    monkeypatch.setattr(rlbuf.offline, "_CHUNK_BYTES", 1)  # one episode a chunk: the good first one goes in
    extended, closed = [], []
    monkeypatch.setattr(ReplayBuffer, "extend", lambda self, td: extended.append(td.batch_size[0]))
    monkeypatch.setattr(ReplayBuffer, "close", lambda self: closed.append(self))
    with pytest.raises(error, match=message):
        from_minari(dataset)
    assert extended == [4] and len(closed) == 1  # the buffer that took the first episode was closed, not returned


@pytest.mark.parametrize("case", sorted(INCONSISTENT))
def test_an_inconsistent_episode_amid_a_chunk_is_refused_by_name(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bad, error, message = INCONSISTENT[case]
    dataset = _minari_dataset([GOOD, GOOD, bad, GOOD])  # one chunk: the bad episode is read amid good ones
    closed = []
    monkeypatch.setattr(ReplayBuffer, "close", lambda self: closed.append(self))
    with pytest.raises(error, match=message.replace("episode 1", "episode 2")):
        from_minari(dataset)
    assert len(closed) == 1


def test_steps_that_are_not_the_metadatas_total_are_refused() -> None:
    import json

    dataset = _minari_dataset([GOOD, GOOD])
    path = Path(dataset.storage.data_path) / "metadata.json"
    metadata = json.loads(path.read_text())
    path.write_text(json.dumps({**metadata, "total_steps": 5}))
    with pytest.raises(ShapeError, match=r"total_steps: expected the 5 steps its metadata says, got more"):
        from_minari(dataset.id)


def test_a_discrete_value_outside_its_space_is_refused() -> None:
    episode = _episode("dict", 2, "terminated", None, np.random.default_rng(4))
    episode["actions"] = np.array([0, 3])
    with pytest.raises(OutOfRangeError, match=r"episode 0: actions: expected values in \[0, 2\] .* got 3 at row 1"):
        from_minari(_minari_dataset([episode], "dict"))


@pytest.mark.parametrize(("observation_space", "action_space", "change", "error", "message"), [
    # helper 41: MultiBinary and integer Box values were not range-checked; an infinity in a bounded Box loaded.
    (gym.spaces.MultiBinary(2), gym.spaces.Discrete(2), lambda e: e["observations"].__setitem__((1, 1), 2),
     OutOfRangeError, r"episode 0: observations: expected values in \[0, 1\] .* at row 1"),
    (BOX, gym.spaces.MultiBinary(1), lambda e: e["actions"].__setitem__((1, 0), 2),
     OutOfRangeError, r"episode 0: actions: expected values in \[0, 1\]"),
    (gym.spaces.Box(0, 3, (2,), np.int64), gym.spaces.Discrete(2), lambda e: e["observations"].__setitem__((1, 0), 99),
     OutOfRangeError, r"episode 0: observations: expected values in \[0, 3\] .* at row 1"),
    (BOX, gym.spaces.Box(0, 3, (), np.int64), lambda e: e["actions"].__setitem__(0, 9),
     OutOfRangeError, r"episode 0: actions: expected values in \[0, 3\]"),
    (gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Discrete(2),
     lambda e: e["observations"].__setitem__((2, 0), np.inf),
     NonFiniteError, r"episode 0: observations: an infinity at row 2, where its space is bounded"),
])
def test_a_value_outside_a_discrete_or_bounded_space_is_refused_by_episode(
        observation_space: Any, action_space: Any, change: Any, error: type[Exception], message: str) -> None:
    rng = np.random.default_rng(7)
    episode = {"observations": _values(observation_space, 4, rng), "actions": _values(action_space, 3, rng),
               "rewards": np.zeros(3), "terminations": np.array([False, False, True]),
               "truncations": np.zeros(3, bool)}
    to_minari([episode], _new_id(), observation_space=observation_space, action_space=action_space)  # valid: written
    change(episode)
    with pytest.raises(error, match=message):
        to_minari([episode], _new_id(), observation_space=observation_space, action_space=action_space)
    buffers = [EpisodeBuffer(observations=episode["observations"], actions=episode["actions"],
                             rewards=episode["rewards"], terminations=episode["terminations"],
                             truncations=episode["truncations"])]
    with pytest.warns(UserWarning):
        dataset = minari.create_dataset_from_buffers(_new_id(), buffers, observation_space=observation_space,
                                                     action_space=action_space)
    with pytest.raises(error, match=message):
        from_minari(dataset)


def _values(space: Any, rows: int, rng: np.random.Generator) -> np.ndarray[Any, Any]:
    if isinstance(space, (gym.spaces.MultiBinary, gym.spaces.Discrete)) or space.dtype.kind == "i":
        high = 2 if not isinstance(space, gym.spaces.Box) else int(space.high.max()) + 1
        return rng.integers(0, high, (rows, *space.shape)).astype(space.dtype)
    return rng.uniform(-1, 1, (rows, *space.shape)).astype(space.dtype)


def test_small_uint8_data_that_minari_0_5_3_broke_is_refused_with_the_cause() -> None:
    """Minari <= 0.5.3 wrote uint8 rows of 2 dims as JPEG bytes whatever their space (0.5.4 writes them raw)."""
    import h5py

    episode = _episode("small_uint8", 2, "terminated", None, np.random.default_rng(6))
    dataset = _minari_dataset([episode], "small_uint8", "hdf5")
    with h5py.File(Path(dataset.storage.data_path) / "main_data.hdf5", "a") as file:
        del file["episode_0/observations"]
        file["episode_0"].create_dataset("observations", dtype=h5py.vlen_dtype(np.uint8), data=np.array(
            [np.arange(n, dtype=np.uint8) for n in (5, 6, 7)], dtype=object))  # as 0.5.3 left them
    with pytest.raises(ShapeError, match=r"episode 0: observations: expected shape \(3, 4, 4\) \(2 steps\), got "
                                         r"\(3,\) of objects, one a row .* the HDF5 writer of Minari 0.5.3 and older"):
        from_minari(dataset)


def test_an_arrow_observation_that_is_null_is_refused_by_episode() -> None:
    import pyarrow as pa
    import pyarrow.ipc as ipc

    dataset = _minari_dataset([GOOD, GOOD, GOOD], "flat", "arrow")
    (path,) = (Path(dataset.storage.data_path) / "1").glob("*.arrow")
    table = ipc.open_file(pa.py_buffer(path.read_bytes())).read_all()
    column = table.column("observations").combine_chunks()
    holed = pa.FixedSizeListArray.from_arrays(column.values, 3, mask=pa.array(np.arange(len(column)) == 2))
    with ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table.set_column(0, "observations", holed))
    with pytest.raises(ShapeError, match=r"episode 1: observations: expected shape \(5, 3\) \(4 steps\), got \(12,\)"):
        from_minari(dataset)


SEEDS = {"int64": np.int64(7), "int64 (1,)": np.array([7], np.int64), "int64 (1, 1)": np.array([[7]], np.int64),
         "big-endian int64": np.array(7, ">i8"), "uint16": np.uint16(7), "int8 (1,)": np.array([7], np.int8)}


@pytest.mark.parametrize("stored", SEEDS.values(), ids=SEEDS.keys())
def test_an_hdf5_seed_of_one_integer_loads_whatever_its_type_and_shape(stored: Any) -> None:
    """Minari's seeds are int64 scalars, read as one int64 (8 bytes, no new type or space), as is one int64 of
    another shape; other types go through h5py's own read of the value as stored."""
    import h5py

    dataset = _minari_dataset([_episode("flat", 2, "terminated", seed, np.random.default_rng(0)) for seed in (4, 5)])
    with h5py.File(Path(dataset.storage.data_path) / "main_data.hdf5", "r+") as file:
        file["episode_1"].attrs["seed"] = stored
    assert _rows(from_minari(dataset))["episode_seed"].tolist() == [4, 4, 7, 7]


@pytest.mark.parametrize(("stored", "error", "message"), [
    (7.5, OutOfRangeError, r"episode 1: seed: expected an int in \[0, 2\*\*63\), got 7.5"),
    (np.array([7, 8], np.int64), DatasetError, r"cannot be read \(ValueError: can only convert an array of size 1"),
], ids=["float", "two int64"])
def test_an_hdf5_seed_that_is_not_one_integer_is_refused(stored: Any, error: type[Exception], message: str) -> None:
    import h5py

    dataset = _minari_dataset([_episode("flat", 2, "terminated", seed, np.random.default_rng(0)) for seed in (4, 5)])
    with h5py.File(Path(dataset.storage.data_path) / "main_data.hdf5", "r+") as file:
        file["episode_1"].attrs["seed"] = stored
    with pytest.raises(error, match=message):
        from_minari(dataset)
