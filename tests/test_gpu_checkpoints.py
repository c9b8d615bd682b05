"""Checkpoints of CUDA buffers across devices (marked ``gpu``: skipped without CUDA): a CUDA replay or
rollout resumes exactly, rows survive CUDA -> file -> CPU -> file -> CUDA, a CUDA rollout loaded on the CPU
finishes its running epoch.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _gpu import (
    ACT,
    OBS,
    REPLAY_FIELDS,
    ROLLOUT_FIELDS,
    assert_same_batch,
    fill_replay,
    fill_rollout,
    gpu,
)

from rlbuf import ReplayBuffer, RolloutBuffer


# -- checkpoints -----------------------------------------------------------------------------------
@gpu
def test_a_cuda_replay_checkpoint_resumes_exactly_on_cuda(tmp_path: Path) -> None:
    buf = ReplayBuffer(64, obs_shape=(OBS,), action_shape=(ACT,), num_envs=4, prioritized=True,
                       storing_device="cuda", seed=0)
    fill_replay([buf], 20)
    buf.update_priority(torch.arange(64, device="cuda"), torch.rand(64, device="cuda") + 0.1)
    buf.sample(8)
    buf.save(tmp_path / "ckpt")
    restored = ReplayBuffer.load(tmp_path / "ckpt")
    assert restored.storing_device.type == "cuda"
    for _ in range(3):
        assert_same_batch(restored.sample(32), buf.sample(32), (*REPLAY_FIELDS, "index", "weight"))
    fill_replay([buf, restored], 3, start=50)  # writing resumes at the same cursor too
    assert_same_batch(restored.sample_all(), buf.sample_all(), REPLAY_FIELDS)


@gpu
def test_a_cuda_rollout_checkpoint_resumes_its_minibatches_exactly(tmp_path: Path) -> None:
    buf = RolloutBuffer(6, 10, obs_shape=(OBS,), action_shape=(ACT,), storing_device="cuda", seed=0)
    fill_rollout([buf], "cuda")
    buf.compute_returns_and_advantages(torch.zeros(10, device="cuda"))
    minibatches = buf.minibatches(num_minibatches=3, n_epochs=2)
    next(minibatches)
    buf.save(tmp_path / "ckpt")
    restored = RolloutBuffer.load(tmp_path / "ckpt")
    resumed = restored.current_epochs
    assert resumed is not None and len(resumed) == len(minibatches) == 5
    for got, expected in zip(resumed, minibatches, strict=True):  # into the next epoch: same generator
        assert got.obs.is_cuda
        assert_same_batch(got, expected, ROLLOUT_FIELDS)


@gpu
def test_cuda_to_file_to_cpu_to_file_to_cuda_keeps_every_row(tmp_path: Path) -> None:
    # CUDA and CPU generators are different algorithms: the draws cannot follow across device
    # types (a RuntimeWarning says so), but rows, counters, priorities and the write position do.
    original = ReplayBuffer(64, obs_shape=(OBS,), action_shape=(ACT,), num_envs=4, prioritized=True,
                            storing_device="cuda", seed=0)
    fill_replay([original], 20)
    original.update_priority(torch.arange(64, device="cuda"), torch.arange(64, device="cuda") % 7 + 0.5)
    original.save(tmp_path / "gpu")
    with pytest.warns(RuntimeWarning, match="another device type"):
        on_cpu = ReplayBuffer.load(tmp_path / "gpu", storing_device="cpu", device="cpu")
    assert on_cpu.storing_device.type == "cpu"
    assert_same_batch(on_cpu.sample_all(), original.sample_all(), REPLAY_FIELDS)
    on_cpu.save(tmp_path / "cpu")
    with pytest.warns(RuntimeWarning, match="another device type"):
        back = ReplayBuffer.load(tmp_path / "cpu", storing_device="cuda", device="cuda")
    assert back.sample(4).obs.is_cuda
    assert_same_batch(back.sample_all(), original.sample_all(), REPLAY_FIELDS)
    index = torch.arange(64, device="cuda")
    assert_same_batch(back.sample_by_index(index), original.sample_by_index(index), REPLAY_FIELDS)
    per_row = []  # same priorities: the same weight for each row
    for buf in (back, original):
        batch = buf.sample(20_000)
        per_row.append(torch.zeros(64, device="cuda").index_reduce_(0, batch.index, batch.weight, "amax",
                                                                    include_self=False))
    torch.testing.assert_close(per_row[0], per_row[1])
    fill_replay([original, back], 2, start=70)
    assert_same_batch(back.sample_all(), original.sample_all(), REPLAY_FIELDS)


@gpu
def test_a_cuda_rollout_loaded_on_the_cpu_finishes_the_running_epoch(tmp_path: Path) -> None:
    buf = RolloutBuffer(6, 10, obs_shape=(OBS,), action_shape=(ACT,), storing_device="cuda", seed=0)
    fill_rollout([buf])
    buf.compute_returns_and_advantages(torch.zeros(10, device="cuda"))
    minibatches = buf.minibatches(num_minibatches=3, n_epochs=2)
    next(minibatches)
    buf.save(tmp_path / "ckpt")
    with pytest.warns(RuntimeWarning, match="another device type"):
        on_cpu = RolloutBuffer.load(tmp_path / "ckpt", storing_device="cpu", device="cpu")
    resumed = on_cpu.current_epochs
    assert resumed is not None
    for _ in range(2):  # the saved permutation of the running epoch moved to the CPU
        assert_same_batch(next(resumed), next(minibatches), ROLLOUT_FIELDS)
