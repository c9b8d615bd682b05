"""Compressed frames (``compression="zstd"``/``"lz4"``): what a compressed buffer gives is exactly
what the same buffer without compression gives, through every entry path, checkpoint and refusal."""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from _snapshot import same, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

import rlbuf._frames as frames_module
from rlbuf import CheckpointError, ConfigError, EmptyBufferError, ReplayBuffer, ShapeError
from rlbuf._codec import Codec
from rlbuf._frames import FrameLog
from rlbuf.gym import Recorder

DATA = Path(__file__).parent / "data" / "breakout_steps.npz"
FRAME = (6, 5)


@pytest.fixture(autouse=True)
def small_dictionary_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dictionaries trained after 40 frames, so that the tests' short streams have one."""
    monkeypatch.setattr(frames_module, "DICTIONARY_AFTER", 40)


def _frame(rng: np.random.Generator, kind: int) -> np.ndarray:
    """Frames of three kinds: a flat colour, a pattern with a moving dot, noise (incompressible)."""
    if kind == 0:
        return np.full(FRAME, rng.integers(0, 4), np.uint8)
    if kind == 1:
        frame = np.tile(np.arange(FRAME[1], dtype=np.uint8), (FRAME[0], 1))
        frame[rng.integers(0, FRAME[0]), rng.integers(0, FRAME[1])] = 255
        return frame
    return rng.integers(0, 256, FRAME, dtype=np.uint8)


def _steps(num_envs: int, frame_stack: int, steps: int, seed: int, end_rate: float) -> Iterator[dict[str, Any]]:
    """Steps of ``num_envs`` envs, stacked as gymnasium's ``FrameStackObservation`` stacks them."""
    rng = np.random.default_rng(seed)
    stacks = [[_frame(rng, 0)] * frame_stack for _ in range(num_envs)]
    for t in range(steps):
        new = [_frame(rng, int(rng.integers(0, 3))) for _ in range(num_envs)]
        ends = rng.random(num_envs) < end_rate
        cut = ends & (rng.random(num_envs) < 0.5)
        next_stacks = [[*stacks[e][1:], new[e]] for e in range(num_envs)]
        shape = (num_envs, frame_stack, *FRAME) if frame_stack > 1 else (num_envs, *FRAME)
        yield {"obs": torch.from_numpy(np.stack([np.stack(s) for s in stacks]).reshape(shape)),
               "action": torch.from_numpy(rng.integers(0, 4, num_envs)),
               "reward": torch.from_numpy(rng.standard_normal(num_envs).astype(np.float32)),
               "next_obs": torch.from_numpy(np.stack([np.stack(s) for s in next_stacks]).reshape(shape)),
               "terminated": torch.from_numpy(ends & ~cut), "truncated": torch.from_numpy(cut), "t": t}
        for e in range(num_envs):
            stacks[e] = [_frame(rng, 0)] * frame_stack if ends[e] else next_stacks[e]


def _pair(capacity: int, num_envs: int, frame_stack: int, n_step: int, compression: str = "zstd",
          **options: Any) -> tuple[ReplayBuffer, ReplayBuffer]:
    shape = (frame_stack, *FRAME) if frame_stack > 1 else FRAME
    level = options.pop("compression_level", None)
    made = [ReplayBuffer(capacity, obs_shape=shape, action_shape=(), obs_dtype=torch.uint8, action_dtype=torch.int64,
                         num_envs=num_envs, frame_stack=frame_stack, n_step=n_step, compact=True, seed=3,
                         compression=codec, compression_level=level if codec else None, **options)
            for codec in (None, compression)]
    return made[0], made[1]


def _add(buffers: tuple[ReplayBuffer, ...], step: dict[str, Any], **kwargs: Any) -> None:
    for buffer in buffers:
        buffer.add(step["obs"], step["action"], step["reward"], step["next_obs"], step["terminated"],
                   step["truncated"], **kwargs)


def _everything(buffer: ReplayBuffer) -> Any:
    """Every complete transition, then three seeded draws."""
    if len(buffer) == 0:
        return []
    try:
        seen = [buffer.sample_all()]
    except EmptyBufferError:  # nothing complete yet: both must say so alike
        return ["empty"]
    seen += [buffer.sample(5) for _ in range(3)]
    return [{name: value.clone() for name, value in batch.to_tensordict().items(include_nested=True, leaves_only=True)}
            for batch in seen]


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return bool(a == b)


