"""Concurrent adds, extends and samples from several threads lose nothing and never tear a row."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from rlbuf import BufferFullError, ReplayBuffer, RolloutBuffer, RolloutIncompleteError, _torchrl

WRITERS, STEPS = 4, 300


def _row(uid: int) -> dict[str, torch.Tensor | float | bool]:
    value = float(uid)
    return {"obs": torch.full((3,), value), "action": torch.full((2,), value), "reward": value,
            "next_obs": torch.full((3,), value + 0.5), "terminated": uid % 2 == 0, "truncated": False}


@pytest.fixture(autouse=True)
def frequent_thread_switches() -> Iterator[None]:
    """Switch threads every microsecond, so a missing lock shows up as a lost or torn row."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


def test_threads_adding_extending_and_sampling_lose_nothing(storage: str) -> None:
    buf = ReplayBuffer(WRITERS * STEPS * 2, obs_shape=(3,), action_shape=(2,), storage=storage, seed=0)  # type: ignore[arg-type]
    errors: list[BaseException] = []
    done = threading.Event()

    def add_rows(writer: int) -> None:
        try:
            for step in range(STEPS):
                buf.add(**_row(writer * 100_000 + step))  # type: ignore[arg-type]
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    def extend_rows() -> None:
        try:
            for chunk in range(STEPS // 10):
                uid = 900_000 + torch.arange(chunk * 10, chunk * 10 + 10, dtype=torch.float32)
                buf.extend(TensorDict({
                    "observation": uid[:, None].expand(10, 3), "action": uid[:, None].expand(10, 2),
                    ("next", "observation"): uid[:, None].expand(10, 3) + 0.5, ("next", "reward"): uid[:, None],
                    ("next", "terminated"): (uid % 2 == 0)[:, None], ("next", "truncated"): torch.zeros(10, 1, dtype=torch.bool),
                }, batch_size=[10]))
        except BaseException as error:  # pragma: no cover
            errors.append(error)

    def sample_rows() -> None:
        try:
            while not done.is_set():
                if len(buf):
                    batch = buf.sample(64)
                    # every field of a row comes from the same write: never a torn row
                    assert torch.equal(batch.obs[:, 0], batch.reward)
                    assert torch.equal(batch.action[:, 1], batch.reward)
                    assert torch.equal(batch.next_obs[:, 2], batch.reward + 0.5)
                    assert torch.equal(batch.terminated, batch.reward % 2 == 0)
        except BaseException as error:  # pragma: no cover
            errors.append(error)

    threads = [threading.Thread(target=add_rows, args=(w,)) for w in range(WRITERS)]
    threads.append(threading.Thread(target=extend_rows))
    sampler = threading.Thread(target=sample_rows)
    sampler.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    sampler.join()
    assert not errors, errors
    stored = buf.sample_all()
    ids = stored.reward.tolist()
    expected = {float(w * 100_000 + s) for w in range(WRITERS) for s in range(STEPS)} | {
        float(900_000 + i) for i in range(STEPS // 10 * 10)}
    assert len(ids) == len(expected) and set(ids) == expected        # nothing lost, nothing doubled
    assert torch.equal(stored.obs[:, 0], stored.reward)
    for writer in range(WRITERS):                                      # each writer's rows in its order
        mine = [i for i in ids if writer * 100_000 <= i < (writer + 1) * 100_000]
        assert mine == sorted(mine)


class _WatchedLock:
    """A buffer's ring lock that reports when a thread other than the test's starts waiting for it."""

    def __init__(self, lock: Any, waiting: threading.Event | None = None) -> None:
        self.lock = lock
        self.test_thread = threading.get_ident()
        self.waiting = waiting or threading.Event()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if threading.get_ident() != self.test_thread:
            self.waiting.set()
        return bool(self.lock.acquire(blocking, timeout))

    def release(self) -> None:
        self.lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _watch_lock(monkeypatch: pytest.MonkeyPatch, buf: RolloutBuffer) -> _WatchedLock:
    watched = _WatchedLock(buf._ring.lock)
    monkeypatch.setattr(buf._ring, "lock", watched)
    return watched


def _rollout_step(buf: RolloutBuffer, value: float) -> None:
    buf.add(torch.full((2, 3), value), torch.zeros(2), torch.ones(2), torch.tensor([False, False]),
            torch.zeros(2), torch.zeros(2), truncated=False)


def _rollout_extend_step(buf: RolloutBuffer, value: float) -> None:
    buf.extend(TensorDict({"observation": torch.full((2, 1, 3), value), "action": torch.zeros(2, 1),
                           "state_value": torch.zeros(2, 1, 1), "sample_log_prob": torch.zeros(2, 1),
                           "next": {"reward": torch.ones(2, 1, 1), "terminated": torch.zeros(2, 1, 1, dtype=torch.bool),
                                    "truncated": torch.zeros(2, 1, 1, dtype=torch.bool)}}, batch_size=[2, 1]))


def _in_thread(call: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as error:  # reported to the test
            raised.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, raised


@pytest.mark.parametrize("write", [_rollout_step, _rollout_extend_step], ids=["add", "extend"])
def test_a_rollout_write_checks_for_room_under_the_lock(monkeypatch: pytest.MonkeyPatch,
                                                        write: Callable[[RolloutBuffer, float], None]) -> None:
    buf = RolloutBuffer(2, 2, obs_shape=(3,), action_shape=(), seed=0)
    _rollout_step(buf, 0.0)
    lock = _watch_lock(monkeypatch, buf)
    with lock:
        thread, raised = _in_thread(lambda: write(buf, 9.0))
        assert lock.waiting.wait(10)
        _rollout_step(buf, 1.0)  # the last free step, taken while the other write waits for the lock
    thread.join(10)
    assert [type(error) for error in raised] == [BufferFullError]  # not a third step written over step 0
    assert buf.steps == 2 and buf.view("obs")[:, 0, 0].tolist() == [0.0, 1.0]
    assert buf.check_valid() == (True, "")


def test_compute_returns_and_advantages_checks_the_rollout_is_full_under_the_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = RolloutBuffer(1, 2, obs_shape=(3,), action_shape=(), seed=0)
    _rollout_step(buf, 0.0)
    lock = _watch_lock(monkeypatch, buf)
    with lock:
        thread, raised = _in_thread(lambda: buf.compute_returns_and_advantages(torch.zeros(2)))
        assert lock.waiting.wait(10)
        buf.clear()  # while the compute waits: it must find the rollout empty
    thread.join(10)
    assert [type(error) for error in raised] == [RolloutIncompleteError]
    assert not buf.advantages_ready


def test_a_rollout_clears_rows_extras_and_advantages_in_one_locked_step(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = RolloutBuffer(1, 2, obs_shape=(3,), action_shape=(), seed=0)
    _rollout_step(buf, 0.0)
    buf.compute_returns_and_advantages(torch.zeros(2))
    lock = buf._ring.lock
    held: list[bool] = []

    class Attached(dict[str, torch.Tensor]):
        def clear(self) -> None:
            held.append(lock._is_owned())
            super().clear()

    monkeypatch.setattr(buf, "_attached", Attached(buf._attached))
    buf.clear()
    assert held == [True] and buf.steps == 0 and not buf.advantages_ready


@pytest.mark.parametrize(("read", "expected"), [(len, 3), (lambda buf: buf._ring.write_count, 3),
                                                (lambda buf: buf._ring.cursor, 3)], ids=["len", "write_count", "cursor"])
def test_a_read_during_a_commit_counts_the_rows_being_committed(monkeypatch: pytest.MonkeyPatch,
                                                                read: Callable[[ReplayBuffer], int], expected: int) -> None:
    buf = ReplayBuffer(10, obs_shape=(3,), action_shape=(2,), seed=0)
    for uid in range(3):
        buf.add(**_row(uid))  # type: ignore[arg-type]
    assert buf._ring.pending == 3
    stopped = threading.Event()  # the reader finished, or waits for the lock
    monkeypatch.setattr(buf._ring, "lock", _WatchedLock(buf._ring.lock, stopped))
    commit_rows, seen, readers = _torchrl.commit_rows, [], []

    def read_in_between(*args: Any) -> None:
        # The pending rows are no longer pending, and not yet in TorchRL's counters: read now, from another thread.
        def reader() -> None:
            seen.append(read(buf))
            stopped.set()
        thread = threading.Thread(target=reader)
        thread.start()
        assert stopped.wait(10)
        commit_rows(*args)
        readers.append(thread)

    monkeypatch.setattr(_torchrl, "commit_rows", read_in_between)
    buf._ring.flush()
    readers[0].join(10)
    assert seen == [expected] and len(buf) == 3


def test_load_state_dict_restores_the_generators_under_the_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    source = ReplayBuffer(10, obs_shape=(3,), action_shape=(2,), seed=1)
    for uid in range(4):
        source.add(**_row(uid))  # type: ignore[arg-type]
    source.sample(2)
    buf = ReplayBuffer(10, obs_shape=(3,), action_shape=(2,), seed=0)
    held: list[bool] = []

    class Recording:
        """A generator that records whether the buffer's lock is held when its state is set."""

        def __init__(self, generator: torch.Generator) -> None:
            self.generator = generator

        def set_state(self, state: torch.Tensor) -> None:
            held.append(buf._ring.lock._is_owned())
            self.generator.set_state(state)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.generator, name)

    monkeypatch.setattr(buf._ring, "generator", Recording(buf._ring.generator))
    monkeypatch.setattr(buf, "_epoch_generator", Recording(buf._epoch_generator))
    buf.load_state_dict(source.state_dict())
    assert held == [True, True]  # a snapshot meanwhile finds the rows and the draws of one state


def test_an_epoch_iterator_moves_on_under_the_buffers_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = ReplayBuffer(10, obs_shape=(3,), action_shape=(2,), seed=0)
    for uid in range(4):
        buf.add(**_row(uid))  # type: ignore[arg-type]
    lock = _WatchedLock(buf._ring.lock)
    monkeypatch.setattr(buf._ring, "lock", lock)
    iterator = buf.epochs(batch_size=2)
    before = iterator.state_dict()
    with lock:  # a save holds the lock: the iterator must not draw its permutation meanwhile
        thread, raised = _in_thread(lambda: next(iterator))
        assert lock.waiting.wait(10)
        during = iterator.state_dict()
    thread.join(10)
    assert not raised
    assert during["position"] == 0 and during["permutation"] is None
    assert torch.equal(during["generator"], before["generator"])
    assert iterator.state_dict()["position"] == 1


def test_sample_sequences_checks_each_env_s_rows_are_whole_steps_under_the_lock(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The check was made before the lock was taken: an add that left an env out while sample_sequences waited
    # for the lock gave sequences jumping between envs (helper 68).
    buf = ReplayBuffer(40, obs_shape=(1,), action_shape=(), num_envs=2, seed=0)

    def step(t: int, env_mask: Any = None) -> None:
        obs = torch.tensor([[float(t)], [100.0 + t]])
        buf.add(obs, torch.zeros(2), torch.zeros(2), obs + 1, torch.zeros(2, dtype=torch.bool), truncated=False,
                env_mask=env_mask)
    for t in range(4):
        step(t)
    lock = _WatchedLock(buf._ring.lock)
    monkeypatch.setattr(buf._ring, "lock", lock)
    drawn: list[Any] = []
    with lock:
        thread, raised = _in_thread(lambda: drawn.append(buf.sample_sequences(64, 3)))
        assert lock.waiting.wait(10)
        step(4, env_mask=torch.tensor([False, True]))  # env 1's rows are no longer 2 apart
        for t in range(5, 9):
            step(t)
    thread.join(10)
    assert [type(error).__name__ for error in raised] == ["ConfigError"] and not drawn
