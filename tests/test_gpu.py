"""The CUDA paths of every buffer: GPU storage, CPU storage delivering to a GPU, memmap to GPU,
GAE, prioritized replay, epochs and minibatches, EpisodeStats. Checkpoints across devices:
``tests/test_gpu_checkpoints.py``; TorchRL's own API on CUDA data: ``tests/test_gpu_torchrl.py``.

Tests marked ``gpu`` are skipped without CUDA; ``nox -s gpu`` runs them, with the CUDA cases of
the other test files, on a GPU machine. The unmarked tests run the device-dependent branches
that can honestly be chosen on a CPU (the staging path GPU storages use, generator states saved
on another device type, gathering into a new tensor).

Rows are traceable (``tests/_gpu.py``): every field of the row added as env ``e`` at step ``s`` encodes the id
``s * 1000 + e``, and each CUDA buffer is compared with a CPU buffer fed the same inputs.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _gpu import (
    ACT,
    OBS,
    REPLAY_FIELDS,
    ROLLOUT_FIELDS,
    as_input,
    assert_same_batch,
    fill_replay,
    fill_rollout,
    gpu,
    replay_step,
)

import rlbuf._buffer
import rlbuf._ring
from rlbuf import (
    ConfigError,
    DeviceError,
    DistillationBuffer,
    EpisodeStats,
    ReplayBuffer,
    RolloutBuffer,
)
from rlbuf._delivery import gather_rows
from rlbuf._sumtree import SumTreeSampler
from rlbuf.gae import compute_gae


# -- CPU: the device-dependent branches that a CPU can take honestly ------------------------------
@pytest.mark.parametrize("num_envs", [1, 4])
def test_the_staging_path_of_gpu_storages_stores_what_writing_through_stores(
        monkeypatch: pytest.MonkeyPatch, num_envs: int) -> None:
    # GPU storages stage small adds in a numpy block and copy it per field at flush; forcing that
    # path on a CPU storage must change nothing observable, across flushes and wrap-arounds.
    direct = ReplayBuffer(103, obs_shape=(OBS,), action_shape=(ACT,), num_envs=num_envs, seed=3)
    monkeypatch.setattr(rlbuf._ring, "_writes_through", lambda device: False)
    staged = ReplayBuffer(103, obs_shape=(OBS,), action_shape=(ACT,), num_envs=num_envs, seed=3)
    assert not staged._ring.write_through and direct._ring.write_through
    for step in range(300 // num_envs):
        values = replay_step(step, num_envs)
        staged.add(**(as_input(values, "numpy") if step % 2 else values))
        direct.add(**values)
        if step % 37 == 0:
            assert_same_batch(staged.sample(16), direct.sample(16), (*REPLAY_FIELDS, "index"))
    assert len(staged) == len(direct) == 103
    assert_same_batch(staged.sample_all(), direct.sample_all(), REPLAY_FIELDS)


def test_a_staged_rollout_computes_what_a_written_through_one_computes(monkeypatch: pytest.MonkeyPatch) -> None:
    direct = RolloutBuffer(6, 4, obs_shape=(OBS,), action_shape=(ACT,), seed=1)
    monkeypatch.setattr(rlbuf._ring, "_writes_through", lambda device: False)
    staged = RolloutBuffer(6, 4, obs_shape=(OBS,), action_shape=(ACT,), seed=1)
    fill_rollout([staged, direct])
    for buf in (staged, direct):
        buf.compute_returns_and_advantages(torch.ones(4), gamma=0.9, gae_lambda=0.8)
    for name in ROLLOUT_FIELDS:
        assert torch.equal(staged.view(name), direct.view(name)), name


def test_generator_states_saved_on_another_device_type_load_with_a_warning() -> None:
    # A CUDA generator's state is 16 bytes, a CPU one's 5056: a checkpoint written on a GPU and
    # loaded on a CPU (or back) carries states this buffer's generators cannot take. The rows, the
    # counters and the running epoch's permutation still load; the draws that follow differ.
    buf = ReplayBuffer(16, obs_shape=(OBS,), action_shape=(ACT,), seed=0)
    fill_replay([buf], 12)
    epochs = buf.epochs(batch_size=4, n_epochs=2)
    next(epochs)
    state = buf.state_dict()
    cuda_like = torch.zeros(16, dtype=torch.uint8)
    state["rng"] = {"sample": cuda_like, "epochs": state["rng"]["epochs"]}
    state["iterator"]["state"]["generator"] = cuda_like
    copy = ReplayBuffer(16, obs_shape=(OBS,), action_shape=(ACT,), seed=5)
    with pytest.warns(RuntimeWarning, match="saved on another device type"):
        copy.load_state_dict(state)
    assert_same_batch(copy.sample_all(), buf.sample_all(), REPLAY_FIELDS)
    resumed = copy.current_epochs
    assert resumed is not None and len(resumed) == len(epochs) == 5
    for _ in range(2):  # the rest of the running epoch: same permutation, same rows
        assert_same_batch(next(resumed), next(epochs), (*REPLAY_FIELDS, "index"))


@pytest.mark.parametrize("storage", ["memory", "memmap"])
def test_gather_rows_equals_index_select_for_narrow_bool_and_wide_rows(storage: str) -> None:
    with ReplayBuffer(40, obs_shape=(84, 84, 4), action_shape=(), obs_dtype=torch.uint8, action_dtype=torch.int64,
                      num_envs=8, storage=storage, seed=0) as buf:  # type: ignore[arg-type]
        for step in range(5):
            frames = torch.randint(0, 256, (8, 84, 84, 4), dtype=torch.uint8)
            buf.add(frames, torch.arange(8) + step, torch.ones(8), frames, torch.arange(8) % 2 == 0, truncated=False)
        ring = buf._ring
        ring.flush()
        index = torch.tensor([39, 0, 7, 7, 21])
        gathered = ring._select(index, None)  # a CPU storage: numpy's take for every field
        for name in ("obs", "action", "terminated", "reward"):
            for got in (gather_rows(ring.leaves[name], ring._arrays[name], index, pin_memory=False),
                        gather_rows(ring.leaves[name], None, index, pin_memory=False), gathered[name]):
                assert got.dtype == ring.leaves[name].dtype
                assert torch.equal(got, ring.leaves[name].index_select(0, index)), name


# -- storing on the GPU ----------------------------------------------------------------------------
@gpu
@pytest.mark.parametrize(("num_envs", "steps", "capacity"), [(1, 300, 257), (4, 80, 303), (300, 5, 1051)])
@pytest.mark.parametrize("kind", ["numpy", "cpu", "cuda", "mixed"])
def test_cuda_storage_stores_what_a_cpu_storage_stores(num_envs: int, steps: int, capacity: int, kind: str) -> None:
    # num_envs 1 and 4 go through the numpy staging block (flushed every 256 rows and at reads);
    # 300 rows per add are copied to the device at once; all cases wrap around the ring.
    on_gpu = ReplayBuffer(capacity, obs_shape=(OBS,), action_shape=(ACT,), num_envs=num_envs,
                          storing_device="cuda", seed=0)
    on_cpu = ReplayBuffer(capacity, obs_shape=(OBS,), action_shape=(ACT,), num_envs=num_envs, seed=0)
    fill_replay([on_gpu, on_cpu], steps, kind)
    assert len(on_gpu) == len(on_cpu) == capacity
    assert on_gpu.state_dict()["fields"]["obs"].is_cuda
    batch = on_gpu.sample_all()
    assert all(getattr(batch, name).is_cuda for name in (*REPLAY_FIELDS, "index", "weight"))
    assert_same_batch(batch, on_cpu.sample_all(), REPLAY_FIELDS)
    sample = on_gpu.sample(64)
    assert sample.index.is_cuda
    assert_same_batch(sample, on_cpu.sample_by_index(sample.index.cpu()), REPLAY_FIELDS)


@gpu
def test_sampling_a_cuda_replay_never_waits_for_the_gpu() -> None:
    buf = ReplayBuffer(1000, obs_shape=(OBS,), action_shape=(ACT,), num_envs=100, storing_device="cuda", seed=0)
    fill_replay([buf], 10)
    buf.sample(8)  # commits the staged rows
    torch.cuda.set_sync_debug_mode("error")  # any host-device synchronisation raises
    try:
        batch = buf.sample(256)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert batch.obs.is_cuda and batch.weight.is_cuda


@gpu
def test_cuda_distillation_buffer_stores_and_delivers_on_the_gpu() -> None:
    on_gpu = DistillationBuffer(50, obs_shape=(OBS,), action_shape=(ACT,), num_envs=4, storing_device="cuda", seed=0)
    on_cpu = DistillationBuffer(50, obs_shape=(OBS,), action_shape=(ACT,), num_envs=4, seed=0)
    for step in range(20):
        values = replay_step(step, 4)
        on_gpu.add(values["obs"].cuda() if step % 2 else values["obs"], values["action"])
        on_cpu.add(values["obs"], values["action"])
    got, expected = on_gpu.sample_all(), on_cpu.sample_all()
    assert got.obs.is_cuda and got.expert_action.is_cuda
    assert torch.equal(got.obs.cpu(), expected.obs) and torch.equal(got.expert_action.cpu(), expected.expert_action)


@gpu
def test_a_cuda_rollout_stores_and_computes_what_a_cpu_rollout_does() -> None:
    for num_envs, kind in ((4, "mixed"), (300, "cuda"), (300, "numpy")):
        on_gpu = RolloutBuffer(8, num_envs, obs_shape=(OBS,), action_shape=(ACT,), storing_device="cuda", seed=0)
        on_cpu = RolloutBuffer(8, num_envs, obs_shape=(OBS,), action_shape=(ACT,), seed=0)
        fill_rollout([on_gpu, on_cpu], kind)
        last_value = torch.randn(num_envs)
        on_gpu.compute_returns_and_advantages(last_value.cuda(), gamma=0.99, gae_lambda=0.95)
        on_cpu.compute_returns_and_advantages(last_value, gamma=0.99, gae_lambda=0.95)
        for name in ROLLOUT_FIELDS:
            got, expected = on_gpu.view(name), on_cpu.view(name)
            assert got.is_cuda, name
            if name in ("advantage", "returns"):  # float64 on the GPU vs the CPU kernel: rounding only
                torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5)
            else:
                assert torch.equal(got.cpu(), expected), name


@gpu
def test_memmap_storage_cannot_live_on_the_gpu() -> None:
    with pytest.raises(ConfigError, match="storage='memmap' keeps data in files on the CPU"):
        ReplayBuffer(8, obs_shape=(OBS,), action_shape=(ACT,), storage="memmap", storing_device="cuda")


# -- CPU storage, CUDA learner ---------------------------------------------------------------------
@gpu
@pytest.mark.parametrize("storage", ["memory", "memmap"])
@pytest.mark.parametrize("images", [False, True])
def test_cpu_and_memmap_storage_deliver_intact_batches_on_cuda(storage: str, images: bool) -> None:
    shape, dtype = ((84, 84, 4), torch.uint8) if images else ((48,), torch.float32)
    options: dict[str, Any] = {"obs_shape": shape, "action_shape": (ACT,), "obs_dtype": dtype, "num_envs": 16,
                               "seed": 0, "storage": storage}
    with ReplayBuffer(200, device="cuda", **options) as buf, ReplayBuffer(200, **options) as reference:
        for _ in range(15):
            obs = (torch.randint(0, 256, (16, *shape), dtype=dtype) if images else torch.randn(16, *shape))
            values = {"obs": obs, "action": torch.randn(16, ACT), "reward": torch.randn(16), "next_obs": obs.flip(0),
                      "terminated": torch.rand(16) < 0.5, "truncated": torch.rand(16) < 0.1}
            buf.add(**values)
            reference.add(**values)
        assert buf.state_dict()["fields"]["obs"].device.type == "cpu"
        batch = buf.sample(128)
        assert all(getattr(batch, name).is_cuda for name in (*REPLAY_FIELDS, "index", "weight"))
        assert_same_batch(batch, reference.sample_by_index(batch.index.cpu()), REPLAY_FIELDS)
        rows = buf.sample_by_index(batch.index, fields=["obs"])
        assert rows.obs.is_cuda and torch.equal(rows.obs, batch.obs)


@gpu
def test_cpu_rows_for_a_cuda_learner_are_gathered_into_pinned_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, bool]] = []
    deliver = rlbuf._buffer.deliver

    def spy(tensors: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
        seen.append({name: tensor.is_pinned() for name, tensor in tensors.items()})
        return deliver(tensors, device)

    monkeypatch.setattr(rlbuf._buffer, "deliver", spy)
    buf = ReplayBuffer(64, obs_shape=(OBS,), action_shape=(ACT,), num_envs=8, device="cuda", seed=0)
    fill_replay([buf], 8)
    buf.sample(32)
    assert seen and all(seen[-1][name] for name in REPLAY_FIELDS)  # gathered straight into pinned memory
    assert not seen[-1]["index"]  # the sampler's own tensors are pinned by deliver


@gpu
def test_pinned_non_blocking_batches_are_intact_for_the_next_kernel() -> None:
    # Each batch is copied with non_blocking=True from page-locked memory and read by a kernel at
    # once, with no synchronisation, while earlier copies may still run (their pinned blocks must
    # not be reused too early). Exact integer checksums of the bits, compared with the CPU rows
    # at the end, catch any row that arrived torn or stale.
    buf = ReplayBuffer(20_000, obs_shape=(48,), action_shape=(ACT,), num_envs=1000, device="cuda", seed=0)
    generator = torch.Generator().manual_seed(0)

    def add_random() -> None:
        obs = torch.randn(1000, 48, generator=generator)
        buf.add(obs, torch.randn(1000, ACT, generator=generator), torch.randn(1000, generator=generator),
                obs + 1, torch.zeros(1000, dtype=torch.bool), truncated=False)

    def checksum(obs: torch.Tensor, next_obs: torch.Tensor) -> torch.Tensor:
        return obs.view(torch.int32).long().sum(1) + next_obs.view(torch.int32).long().sum(1)

    for _ in range(20):
        add_random()
    fields = buf.state_dict()["fields"]  # CPU copies of the whole (full) storage
    batches = [buf.sample(4096) for _ in range(48)]
    sums = [checksum(batch.obs, batch.next_obs) for batch in batches]
    torch.cuda.synchronize()
    for batch, got in zip(batches, sums, strict=True):
        index = batch.index.cpu()
        assert torch.equal(got.cpu(), checksum(fields["obs"][index], fields["next_obs"][index]))
    # The storage overwritten right after a sample: the batch was gathered before, it keeps the old rows.
    overwritten = []
    for _ in range(8):
        fields = buf.state_dict()["fields"]  # a copy of the rows as they are now
        before = (fields["obs"], fields["next_obs"])
        batch = buf.sample(4096)
        overwritten.append((checksum(batch.obs, batch.next_obs), batch.index, before))
        add_random()
    torch.cuda.synchronize()
    for got, index, (obs, next_obs) in overwritten:
        assert torch.equal(got.cpu(), checksum(obs[index.cpu()], next_obs[index.cpu()]))


@gpu
def test_cpu_storage_refuses_cuda_inputs_and_stays_unchanged() -> None:
    buf = ReplayBuffer(16, obs_shape=(OBS,), action_shape=(ACT,), num_envs=2, device="cuda", seed=0)
    fill_replay([buf], 2)
    before = buf.state_dict()
    values = as_input(replay_step(9, 2), "cpu")
    values["action"] = values["action"].cuda()
    with pytest.raises(DeviceError, match="action: expected a tensor on cpu, got one on cuda"):
        buf.add(**values)
    after = buf.state_dict()
    assert (after["size"], after["cursor"]) == (before["size"], before["cursor"])
    assert torch.equal(after["rng"]["sample"], before["rng"]["sample"])


# -- GAE -------------------------------------------------------------------------------------------
@gpu
@pytest.mark.parametrize(("num_steps", "num_envs"), [(24, 4096), (512, 3)])
@pytest.mark.parametrize("time_dim", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gae_on_cuda_equals_the_cpu_reference(num_steps: int, num_envs: int, time_dim: int,
                                              dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(num_steps)
    shape = (num_steps, num_envs) if time_dim == 0 else (num_envs, num_steps)
    reward, value, bootstrap = (torch.randn(shape, generator=generator, dtype=dtype) for _ in range(3))
    terminated = torch.rand(shape, generator=generator) < 0.05
    truncated = ~terminated & (torch.rand(shape, generator=generator) < 0.02)
    last_value = torch.randn(num_envs, generator=generator, dtype=dtype)
    inputs = (reward, value, terminated, truncated, last_value)
    options: dict[str, Any] = {"gamma": 0.99, "gae_lambda": 0.95, "time_dim": time_dim}
    expected = compute_gae(*inputs, bootstrap_value=bootstrap, **options)
    got = compute_gae(*(t.cuda() for t in inputs), bootstrap_value=bootstrap.cuda(), **options)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-10
    for a, b in zip(got, expected, strict=True):
        assert a.is_cuda and a.dtype == dtype
        torch.testing.assert_close(a.cpu(), b, rtol=tolerance, atol=tolerance)


# -- prioritized replay ----------------------------------------------------------------------------
@gpu
@pytest.mark.parametrize("storing_device", ["cuda", "cpu"])
def test_prioritized_replay_draws_and_weighs_on_the_training_device(storing_device: str) -> None:
    buf = ReplayBuffer(8, obs_shape=(OBS,), action_shape=(ACT,), prioritized=True, alpha=1.0, beta=1.0,
                       storing_device=storing_device, device="cuda", seed=0)
    fill_replay([buf], 8)
    sampler = buf.torchrl.sampler
    assert isinstance(sampler, SumTreeSampler) and sampler.device == torch.device("cpu")  # numpy tree, by design
    buf.update_priority(torch.arange(8, device="cuda"), torch.arange(1.0, 9.0, device="cuda"))
    batch = buf.sample(20_000)
    assert batch.index.is_cuda and batch.weight.is_cuda and batch.obs.is_cuda
    assert batch.weight.dtype == torch.float32
    # weight = (q_i / q_min) ** -beta with q = p + eps: 1 / p_i here.
    torch.testing.assert_close(batch.weight, 1.0 / (batch.index.float() + 1.0), rtol=1e-5, atol=1e-6)
    frequency = torch.bincount(batch.index, minlength=8).float().cpu() / len(batch.index)
    torch.testing.assert_close(frequency, torch.arange(1.0, 9.0) / 36.0, rtol=0.0, atol=0.02)
    assert torch.equal(batch.obs[:, 0].cpu(), (batch.index.cpu() * 1000).float())  # rows match their index
    buf.update_priority(batch.index[:4], torch.zeros(4, device="cuda"))  # TD errors straight from the GPU
    assert buf.sample(4).weight.is_cuda


# -- epochs and minibatches ------------------------------------------------------------------------
@gpu
@pytest.mark.parametrize(("storage", "storing_device"), [("memory", "cuda"), ("memory", "cpu"), ("memmap", "cpu")])
def test_replay_epochs_visit_every_row_once_on_cuda(storage: str, storing_device: str) -> None:
    with ReplayBuffer(60, obs_shape=(OBS,), action_shape=(ACT,), num_envs=4, storage=storage,  # type: ignore[arg-type]
                      storing_device=storing_device, device="cuda", seed=0) as buf:
        fill_replay([buf], 12)
        batches = list(buf.epochs(batch_size=7, n_epochs=2))
        assert len(batches) == 2 * 7
        for epoch in (batches[:7], batches[7:]):
            index = torch.cat([batch.index for batch in epoch])
            assert index.is_cuda and torch.equal(index.sort().values, torch.arange(48, device="cuda"))
        for batch in batches:
            assert batch.obs.is_cuda
            assert torch.equal(batch.reward, batch.obs[:, 0])  # each row's fields belong together


@gpu
@pytest.mark.parametrize(("storage", "storing_device"), [("memory", "cuda"), ("memory", "cpu"), ("memmap", "cpu")])
def test_rollout_minibatches_cover_the_rollout_on_cuda(storage: str, storing_device: str) -> None:
    with RolloutBuffer(6, 10, obs_shape=(OBS,), action_shape=(ACT,), storage=storage,  # type: ignore[arg-type]
                       storing_device=storing_device, device="cuda", seed=0) as buf:
        fill_rollout([buf])
        buf.compute_returns_and_advantages(torch.zeros(10, device=storing_device))
        buf.set_extras({"old_mean": torch.arange(60.0, device=storing_device).view(6, 10, 1).expand(6, 10, 3)})
        ids = buf.view("obs")[..., 0].reshape(-1).cpu()
        advantage = buf.view("advantage").reshape(-1).cpu()
        batches = list(buf.minibatches(num_minibatches=4, n_epochs=3))
        assert len(batches) == 12
        for epoch in range(3):
            seen = torch.cat([batch.obs[:, 0] for batch in batches[4 * epoch:4 * epoch + 4]])
            assert seen.is_cuda and torch.equal(seen.sort().values.cpu(), ids.sort().values)
        for batch in batches:
            assert batch.advantage.is_cuda and batch.extras["old_mean"].is_cuda
            row = torch.searchsorted(ids, batch.obs[:, 0].cpu())  # ids are increasing in storage order
            assert torch.equal(batch.advantage.cpu(), advantage[row])
            assert torch.equal(batch.extras["old_mean"][:, 0].cpu(), row.float())


# -- episode statistics ----------------------------------------------------------------------------
@gpu
def test_episode_stats_fed_by_a_cuda_rollout_match_a_cpu_one() -> None:
    on_gpu, on_cpu = EpisodeStats(50), EpisodeStats(50)
    gpu_buffer = RolloutBuffer(20, 50, obs_shape=(OBS,), action_shape=(ACT,), storing_device="cuda", stats=on_gpu)
    cpu_buffer = RolloutBuffer(20, 50, obs_shape=(OBS,), action_shape=(ACT,), stats=on_cpu)
    fill_rollout([gpu_buffer, cpu_buffer], "cuda")
    assert on_gpu.episodes_finished == on_cpu.episodes_finished > 0
    assert on_gpu.summary() == on_cpu.summary()
    assert on_gpu.recent_returns() == on_cpu.recent_returns()
