"""The ``gpu`` mark and traceable rows for the CUDA tests (``tests/test_gpu*.py``): every field of the row
added as env ``e`` at step ``s`` encodes the id ``s * 1000 + e``; buffers filled alike and batches compared
field by field.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import torch

from rlbuf import ReplayBuffer, RolloutBuffer

OBS, ACT = 5, 2
CUDA_AVAILABLE = torch.cuda.is_available()
F = TypeVar("F", bound=Callable[..., Any])


def gpu(test: F) -> F:
    """Mark a test as needing CUDA: the `gpu` mark, and a skip where there is none."""
    return pytest.mark.gpu(pytest.mark.skipif(not CUDA_AVAILABLE, reason="needs a CUDA device")(test))  # type: ignore[no-any-return]


# -- data ----------------------------------------------------------------------------------------
def replay_step(step: int, num_envs: int) -> dict[str, torch.Tensor]:
    """One step of ``num_envs`` transitions on the CPU; every field encodes its row id."""
    ids = torch.arange(num_envs) + step * 1000
    obs = ids[:, None].float() + torch.arange(OBS) / 8
    return {"obs": obs, "action": ids[:, None].float().expand(num_envs, ACT).clone(), "reward": ids.float(),
            "next_obs": obs + 0.5, "terminated": ids % 3 == 0, "truncated": ids % 5 == 0}


def rollout_step(step: int, num_envs: int) -> dict[str, torch.Tensor]:
    """One rollout step on the CPU: traceable obs, ~10 % terminations, ~5 % timeouts."""
    ids = torch.arange(num_envs) + step * 1000
    generator = torch.Generator().manual_seed(step)
    terminated = torch.rand(num_envs, generator=generator) < 0.1
    truncated = ~terminated & (torch.rand(num_envs, generator=generator) < 0.05)
    return {"obs": ids[:, None].float() + torch.arange(OBS) / 8, "action": torch.randn(num_envs, ACT, generator=generator),
            "reward": torch.randn(num_envs, generator=generator), "terminated": terminated, "truncated": truncated,
            "value": torch.randn(num_envs, generator=generator), "log_prob": torch.randn(num_envs, generator=generator),
            "bootstrap_value": torch.randn(num_envs, generator=generator)}


def as_input(values: dict[str, torch.Tensor], kind: str) -> dict[str, Any]:
    """The same values as numpy arrays, CPU tensors or CUDA tensors."""
    if kind == "numpy":
        return {name: value.numpy() for name, value in values.items()}
    if kind == "cuda":
        return {name: value.cuda() for name, value in values.items()}
    return dict(values)


def kinds(kind: str) -> Iterator[str]:
    """The input kind of each step: one kind, or all of them in turn (``"mixed"``)."""
    order = ["numpy", "cuda", "cpu"] if kind == "mixed" else [kind]
    step = 0
    while True:
        yield order[step % len(order)]
        step += 1


def fill_replay(buffers: list[ReplayBuffer], steps: int, kind: str = "cpu", start: int = 0) -> None:
    """Add ``steps`` steps to each buffer; the first gets ``kind`` inputs, the others CPU tensors."""
    step_kinds = kinds(kind)
    for step in range(start, start + steps):
        values = replay_step(step, buffers[0].num_envs)
        buffers[0].add(**as_input(values, next(step_kinds)))
        for other in buffers[1:]:
            other.add(**values)


def fill_rollout(buffers: list[RolloutBuffer], kind: str = "cpu") -> None:
    """Fill each rollout; the first gets ``kind`` inputs, the others CPU tensors."""
    step_kinds = kinds(kind)
    for step in range(buffers[0].num_steps):
        values = rollout_step(step, buffers[0].num_envs)
        buffers[0].add(**as_input(values, next(step_kinds)))
        for other in buffers[1:]:
            other.add(**values)


def assert_same_batch(got: Any, expected: Any, fields: tuple[str, ...]) -> None:
    for name in fields:
        assert torch.equal(getattr(got, name).cpu(), getattr(expected, name).cpu()), name


REPLAY_FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated", "done")
ROLLOUT_FIELDS = ("obs", "action", "reward", "terminated", "truncated", "value", "log_prob", "advantage", "returns")
