"""What an Atari user feels: a CleanRL ``dqn_atari``-shaped loop on real Breakout with rlbuf's buffer, next to SB3's.

The loop is CleanRL's ``dqn_atari.py`` on one env: ale-py's Breakout with the DQN
preprocessing (gymnasium's ``AtariPreprocessing``: frame skip 4, 84×84 grey, life loss ends an
episode; rewards clipped to their sign; ``FrameStackObservation(4)``), the Nature CNN, Adam
(lr 1e-4), an ε-greedy action per step (one forward), one ``add`` per step, and after
``learning_starts`` one ``sample(32)`` and one optimizer step every 4 steps; the target network
is synced every 1,000 steps. The agents:

* ``rlbuf``: ``rlbuf.ReplayBuffer(frame_stack=4)`` (one frame per row, every stack checked);
* ``rlbuf-zstd``: the same with ``compression="zstd"`` (each frame compressed, docs/pixels.md);
* ``sb3``: ``stable_baselines3.common.buffers.ReplayBuffer(optimize_memory_usage=True)``, as CleanRL uses it.

All start from the same seeds and run in lockstep chunks of ``--chunk`` steps (who goes first
rotates), so a burst of load on this shared machine lands on both. Printed per agent: the
loop's wall time, steps per second, and the part spent in the buffer (``add``, ``sample`` and the
batch's conversion); then rlbuf's steps per second ÷ SB3's (issue 22: ≥ 1.0). numba loads rlbuf's
compiled stream kernels (about 1 s in a new process) when the buffer is made, before the loop, as
SB3 allocates its arrays there.

One torch thread. ``pip install -e ".[bench]"`` brings ale-py and OpenCV. From the repository root::

    PYTHONPATH=. python benchmarks/dqn_atari_loop.py            # 4,000 steps each, about 2 minutes
    PYTHONPATH=. python benchmarks/dqn_atari_loop.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import random
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ale_py
import gymnasium as gym
import numpy as np
import torch
from stable_baselines3.common.buffers import ReplayBuffer as Sb3Buffer
from torch import nn

from rlbuf import NextStepResetWarning, ReplayBuffer

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def make_env(seed: int) -> Any:
    gym.register_envs(ale_py)
    env = gym.make("BreakoutNoFrameskip-v4")
    env = gym.wrappers.AtariPreprocessing(env, frame_skip=4, terminal_on_life_loss=True)
    env = gym.wrappers.TransformReward(env, np.sign)
    env = gym.wrappers.FrameStackObservation(env, 4)
    env.action_space.seed(seed)
    return env


class QNetwork(nn.Module):
    """The Nature CNN, as CleanRL's ``dqn_atari.py`` has it."""

    def __init__(self, actions: int) -> None:
        super().__init__()
        self.network = nn.Sequential(
            nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(),
            nn.Linear(512, actions))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x / 255.0)  # type: ignore[no-any-return]


@dataclass
class Agent:
    """One DQN run on its own env, advanced a chunk of steps at a time."""

    name: str
    add: Callable[[np.ndarray, int, float, np.ndarray, bool, bool], None]
    sample: Callable[[int], Batch]
    seed: int
    total_steps: int
    learning_starts: int
    step: int = 0
    wall: float = 0.0
    in_buffer: float = 0.0

    def __post_init__(self) -> None:
        torch.manual_seed(self.seed)
        self.env = make_env(self.seed)
        self.q = QNetwork(int(self.env.action_space.n))
        self.target = QNetwork(int(self.env.action_space.n))
        self.target.load_state_dict(self.q.state_dict())
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=1e-4)
        self.obs, _ = self.env.reset(seed=self.seed)
        self.explore = random.Random(self.seed)

    def run(self, steps: int) -> None:
        start = time.perf_counter()
        for _ in range(min(steps, self.total_steps - self.step)):
            self._one_step()
        self.wall += time.perf_counter() - start

    def _one_step(self) -> None:
        epsilon = max(0.01, 1.0 - 0.99 * self.step / (0.5 * self.total_steps))
        if self.explore.random() < epsilon:
            action = self.explore.randrange(int(self.env.action_space.n))
        else:
            with torch.no_grad():
                action = int(self.q(torch.from_numpy(self.obs)[None]).argmax())
        next_obs, reward, terminated, truncated, _ = self.env.step(action)
        tick = time.perf_counter()
        self.add(self.obs, action, float(reward), next_obs, bool(terminated), bool(truncated))
        self.in_buffer += time.perf_counter() - tick
        if terminated or truncated:
            next_obs, _ = self.env.reset()
        self.obs = next_obs
        self.step += 1
        if self.step > self.learning_starts and self.step % 4 == 0:
            tick = time.perf_counter()
            obs, actions, rewards, next_obs_b, dones = self.sample(32)
            self.in_buffer += time.perf_counter() - tick
            with torch.no_grad():
                target = rewards + 0.99 * self.target(next_obs_b.float()).max(dim=1).values * (1 - dones)
            value = self.q(obs.float()).gather(1, actions.view(-1, 1)).squeeze(1)
            loss = nn.functional.mse_loss(target, value)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
        if self.step % 1_000 == 0:
            self.target.load_state_dict(self.q.state_dict())


