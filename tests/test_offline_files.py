"""A Minari dataset whose files are damaged (missing, truncated, corrupted) is refused by
``from_minari`` with a ``DatasetError`` naming the file or episode; no buffer comes back."""

from __future__ import annotations

import itertools
import os
import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

minari = pytest.importorskip("minari")

import numpy as np  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import rlbuf.offline  # noqa: E402
from rlbuf import DatasetError, DtypeError, ReplayBuffer, RlbufError  # noqa: E402
from rlbuf.offline import from_minari, to_minari  # noqa: E402

_IDS = itertools.count()


@pytest.fixture(autouse=True)
def minari_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    yield tmp_path


def _dataset(data_format: str) -> Any:
    """Three episodes of 3 steps, each with a seed."""
    episodes = [{"observations": np.full((4, 3), float(n)), "actions": np.zeros((3, 1), np.float32),
                 "rewards": np.ones(3), "terminations": np.array([False, False, True]),
                 "truncations": np.zeros(3, bool), "seed": n} for n in range(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Minari's reminders of metadata
        return to_minari(episodes, f"rlbuf-test/files{next(_IDS)}-{data_format}-v0", data_format=data_format)


def _cut(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def _garble(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:2048] + b"\x01" * (len(data) - 2048))


def _arrow_file(episode: Path) -> Path:
    return next(episode.glob("*.arrow"))


# What is done to episode 1's files (Arrow) or to the HDF5 file, and what the refusal must say.
ARROW: dict[str, tuple[Callable[[Path], None], str]] = {
    "metadata not JSON": (lambda episode: (episode / "metadata.json").write_text("{seed"), "JSONDecodeError"),
    "metadata a list": (lambda episode: (episode / "metadata.json").write_text("[1]"),
                        "metadata.json: expected an object whose options are an object, got \\[1\\]"),
    "metadata missing": (lambda episode: (episode / "metadata.json").unlink(), "FileNotFoundError"),
    "Arrow file cut short": (lambda episode: _cut(_arrow_file(episode)), "ArrowInvalid"),
    "Arrow file zeroed": (lambda episode: _arrow_file(episode).write_bytes(bytes(_arrow_file(episode).stat().st_size)),
                          "ArrowInvalid"),
    "Arrow file missing": (lambda episode: _arrow_file(episode).unlink(), "no Arrow file"),
}
HDF5: dict[str, tuple[Callable[[Path], None], str]] = {
    "file cut short": (_cut, "cannot be read as the dataset's HDF5 file"),
    "file garbled": (_garble, "cannot be read"),
    "file missing": (lambda path: path.unlink(), "cannot be read as the dataset's HDF5 file"),
}


def _refused(dataset: Any, message: str, monkeypatch: pytest.MonkeyPatch) -> DatasetError:
    closed: list[ReplayBuffer] = []
    close = ReplayBuffer.close
    monkeypatch.setattr(ReplayBuffer, "close", lambda self: (closed.append(self), close(self)))
    monkeypatch.setattr(rlbuf.offline, "_CHUNK_BYTES", 1)  # one episode a chunk: episode 0 is stored first
    with pytest.raises(DatasetError, match=message) as raised:
        from_minari(dataset)
    assert len(closed) == 1  # the buffer that took episode 0 was closed, not returned
    return raised.value


@pytest.mark.parametrize("damage", sorted(ARROW))
def test_a_damaged_arrow_episode_is_refused_by_episode(damage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    dataset = _dataset("arrow")
    assert len(from_minari(dataset)) == 9
    change, message = ARROW[damage]
    change(Path(dataset.storage.data_path) / "1")
    error = _refused(dataset, message, monkeypatch)
    assert str(error).startswith("episode 1: ") and "re-create the dataset" in str(error)


@pytest.mark.parametrize("damage", sorted(HDF5))
def test_a_damaged_hdf5_file_is_refused_by_file(damage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    dataset = _dataset("hdf5")
    assert len(from_minari(dataset)) == 9
    change, message = HDF5[damage]
    path = Path(dataset.storage.data_path) / "main_data.hdf5"
    change(path)
    if damage == "file garbled":  # the file opens: the first episode's buffer is made before a read fails
        with pytest.raises(DatasetError, match=message):
            from_minari(dataset)
        return
    closed: list[ReplayBuffer] = []
    monkeypatch.setattr(ReplayBuffer, "close", lambda self: closed.append(self))
    with pytest.raises(DatasetError, match=message) as raised:
        from_minari(dataset)
    assert str(path) in str(raised.value) and "re-create the dataset" in str(raised.value)
    assert closed == []  # refused at the file's opening, before a buffer was made
    assert os.path.exists(path) == (damage != "file missing")


@pytest.mark.parametrize("episode", [0, 1])
def test_a_deleted_hdf5_episode_group_is_refused_by_episode(episode: int) -> None:
    import h5py

    dataset = _dataset("hdf5")
    path = Path(dataset.storage.data_path) / "main_data.hdf5"
    with h5py.File(path, "a") as file:
        del file[f"episode_{episode}"]
    with pytest.raises(DatasetError, match=rf"^episode {episode}: {re.escape(str(path))}: its group episode_{episode} cannot be "
                                           r"opened .*; re-create the dataset"):
        from_minari(dataset)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data_format=st.sampled_from(["hdf5", "arrow"]), at=st.floats(0, 1, exclude_max=True),
       damage=st.binary(min_size=1, max_size=64))
def test_any_damage_loads_or_is_refused_by_an_rlbuf_error(data_format: str, at: float, damage: bytes) -> None:
    """Bytes overwritten anywhere in a file: the import loads (data bytes carry no checksum in Minari's
    files) or raises an rlbuf error, never another exception."""
    dataset = _dataset(data_format)
    root = Path(dataset.storage.data_path)
    path = root / "main_data.hdf5" if data_format == "hdf5" else _arrow_file(root / "1")
    data = bytearray(path.read_bytes())
    start = int(at * len(data))
    data[start:start + len(damage)] = damage
    path.write_bytes(bytes(data[:len(data)]))
    try:
        buffer = from_minari(dataset)
    except RlbufError:
        return
    buffer.close()


def test_an_hdf5_shape_larger_than_its_data_is_refused_before_any_allocation() -> None:
    """A damaged shape would be allocated (and zero-filled) before any check: 3.2 TB here."""
    h5py = pytest.importorskip("h5py")
    dataset = _dataset("hdf5")
    with h5py.File(Path(dataset.storage.data_path) / "main_data.hdf5", "r+") as file:
        del file["episode_1/observations"]
        observations = file.create_dataset("episode_1/observations", data=np.ones((4, 3)), chunks=(4, 3),
                                           maxshape=(None, None))
        observations.resize((4, 10**11))  # unwritten chunks: a shape the file holds no data for
    with pytest.raises(DatasetError, match=r"episode 1: observations: the dataset 'observations' says \(4, "
                                           r"100000000000\) \(3,200,000,000,000 bytes\) but holds 96 bytes"):
        from_minari(dataset)


def _rewrite(dataset: Any, name: str, **create: Any) -> None:
    """Replace episode 1's dataset ``name`` (HDF5) with one made by ``create_dataset(**create)``."""
    h5py = pytest.importorskip("h5py")
    with h5py.File(Path(dataset.storage.data_path) / "main_data.hdf5", "r+") as file:
        del file[f"episode_1/{name}"]
        file.create_dataset(f"episode_1/{name}", **create)


def test_a_compressed_hdf5_dataset_of_more_rows_than_the_dataset_is_refused_before_allocation() -> None:
    dataset = _dataset("hdf5")
    h5py = pytest.importorskip("h5py")
    _rewrite(dataset, "rewards", data=np.ones(3), chunks=(1 << 20,), maxshape=(None,), compression="gzip")
    with h5py.File(Path(dataset.storage.data_path) / "main_data.hdf5", "r+") as file:
        file["episode_1/rewards"].resize((200_000_000,))  # a 55 KB file: missing chunks read as zeros
    with pytest.raises(DatasetError, match=r"episode 1: rewards: the dataset 'rewards' says 200,000,000 rows, more "
                                           r"than the dataset's 9 steps"):
        from_minari(dataset)


def test_big_endian_hdf5_rewards_load_as_their_values() -> None:
    dataset = _dataset("hdf5")
    h5py = pytest.importorskip("h5py")
    with h5py.File(Path(dataset.storage.data_path) / "main_data.hdf5", "r+") as file:
        for episode in range(3):
            del file[f"episode_{episode}/rewards"]
            file.create_dataset(f"episode_{episode}/rewards", data=np.array([1.5, -2.0, 3.25], ">f8"))
    extras = from_minari(dataset).sample_all().extras
    assert extras["dataset_reward"].tolist() == [1.5, -2.0, 3.25] * 3



def test_float64_rewards_after_a_first_episode_of_float32_ones_are_refused_not_rounded() -> None:
    dataset = _dataset("hdf5")
    h5py = pytest.importorskip("h5py")
    with h5py.File(Path(dataset.storage.data_path) / "main_data.hdf5", "r+") as file:
        del file["episode_0/rewards"]
        file.create_dataset("episode_0/rewards", data=np.ones(3, np.float32))
    _rewrite(dataset, "rewards", data=np.full(3, 0.1))  # float64: float32 would round it
    with pytest.raises(DtypeError, match=r"episode 1: rewards: expected dtype float32 \(as the first episode's\), "
                                         r"got float64"):
        from_minari(dataset)
    assert from_minari(dataset, exact=False).sample_all().reward.tolist() == [1.0] * 3 + [np.float32(0.1)] * 3 + [1.0] * 3


def test_an_hdf5_seed_without_a_value_is_refused() -> None:
    dataset = _dataset("hdf5")
    h5py = pytest.importorskip("h5py")
    with h5py.File(Path(dataset.storage.data_path) / "main_data.hdf5", "r+") as file:
        file["episode_1"].attrs["seed"] = h5py.Empty("i8")
    with pytest.raises(DatasetError, match="cannot be read"):
        from_minari(dataset)


@pytest.mark.parametrize("options", ['"text"', "5", "[1, 2]"])
def test_arrow_options_that_are_no_object_are_refused_when_not_asked_for(options: str) -> None:
    dataset = _dataset("arrow")
    path = Path(dataset.storage.data_path) / "1" / "metadata.json"
    path.write_text(path.read_text()[:-1] + f', "options": {options}}}')
    with pytest.raises(DatasetError, match=r"episode 1: .*expected an object whose options are an object"):
        from_minari(dataset)


@pytest.mark.parametrize(("change", "message"), [
    (lambda meta: "{not json", "metadata.json cannot be read as a Minari dataset's"),
    (lambda meta: meta.replace('"total_steps": 9', '"total_steps": "abc"'), r"total_steps: expected a count .* 'abc'"),
    (lambda meta: meta.replace('"total_steps": 9', '"total_steps": -5'), r"total_steps: expected a count .* -5"),
    (lambda meta: meta.replace('"total_episodes": 3', '"total_episodes": -1'), r"total_episodes: .* got none"),
], ids=["not JSON", "total_steps a string", "total_steps negative", "total_episodes negative"])
def test_a_damaged_dataset_metadata_file_is_refused(change: Callable[[str], str], message: str) -> None:
    dataset = _dataset("hdf5")
    path = Path(dataset.storage.data_path) / "metadata.json"
    text = path.read_text()
    assert '"total_steps": 9' in text and '"total_episodes": 3' in text
    path.write_text(change(text))
    with pytest.raises(DatasetError, match=message):
        from_minari(dataset.storage.data_path.parent)


def test_a_compressed_hdf5_dataset_of_rows_far_larger_than_its_space_is_refused_before_allocation() -> None:
    dataset = _dataset("hdf5")
    h5py = pytest.importorskip("h5py")
    _rewrite(dataset, "observations", data=np.ones((4, 3)), chunks=(4, 1 << 16), maxshape=(None, None),
             compression="gzip")
    with h5py.File(Path(dataset.storage.data_path) / "main_data.hdf5", "r+") as file:
        file["episode_1/observations"].resize((4, 10**10))  # a row of 80 GB where the space's is 24 bytes
    with pytest.raises(DatasetError, match=r"episode 1: observations: .* more than 10 rows of its space could need"):
        from_minari(dataset)
