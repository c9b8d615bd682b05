"""Rows tagged with a unique id in every field, for the tests where several writers share a buffer:
a sampled row whose fields carry different ids was torn (parts of two writes)."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from rlbuf import ReplayBatch


def id_rows(uid: torch.Tensor) -> TensorDict:
    """TorchRL-layout rows for ``obs_shape=(3,)``, ``action_shape=(2,)``, every field derived from ``uid``.

    Example:
        >>> rows = id_rows(torch.tensor([4.0, 5.0]))
        >>> rows["action"].tolist(), rows["next", "terminated"].flatten().tolist()
        ([[4.0, 4.0], [5.0, 5.0]], [True, False])
    """
    n = uid.numel()
    return TensorDict({
        "observation": uid[:, None].expand(n, 3).clone(), "action": uid[:, None].expand(n, 2).clone(),
        ("next", "observation"): uid[:, None].expand(n, 3) + 0.5, ("next", "reward"): uid[:, None].clone(),
        ("next", "terminated"): (uid % 2 == 0)[:, None], ("next", "truncated"): torch.zeros(n, 1, dtype=torch.bool),
    }, batch_size=[n])


def check_id_rows(batch: ReplayBatch) -> list[int]:
    """Assert that every field of every row of ``batch`` carries the same id; return the ids.

    Example:
        >>> from rlbuf import ReplayBuffer
        >>> buffer = ReplayBuffer(4, obs_shape=(3,), action_shape=(2,))
        >>> _ = buffer.torchrl.extend(id_rows(torch.tensor([4.0, 5.0])))
        >>> check_id_rows(buffer.sample_all())
        [4, 5]
    """
    reward = batch.reward
    assert torch.equal(batch.obs, reward[:, None].expand(-1, 3)), "torn row: obs"
    assert torch.equal(batch.action, reward[:, None].expand(-1, 2)), "torn row: action"
    assert torch.equal(batch.next_obs, reward[:, None].expand(-1, 3) + 0.5), "torn row: next_obs"
    assert torch.equal(batch.terminated, reward % 2 == 0), "torn row: terminated"
    assert torch.equal(batch.done, batch.terminated | batch.truncated), "torn row: done"
    return [int(r) for r in reward.tolist()]
