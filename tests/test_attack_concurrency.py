"""Attacks on the write path: many writers (threads, processes, rlbuf and TorchRL APIs), saves during writes.

Every row carries its id in every field (obs, action, reward, next_obs, terminated), so a torn
row shows as fields that disagree. Writers write their ids in order, so a snapshot of one
write count holds, per writer, exactly its first k ids: a gap or an extra id is a lost,
duplicated or counted-but-unwritten row. The CI cases are short; ``-m stress`` repeats them
``RLBUF_STRESS_REPEATS`` times (``nox -s stress``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from _rows import check_id_rows, id_rows

from rlbuf import ReplayBuffer

REPEATS = int(os.environ.get("RLBUF_STRESS_REPEATS", "20"))
STRIDE = 1_000_000  # writer w writes ids w * STRIDE + 0, 1, 2, ...


def _ids(buffer: ReplayBuffer) -> list[int]:
    """The ids stored, after checking that every field of every row carries the same id."""
    return check_id_rows(buffer.sample_all()) if len(buffer) else []


def _assert_prefixes(ids: list[int], writers: int) -> int:
    """Each writer's ids form 0..k-1: nothing lost, duplicated, or counted but unwritten; returns how many."""
    assert len(ids) == len(set(ids)), "duplicated rows"
    for w in range(writers):
        mine = sorted(i - w * STRIDE for i in ids if w * STRIDE <= i < (w + 1) * STRIDE)
        assert mine == list(range(len(mine))), f"writer {w}: ids missing in a snapshot"
    return len(ids)


def _buffer(capacity: int, storage: str = "memory", **options: Any) -> ReplayBuffer:
    return ReplayBuffer(capacity, obs_shape=(3,), action_shape=(2,), storage=storage, seed=0, **options)  # type: ignore[arg-type]


def _add(buffer: ReplayBuffer, uid: int) -> None:
    value = float(uid)
    buffer.add(torch.full((3,), value), torch.full((2,), value), value, torch.full((3,), value + 0.5), uid % 2 == 0, truncated=False)


def _mixed_round(tmp_path: Path, *, rows: int, storage: str, prioritized: bool) -> dict[str, int]:
    """Four writers (2 rlbuf add, 1 TorchRL extend, 1 TorchRL add), one sampler, one saver."""
    writers = 4
    buffer = _buffer(writers * rows, storage, prioritized=prioritized)
    start = threading.Barrier(writers + 2)
    done = threading.Event()
    errors: list[BaseException] = []
    saved: list[Path] = []
    checked = [0]  # ids checked in snapshots (saves loaded back, state dicts)

    def guarded(job: Any) -> Any:
        def run(*args: Any) -> None:
            try:
                start.wait()
                job(*args)
            except BaseException as error:
                errors.append(error)
        return run

    def rlbuf_adds(w: int) -> None:
        for i in range(rows):
            _add(buffer, w * STRIDE + i)

    def torchrl_extends(w: int) -> None:
        for i in range(0, rows, 8):
            buffer.torchrl.extend(id_rows(torch.arange(w * STRIDE + i, w * STRIDE + min(i + 8, rows), dtype=torch.float32)))

    def torchrl_adds(w: int) -> None:
        for i in range(rows):
            buffer.torchrl.add(id_rows(torch.tensor([float(w * STRIDE + i)]))[0])

    def sample() -> None:
        while not done.is_set():
            if len(buffer):
                check_id_rows(buffer.sample(16))

    def save() -> None:
        n = 0
        while not done.is_set() or n == 0:  # at least one snapshot is checked, however fast the writers
            path = tmp_path / f"ckpt{n % 2}"
            buffer.save(path)
            saved.append(path)
            checked[0] += _assert_prefixes(_ids(ReplayBuffer.load(path)), writers)
            checked[0] += _assert_prefixes([int(r) for r in buffer.state_dict()["fields"]["reward"].tolist()], writers)
            n += 1

    jobs = [threading.Thread(target=guarded(job), args=args) for job, args in (
        (rlbuf_adds, (0,)), (rlbuf_adds, (1,)), (torchrl_extends, (2,)), (torchrl_adds, (3,)))]
    helpers = [threading.Thread(target=guarded(sample)), threading.Thread(target=guarded(save))]
    for thread in jobs + helpers:
        thread.start()
    for thread in jobs:
        thread.join()
    done.set()
    for thread in helpers:
        thread.join()
    assert not errors, errors[0]
    ids = _ids(buffer)
    assert sorted(ids) == sorted(w * STRIDE + i for w in range(writers) for i in range(rows))
    valid, reason = buffer.check_valid()
    assert valid, reason
    final = tmp_path / "final"
    buffer.save(final)
    assert sorted(_ids(ReplayBuffer.load(final))) == sorted(ids)
    return {"writers": writers, "ids": len(ids), "saves": len(saved), "ids_checked_in_snapshots": checked[0]}


