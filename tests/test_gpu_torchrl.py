"""TorchRL's own API on CUDA data (marked ``gpu``: skipped without CUDA): TorchRL's ``extend`` seen by
rlbuf, rlbuf's ``extend`` of CUDA data, a rollout extended from a CUDA collector's batch, non-finite steps.
"""

from __future__ import annotations

import pytest
import torch
from _gpu import ACT, OBS, ROLLOUT_FIELDS, as_input, fill_replay, fill_rollout, gpu, rollout_step
from tensordict import TensorDict

from rlbuf import DeviceError, EpisodeStats, NonFiniteError, ReplayBuffer, RolloutBuffer


# -- TorchRL's API on CUDA data --------------------------------------------------------------------
def transitions_td(rows: int, start: int, device: str) -> TensorDict:
    ids = torch.arange(rows, dtype=torch.float32) + start
    obs = ids[:, None].expand(rows, OBS).clone()
    return TensorDict({"observation": obs, "action": torch.zeros(rows, ACT),
                       "next": {"observation": obs + 0.5, "reward": ids[:, None],
                                "terminated": (ids % 2 == 0)[:, None], "truncated": (ids % 3 == 0)[:, None]}},
                      batch_size=[rows], device=device)


@gpu
@pytest.mark.parametrize("storing_device", ["cuda", "cpu"])
def test_torchrl_extend_with_cuda_data_is_seen_by_rlbuf(storing_device: str) -> None:
    buf = ReplayBuffer(32, obs_shape=(OBS,), action_shape=(ACT,), num_envs=2, storing_device=storing_device,
                       device="cuda", seed=0)
    fill_replay([buf], 3)  # pending rows: committed before TorchRL writes
    data = transitions_td(10, 100, "cuda")
    if storing_device == "cpu":  # rows on the CPU take CPU tensors, as add does: the message says how
        with pytest.raises(DeviceError, match=r"expected a tensor on cpu, got one on cuda:0: move it there first"):
            buf.torchrl.extend(data)
        assert len(buf) == 6
        data = data.to("cpu")
    buf.torchrl.extend(data)
    assert len(buf) == 16
    batch = buf.sample_all()
    assert batch.obs.is_cuda
    assert batch.reward[6:].tolist() == [float(i) for i in range(100, 110)]
    assert torch.equal(batch.done[6:], batch.terminated[6:] | batch.truncated[6:])
    td = buf.torchrl.sample(8)
    assert td["observation"].device.type == storing_device


@gpu
def test_rlbuf_extend_takes_cuda_data_on_a_cuda_storage_only() -> None:
    on_gpu = ReplayBuffer(32, obs_shape=(OBS,), action_shape=(ACT,), storing_device="cuda", seed=0)
    on_gpu.extend(transitions_td(10, 0, "cuda"))
    assert on_gpu.sample_all().reward.tolist() == [float(i) for i in range(10)]
    on_cpu = ReplayBuffer(32, obs_shape=(OBS,), action_shape=(ACT,), device="cuda", seed=0)
    with pytest.raises(DeviceError, match="expected a tensor on cpu"):
        on_cpu.extend(transitions_td(10, 0, "cuda"))
    assert len(on_cpu) == 0


@gpu
def test_a_rollout_extends_from_a_cuda_collector_batch() -> None:
    num_envs, steps = 3, 4
    td = TensorDict({"observation": torch.randn(num_envs, steps, OBS), "action": torch.randn(num_envs, steps, ACT),
                     "state_value": torch.randn(num_envs, steps, 1), "sample_log_prob": torch.randn(num_envs, steps),
                     "next": {"reward": torch.randn(num_envs, steps, 1), "state_value": torch.randn(num_envs, steps, 1),
                              "terminated": torch.zeros(num_envs, steps, 1, dtype=torch.bool),
                              "truncated": torch.ones(num_envs, steps, 1, dtype=torch.bool)}},
                    batch_size=[num_envs, steps])
    stats_gpu, stats_cpu = EpisodeStats(num_envs), EpisodeStats(num_envs)
    on_gpu = RolloutBuffer(steps, num_envs, obs_shape=(OBS,), action_shape=(ACT,), storing_device="cuda",
                           stats=stats_gpu)
    on_cpu = RolloutBuffer(steps, num_envs, obs_shape=(OBS,), action_shape=(ACT,), stats=stats_cpu)
    on_gpu.extend(td.to("cuda"))
    on_cpu.extend(td)
    for buf in (on_gpu, on_cpu):
        buf.compute_returns_and_advantages(torch.zeros(num_envs, device=buf.storing_device))
    for name in ROLLOUT_FIELDS:
        torch.testing.assert_close(on_gpu.view(name).cpu(), on_cpu.view(name), rtol=1e-5, atol=1e-5)
    assert stats_gpu.summary() == stats_cpu.summary() and stats_gpu.episodes_finished == num_envs * steps


@gpu
@pytest.mark.parametrize(("field", "bad"), [("value", float("nan")), ("bootstrap_value", float("-inf")),
                                            ("reward", float("inf"))])
def test_a_cuda_rollout_refuses_a_non_finite_step_naming_its_field_and_row(field: str, bad: float) -> None:
    # The finiteness of a step's device tensors is checked with one wait for the GPU; the refusal
    # still names the field and the row, and stores nothing.
    buf = RolloutBuffer(4, 8, obs_shape=(OBS,), action_shape=(ACT,), storing_device="cuda", seed=0)
    fill_rollout([buf], "cuda")  # a full rollout: the next add starts over
    buf.clear()
    values = as_input(rollout_step(0, 8), "cuda")
    values["reward"] = torch.full((8,), 3e38, device="cuda")  # huge but finite: a float32 sum would overflow
    buf.add(**values)
    values[field] = values[field].clone()
    values[field][5] = bad
    with pytest.raises(NonFiniteError, match=rf"{field}: expected finite values, got -?(nan|inf) at row 5"):
        buf.add(**values)
    assert buf.steps == 1
