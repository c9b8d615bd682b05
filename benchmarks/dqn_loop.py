"""What a user feels: a CleanRL-style DQN loop on CartPole-v1 with rlbuf's buffer, next to SB3's.

The loop is CleanRL's ``dqn.py`` with one env: an MLP Q-network (4-120-84-2), Adam, an
ε-greedy action per step, one ``add`` per step, and after ``learning_starts`` one ``sample(128)``
and one optimizer step per step; the target network is synced every 500 steps. The two
agents (``rlbuf``: ``rlbuf.ReplayBuffer`` fed what gymnasium returns; ``sb3``:
``stable_baselines3.common.buffers.ReplayBuffer`` as CleanRL uses it) start from the same
seeds (networks, env, ε draws) and run in lockstep: chunks of ``--chunk`` steps alternate
between them, so a burst of load on this shared machine lands on both. Their batches are
drawn by different generators, so after ``learning_starts`` their episodes differ; the work
per step (one env step, one forward for the action, add, sample, one update) is the same.

Printed per agent: total time of the loop, µs per step, the part of it spent in the buffer's
``add`` and ``sample`` (with the batch's conversion to the loss's tensors), and the ratio
rlbuf ÷ SB3 of the time (budget, issue 20: ≤ 1.0×). Times are this thread's CPU time (the loop
runs on one thread), which leaves out the time other processes of this shared machine hold the
cores; ``--wall`` times by the wall clock.

One torch thread. Run from the repository root::

    PYTHONPATH=. python benchmarks/dqn_loop.py              # 15,000 steps each, about a minute
    PYTHONPATH=. python benchmarks/dqn_loop.py --quick      # a smoke run
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import platform
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3.common.buffers import ReplayBuffer as Sb3Buffer
from torch import nn

from rlbuf import ReplayBuffer

_BUDGET = 1.0


class QNetwork(nn.Module):
    """CleanRL's Q-network for CartPole."""

    def __init__(self) -> None:
        super().__init__()
        self.network = nn.Sequential(nn.Linear(4, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x)  # type: ignore[no-any-return]


@dataclass
class Agent:
    """One DQN run: its env, networks, buffer and clocks, advanced a chunk of steps at a time."""

    name: str
    add: Callable[[np.ndarray, int, float, np.ndarray, bool, bool], None]
    sample: Callable[[int], tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]
    seed: int
    total_steps: int
    learning_starts: int
    env: Any = None
    obs: np.ndarray = field(default_factory=lambda: np.zeros(4, np.float32))
    step: int = 0
    elapsed: float = 0.0
    in_buffer: float = 0.0
    episodes: int = 0
    clock: Callable[[], float] = time.perf_counter

    def __post_init__(self) -> None:
        torch.manual_seed(self.seed)
        self.q = QNetwork()
        self.target = QNetwork()
        self.target.load_state_dict(self.q.state_dict())
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=2.5e-4)
        self.env = gym.make("CartPole-v1")
        self.obs, _ = self.env.reset(seed=self.seed)
        self.explore = random.Random(self.seed)

    def run(self, steps: int) -> None:
        start = self.clock()
        for _ in range(min(steps, self.total_steps - self.step)):
            self._one_step()
        self.elapsed += self.clock() - start

    def _one_step(self) -> None:
        epsilon = max(0.05, 1.0 - 0.95 * self.step / (0.5 * self.total_steps))
        if self.explore.random() < epsilon:
            action = self.explore.randrange(2)
        else:
            with torch.no_grad():
                action = int(self.q(torch.from_numpy(self.obs)).argmax())
        next_obs, reward, terminated, truncated, _ = self.env.step(action)
        tick = self.clock()
        self.add(self.obs, action, float(reward), next_obs, bool(terminated), bool(truncated))
        self.in_buffer += self.clock() - tick
        if terminated or truncated:
            self.episodes += 1
            next_obs, _ = self.env.reset()
        self.obs = next_obs
        self.step += 1
        if self.step > self.learning_starts:
            tick = self.clock()
            obs, actions, rewards, next_obs_b, dones = self.sample(128)
            self.in_buffer += self.clock() - tick
            with torch.no_grad():
                target = rewards + 0.99 * self.target(next_obs_b).max(dim=1).values * (1 - dones)
            value = self.q(obs).gather(1, actions.view(-1, 1)).squeeze(1)
            loss = nn.functional.mse_loss(target, value)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            if self.step % 500 == 0:
                self.target.load_state_dict(self.q.state_dict())


