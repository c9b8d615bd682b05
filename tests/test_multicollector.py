"""TorchRL's MultiSyncCollector writes into ``buffer.torchrl`` from worker processes."""

from __future__ import annotations

import warnings
from functools import partial

import torch
from torchrl.collectors import MultiSyncCollector, RandomPolicy
from torchrl.envs import GymEnv

from rlbuf import ReplayBuffer

WORKERS, FRAMES_PER_BATCH, TOTAL_FRAMES = 2, 64, 256
CHUNK = FRAMES_PER_BATCH // WORKERS     # each worker writes its share of a batch in one extend


def test_multi_sync_collector_workers_fill_the_learners_buffer() -> None:
    make_env = partial(GymEnv, "CartPole-v1")
    buffer = ReplayBuffer(TOTAL_FRAMES, obs_shape=(4,), action_shape=(2,), action_dtype=torch.int64, seed=0)
    sizes = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)          # the one-time sharing-strategy notice
        collector = MultiSyncCollector([make_env] * WORKERS, RandomPolicy(make_env().full_action_spec),
                                       frames_per_batch=FRAMES_PER_BATCH, total_frames=TOTAL_FRAMES,
                                       replay_buffer=buffer.torchrl)
        try:
            for nothing in collector:                            # workers write; the collector yields None
                assert nothing is None
                sizes.append(len(buffer))
                batch = buffer.sample(16)                        # the learner samples typed batches
                assert batch.reward.shape == (16,)
        finally:
            collector.shutdown()
    assert sizes == list(range(FRAMES_PER_BATCH, TOTAL_FRAMES + 1, FRAMES_PER_BATCH))
    rows = buffer.sample_all()
    assert torch.equal(rows.reward, torch.ones(TOTAL_FRAMES))                     # CartPole: +1 per step
    assert torch.equal(rows.action.sum(-1), torch.ones(TOTAL_FRAMES, dtype=torch.int64))   # one-hot
    assert torch.equal(rows.done, rows.terminated | rows.truncated)
    assert bool(rows.terminated.any())
    # Each worker's extend is one contiguous block of its own steps: inside a block, the next
    # row starts where this one ended unless the episode ended (then the env was reset).
    for start in range(0, TOTAL_FRAMES, CHUNK):
        block = slice(start, start + CHUNK - 1)
        following = slice(start + 1, start + CHUNK)
        continues = ~rows.done[block]
        assert torch.equal(rows.next_obs[block][continues], rows.obs[following][continues])
