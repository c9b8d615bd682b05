"""Buffers of every kind fed identical random data, and lockstep comparisons, for the checkpoint tests.

Example:
    >>> buffers = [make("replay"), make("replay")]
    >>> add_steps(buffers, "replay", torch.Generator().manual_seed(0), 3)
    >>> assert_lockstep(buffers, lambda buffer: buffer.sample(4))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from rlbuf import DistillationBuffer, ReplayBuffer, RolloutBuffer

STORAGES = ["memory", "memmap"]
KINDS = ["replay", "prioritized", "rollout", "distillation"]
Buffer = Any  # any rlbuf buffer: the tests call each kind's own methods


def make(kind: str, storage: str = "memory", *, capacity: int = 8, num_envs: int = 2, seed: int = 0) -> Buffer:
    """A buffer of ``kind`` with an extra field (``capacity`` is ``num_steps`` for a rollout)."""
    if kind in ("replay", "prioritized"):
        return ReplayBuffer(capacity, obs_shape=(3,), action_shape=(2,), num_envs=num_envs,
                            prioritized=kind == "prioritized", storage=storage,  # type: ignore[arg-type]
                            **({"alpha": 0.7, "beta": 0.5} if kind == "prioritized" else {}),
                            seed=seed, extra_fields={"cost": ((), torch.float32)})
    if kind == "distillation":
        return DistillationBuffer(capacity, obs_shape=(3,), action_shape=(), action_dtype=torch.int64,
                                  num_envs=num_envs, storage=storage, seed=seed,  # type: ignore[arg-type]
                                  extra_fields={"expert_logits": ((4,), torch.float32)})
    return RolloutBuffer(capacity, num_envs, obs_shape=(3,), action_shape=(), action_dtype=torch.int64,
                         storage=storage, seed=seed, extra_fields={"mask": ((4,), torch.bool)})  # type: ignore[arg-type]


def add_steps(buffers: Sequence[Buffer], kind: str, data: torch.Generator, steps: int) -> None:
    """``steps`` adds of ``num_envs`` random rows each, the same rows into every buffer."""
    n = buffers[0].num_envs
    for _ in range(steps):
        obs = torch.randn(n, 3, generator=data)
        if kind == "distillation":
            values: dict[str, Any] = dict(obs=obs, expert_action=torch.randint(0, 4, (n,), generator=data),
                                          expert_logits=torch.randn(n, 4, generator=data))
        elif kind == "rollout":
            terminated = torch.rand(n, generator=data) < 0.2
            values = dict(obs=obs, action=torch.randint(0, 4, (n,), generator=data),
                          reward=torch.randn(n, generator=data), terminated=terminated,
                          value=torch.randn(n, generator=data), log_prob=torch.randn(n, generator=data),
                          truncated=~terminated & (torch.rand(n, generator=data) < 0.2),
                          bootstrap_value=torch.randn(n, generator=data), mask=torch.rand(n, 4, generator=data) < 0.5)
        else:
            values = dict(obs=obs, action=torch.randn(n, 2, generator=data), reward=torch.randn(n, generator=data),
                          next_obs=torch.randn(n, 3, generator=data), terminated=torch.rand(n, generator=data) < 0.1,
                          truncated=torch.rand(n, generator=data) < 0.1, cost=torch.randn(n, generator=data))
        for buf in buffers:
            buf.add(**values)


def same_tensor(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), what


def assert_same(batches: Sequence[Any]) -> None:
    """Batches equal in every field (index and weight included), value, dtype and shape."""
    first = batches[0]
    for other in batches[1:]:
        assert type(other) is type(first)
        for field in dataclasses.fields(first):
            a, b = getattr(first, field.name), getattr(other, field.name)
            if isinstance(a, dict):
                assert a.keys() == b.keys(), field.name
                for key in a:
                    same_tensor(a[key], b[key], f"{field.name}[{key!r}]")
            elif a is None:
                assert b is None, field.name
            else:
                same_tensor(a, b, field.name)


def counters(buf: Buffer) -> tuple[int, int, int]:
    return len(buf), buf._ring.cursor, buf._ring.write_count


def assert_lockstep(buffers: Sequence[Buffer], call: Callable[[Buffer], Any]) -> None:
    assert_same([call(buf) for buf in buffers])


def rest(iterator: Iterator[Any], n_epochs: int) -> list[Any]:
    """What an epoch iterator has left (three batches of an endless one)."""
    return list(iterator) if n_epochs else [next(iterator) for _ in range(3)]


def update_priorities(buffers: Sequence[Buffer], data: torch.Generator, batch_size: int) -> None:
    batches = [buf.sample(batch_size) for buf in buffers]
    assert_same(batches)
    priority = torch.rand(batch_size, generator=data, dtype=torch.float64) * 3
    for buf, batch in zip(buffers, batches, strict=True):
        buf.update_priority(batch.index, priority)


def close_all(buffers: Sequence[Buffer]) -> None:
    for buf in buffers:
        buf.close()
