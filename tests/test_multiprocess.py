"""Worker processes write into a buffer's TorchRL side while the learner samples from rlbuf."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import warnings
from typing import Any

import pytest
import torch
from _rows import check_id_rows, id_rows
from tensordict import TensorDict

from rlbuf import ReplayBuffer

WORKERS, CHUNKS, ROWS = 2, 40, 16
_SHM = "/dev/shm"  # where torch's file_system sharing strategy keeps its files on Linux


def _rows(uid: torch.Tensor) -> TensorDict:
    rows = id_rows(uid)
    rows["next", "done"] = rows["next", "terminated"].clone()
    return rows


def _write(rb: Any, worker: int, started: Any) -> None:
    started.wait()
    for chunk in range(CHUNKS):
        first = worker * 1_000_000 + chunk * ROWS
        rb.extend(_rows(torch.arange(first, first + ROWS, dtype=torch.float32)))


@pytest.mark.parametrize("storage", ["memory", "memmap"])
def test_worker_processes_write_every_row_once_samples_are_never_torn_and_shared_memory_goes_with_the_buffer(storage: str) -> None:
    before = _torch_shared_files()
    buf = ReplayBuffer(WORKERS * CHUNKS * ROWS, obs_shape=(3,), action_shape=(2,), storage=storage, seed=0)  # type: ignore[arg-type]
    buf.extend(_rows(torch.tensor([-2.0])))          # one row from the learner before workers start
    context = mp.get_context("spawn")
    started = context.Event()
    workers = [context.Process(target=_write, args=(buf.torchrl, w, started)) for w in range(WORKERS)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)     # the one-time sharing-strategy notice
        for worker in workers:
            worker.start()
    started.set()
    samples = 0
    while any(worker.is_alive() for worker in workers) or samples == 0:
        batch = buf.sample(128)
        check_id_rows(batch)                              # all fields of a row come from one write
        samples += 1
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    stored = buf.sample_all().reward
    expected = {-2.0} | {float(w * 1_000_000 + i) for w in range(WORKERS) for i in range(CHUNKS * ROWS)}
    assert len(buf) == buf.capacity            # ring full: the learner's first row was overwritten
    ids = stored.tolist()
    assert len(set(ids)) == len(ids) and set(ids) <= expected and len(expected - set(ids)) == 1
    # The shared memory files of a RAM storage go with the buffer, not when the learner exits.
    held = _torch_shared_files() - before
    assert len(held) >= (7 if storage == "memory" and os.path.isdir(_SHM) else 0)  # one per stored field at least
    del buf, workers, batch                                   # Process objects keep their arguments
    gc.collect()
    assert not held & _torch_shared_files()


def _torch_shared_files() -> set[str]:
    """This process's torch files in /dev/shm (torch names them torch_<pid>_...); none elsewhere than Linux."""
    if not os.path.isdir(_SHM):
        return set()
    return {name for name in os.listdir(_SHM) if name.startswith(f"torch_{os.getpid()}_")}

