"""An attacker's checks of batch protocols changed this session: a batch of some fields only
(``sample_by_index(..., fields=...)``) copies, deep-copies, pickles and saves as a whole batch does, holding
the same fields (the absent ones still absent), as the protocols promise ("copies and pickles hold the same").
"""

from __future__ import annotations

import copy
import io
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch

from rlbuf import ReplayBuffer, RolloutBuffer


def _replay() -> ReplayBuffer:
    buffer = ReplayBuffer(8, obs_shape=(2,), action_shape=(), seed=0, extra_fields={"cost": ((), torch.float32)})
    for t in range(5):
        buffer.add(torch.full((2,), float(t)), 0.0, float(t), torch.ones(2), False, truncated=False,
                   cost=torch.tensor(2.0 * t))
    return buffer


def _rollout() -> RolloutBuffer:
    buffer = RolloutBuffer(num_steps=2, num_envs=2, obs_shape=(3,), action_shape=(), seed=0)
    for _ in range(2):
        buffer.add(obs=torch.randn(2, 3), action=torch.zeros(2), reward=torch.ones(2), terminated=torch.zeros(2, dtype=torch.bool),
                   value=torch.zeros(2), log_prob=torch.zeros(2), truncated=False)
    return buffer


def _saved(batch: Any) -> Any:
    stream = io.BytesIO()
    torch.save(batch, stream)
    stream.seek(0)
    return torch.load(stream, weights_only=False)


COPIES: dict[str, Callable[[Any], Any]] = {
    "copy.copy": copy.copy, "copy.deepcopy": copy.deepcopy, "pickle": lambda batch: pickle.loads(pickle.dumps(batch)),
    "torch.save": _saved,
}


@pytest.mark.parametrize("how", sorted(COPIES))
@pytest.mark.parametrize("make, fields", [(_replay, ["reward"]), (_replay, ["obs", "cost"]), (_replay, None),
                                          (_rollout, ["value"]), (_rollout, None)])
def test_a_batch_of_some_fields_copies_as_a_whole_batch_does(how: str, make: Callable[[], Any],
                                                             fields: list[str] | None) -> None:
    batch = make().sample_by_index([0, 1, 1], fields=fields)
    copied = COPIES[how](batch)
    assert type(copied) is type(batch) and copied == batch and repr(copied) == repr(batch) and len(copied) == 3
    if fields is not None:
        absent = "action" if "action" not in fields else "obs"
        with pytest.raises(AttributeError, match="holds only the fields asked for"):
            getattr(copied, absent)
    if how == "copy.deepcopy":  # its own tensors
        assert all(getattr(copied, name) is not getattr(batch, name) for name in fields or ["obs"] if name != "cost")


@pytest.mark.parametrize("how", sorted(COPIES))
def test_a_sequence_batch_copies_with_its_burn_in(how: str) -> None:
    batch = _replay().sample_sequences(2, 3, burn_in=1)
    copied = COPIES[how](batch)
    assert type(copied) is type(batch) and copied == batch and copied.burn_in == 1 and len(copied) == 2
