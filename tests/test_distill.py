"""DistillationBuffer: adds, unpacking, extras, storages, devices, epochs, DAgger rounds, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from rlbuf import (
    BatchSizeError,
    DistillationBuffer,
    DtypeError,
    EmptyBufferError,
    MissingFieldError,
    ShapeError,
)


def make(storage: str = "memory", **kwargs: object) -> DistillationBuffer:
    kwargs.setdefault("obs_shape", (3,))
    kwargs.setdefault("action_shape", ())
    kwargs.setdefault("action_dtype", torch.int64)
    kwargs.setdefault("seed", 0)
    return DistillationBuffer(int(kwargs.pop("capacity", 32)), storage=storage, **kwargs)  # type: ignore[arg-type]


def test_add_sample_and_unpack(storage: str, device: str) -> None:
    buf = make(storage, device=device, num_envs=4, extra_fields={"expert_logits": ((2,), torch.float32)})
    for step in range(3):
        ids = torch.arange(4) + 10 * step
        buf.add(ids[:, None].float().expand(4, 3), ids, expert_logits=ids[:, None].float().expand(4, 2))
    assert len(buf) == 12
    batch = buf.sample(16)
    obs, expert_action = batch
    assert obs.shape == (16, 3) and expert_action.shape == (16,) and obs.device.type == device
    assert torch.equal(obs[:, 0].long(), expert_action)
    assert torch.equal(batch.expert_logits[:, 1].long(), expert_action)
    assert batch.to_tensordict()["expert_action"].shape == (16,)


def test_single_env_numpy_and_ring_overwrite(storage: str) -> None:
    buf = make(storage, capacity=3)
    for i in range(5):
        buf.add(np.full(3, i, np.float32), i)
    assert buf.is_full and buf.sample_all().expert_action.tolist() == [2, 3, 4]


def test_uint8_observations_are_compact() -> None:
    buf = make(obs_shape=(16, 16), obs_dtype=torch.uint8)
    buf.add(np.full((16, 16), 200, np.uint8), 1)
    assert buf.torchrl.storage._storage["observation"].dtype == torch.uint8
    assert int(buf.sample_all().obs.max()) == 200


def test_dagger_rounds_aggregate_by_continued_adds() -> None:
    buf = make(capacity=1000, num_envs=10)
    sizes = []
    for round_ in range(3):
        for _ in range(5):
            buf.add(torch.randn(10, 3), torch.full((10,), round_))
        sizes.append(len(buf))
    assert sizes == [50, 100, 150]
    assert set(buf.sample_all().expert_action.tolist()) == {0, 1, 2}


def test_epochs_visit_each_row_once(storage: str) -> None:
    buf = make(storage, capacity=100)
    for i in range(25):
        buf.add(torch.zeros(3), i)
    it = buf.epochs(batch_size=10, n_epochs=2)
    assert len(it) == 6 and buf.num_batches(10) == 3
    batches = list(it)
    for epoch in range(2):
        labels = torch.cat([b.expert_action for b in batches[epoch * 3:(epoch + 1) * 3]]).tolist()
        assert sorted(labels) == list(range(25))


def test_bad_input_changes_nothing() -> None:
    buf = make(extra_fields={"expert_value": ((), torch.float32)})
    buf.add(torch.zeros(3), 1, expert_value=0.5)
    for kwargs, error in (
        ({"obs": torch.zeros(4), "expert_action": 1, "expert_value": 0.5}, ShapeError),
        ({"obs": torch.zeros(3), "expert_action": 1.5, "expert_value": 0.5}, DtypeError),
        ({"obs": torch.zeros(3), "expert_action": 1}, MissingFieldError),
    ):
        with pytest.raises(error):
            buf.add(**kwargs)  # type: ignore[arg-type]
    assert len(buf) == 1 and buf.sample_all().expert_value.tolist() == [0.5]
    with pytest.raises(BatchSizeError):
        buf.sample(0)
    with pytest.raises(BatchSizeError, match="at most 1"):
        buf.epochs(batch_size=2)
    with pytest.raises(EmptyBufferError):
        make().sample(1)


def test_batches_of_any_size_and_one_row_without_batch_dim() -> None:
    buf = DistillationBuffer(100, obs_shape=(2,), action_shape=(), action_dtype=torch.int64, num_envs=16,
                             extra_fields={"expert_logits": ((3,), torch.float32)})
    for rows in (16, 3, 0):
        buf.add(torch.full((rows, 2), float(rows)), torch.full((rows,), rows), expert_logits=torch.zeros(rows, 3))
    buf.add(np.full(2, 1.0, np.float32), 1, expert_logits=np.zeros(3, np.float32))
    data = buf.sample_all()
    assert data.obs[:, 0].tolist() == [16.0] * 16 + [3.0] * 3 + [1.0]
    assert data.expert_action.tolist() == [16] * 16 + [3] * 3 + [1]
    assert buf.num_envs == 16


def test_a_bad_batch_of_another_size_writes_nothing() -> None:
    buf = DistillationBuffer(100, obs_shape=(2,), action_shape=(), action_dtype=torch.int64, num_envs=4)
    with pytest.raises(ShapeError, match="expert_action"):
        buf.add(torch.zeros(3, 2), torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ShapeError, match="obs"):
        buf.add(torch.zeros(3, 5), torch.zeros(3, dtype=torch.int64))
    with pytest.raises(DtypeError, match="expert_action"):
        buf.add(torch.zeros(3, 2), torch.zeros(3))
    assert len(buf) == 0


def test_extend_takes_any_batch_shape() -> None:
    buf = DistillationBuffer(100, obs_shape=(2,), action_shape=(1,), extra_fields={"expert_value": ((), torch.float32)})
    td = TensorDict({"observation": torch.arange(24.0).reshape(3, 4, 2), "expert_action": torch.ones(3, 4, 1),
                     "expert_value": torch.ones(3, 4), "ignored": torch.zeros(3, 4)}, batch_size=[3, 4])
    buf.extend(td)
    assert len(buf) == 12 and buf.sample_all().obs[5].tolist() == [10.0, 11.0]
    with pytest.raises(MissingFieldError, match="expert_value"):
        buf.extend(td.exclude("expert_value"))
    assert len(buf) == 12
