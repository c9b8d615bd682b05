"""Envs whose observations are frame stacks as gymnasium's FrameStackObservation builds them (both padding
types, episode ends of either kind, dict observations), each frame unique: what compact-layout tests feed."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

FRAME = (3, 2)
STATE = (2,)


class Envs:
    """``num_envs`` envs whose frames are stacked as gymnasium's FrameStackObservation stacks them."""

    def __init__(self, num_envs: int, frame_stack: int, padding_type: str, dtype: torch.dtype, dict_obs: bool,
                 seed: int) -> None:
        self.num_envs, self.k, self.padding_type, self.dtype, self.dict_obs = (num_envs, frame_stack, padding_type,
                                                                                dtype, dict_obs)
        self.rng = np.random.default_rng(seed)
        self.count = 0
        self.stacks = [self._started() for _ in range(num_envs)]

    def _frame(self) -> torch.Tensor:
        self.count += 1
        values = (np.arange(np.prod(FRAME)).reshape(FRAME) * 7 + self.count * 13) % 251
        return torch.from_numpy(values).to(self.dtype)

    def _started(self) -> deque[torch.Tensor]:
        first = self._frame()
        pad = first if self.padding_type == "reset" else torch.zeros_like(first)
        return deque([pad] * (self.k - 1) + [first], maxlen=self.k)

    def _obs(self, stack: deque[torch.Tensor]) -> Any:
        image = torch.stack(list(stack)) if self.k > 1 else stack[-1]
        if not self.dict_obs:
            return image
        state = image.float().reshape(*image.shape[:-2], -1)[..., :2] * 0.5
        return {"image": image, "state": state}

    def step(self, ends: list[int], reset_steps: Sequence[int] = ()) -> tuple[Any, ...]:
        """One step of every env; ``ends[e]``: 0 goes on, 1 terminates, 2 truncates env ``e``'s episode.

        An env in ``reset_steps`` gives gymnasium's ``NEXT_STEP`` reset step instead (its row is junk: leave it
        out with ``env_mask``): its stream does not move, its flags are False.
        """
        obs = [self._obs(stack) for stack in self.stacks]
        for e, stack in enumerate(self.stacks):
            if e not in reset_steps:
                stack.append(self._frame())
        next_obs = [self._obs(stack) for stack in self.stacks]
        ends = [0 if e in reset_steps else end for e, end in enumerate(ends)]
        for e, end in enumerate(ends):
            if end:
                self.stacks[e] = self._started()
        rewards = torch.from_numpy(self.rng.choice([-0.0, 0.0, 1.0, -1.5, 0.25], self.num_envs).astype(np.float32))
        actions = torch.from_numpy(self.rng.integers(0, 4, self.num_envs))
        return (_batched(obs), actions, rewards, _batched(next_obs), torch.tensor([end == 1 for end in ends]),
                torch.tensor([end == 2 for end in ends]))


def _batched(values: list[Any]) -> Any:
    if isinstance(values[0], dict):
        return {key: torch.stack([value[key] for value in values]) for key in values[0]}
    return torch.stack(values)


def torchrl_steps(envs: Envs, ends: list[list[int]]) -> TensorDict:
    """``len(ends)`` steps of every env in TorchRL's layout, ``[num_envs, T]`` (tensor observations)."""
    steps = [envs.step(step_ends) for step_ends in ends]
    stacked = [torch.stack([step[i] for step in steps], dim=1) for i in range(6)]
    return TensorDict({"observation": stacked[0], "action": stacked[1], ("next", "reward"): stacked[2],
                       ("next", "observation"): stacked[3], ("next", "terminated"): stacked[4],
                       ("next", "truncated"): stacked[5]}, batch_size=stacked[0].shape[:2])