# -- compressed = uncompressed ------------------------------------------------------------------
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(num_envs=st.integers(1, 3), frame_stack=st.sampled_from([1, 2, 4]), n_step=st.sampled_from([1, 3]),
       capacity=st.integers(8, 48), steps=st.integers(0, 90), seed=st.integers(0, 2**16),
       end_rate=st.sampled_from([0.0, 0.1, 0.4]), codec=st.sampled_from(["zstd", "lz4"]))
def test_a_compressed_buffer_gives_exactly_what_an_uncompressed_one_gives(
        num_envs: int, frame_stack: int, n_step: int, capacity: int, steps: int, seed: int, end_rate: float,
        codec: str) -> None:
    capacity = max(capacity, num_envs)
    plain, compressed = _pair(capacity, num_envs, frame_stack, n_step, codec)
    for step in _steps(num_envs, frame_stack, steps, seed, end_rate):
        _add((plain, compressed), step)
        if step["t"] % 29 == 0:
            assert _equal(_everything(plain), _everything(compressed))
    assert _equal(_everything(plain), _everything(compressed))
    loaded = ReplayBuffer(capacity, obs_shape=compressed._compact.obs_spec.shape, action_shape=(),  # type: ignore[union-attr]
                          obs_dtype=torch.uint8, action_dtype=torch.int64, num_envs=num_envs, frame_stack=frame_stack,
                          n_step=n_step, compact=True, compression=codec)
    loaded.load_state_dict(compressed.state_dict())
    assert loaded.check_valid() == (True, "")
    assert _equal(_everything(loaded), _everything(compressed))


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
@pytest.mark.parametrize("level", [None, 1, 9])
def test_every_level_round_trips(codec: str, level: int | None) -> None:
    plain, compressed = _pair(32, 2, 4, 3, codec, compression_level=level)
    for step in _steps(2, 4, 70, 0, 0.1):
        _add((plain, compressed), step)
    assert compressed._compact.log.codec.dictionary  # type: ignore[union-attr]
    assert _equal(_everything(plain), _everything(compressed))


@pytest.mark.parametrize("storage", ["memory", "memmap"])
@pytest.mark.parametrize("prioritized", [False, True])
def test_storages_and_priorities(storage: str, prioritized: bool) -> None:
    plain, compressed = _pair(24, 2, 4, 2, storage=storage, prioritized=prioritized)
    for step in _steps(2, 4, 60, 1, 0.1):
        _add((plain, compressed), step)
    if prioritized:
        for buffer in (plain, compressed):
            index = buffer.sample_all().index
            buffer.update_priority(index, torch.arange(len(index), dtype=torch.float64) + 1)
    assert _equal(_everything(plain), _everything(compressed))


def test_env_mask_leaves_out_reset_steps_alike() -> None:
    """gymnasium's NEXT_STEP autoreset: the step after an episode's end is no transition."""
    plain, compressed = _pair(40, 3, 2, 2)
    rng = np.random.default_rng(2)
    stacks = [[_frame(rng, 0)] * 2 for _ in range(3)]
    resetting = np.zeros(3, np.bool_)
    for _ in range(80):
        ends = ~resetting & (rng.random(3) < 0.15)
        next_stacks = [[_frame(rng, 0)] * 2 if resetting[e] else [*stacks[e][1:], _frame(rng, 1)] for e in range(3)]
        step = {"obs": torch.from_numpy(np.stack([np.stack(s) for s in stacks])),
                "action": torch.from_numpy(rng.integers(0, 4, 3)),
                "reward": torch.from_numpy(np.where(resetting, 0, rng.standard_normal(3)).astype(np.float32)),
                "next_obs": torch.from_numpy(np.stack([np.stack(s) for s in next_stacks])),
                "terminated": torch.from_numpy(ends), "truncated": torch.zeros(3, dtype=torch.bool)}
        _add((plain, compressed), step, env_mask=torch.from_numpy(~resetting))
        stacks, resetting = next_stacks, ends
    assert _equal(_everything(plain), _everything(compressed))


def _env_major(steps: list[dict[str, Any]]) -> TensorDict:
    """``steps`` as one TensorDict of batch size ``[num_envs, T]``, as TorchRL collectors give them."""
    def stacked(name: str) -> torch.Tensor:
        return torch.stack([step[name] for step in steps], 1)
    return TensorDict({"observation": stacked("obs"), "action": stacked("action"),
                       ("next", "observation"): stacked("next_obs"), ("next", "reward"): stacked("reward"),
                       ("next", "terminated"): stacked("terminated"), ("next", "truncated"): stacked("truncated")},
                      batch_size=[len(steps[0]["obs"]), len(steps)])


