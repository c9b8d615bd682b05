"""Compressed frames from several threads: a load's check beside sampling threads shares no decompressor;
writers, samplers and savers race without tearing a stack.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _compressed_frames import FRAME, _add, _pair, _steps

from rlbuf import CheckpointError, ReplayBuffer

pytestmark = pytest.mark.usefixtures("small_dictionary_threshold")  # dictionaries after 40 frames


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