def rlbuf_agent(capacity: int, **options: Any) -> Agent:
    buf = ReplayBuffer(capacity, obs_shape=(4,), action_shape=(), action_dtype=torch.int64, seed=options["seed"])

    def sample(batch_size: int) -> tuple[torch.Tensor, ...]:
        batch = buf.sample(batch_size)
        return batch.obs, batch.action, batch.reward, batch.next_obs, batch.terminated.float()

    return Agent("rlbuf", buf.add, sample, **options)  # type: ignore[arg-type]


def sb3_agent(capacity: int, **options: Any) -> Agent:
    env = gym.make("CartPole-v1")
    buf = Sb3Buffer(capacity, env.observation_space, env.action_space, device="cpu", handle_timeout_termination=False)
    np.random.seed(options["seed"])  # SB3 samples with numpy's global generator

    def add(obs: np.ndarray, action: int, reward: float, next_obs: np.ndarray, terminated: bool,
            truncated: bool) -> None:
        # What CleanRL passes: dones are terminations (timeouts are not deaths there either).
        buf.add(obs, next_obs, np.array([action]), np.array([reward]), np.array([terminated]), [{}])

    def sample(batch_size: int) -> tuple[torch.Tensor, ...]:
        data = buf.sample(batch_size)
        return (data.observations, data.actions.flatten(), data.rewards.flatten(), data.next_observations,
                data.dones.flatten())

    return Agent("sb3", add, sample, **options)  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1,500 steps each")
    parser.add_argument("--steps", type=int, default=15_000, help="env steps per agent")
    parser.add_argument("--chunk", type=int, default=250, help="steps per turn of the lockstep")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--wall", action="store_true",
                        help="time by the wall clock (default: this thread's CPU time, see the module)")
    args = parser.parse_args()
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    steps = 1_500 if args.quick else args.steps
    options = {"seed": args.seed, "total_steps": steps, "learning_starts": min(1_000, steps // 3),
               "clock": time.perf_counter if args.wall else time.thread_time}
    agents = [rlbuf_agent(10_000, **options), sb3_agent(10_000, **options)]
    versions = ", ".join(f"{name} {importlib.metadata.version(name)}"
                         for name in ("torch", "torchrl", "gymnasium", "stable-baselines3"))
    print(f"DQN loop on CartPole-v1, {steps} steps per agent, sample(128) + one Adam step per step after "
          f"{options['learning_starts']}; {versions}; {platform.machine()}, 1 torch thread; lockstep chunks of "
          f"{args.chunk} steps; {'wall' if args.wall else 'CPU'} time")
    turn = 0
    while any(agent.step < steps for agent in agents):
        for agent in agents[turn % 2:] + agents[:turn % 2]:  # who goes first alternates
            agent.run(args.chunk)
        turn += 1
    print(f"\n{'agent':<6}  {'time s':>7}  {'µs/step':>8}  {'buffer µs/step':>14}  {'episodes':>8}")
    for agent in agents:
        print(f"{agent.name:<6}  {agent.elapsed:>7.2f}  {agent.elapsed / steps * 1e6:>8.1f}  "
              f"{agent.in_buffer / steps * 1e6:>14.1f}  {agent.episodes:>8}")
    ratio = agents[0].elapsed / agents[1].elapsed
    print(f"\n{'PASS' if ratio <= _BUDGET else 'MISS'}  rlbuf ÷ SB3 time {ratio:.3f}  (budget ≤ {_BUDGET}×)")


if __name__ == "__main__":
    main()
