"""A short DQN run on CartPole-v1 with rlbuf's ReplayBuffer: collect, sample, learn.

Run: `python examples/replay_quickstart.py [--steps N] [--seed S]`. Prints the mean return of
recent episodes as it goes; at the default 6,000 steps it takes under a minute on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import copy

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlbuf import ReplayBuffer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=6_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=args.seed)
    q_net = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 2))
    target_net = copy.deepcopy(q_net)
    optimizer = torch.optim.Adam(q_net.parameters(), lr=1e-3)
    buffer = ReplayBuffer(20_000, obs_shape=(4,), action_shape=(), action_dtype=torch.int64, seed=args.seed)
    rng = np.random.default_rng(args.seed)
    returns: list[float] = []
    episode_return = 0.0

    for step in range(args.steps):
        epsilon = max(0.05, 1.0 - step / (0.5 * args.steps))
        if rng.random() < epsilon:
            action = int(rng.integers(2))
        else:
            with torch.no_grad():
                action = int(q_net(torch.as_tensor(obs)).argmax())
        next_obs, reward, terminated, truncated, _ = env.step(action)
        # next_obs is the true final observation even when the episode was truncated.
        buffer.add(obs, action, float(reward), next_obs, terminated, truncated)
        episode_return += float(reward)
        obs = next_obs
        if terminated or truncated:
            returns.append(episode_return)
            episode_return = 0.0
            obs, _ = env.reset()

        if len(buffer) >= 500:
            batch = buffer.sample(64)
            with torch.no_grad():
                next_q = target_net(batch.next_obs).max(dim=1).values
                # A timeout is not a death: only `terminated` stops the bootstrap.
                target = batch.reward + 0.99 * (~batch.terminated) * next_q
            q = q_net(batch.obs).gather(1, batch.action.unsqueeze(1)).squeeze(1)
            loss = nn.functional.smooth_l1_loss(q, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if step % 250 == 0:
            target_net.load_state_dict(q_net.state_dict())
        if step % 1000 == 999 and returns:
            print(f"step {step + 1:>6}  episodes {len(returns):>4}  mean return (last 10) {np.mean(returns[-10:]):7.1f}")
    print(f"done: {len(buffer)} transitions stored; {buffer!r}")


if __name__ == "__main__":
    main()
