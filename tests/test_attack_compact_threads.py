"""Attacks on the compact layout from two threads: a writer and a sampler, state dicts taken while a writer
adds, ``sample_all`` while another thread adds; every row sampled is a whole transition of one state.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from typing import Any

import numpy as np
import pytest
import torch
from _compact_envs import IMAGE, IdEnvs, _dict_buffer, check_id_batch

from rlbuf import (
    EmptyBufferError,
    ReplayBuffer,
    StoredIndexError,
)


@pytest.mark.parametrize(("compression", "prioritized", "masked"),
                         [(None, False, False), ("zstd", True, False), ("lz4", False, True), (None, True, True)])
def test_a_writer_and_a_sampler_on_two_threads(monkeypatch: pytest.MonkeyPatch, compression: str | None,
                                                prioritized: bool, masked: bool) -> None:
    import rlbuf._frames as frames_module
    monkeypatch.setattr(frames_module, "DICTIONARY_AFTER", 40)  # a dictionary trained while the sampler reads
    k, n, gamma = 3, 3, 0.5
    buffer = ReplayBuffer(48, obs_shape={"image": (k, *IMAGE), "state": (k, 3)}, obs_dtype={"image": torch.uint8},
                          action_shape=(), num_envs=2, frame_stack=k, n_step=n, gamma=gamma, compression=compression,
                          prioritized=prioritized, seed=0)
    envs = IdEnvs(k)
    for _ in range(4):
        buffer.add(*envs.step())
    errors: list[BaseException] = []
    done = threading.Event()
    checked = [0]

    def write() -> None:
        try:
            for t in range(300):
                keep = (t % 3 != 1, t % 4 != 2) if masked else (True, True)
                buffer.add(*envs.step(keep), env_mask=np.array(keep) if masked else None)
        except BaseException as error:
            errors.append(error)
        finally:
            done.set()

    def sample() -> None:
        try:
            while not done.is_set() or checked[0] < 20:
                batch = buffer.sample(16)
                check_id_batch(batch, k, n, gamma)
                if prioritized:
                    buffer.update_priority(batch.index, torch.rand(16, dtype=torch.float64) + 0.1)
                # the rows may have been overwritten since: refused, or whole transitions of other steps
                with contextlib.suppress(StoredIndexError):
                    check_id_batch(buffer.sample_by_index(batch.index), k, n, gamma)
                checked[0] += 1
        except BaseException as error:
            errors.append(error)
            done.set()

    threads = [threading.Thread(target=write), threading.Thread(target=sample)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert checked[0] >= 20
    check_id_batch(buffer.sample_all(), k, n, gamma)
    assert buffer.check_valid() == (True, "")


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_state_dicts_taken_while_a_writer_adds_load_whole(monkeypatch: pytest.MonkeyPatch,
                                                          compression: str | None) -> None:
    """A thread takes state dicts while another adds (a dictionary trained meanwhile): each loads into a fresh
    buffer, passes its checks and samples whole transitions."""
    import rlbuf._frames as frames_module
    monkeypatch.setattr(frames_module, "DICTIONARY_AFTER", 30)
    buffer = _dict_buffer(compression)
    envs = IdEnvs(3)
    for _ in range(3):
        buffer.add(*envs.step())
    states: list[dict[str, Any]] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def write() -> None:
        try:
            for _ in range(120):
                buffer.add(*envs.step())
        except BaseException as error:
            errors.append(error)
        finally:
            done.set()

    def take() -> None:
        try:
            while len(states) < 12 and not (done.is_set() and states):
                states.append(copy.deepcopy(buffer.state_dict()))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=write), threading.Thread(target=take)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    for state in states:
        loaded = _dict_buffer(compression)
        loaded.load_state_dict(state)
        assert loaded.check_valid() == (True, "")
        with contextlib.suppress(EmptyBufferError):   # a state taken before any transition was complete
            check_id_batch(loaded.sample_all(), 3, 2, 0.5)


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_sample_all_while_another_thread_adds(compression: str | None) -> None:
    """Deterministic: another thread's add is started right after sample_all has listed the complete transitions
    (and given a second to go in); sample_all must still return whole transitions of one state."""
    buffer = _dict_buffer(compression)
    envs = IdEnvs(3)
    for _ in range(15):   # 30 rows in a ring of 24
        buffer.add(*envs.step())
    layout = buffer._compact
    assert layout is not None
    listed = layout.complete_index
    writers: list[threading.Thread] = []
    errors: list[BaseException] = []

    def add() -> None:
        try:
            buffer.add(*envs.step())
        except BaseException as error:
            errors.append(error)

    def listed_then_an_add() -> torch.Tensor:
        index = listed()
        writer = threading.Thread(target=add)
        writers.append(writer)
        writer.start()
        writer.join(timeout=1.0)   # goes in now unless sample_all holds the buffer's lock
        return index

    layout.complete_index = listed_then_an_add  # type: ignore[method-assign]
    try:
        batch = buffer.sample_all()
    finally:
        layout.complete_index = listed  # type: ignore[method-assign]
        for writer in writers:
            writer.join()
    assert not errors, errors
    check_id_batch(batch, 3, 2, 0.5)
