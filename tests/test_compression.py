"""Compressed frames (``compression="zstd"``/``"lz4"``): what a compressed buffer gives is exactly
what the same buffer without compression gives, through every entry path; the byte log against a plain
reference, rows decoded in place, and what the compressed frames cost (memory reports, ``inspect``, training).
Refusals and checkpoints: ``tests/test_compression_refusals.py``; threads: ``tests/test_compression_threads.py``.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from _compressed_frames import (
    DATA,
    FRAME,
    _add,
    _env_major,
    _equal,
    _everything,
    _frame,
    _pair,
    _saved,
    _steps,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlbuf._frames as frames_module
from rlbuf import ConfigError, ReplayBuffer
from rlbuf._codec import Codec
from rlbuf._frames import FrameLog
from rlbuf.gym import Recorder

pytestmark = pytest.mark.usefixtures("small_dictionary_threshold")  # dictionaries after 40 frames


# -- compressed = uncompressed ------------------------------------------------------------------
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(num_envs=st.integers(1, 3), frame_stack=st.sampled_from([1, 2, 4]), n_step=st.sampled_from([1, 3]),
       capacity=st.integers(8, 48), steps=st.integers(0, 90), seed=st.integers(0, 2**16),
       end_rate=st.sampled_from([0.0, 0.1, 0.4]), codec=st.sampled_from(["zstd", "lz4"]),
       padding_type=st.sampled_from(["reset", "zero"]))
def test_a_compressed_buffer_gives_exactly_what_an_uncompressed_one_gives(
        num_envs: int, frame_stack: int, n_step: int, capacity: int, steps: int, seed: int, end_rate: float,
        codec: str, padding_type: str) -> None:
    capacity = max(capacity, num_envs)
    plain, compressed = _pair(capacity, num_envs, frame_stack, n_step, codec, padding_type=padding_type)
    for step in _steps(num_envs, frame_stack, steps, seed, end_rate, padding_type):
        _add((plain, compressed), step)
        if step["t"] % 29 == 0:
            assert _equal(_everything(plain), _everything(compressed))
    assert _equal(_everything(plain), _everything(compressed))
    loaded = ReplayBuffer(capacity, obs_shape=compressed._compact.obs_spec.shape, action_shape=(),  # type: ignore[union-attr]
                          obs_dtype=torch.uint8, action_dtype=torch.int64, num_envs=num_envs, frame_stack=frame_stack,
                          n_step=n_step, compact=True, compression=codec, padding_type=padding_type)
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
    for kinds in adds:  # an add of more frames than rows keeps the newest
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


def test_warnings_are_not_raised_on_the_compressed_path() -> None:
    plain, compressed = _pair(20, 2, 4, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for step in _steps(2, 4, 30, 8, 0.1):
            _add((plain, compressed), step)
        assert _equal(_everything(plain), _everything(compressed))


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


def test_the_size_estimate_sends_compression_to_a_measurement() -> None:
    with pytest.raises(ConfigError, match="nbytes"):
        ReplayBuffer.bytes_per_transition(obs_shape=(4, 84, 84), action_shape=(), obs_dtype=torch.uint8,
                                          frame_stack=4, compression="zstd")