def rlbuf_agent(capacity: int, compression: str | None = None, **options: Any) -> Agent:
    env = make_env(0)
    buf = ReplayBuffer(capacity, observation_space=env.observation_space, action_space=env.action_space,
                       frame_stack=4, seed=options["seed"], compression=compression)
    env.close()

    def sample(batch_size: int) -> Batch:
        batch = buf.sample(batch_size)
        return batch.obs, batch.action, batch.reward, batch.next_obs, batch.terminated.float()

    name = "rlbuf" if compression is None else f"rlbuf-{compression}"
    return Agent(name, lambda *step: buf.add(*step[:5], truncated=step[5]), sample, **options)


def sb3_agent(capacity: int, **options: Any) -> Agent:
    env = make_env(0)
    buf = Sb3Buffer(capacity, env.observation_space, env.action_space, device="cpu", optimize_memory_usage=True,
                    handle_timeout_termination=False)
    env.close()
    np.random.seed(options["seed"])  # SB3 samples with numpy's global generator

    def add(obs: np.ndarray, action: int, reward: float, next_obs: np.ndarray, terminated: bool,
            truncated: bool) -> None:
        buf.add(obs, next_obs, np.array([action]), np.array([reward]), np.array([terminated]), [{}])

    def sample(batch_size: int) -> Batch:
        data = buf.sample(batch_size)
        return (data.observations, data.actions.flatten(), data.rewards.flatten(), data.next_observations,
                data.dones.flatten())

    return Agent("sb3", add, sample, **options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 600 steps each")
    parser.add_argument("--steps", type=int, default=4_000, help="env steps per agent")
    parser.add_argument("--chunk", type=int, default=200, help="steps per turn of the lockstep")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    # One env, reset by hand: no NEXT_STEP reset steps. Breakout can end a life in the very frames it
    # restarts from (no reward), which the heuristic cannot tell from one (docs/gymnasium.md).
    warnings.filterwarnings("ignore", category=NextStepResetWarning)
    steps = 600 if args.quick else args.steps
    options = {"seed": args.seed, "total_steps": steps, "learning_starts": min(1_000, steps // 3)}
    agents = [rlbuf_agent(steps + 16, **options), rlbuf_agent(steps + 16, "zstd", **options),
              sb3_agent(steps + 16, **options)]
    print(f"DQN (CleanRL dqn_atari shape) on Breakout, {steps} steps per agent, sample(32) + one Adam step every 4 "
          f"steps after {options['learning_starts']}; 1 torch thread; lockstep chunks of {args.chunk} steps")
    turn = 0
    while any(agent.step < steps for agent in agents):
        for agent in agents[turn % 3:] + agents[:turn % 3]:
            agent.run(args.chunk)
        turn += 1
    print(f"\n{'agent':<10}  {'wall s':>7}  {'steps/s':>8}  {'buffer µs/step':>14}")
    for agent in agents:
        print(f"{agent.name:<10}  {agent.wall:>7.2f}  {steps / agent.wall:>8.1f}  "
              f"{agent.in_buffer / steps * 1e6:>14.1f}")
    for agent in agents[:2]:
        ratio = agents[2].wall / agent.wall
        print(f"{'PASS' if ratio >= 1.0 else 'MISS'}  {agent.name} steps/s ÷ SB3's {ratio:.3f}  (target ≥ 1.0)")


if __name__ == "__main__":
    main()
