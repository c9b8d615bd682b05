"""from_minari's chunk readers (h5py and pyarrow, arrays reused) read what Minari's own reader
reads, whatever the chunk size and however an Arrow episode is split into record batches and files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

minari = pytest.importorskip("minari")

import numpy as np  # noqa: E402
from _minari import (  # noqa: E402
    ACTIONS,
    BOX,
    _assert_same_rows,
    _assert_same_tree,
    _episode,
    _minari_dataset,
    _new_id,
    _rows,
)

import rlbuf.offline  # noqa: E402
from rlbuf.offline import from_minari, to_minari  # noqa: E402

pytestmark = pytest.mark.usefixtures("minari_root")  # every test in a temporary Minari root


@pytest.mark.parametrize("data_format", ["hdf5", "arrow"])
@pytest.mark.parametrize("options", [{}, {"compact": True}, {"compact": True, "exact": False}], ids=str)
def test_chunks_of_any_size_store_the_same_rows(data_format: str, options: dict[str, Any],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks reuse their arrays (two sets, alternating): many small chunks store what one chunk stores."""
    rng = np.random.default_rng(5)
    episodes = [_episode(kind, n, end, seed, rng) for kind, n, end, seed in
                [("flat", 3, "terminated", 1), ("flat", 5, "truncated", None), ("flat", 1, "both", 7),
                 ("flat", 4, "truncated", 2), ("flat", 2, "terminated", 3), ("flat", 6, "truncated", 4)]]
    dataset = _minari_dataset(episodes, "flat", data_format)
    whole = from_minari(dataset, **options)
    for chunk_bytes in (1, 120):  # one episode a chunk; about 3 steps a chunk (BOX and ACTIONS: 42 bytes a step)
        monkeypatch.setattr(rlbuf.offline, "_CHUNK_BYTES", chunk_bytes)
        _assert_same_rows(whole, from_minari(dataset, **options))
    assert len(whole) == 21


@pytest.mark.parametrize("data_format", ["hdf5", "arrow"])
def test_the_chunk_readers_read_what_minaris_reader_reads(data_format: str) -> None:
    """Pins Minari's HDF5 and Arrow layouts, which from_minari reads with h5py and pyarrow directly,
    chunk by chunk into reused arrays (each chunk compared before the next ones are read)."""
    from rlbuf._minari_chunks import _minari_episodes, dataset_chunks, reader
    from rlbuf._minari_read import Spaces

    rng = np.random.default_rng(7)
    for kind in ("flat", "dict"):
        lengths = [(3, 5), (2, None), (4, 1), (1, 2), (5, None), (2, 3)]
        dataset = _minari_dataset([_episode(kind, n, "truncated", seed, rng) for n, seed in lengths], kind,
                                  data_format)
        ids = [int(i) for i in dataset.episode_indices]
        spaces = Spaces.of(dataset.observation_space, dataset.action_space)
        assert reader(dataset, spaces) == data_format
        theirs = _minari_episodes(dataset, ids)
        chunks = 0
        for chunk in dataset_chunks(dataset, spaces, 5):
            chunks += 1
            for number in range(len(chunk.ids)):
                ours, expected = chunk.episode(number, structured=kind == "dict"), next(theirs)
                assert ours["id"] == expected["id"] and ours["seed"] == expected["seed"]
                for name in ("observations", "actions", "rewards", "terminations", "truncations"):
                    _assert_same_tree(ours[name], expected[name])
        assert chunks == 4 and next(theirs, None) is None  # several episodes a chunk, arrays reused


def test_an_arrow_episode_in_several_record_batches_and_files_loads_the_same_rows() -> None:
    """from_minari takes each record batch of an episode's files as a view, and joins several in order
    (Minari writes one batch an episode, and its own reader assumes so)."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    rng = np.random.default_rng(11)
    for kind in ("flat", "dict"):
        dataset = _minari_dataset([_episode(kind, n, "terminated", n, rng) for n in (5, 3, 6)], kind, "arrow")
        whole = from_minari(dataset)
        directory = Path(dataset.storage.data_path) / "1"
        (path,) = directory.glob("*.arrow")
        table = ipc.open_file(pa.py_buffer(path.read_bytes())).read_all()  # in memory: the file is rewritten
        for name, parts in ((path.name, [table.slice(0, 1), table.slice(1, 1)]), ("part-9.arrow", [table.slice(2)])):
            with ipc.new_file(str(directory / name), table.schema) as writer:
                for part in parts:
                    writer.write_table(part)
        _assert_same_rows(whole, from_minari(dataset))
        assert len(whole) == 5 + 3 + 6


def test_arrow_infos_of_an_episode_in_several_record_batches_and_files_load_as_minari_decodes_them() -> None:
    import pyarrow as pa
    import pyarrow.ipc as ipc

    from rlbuf._minari_arrow import arrow_episodes
    from rlbuf._minari_read import Spaces

    rng = np.random.default_rng(12)
    episodes = [{**_episode("flat", n, "terminated", None, rng), "infos": {
        "k": np.arange(n + 1) + 100 * n, "m": rng.random((n + 1, 2, 2)).astype(np.float32)}} for n in (4, 3, 5)]
    dataset = to_minari(episodes, _new_id(), data_format="arrow", observation_space=BOX, action_space=ACTIONS)
    spaces = Spaces.of(dataset.observation_space, dataset.action_space)
    theirs = dataset.storage.get_episodes([0, 1, 2])
    for ours, expected in zip(arrow_episodes(dataset, [0, 1, 2], spaces, True), theirs, strict=True):
        _assert_same_tree(ours["infos"], expected["infos"])  # one record batch an episode: Minari reads it right
    whole = from_minari(dataset, infos=True)
    directory = Path(dataset.storage.data_path) / "0"
    (path,) = directory.glob("*.arrow")
    table = ipc.open_file(pa.py_buffer(path.read_bytes())).read_all()
    for name, parts in ((path.name, [table.slice(0, 1), table.slice(1, 2)]), ("part-9.arrow", [table.slice(3)])):
        with ipc.new_file(str(directory / name), table.schema) as writer:
            for part in parts:
                writer.write_table(part)
    split = from_minari(dataset, infos=True)
    _assert_same_rows(whole, split)
    assert _rows(split)["next_info_k"].tolist() == [401, 402, 403, 404, 301, 302, 303, 501, 502, 503, 504, 505]