def test_extend_of_env_major_steps() -> None:
    plain, compressed = _pair(40, 2, 4, 1)
    steps = list(_steps(2, 4, 12, 4, 0.0))
    td = _env_major(steps)
    plain.extend(td)
    compressed.extend(td)
    assert len(compressed) == 24
    assert _equal(_everything(plain), _everything(compressed))


def test_the_recorder_feeds_a_compressed_buffer_alike() -> None:
    """CartPole through gymnasium's vector env (NEXT_STEP), n-step returns from the compact layout."""
    buffers = [ReplayBuffer(300, observation_space=gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), action_shape=(),
                            action_dtype=torch.int64, num_envs=2, n_step=3, seed=0, compression=codec)
               for codec in (None, "lz4")]
    envs = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    envs.action_space.seed(0)
    recorders = [Recorder(envs, buffer) for buffer in buffers]
    obs, _ = envs.reset(seed=0)
    for _ in range(120):
        action = envs.action_space.sample()
        next_obs, reward, terminated, truncated, info = envs.step(action)
        for recorder in recorders:
            recorder.record(obs, action, reward, next_obs, terminated, truncated, info)
        obs = next_obs
    envs.close()
    assert _equal(_everything(buffers[0]), _everything(buffers[1]))


def test_real_breakout_frames_round_trip_and_shrink() -> None:
    """Real ale-py frames (tests/data): every stack exact, a frame stored in a small part of its bytes."""
    data = np.load(DATA)
    plain, compressed = (ReplayBuffer(400, obs_shape=(4, 84, 84), action_shape=(), obs_dtype=torch.uint8,
                                      action_dtype=torch.int64, frame_stack=4, n_step=3, seed=0, compression=codec)
                         for codec in (None, "zstd"))
    frames, index = data["frames_0"], 0
    stack = [frames[0]] * 4
    for t in range(len(data["action"])):
        index += 1
        next_stack = [*stack[1:], frames[index]]
        ended = bool(data["terminated"][t, 0] or data["truncated"][t, 0])
        for buffer in (plain, compressed):
            buffer.add(torch.from_numpy(np.stack(stack)), int(data["action"][t, 0]), float(data["reward"][t, 0]),
                       torch.from_numpy(np.stack(next_stack)), bool(data["terminated"][t, 0]),
                       truncated=bool(data["truncated"][t, 0]))
        if ended:
            index += 1
            stack = [frames[index]] * 4
        else:
            stack = next_stack
    assert _equal(_everything(plain), _everything(compressed))
    log = compressed._compact.log  # type: ignore[union-attr]
    assert log.codec.dictionary
    assert log.stored_bytes / len(compressed) < 84 * 84 / 10
    assert "compression='zstd'" in repr(compressed) and "obs: (84, 84) uint8 zstd-compressed" in repr(compressed)


# -- the byte log against a plain reference -----------------------------------------------------
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(capacity=st.integers(1, 12), adds=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=4), max_size=60),
       seed=st.integers(0, 2**16))
def test_the_log_holds_the_newest_frames_through_wraps_and_growth(capacity: int, adds: list[list[int]],
                                                                   seed: int) -> None:
    rng = np.random.default_rng(seed)
    log = FrameLog(capacity, FRAME, torch.uint8, Codec("lz4", None))
    reference: dict[int, np.ndarray] = {}
    for kinds in adds:
        kinds = kinds[:capacity]
        batch = np.stack([_frame(rng, kind) for kind in kinds])
        packed = log.compress(batch)
        first = log.count
        log.append(first, packed, log.place(packed))
        for offset, frame in enumerate(batch):
            reference[(first + offset) % capacity] = frame
        if log.training_due(len(packed.blobs)):
            log.train()
        positions = np.array(sorted(reference), np.int64)
        assert (log.take(positions) == np.stack([reference[p] for p in positions.tolist()])).all()
        assert log.stored_bytes == int(log.length[positions].sum())
        again = log.loaded(log.state_dict(), torch.from_numpy(log.length[:len(reference)].astype(np.int32)),
                           write_count=log.count)
        assert (again.take(positions) == log.take(positions)).all()


