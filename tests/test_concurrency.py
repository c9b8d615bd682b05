"""Concurrent adds, extends and samples from several threads lose nothing and never tear a row."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import pytest
import torch
from tensordict import TensorDict

from rlbuf import ReplayBuffer

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
