"""Compressed frames refused: invalid options, missing libraries, a refused add that changes nothing,
forged frame bytes, dictionaries and options in checkpoints, trailing bytes, states of another compression;
and a checkpoint that stores the compressed bytes and loads exactly.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _compressed_frames import FRAME, _add, _equal, _everything, _pair, _saved, _steps
from _snapshot import same, snapshot

import rlbuf._frames as frames_module
from rlbuf import CheckpointError, ConfigError, ReplayBuffer, ShapeError

pytestmark = pytest.mark.usefixtures("small_dictionary_threshold")  # dictionaries after 40 frames


# -- refusals -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("options", "match"), [
    ({"compression": "zstd", "frame_stack": 1}, "compact layout"),
    ({"compression": "gzip"}, "expected one of"),
    ({"compression": "zstd", "compression_level": 0}, r"\[1, 22\]"),
    ({"compression": "lz4", "compression_level": 13}, r"\[1, 12\]"),
    ({"compression": "zstd", "compression_level": 2.5}, "compression_level"),
    ({"compression_level": 3}, "without compression"),
])
def test_invalid_options_are_refused(options: dict[str, Any], match: str) -> None:
    frame_stack = options.pop("frame_stack", 4)
    with pytest.raises(ConfigError, match=match):
        ReplayBuffer(10, obs_shape=(frame_stack, *FRAME) if frame_stack > 1 else FRAME, action_shape=(),
                     frame_stack=frame_stack, **options)


def test_missing_libraries_name_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(ConfigError, match=r"rlbuf\[compression\]"):
        ReplayBuffer(10, obs_shape=(4, *FRAME), action_shape=(), frame_stack=4, compression="zstd")


def test_a_refused_add_leaves_the_buffer_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    """Also when the refused add needs a larger arena (a small first arena, steps added until the next needs one)."""
    monkeypatch.setattr(frames_module, "_MIN_ARENA", 1)
    _, compressed = _pair(16, 1, 2, 1, "lz4")
    log = compressed._compact.log  # type: ignore[union-attr]
    for step in _steps(1, 2, 200, 5, 0.0):
        if step["t"] > 30 and log.place(log.compress(step["obs"][:, -1].numpy())).arena is not None:
            break
        _add((compressed,), step)
    else:
        pytest.fail("no add needed a larger arena")
    before, held = snapshot(compressed), compressed.nbytes
    with pytest.raises(ShapeError):
        compressed.add(step["obs"], torch.zeros(1, 3, dtype=torch.int64), step["reward"], step["next_obs"],
                       step["terminated"], step["truncated"])
    assert same(snapshot(compressed), before)
    assert compressed.nbytes == held  # a larger arena for the refused frames was made, and dropped


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_a_checkpoint_stores_the_compressed_bytes_and_loads_exactly(tmp_path: Path, codec: str) -> None:
    path, original = _saved(tmp_path, codec)
    stored = sum(f.stat().st_size for f in (path / "tensors").iterdir() if "frames.bytes" in f.name)
    assert stored == original._compact.log.stored_bytes  # type: ignore[union-attr]
    loaded = ReplayBuffer.load(path)
    assert loaded.check_valid() == (True, "")
    assert _equal(_everything(loaded), _everything(original))


def _forge_tensor(path: Path, suffix: str, edit: Any) -> None:
    from test_forged_checkpoints import _edit_tensor, _manifest, _rewrite

    manifest = _manifest(path)
    _edit_tensor(path, manifest, suffix, edit)
    _rewrite(path, manifest)


def _set_entry(path: Path, suffix: str, data: bytes) -> None:
    """Replace a tensor file with ``data`` (its manifest entry's shape updated, checksums recomputed)."""
    from test_forged_checkpoints import _file_of, _manifest, _rewrite

    manifest = _manifest(path)
    rel = _file_of(manifest, suffix)
    (path / rel).write_bytes(data)
    manifest["files"][rel]["shape"] = [len(data)]
    manifest["files"][rel]["bytes"] = len(data)
    _rewrite(path, manifest)


def _swap_two_sizes(t: torch.Tensor) -> None:
    values = t.view(-1)
    first = int((values != values[0]).nonzero()[0])
    values[0], values[first] = values[first].clone(), values[0].clone()


FRAME_FORGERIES: dict[str, Any] = {
    "a frame's size + 1": lambda path: _forge_tensor(path, "fields.obs.bin", lambda t: t.view(-1).__setitem__(
        3, t.view(-1)[3] + 1)),
    "two sizes swapped": lambda path: _forge_tensor(path, "fields.obs.bin", _swap_two_sizes),
    "a size of 0": lambda path: _forge_tensor(path, "fields.obs.bin", lambda t: t.view(-1).__setitem__(0, 0)),
    "a size of 10**9": lambda path: _forge_tensor(path, "fields.obs.bin", lambda t: t.view(-1).__setitem__(0, 10**9)),
    "bytes cut by one": lambda path: _set_entry(path, "frames.bytes.bin", _file_bytes(path, "frames.bytes.bin")[:-1]),
    "a byte appended": lambda path: _set_entry(path, "frames.bytes.bin", _file_bytes(path, "frames.bytes.bin") + b"\0"),
    "bytes zeroed": lambda path: _set_entry(path, "frames.bytes.bin", bytes(len(_file_bytes(path, "frames.bytes.bin")))),
    "a final frame's size + 1": lambda path: _forge_tensor(path, "finals.sizes.bin", lambda t: t.view(-1).__setitem__(
        int(t.view(-1).argmax()), t.view(-1).max() + 1)),
    "two final sizes moved": lambda path: _forge_tensor(path, "finals.sizes.bin", lambda t: t.view(-1).__setitem__(
        slice(0, 2), t.view(-1)[:2].flip(0) + torch.tensor([1, -1]))),
    "final bytes cut by one": lambda path: _set_entry(path, "finals.bytes.bin", _file_bytes(path, "finals.bytes.bin")[:-1]),
    "final bytes zeroed": lambda path: _set_entry(path, "finals.bytes.bin", bytes(len(_file_bytes(path, "finals.bytes.bin")))),
    "a frame's checksum changed": lambda path: _forge_tensor(path, "frames.checksums.bin", lambda t: t.view(-1).__setitem__(
        0, (t.view(-1)[0] + 1) % 2**32)),
    "a final frame's checksum changed": lambda path: _forge_tensor(path, "finals.checksums.bin", lambda t: t.view(
        -1).__setitem__(int(t.view(-1).argmax()), t.view(-1).max() - 1)),
    "the dictionary dropped": lambda path: _set_entry(path, "frames.dictionary.bin", b""),
    "the dictionary changed": lambda path: _set_entry(path, "frames.dictionary.bin", bytes(
        b ^ 0x5A for b in _file_bytes(path, "frames.dictionary.bin"))),
}


def _file_bytes(path: Path, suffix: str) -> bytes:
    from test_forged_checkpoints import _file_of, _manifest

    return (path / _file_of(_manifest(path), suffix)).read_bytes()


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
@pytest.mark.parametrize("case", sorted(FRAME_FORGERIES))
def test_hostile_frame_bytes_are_refused(tmp_path: Path, case: str, codec: str) -> None:
    path, _ = _saved(tmp_path, codec)
    FRAME_FORGERIES[case](path)
    with pytest.raises(CheckpointError):
        ReplayBuffer.load(path)


def test_a_dictionary_before_its_time_is_refused(tmp_path: Path) -> None:
    _, compressed = _pair(32, 1, 4, 1)
    for step in _steps(1, 4, 10, 7, 0.0):
        _add((compressed,), step)
    path = tmp_path / "ckpt"
    compressed.save(path)
    _set_entry(path, "frames.dictionary.bin", b"\x37\xa4\x30\xec" + bytes(200))
    with pytest.raises(CheckpointError, match="dictionary"):
        ReplayBuffer.load(path)


@pytest.mark.parametrize(("option", "value"), [("compression", "lz4"), ("compression", None), ("compression", "gzip"),
                                               ("compression_level", 30), ("compression_level", "3")])
def test_a_forged_compression_option_is_refused(tmp_path: Path, option: str, value: Any) -> None:
    from test_forged_checkpoints import _forge

    path, _ = _saved(tmp_path, "zstd")
    _forge(path, state={("options", option): value})
    with pytest.raises(CheckpointError):
        ReplayBuffer.load(path)


def test_a_dictionary_zstd_cannot_use_is_a_checkpoint_error() -> None:
    _, compressed = _pair(64, 2, 4, 1)
    for step in _steps(2, 4, 30, 10, 0.1):
        _add((compressed,), step)
    state = compressed.state_dict()
    state["extra"]["frames"]["dictionary"] = torch.frombuffer(bytearray(b"\x37\xa4\x30\xec" + bytes(200)),
                                                              dtype=torch.uint8)
    before = snapshot(compressed)
    with pytest.raises(CheckpointError, match="dictionary"):
        compressed.load_state_dict(state)
    assert same(snapshot(compressed), before)


@pytest.mark.parametrize("dictionary", [bytes(range(256)) * 64, b"\x37\xa4\x30\xec" + bytes(1 << 15)])
def test_a_dictionary_rlbuf_would_not_train_is_refused_and_the_one_it_trains_is_counted(dictionary: bytes) -> None:
    # A 16 KiB raw-content dictionary (no zstd magic) and one larger than rlbuf trains loaded (helper 40).
    _, compressed = _pair(64, 2, 4, 1)
    for step in _steps(2, 4, 30, 10, 0.1):
        _add((compressed,), step)
    log = compressed._compact.log  # type: ignore[union-attr]
    assert log.codec.dictionary and log.nbytes == (log.arena.nbytes + log.start.nbytes + log.length.nbytes
                                                   + log.sums.nbytes + len(log.codec.dictionary))
    state = compressed.state_dict()
    state["extra"]["frames"]["dictionary"] = torch.frombuffer(bytearray(dictionary), dtype=torch.uint8)
    before = snapshot(compressed)
    with pytest.raises(CheckpointError, match=r"a compression dictionary of \d+ bytes starting [0-9a-f]{8}; rlbuf "
                                              r"writes the ones zstd trains: at most 16384 bytes, starting 37a430ec"):
        compressed.load_state_dict(state)
    assert same(snapshot(compressed), before)


def test_trailing_bytes_after_a_frame_are_refused() -> None:
    _, compressed = _pair(16, 1, 2, 1)
    for step in _steps(1, 2, 10, 11, 0.0):
        _add((compressed,), step)
    state = compressed.state_dict()
    newest = (compressed._ring.write_count - 1) % 16
    state["fields"]["obs"][newest] += 3
    state["extra"]["frames"]["bytes"] = torch.cat([state["extra"]["frames"]["bytes"], torch.zeros(3, dtype=torch.uint8)])
    with pytest.raises(CheckpointError):
        compressed.load_state_dict(state)


def test_frames_without_bytes_and_array_options_are_refused() -> None:
    with pytest.raises(ConfigError, match="no bytes"):
        ReplayBuffer(8, obs_shape=(0,), action_shape=(), n_step=2, compression="zstd")
    for option in (np.array(["zstd", "lz4"]), np.array("zstd")):
        with pytest.raises(ConfigError, match="compression"):
            ReplayBuffer(8, obs_shape=(2, 3), action_shape=(), frame_stack=2, compression=option)


def test_a_compressed_state_loaded_into_an_uncompressed_buffer_names_the_option() -> None:
    # The message was two dumps of field specs, compression nowhere in them (helper 40).
    def build(**options: Any) -> ReplayBuffer:
        return ReplayBuffer(8, obs_shape=(4, 4), obs_dtype=torch.uint8, action_shape=(), compact=True, **options)
    state = build(compression="zstd").state_dict()
    with pytest.raises(CheckpointError, match=r"^state: options: compression is 'zstd' in the state, None in this"):
        build().load_state_dict(state)