# -- decoding rows in place -----------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(codec=st.sampled_from(["zstd", "lz4"]), kinds=st.lists(st.integers(0, 2), max_size=12),
       gaps=st.lists(st.integers(0, 2), min_size=12, max_size=12), primed=st.booleans(), seed=st.integers(0, 2**16))
def test_decoded_rows_hold_each_frame_where_it_is_asked(codec: str, kinds: list[int], gaps: list[int],
                                                         primed: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    frames = [_frame(rng, kind).tobytes() for kind in kinds]
    made = Codec(codec, None)
    if primed:
        made = made.with_dictionary(made.train([_frame(rng, k % 3).tobytes() for k in range(200)]) or b"")
    rows = np.cumsum(np.array(gaps[:len(frames)], np.int64) + 1) - 1  # ascending, some consecutive
    size = len(_frame(rng, 0).tobytes())
    out = bytearray(size * (int(rows[-1]) + 2 if len(rows) else 1))
    blobs = [made.compress(frame) for frame in frames]
    lengths = np.array([len(blob) for blob in blobs], np.int64)
    made.decode_rows(np.frombuffer(b"".join(blobs), np.uint8), np.cumsum(lengths) - lengths, lengths, memoryview(out),
                     rows, size)
    expected = bytearray(len(out))
    for row, frame in zip(rows.tolist(), frames, strict=True):
        expected[row * size:(row + 1) * size] = frame
    assert out == expected


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
@pytest.mark.parametrize("case", ["a frame too short", "a frame too long", "garbage", "two frames as one",
                                  "a frame cut"])
def test_rows_that_do_not_decode_to_their_bytes_are_refused(codec: str, case: str) -> None:
    made, size = Codec(codec, None), 30
    frame = bytes(range(size))
    blobs = {"a frame too short": [made.compress(frame[:-1])], "a frame too long": [made.compress(frame + b"x")],
             "garbage": [bytes(range(200, 230))], "two frames as one": [made.compress(frame) * 2],
             "a frame cut": [made.compress(frame)[:-2]]}[case]
    out = bytearray(3 * size)
    arena = np.frombuffer(blobs[0], np.uint8)
    with pytest.raises(ValueError, match=f"{codec} frames that do not decode"):
        made.decode_rows(arena, np.array([0]), np.array([len(arena)]), memoryview(out), np.array([1]), size)
    with pytest.raises(ValueError, match=f"{codec} frames that do not decode"):  # a range past the arena's end
        made.decode_rows(arena, np.array([1]), np.array([len(arena)]), memoryview(out), np.array([1]), size)
    with pytest.raises(ValueError, match="1 starts and 2 lengths of frames for 2 rows"):
        made.decode_rows(arena, np.array([0]), np.array([1, 2]), memoryview(out), np.array([0, 1]), size)


def test_a_zstd_header_giving_another_size_is_refused_before_decoding() -> None:
    import zstandard

    # 1 MiB of zeros in 40-odd bytes: python-zstandard would allocate the header's size whatever the bound.
    bomb = zstandard.ZstdCompressor(write_content_size=True).compress(bytes(1 << 20))
    with pytest.raises(ValueError, match="its header gives 1048576 bytes"):
        Codec("zstd", None).decompress(bomb, 64)
    honest = zstandard.ZstdCompressor(write_content_size=True).compress(bytes(64))
    assert Codec("zstd", None).decompress(honest, 64) == bytes(64)


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


def _saved(tmp_path: Path, codec: str = "zstd") -> tuple[Path, ReplayBuffer]:
    _, compressed = _pair(32, 2, 4, 3, codec)
    for step in _steps(2, 4, 50, 6, 0.1):
        _add((compressed,), step)
    path = tmp_path / "ckpt"
    compressed.save(path)
    return path, compressed


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


def test_warnings_are_not_raised_on_the_compressed_path() -> None:
    plain, compressed = _pair(20, 2, 4, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for step in _steps(2, 4, 30, 8, 0.1):
            _add((plain, compressed), step)
        assert _equal(_everything(plain), _everything(compressed))


@pytest.mark.parametrize(("option", "value"), [("compression", "lz4"), ("compression", None), ("compression", "gzip"),
                                               ("compression_level", 30), ("compression_level", "3")])
def test_a_forged_compression_option_is_refused(tmp_path: Path, option: str, value: Any) -> None:
    from test_forged_checkpoints import _forge

    path, _ = _saved(tmp_path, "zstd")
    _forge(path, state={("options", option): value})
    with pytest.raises(CheckpointError):
        ReplayBuffer.load(path)


def test_memory_reports_count_the_compressed_bytes(tmp_path: Path) -> None:
    """``repr``, ``nbytes`` and ``rlbuf inspect`` report what the compressed frames take, not their raw size."""
    from rlbuf._inspect import inspect_checkpoint

    path, buffer = _saved(tmp_path)
    log, finals = buffer._compact.log, buffer._compact.streams.finals  # type: ignore[union-attr]
    raw = math.prod(FRAME)
    frames = (log.stored_bytes + finals.stored_bytes) / len(buffer)
    assert 0 < frames < raw
    stored = float(repr(buffer).split("bytes_per_transition~")[1].split(" B")[0])
    report = inspect_checkpoint(str(path))
    assert report["bytes_per_transition"] == pytest.approx(stored, abs=0.1)
    assert buffer.nbytes >= log.stored_bytes + finals.stored_bytes + sum(
        leaf.numel() * leaf.element_size() for leaf in buffer._ring.leaves.values())


@pytest.mark.parametrize("steps", [0, 50])
def test_inspect_names_the_compression_and_agrees_with_repr_empty_or_not(tmp_path: Path, steps: int) -> None:
    # rlbuf inspect listed obs as a () int32 field, compression nowhere, and an empty compressed buffer's estimate
    # left out the 16 bytes a row's frame takes beside it that repr counts (helper 70).
    from rlbuf._inspect import format_report, inspect_checkpoint

    _, compressed = _pair(32, 2, 4, 3, "lz4", compression_level=5)
    for step in _steps(2, 4, steps, 6, 0.1):
        _add((compressed,), step)
    compressed.save(tmp_path / "ckpt")
    report = inspect_checkpoint(str(tmp_path / "ckpt"))
    shown = repr(compressed).split("bytes_per_transition~")[1].split(", fields=")[0]
    assert report["compression"] == {"codec": "lz4", "level": 5}
    assert report["bytes_per_transition"] == pytest.approx(float(shown.split(" B")[0]), abs=0.1)
    text = format_report(report)
    assert "compression lz4, level 5" in text
    assert text.count("+ compressed frames") == shown.count("+ compressed frames") == (steps == 0)


# -- found by review ------------------------------------------------------------------------------
def test_a_load_check_beside_sampling_threads_shares_no_decompressor() -> None:
    """python-zstandard's (de)compressors are not thread-safe: a load's check builds its own codec."""
    import threading

    _, compressed = _pair(64, 2, 4, 1)
    for step in _steps(2, 4, 60, 9, 0.1):
        _add((compressed,), step)
    expected = compressed.sample_by_index(torch.arange(0, 40, 3)).obs.clone()
    bad = compressed.state_dict()
    bad["iterator"] = {"method": "nope"}  # refused at the end of the check, after the frames are decoded
    failures: list[BaseException] = []
    stop = threading.Event()

    def sample() -> None:
        try:
            while not stop.is_set():
                assert torch.equal(compressed.sample_by_index(torch.arange(0, 40, 3)).obs, expected)
        except BaseException as error:
            failures.append(error)

    thread = threading.Thread(target=sample)
    thread.start()
    try:
        for _ in range(30):
            with pytest.raises(CheckpointError):
                compressed.load_state_dict(bad)
    finally:
        stop.set()
        thread.join()
    assert failures == []


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


def test_empty_selections_and_checks_keep_no_second_copy() -> None:
    plain, compressed = _pair(16, 1, 2, 1)
    for step in _steps(1, 2, 10, 12, 0.0):
        _add((plain, compressed), step)
    assert _equal(plain.sample_by_index(torch.zeros(0, dtype=torch.int64)).obs,
                  compressed.sample_by_index(torch.zeros(0, dtype=torch.int64)).obs)
    logs = _live_logs()
    assert compressed.check_valid() == (True, "")
    assert _live_logs() == logs  # the check's own log of the frames is gone with it


def _live_logs() -> int:
    import gc

    gc.collect()
    with warnings.catch_warnings():  # isinstance on some torch module objects warns of deprecations
        warnings.simplefilter("ignore")
        return sum(isinstance(item, FrameLog) for item in gc.get_objects())


def test_frames_without_bytes_and_array_options_are_refused() -> None:
    with pytest.raises(ConfigError, match="no bytes"):
        ReplayBuffer(8, obs_shape=(0,), action_shape=(), n_step=2, compression="zstd")
    for option in (np.array(["zstd", "lz4"]), np.array("zstd")):
        with pytest.raises(ConfigError, match="compression"):
            ReplayBuffer(8, obs_shape=(2, 3), action_shape=(), frame_stack=2, compression=option)


def test_training_reads_a_bounded_sample_of_the_stored_frames(monkeypatch: pytest.MonkeyPatch) -> None:
    """An extend past the threshold trains on the newest DICTIONARY_AFTER frames, not on all it wrote."""
    seen: list[int] = []
    train = Codec.train

    def counting(self: Codec, frames: Any) -> bytes:
        seen.append(len(frames))
        return train(self, frames)

    monkeypatch.setattr(Codec, "train", counting)
    plain, compressed = _pair(400, 2, 1, 1)
    steps = list(_steps(2, 1, 150, 13, 0.0))
    td = _env_major(steps)
    plain.extend(td)
    compressed.extend(td)
    assert seen == [frames_module.DICTIONARY_AFTER]
    assert _equal(_everything(plain), _everything(compressed))


def _serial_frame(serial: int) -> np.ndarray:
    frame = np.tile(np.arange(FRAME[1], dtype=np.uint8), (FRAME[0], 1))
    frame[0, 0], frame[0, 1] = serial % 256, serial // 256
    return frame


def _serials(stacks: torch.Tensor) -> np.ndarray:
    frames = stacks.numpy().astype(np.int64)
    return frames[..., 0, 0] + 256 * frames[..., 0, 1]  # type: ignore[no-any-return]


def test_writers_samplers_and_savers_race_without_tearing() -> None:
    """One thread adds a stream whose frames carry their own serial, one samples, one snapshots and
    loads each snapshot into a new buffer: every batch and every loaded buffer holds whole, consecutive stacks."""
    import threading

    def made() -> ReplayBuffer:
        return ReplayBuffer(64, obs_shape=(4, *FRAME), action_shape=(), obs_dtype=torch.uint8,
                            action_dtype=torch.int64, frame_stack=4, seed=0, compression="zstd")

    buffer = made()
    failures: list[BaseException] = []
    done = threading.Event()

    def consecutive(obs: torch.Tensor, next_obs: torch.Tensor) -> None:
        seen, after = _serials(obs), _serials(next_obs)
        newest = seen[:, -1]
        expected = np.maximum(newest[:, None] + np.arange(-3, 1), 0)
        assert (seen == expected).all()
        assert (after[:, :-1] == seen[:, 1:]).all() and (after[:, -1] == newest + 1).all()

    def write() -> None:
        try:
            stack = [_serial_frame(0)] * 4
            for serial in range(1, 400):
                next_stack = [*stack[1:], _serial_frame(serial)]
                buffer.add(np.stack(stack), 0, 1.0, np.stack(next_stack), False, truncated=False)
                stack = next_stack
        except BaseException as error:
            failures.append(error)
        finally:
            done.set()

    def sample() -> None:
        try:
            while not done.is_set():
                if len(buffer) > 8:
                    batch = buffer.sample(16)
                    consecutive(batch.obs, batch.next_obs)
        except BaseException as error:
            failures.append(error)

    def save() -> None:
        try:
            while not done.is_set():
                copy = made()
                copy.load_state_dict(buffer.state_dict())
                assert copy.check_valid() == (True, "")
                if len(copy) > 8:
                    batch = copy.sample_all()
                    consecutive(batch.obs, batch.next_obs)
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=target) for target in (write, sample, save)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert len(buffer) == 64 and buffer._compact.log.codec.dictionary  # type: ignore[union-attr]


def test_the_size_estimate_sends_compression_to_a_measurement() -> None:
    with pytest.raises(ConfigError, match="nbytes"):
        ReplayBuffer.bytes_per_transition(obs_shape=(4, 84, 84), action_shape=(), obs_dtype=torch.uint8,
                                          frame_stack=4, compression="zstd")


def test_a_compressed_state_loaded_into_an_uncompressed_buffer_names_the_option() -> None:
    # The message was two dumps of field specs, compression nowhere in them (helper 40).
    def build(**options: Any) -> ReplayBuffer:
        return ReplayBuffer(8, obs_shape=(4, 4), obs_dtype=torch.uint8, action_shape=(), compact=True, **options)
    state = build(compression="zstd").state_dict()
    with pytest.raises(CheckpointError, match=r"^state: options: compression is 'zstd' in the state, None in this"):
        build().load_state_dict(state)
