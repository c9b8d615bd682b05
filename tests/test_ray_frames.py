"""A ReplayService of compact shards sends each distinct frame of a batch once (compressed as stored) and the
learner rebuilds the stacks: the batches are, bit for bit, those the shards build and send whole, with
priorities, episode ends and a trained zstd dictionary, which travels once per shard."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from _ray_cluster import local_ray
from _stacked_envs import Envs, torchrl_steps

ray = pytest.importorskip("ray")

from rlbuf.ray import ReplayService  # noqa: E402

DICTIONARY_AFTER = 1024  # rlbuf._frames' threshold: each shard trains its dictionary past it


@pytest.fixture(scope="module", autouse=True)
def ray_cluster() -> Iterator[None]:
    """One local Ray instance for the module, on loopback, shut down at the end."""
    yield from local_ray(sys.modules[__name__])


def frozen(batch: Any) -> dict[str, Any]:
    """A batch's every field as (dtype, shape, bytes)."""
    def one(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return str(value.dtype), tuple(value.shape), value.contiguous().view(torch.uint8).numpy().tobytes()
        return {key: one(item) for key, item in value.items()} if isinstance(value, dict) else value
    return {field.name: one(getattr(batch, field.name)) for field in dataclasses.fields(batch)}


def test_frames_sent_once_rebuild_the_batches_the_shards_send_whole(tmp_path: Path) -> None:
    """The same draws twice (a restore in between): frames sent once, then stacks sent whole; prioritized shards
    of zstd frames, each past the point where it trains its dictionary."""
    steps = DICTIONARY_AFTER // 2 + 40   # per env: each shard stores 1,104 frames
    ends = [[1 if t % 23 == 22 else 0, 2 if t % 31 == 30 else 0] for t in range(steps)]
    with ReplayService(2 * 2048, num_shards=2, obs_shape=(4, 3, 2), obs_dtype=torch.uint8, action_shape=(),
                       action_dtype=torch.int64, num_envs=2, frame_stack=4, n_step=3, padding_type="zero",
                       prioritized=True, compression="zstd", seed=5, actor_options={"num_cpus": 0}) as service:
        for w in range(2):
            service.writer(writer_id=w).extend(torchrl_steps(Envs(2, 4, "zero", torch.uint8, False, seed=w), ends))
        service.save(tmp_path / "replay")
        runs = []
        for on_learner in (True, False):
            service.restore(tmp_path / "replay")
            service._frames_on_learner = on_learner
            batches = []
            for _ in range(4):
                batches.append(frozen(batch := service.sample(64)))
                service.update_priority(batch.index, batch.reward.abs() + 0.5)
            runs.append(batches)
        assert runs[0] == runs[1]
        # Both shards hold alike frames here, so alike dictionaries: one id, kept once.
        assert len(service._decoders.known) == 1