@pytest.mark.parametrize("prioritized", [False, True])
def test_mixed_rlbuf_and_torchrl_writers_with_saves_lose_nothing(tmp_path: Path, prioritized: bool) -> None:
    _mixed_round(tmp_path, rows=120, storage="memory", prioritized=prioritized)


def test_a_snapshot_reflects_one_write_count_in_a_full_ring_under_writes(tmp_path: Path) -> None:
    buffer = _buffer(64)
    stop = threading.Event()

    def write() -> None:
        uid = 0
        while not stop.is_set():
            _add(buffer, uid)
            uid += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        for n in range(20):
            state = buffer.state_dict()
            rewards = state["fields"]["reward"]
            # One write count: the ring holds exactly the ids write_count - size ... write_count - 1.
            count, size, cursor = state["write_count"], state["size"], state["cursor"]
            expected = torch.arange(count - size, count, dtype=torch.float32)
            if size == buffer.capacity:
                expected = torch.roll(expected, cursor)
            assert torch.equal(rewards, expected)
            if n % 5 == 0:
                buffer.save(tmp_path / "ckpt")
                assert ReplayBuffer.load(tmp_path / "ckpt").check_valid() == (True, "")
    finally:
        stop.set()
        writer.join()


def _process_writer(rb: Any, worker: int, rows: int, started: Any) -> None:
    started.wait()
    for i in range(0, rows, 16):
        first = worker * STRIDE + i
        rb.extend(id_rows(torch.arange(first, first + min(16, rows - i), dtype=torch.float32)))


def _process_round(tmp_path: Path, *, workers: int, rows: int, storage: str) -> dict[str, int]:
    buffer = _buffer(workers * rows + 16, storage)
    context = mp.get_context("spawn")
    started = context.Event()
    procs = [context.Process(target=_process_writer, args=(buffer.torchrl, w, rows, started)) for w in range(workers)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the one-time sharing-strategy notice
        for proc in procs:
            proc.start()
    started.set()
    saves = checked = 0
    while any(proc.is_alive() for proc in procs) or saves == 0:
        path = tmp_path / "ckpt"
        buffer.save(path)
        loaded = ReplayBuffer.load(path)
        checked += _assert_prefixes(_ids(loaded), workers)
        saves += 1
    for proc in procs:
        proc.join(timeout=120)
        assert proc.exitcode == 0
    ids = _ids(buffer)
    assert sorted(ids) == sorted(w * STRIDE + i for w in range(workers) for i in range(rows))
    return {"writers": workers, "ids": len(ids), "saves": saves, "ids_checked_in_snapshots": checked}


@pytest.mark.slow
def test_saves_while_worker_processes_write_hold_whole_rows_of_one_write_count(tmp_path: Path) -> None:
    _process_round(tmp_path, workers=2, rows=400, storage="memory")


@pytest.mark.stress
@pytest.mark.parametrize("storage", ["memory", "memmap"])
def test_stress_mixed_writers(tmp_path: Path, storage: str) -> None:
    totals = dict.fromkeys(("writers", "ids", "saves", "ids_checked_in_snapshots"), 0)
    for n in range(REPEATS):
        figures = _mixed_round(tmp_path / str(n), rows=500, storage=storage, prioritized=n % 2 == 1)
        totals = {key: totals[key] + figures[key] for key in totals}
    print(f"\nSTRESS mixed threads {storage}: rounds={REPEATS} {totals}")


@pytest.mark.stress
def test_stress_worker_processes(tmp_path: Path) -> None:
    totals = dict.fromkeys(("writers", "ids", "saves", "ids_checked_in_snapshots"), 0)
    rounds = max(1, REPEATS // 5)
    for n in range(rounds):
        figures = _process_round(tmp_path / str(n), workers=3, rows=2000, storage=("memory", "memmap")[n % 2])
        totals = {key: totals[key] + figures[key] for key in totals}
    print(f"\nSTRESS worker processes: rounds={rounds} {totals}")
