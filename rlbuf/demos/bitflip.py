"""A bit-flipping goal env: flip one of ``n`` bits per step until they equal a random target.

The reward is sparse: 0 when the bits equal the goal, else -1. With ``n`` bits a random policy
almost never sees a 0 (a chance of ``2**-n`` per state), so DQN without relabelling learns
nothing, which is what hindsight experience replay (Andrychowicz et al., 2017) fixes. An episode
ends with ``terminated`` when the goal is reached and ``truncated`` after ``n`` steps (always
enough, flipping each differing bit once). Observations follow gymnasium-robotics' goal-env
layout: a ``Dict`` of ``"observation"``, ``"achieved_goal"`` (both the bits) and
``"desired_goal"``, float32.

Example:
    >>> env = BitFlipEnv(4)
    >>> obs, _ = env.reset(seed=0)
    >>> sorted(obs), obs["observation"].dtype.name
    (['achieved_goal', 'desired_goal', 'observation'], 'float32')
    >>> obs, reward, terminated, truncated, _ = env.step(0)
    >>> float(reward), terminated, truncated
    (-1.0, False, False)
    >>> float(env.compute_reward(obs["achieved_goal"], obs["achieved_goal"], {}))
    0.0
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

Bits = np.ndarray[Any, np.dtype[np.float32]]


class BitFlipEnv(gym.Env[dict[str, Bits], int]):  # type: ignore[misc]
    """``n_bits`` bits and a target; action ``i`` flips bit ``i``.

    Args:
        n_bits: bits of the state and goal.
        max_steps: steps before truncation (default ``n_bits``).
    """

    def __init__(self, n_bits: int = 10, max_steps: int | None = None) -> None:
        self.n_bits = n_bits
        self.max_steps = n_bits if max_steps is None else max_steps
        bits = spaces.Box(0.0, 1.0, (n_bits,), np.float32)
        self.observation_space = spaces.Dict({"observation": bits, "achieved_goal": bits, "desired_goal": bits})
        self.action_space = spaces.Discrete(n_bits)
        self._state = np.zeros(n_bits, np.float32)
        self._goal = np.zeros(n_bits, np.float32)
        self._steps = 0

    def _obs(self) -> dict[str, Bits]:
        return {"observation": self._state.copy(), "achieved_goal": self._state.copy(), "desired_goal": self._goal.copy()}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, Bits], dict[str, Any]]:
        super().reset(seed=seed)
        self._state = self.np_random.integers(0, 2, self.n_bits).astype(np.float32)
        self._goal = self.np_random.integers(0, 2, self.n_bits).astype(np.float32)
        while np.array_equal(self._state, self._goal):
            self._goal = self.np_random.integers(0, 2, self.n_bits).astype(np.float32)
        self._steps = 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[dict[str, Bits], float, bool, bool, dict[str, Any]]:
        if not self.action_space.contains(np.int64(action)):
            raise ValueError(f"action: expected a bit index in [0, {self.n_bits}), got {action!r}")
        self._state[int(action)] = 1.0 - self._state[int(action)]
        self._steps += 1
        reward = float(self.compute_reward(self._state, self._goal, {}))
        return self._obs(), reward, reward == 0.0, self._steps >= self.max_steps, {}

    @staticmethod
    def compute_reward(achieved_goal: Any, desired_goal: Any, info: Any) -> Any:
        """0 where the goal is achieved, else -1 (vectorised over leading dims, gymnasium-robotics' signature)."""
        reached = (np.asarray(achieved_goal) == np.asarray(desired_goal)).all(axis=-1)
        return np.where(reached, 0.0, -1.0).astype(np.float32)
