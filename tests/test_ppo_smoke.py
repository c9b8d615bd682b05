"""PPO end to end: a TorchRL collector on CartPole feeds the RolloutBuffer, GAE, 2 epochs of minibatches."""

from __future__ import annotations

import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torch.distributions import OneHotCategorical

from rlbuf import GAE, EpisodeStats, RolloutBuffer


def test_ppo_iteration_on_cartpole() -> None:
    from torchrl.collectors import Collector
    from torchrl.envs import GymEnv
    from torchrl.modules import ProbabilisticActor, ValueOperator

    torch.manual_seed(0)
    env = GymEnv("CartPole-v1")
    env.set_seed(0)
    actor = ProbabilisticActor(
        TensorDictModule(nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2)), ["observation"], ["logits"]),
        in_keys=["logits"], distribution_class=OneHotCategorical, return_log_prob=True, spec=env.action_spec,
    )
    critic = ValueOperator(nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 1)), in_keys=["observation"])
    optimizer = torch.optim.Adam([*actor.parameters(), *critic.parameters()], lr=1e-3)
    steps = 64
    stats = EpisodeStats(1)
    buffer = RolloutBuffer(steps, 1, obs_shape=(4,), action_shape=(2,), seed=0, stats=stats)  # one-hot float actions
    collector = Collector(env, actor, frames_per_batch=steps, total_frames=2 * steps, auto_register_policy_transforms=False)
    gae = GAE(gamma=0.99, lmbda=0.95)
    losses = []
    for rollout in collector:
        with torch.no_grad():
            critic(rollout)
            critic(rollout["next"])
        rollout = gae(rollout)
        buffer.clear()
        buffer.extend(rollout)
        assert buffer.is_full and buffer.advantages_ready
        from_transform = buffer.view("advantage").clone()
        # The buffer's own GAE, bootstrapping from value[t + 1] and from V(final obs) at truncations,
        # agrees with the transform that used ("next", "state_value") everywhere.
        buffer.compute_returns_and_advantages(rollout["next", "state_value"][-1], gamma=0.99, gae_lambda=0.95)
        assert torch.allclose(buffer.view("advantage"), from_transform, atol=1e-5)
        seen = 0
        for batch in buffer.minibatches(batch_size=16, n_epochs=2):
            dist = actor.get_dist(TensorDict({"observation": batch.obs}, batch_size=[len(batch)]))
            ratio = (dist.log_prob(batch.action) - batch.log_prob).exp()
            advantage = (batch.advantage - batch.advantage.mean()) / (batch.advantage.std() + 1e-8)
            policy_loss = -torch.min(ratio * advantage, ratio.clamp(0.8, 1.2) * advantage).mean()
            value_loss = (critic.module(batch.obs).squeeze(-1) - batch.returns).pow(2).mean()
            loss = policy_loss + 0.5 * value_loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.detach().item())
            seen += len(batch)
        assert seen == 2 * steps
    collector.shutdown()
    assert len(losses) == 2 * 2 * (steps // 16)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert stats.summary()["episodes"] >= 1      # a random CartPole policy falls within 128 steps
