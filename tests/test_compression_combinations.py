"""Compressed frames combined: the ways rows enter, leave and come back (add, extend, truncate_episodes, clear,
priorities, mid-stream checkpoints, memmap reloaded by a fresh process) gives exactly the batches of the
same buffer without compression, across wraps and the dictionary training point (env_mask alike:
``test_compression``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _compressed_frames import _env_major, _equal, _everything, _pair, _steps
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlbuf._frames as frames_module
from rlbuf import EmptyBufferError, ReplayBuffer

OPS = ("add", "extend", "truncate", "clear", "priorities", "reload")


def _fed(buffers: tuple[ReplayBuffer, ReplayBuffer], step: dict[str, Any], **kwargs: Any) -> None:
    for buffer in buffers:
        buffer.add(step["obs"], step["action"], step["reward"], step["next_obs"], step["terminated"],
                   step["truncated"], **kwargs)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.sampled_from(OPS), min_size=1, max_size=25), frame_stack=st.sampled_from([1, 4]),
       n_step=st.sampled_from([1, 3]), capacity=st.integers(6, 30), prioritized=st.booleans(),
       codec=st.sampled_from(["zstd", "lz4"]), seed=st.integers(0, 2**16))
def test_every_operation_mixed_gives_what_an_uncompressed_buffer_gives(
        monkeypatch: pytest.MonkeyPatch, ops: list[str], frame_stack: int, n_step: int, capacity: int,
        prioritized: bool, codec: str, seed: int) -> None:
    monkeypatch.setattr(frames_module, "DICTIONARY_AFTER", 30)  # trained, then the ring wraps, within a few ops
    num_envs = 2
    buffers = _pair(capacity, num_envs, frame_stack, n_step, codec, prioritized=prioritized)
    rng = np.random.default_rng(seed)
    stream = _steps(num_envs, frame_stack, 10**6, seed, 0.1)
    for op in ops:
        if op in ("truncate", "clear"):
            # The envs are reset after either: a new stream of steps starts every env's episode.
            stream = _steps(num_envs, frame_stack, 10**6, int(rng.integers(2**16)), 0.1)
            for buffer in buffers:
                buffer.truncate_episodes() if op == "truncate" else buffer.clear()
        elif op == "add":
            for _ in range(int(rng.integers(1, 8))):
                _fed(buffers, next(stream))
        elif op == "extend":
            batch = _env_major([next(stream) for _ in range(int(rng.integers(1, 2 * capacity)))])
            for buffer in buffers:
                buffer.extend(batch)
        elif op == "priorities" and prioritized:
            try:
                index = buffers[0].sample_all().index  # no draw: the buffers' random states stay alike
            except EmptyBufferError:
                continue
            priority = torch.from_numpy(rng.random(len(index)) + 0.05)
            for buffer in buffers:
                buffer.update_priority(index, priority)
        elif op == "reload":
            again = _pair(capacity, num_envs, frame_stack, n_step, codec, prioritized=prioritized)
            for old, new in zip(buffers, again, strict=True):
                new.load_state_dict(old.state_dict())
            buffers = again
        assert _equal(_everything(buffers[0]), _everything(buffers[1]))
    assert buffers[1].check_valid() == (True, "")


def test_the_real_training_point_inside_extends_that_wrap_the_ring() -> None:
    """DICTIONARY_AFTER as shipped (1,024 frames), reached inside an extend larger than the ring."""
    plain, compressed = _pair(100, 2, 4, 3, "zstd", prioritized=True)
    steps = _steps(2, 4, 10**6, 21, 0.05)
    for length in (300, 250, 7, 40):
        batch = _env_major([next(steps) for _ in range(length)])
        plain.extend(batch)
        compressed.extend(batch)
        assert _equal(_everything(plain), _everything(compressed))
    assert compressed._compact.log.codec.dictionary  # type: ignore[union-attr]


_FRESH = textwrap.dedent("""
    import sys, torch
    from rlbuf import EmptyBufferError, ReplayBuffer
    buffer = ReplayBuffer.load(sys.argv[1])
    assert buffer.check_valid() == (True, "")
    batches = [buffer.sample(16) for _ in range(3)]
    torch.save([{k: v for k, v in b.to_tensordict().items(include_nested=True, leaves_only=True)} for b in batches],
               sys.argv[2])
""")


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_a_memmap_checkpoint_reloaded_by_a_fresh_process_samples_the_same_batches(tmp_path: Path, codec: str) -> None:
    _, compressed = _pair(64, 2, 4, 3, codec, prioritized=True, storage="memmap")
    steps = list(_steps(2, 4, 600, 22, 0.05))  # 1,200 frames: the shipped dictionary point is passed
    for step in steps:
        compressed.add(step["obs"], step["action"], step["reward"], step["next_obs"], step["terminated"],
                       step["truncated"])
    index = compressed.sample_all().index
    compressed.update_priority(index, torch.linspace(0.1, 2.0, len(index), dtype=torch.float64))
    compressed.save(tmp_path / "ckpt")
    expected = [compressed.sample(16) for _ in range(3)]
    subprocess.run([sys.executable, "-c", _FRESH, str(tmp_path / "ckpt"), str(tmp_path / "batches.pt")], check=True,
                   timeout=300)
    got = torch.load(tmp_path / "batches.pt")
    assert compressed._compact.log.codec.dictionary  # type: ignore[union-attr]
    assert _equal(got, [{k: v for k, v in b.to_tensordict().items(include_nested=True, leaves_only=True)}
                        for b in expected])
