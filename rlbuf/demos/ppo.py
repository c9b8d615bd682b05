"""PPO on CartPole-v1: a TorchRL collector, rlbuf's RolloutBuffer, the GAE transform, EpisodeStats.

Run it with ``rlbuf demo ppo`` (``--help`` lists the options). The loop, top to bottom:

1. a TorchRL ``Collector`` steps ``num_envs`` CartPoles (a gymnasium ``SyncVectorEnv`` wrapped
   by ``GymWrapper``: one TorchRL call per vector step, the fastest layout on 2 cores) and
   yields a ``[num_envs, num_steps]`` rollout;
2. the critic writes ``state_value`` and ``("next", "state_value")``; the ``rlbuf.GAE``
   transform turns them into ``advantage`` and ``value_target``. CartPole truncates episodes at
   500 steps: there ``("next", "observation")`` is the final observation, and GAE bootstraps
   from its value, while a pole that fell (``terminated``) does not bootstrap;
3. ``buffer.extend(rollout)`` stores it (and feeds the ``rlbuf.EpisodeStats``);
4. ``epochs`` passes of shuffled minibatches update actor and critic with the clipped objective.

Example (not run here: each trains for 10 to 30 seconds)::

    rlbuf demo ppo --out runs/ppo            # stops once the last 20 episodes average >= 475
    rlbuf demo ppo --frames 50000 --storage memmap --checkpoint-every 10000
    rlbuf demo ppo --resume runs/ppo         # continue a stopped run (Ctrl-C writes a checkpoint first)
    rlbuf demo ppo --recurrent               # LSTM policy, CartPole without velocities
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torch.distributions import Categorical
from torchrl.collectors import Collector
from torchrl.envs import GymWrapper
from torchrl.modules import ProbabilisticActor, ValueOperator

from rlbuf import GAE, EpisodeStats, RolloutBuffer
from rlbuf.demos import _checkpoint, _progress, _run, ppo_recurrent
from rlbuf.demos._options import PPOArgs as Args
from rlbuf.demos.ppo_recurrent import HideVelocities


def make_env(num_envs: int, hide_velocities: bool = False) -> GymWrapper:
    """``num_envs`` CartPole-v1 envs in one gymnasium ``SyncVectorEnv``, as a TorchRL env.

    Done envs are reset by TorchRL (autoreset disabled in gymnasium), so ``("next",
    "observation")`` of a truncated step is the real final observation.

    Example:
        >>> make_env(2).batch_size
        torch.Size([2])
    """
    def one() -> gym.Env[Any, Any]:
        return HideVelocities(gym.make("CartPole-v1")) if hide_velocities else gym.make("CartPole-v1")

    envs = gym.vector.SyncVectorEnv([one] * num_envs,
                                    autoreset_mode=gym.vector.AutoresetMode.DISABLED)
    return GymWrapper(envs, categorical_action_encoding=True)


def mlp(inputs: int, hidden: int, outputs: int, last_gain: float) -> nn.Sequential:
    """A two-layer tanh MLP with orthogonal init (as in CleanRL's PPO).

    Example:
        >>> mlp(4, 8, 2, 0.01)(torch.zeros(3, 4)).shape
        torch.Size([3, 2])
    """
    layers = [nn.Linear(inputs, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, outputs)]
    for layer, gain in zip(layers[::2], (2**0.5, 2**0.5, last_gain), strict=True):
        assert isinstance(layer, nn.Linear)
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)
    return nn.Sequential(*layers)


def make_actor(net: nn.Module, env: GymWrapper) -> ProbabilisticActor:
    """The TorchRL policy around ``net`` (observation -> logits): samples an action, keeps its log-prob.

    Example:
        >>> env = make_env(1)
        >>> td = make_actor(mlp(4, 8, 2, 0.01), env)(env.reset())
        >>> td["action"].dtype, "action_log_prob" in td.keys()
        (torch.int64, True)
    """
    return ProbabilisticActor(TensorDictModule(net, ["observation"], ["logits"]), in_keys=["logits"],
                              distribution_class=Categorical, return_log_prob=True, spec=env.action_spec)


def run(args: Args) -> dict[str, Any]:
    """Train PPO as ``args`` say; write curve, summary, model and checkpoints; return the summary."""
    if args.recurrent:
        return ppo_recurrent.run(args)
    out = _run.setup(args, "ppo")
    device = torch.device(args.device)
    frames_per_batch = args.num_envs * args.num_steps

    # -- setup: envs, networks, buffer --------------------------------------------------------
    env = make_env(args.num_envs, args.hide_velocities)
    obs_size = 2 if args.hide_velocities else 4
    actor_net = mlp(obs_size, args.hidden, 2, 0.01).to(device)
    critic_net = mlp(obs_size, args.hidden, 1, 1.0).to(device)
    actor = make_actor(actor_net, env)
    critic = ValueOperator(critic_net, in_keys=["observation"])
    optimizer = torch.optim.Adam([*actor_net.parameters(), *critic_net.parameters()], lr=args.lr, eps=1e-5, fused=True)
    gae = GAE(gamma=args.gamma, lmbda=args.gae_lambda)
    stats = EpisodeStats(args.num_envs)
    buffer = RolloutBuffer(args.num_steps, args.num_envs, obs_shape=(obs_size,), action_shape=(), action_dtype=torch.int64,
                           storage=args.storage, storing_device=device, seed=args.seed, stats=stats)

    frames, saved = 0, _checkpoint.resume(args, out, buffer)
    if saved is not None:
        actor_net.load_state_dict(saved["models"]["actor"])
        critic_net.load_state_dict(saved["models"]["critic"])
        optimizer.load_state_dict(saved["optimizer"])
        frames = saved["frames"]
        _run.drop_running_episodes(stats)  # the envs restart below
    remaining = -(-max(0, args.frames - frames) // frames_per_batch) * frames_per_batch  # whole rollouts
    collector = Collector(env, actor, frames_per_batch=frames_per_batch, total_frames=max(remaining, frames_per_batch),
                          policy_device=device, storing_device=device, auto_register_policy_transforms=False)
    collector.reset(seed=_run.env_seed(args.seed, frames))  # see rlbuf.demos._run: exact resume
    progress = _progress.Progress(args, frames, None if saved is None else saved["progress"])

    def checkpoint(reason: _run.CheckpointReason) -> Path:
        return _checkpoint.save_checkpoint(out, "ppo", args, frames, buffer, {
            "frames": frames, "progress": progress.state_dict(), "optimizer": optimizer.state_dict(),
            "models": {"actor": actor_net.state_dict(), "critic": critic_net.state_dict()}}, reason)

    # -- collect, learn, log ------------------------------------------------------------------------
    stopped, interrupted_at = progress.done(frames), None
    for rollout in () if stopped else collector:
        frames_before, frames = frames, frames + rollout.numel()
        with torch.no_grad():
            critic(rollout)
            critic(rollout["next"])  # V(next obs): the bootstrap of truncated steps and of the rollout end
        buffer.clear()
        buffer.extend(gae(rollout))

        for group in optimizer.param_groups:
            group["lr"] = args.lr * max(0.0, 1.0 - frames_before / args.frames)
        for batch in buffer.minibatches(num_minibatches=args.num_minibatches, n_epochs=args.epochs):
            log_probs = actor_net(batch.obs).log_softmax(-1)
            ratio = (log_probs.gather(1, batch.action.unsqueeze(1)).squeeze(1) - batch.log_prob).exp()
            entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
            advantage = (batch.advantage - batch.advantage.mean()) / (batch.advantage.std() + 1e-8)
            policy_loss = -torch.min(ratio * advantage, ratio.clamp(1 - args.clip, 1 + args.clip) * advantage).mean()
            value_loss = 0.5 * (critic_net(batch.obs).squeeze(-1) - batch.returns).pow(2).mean()
            loss = policy_loss + args.vf_coef * value_loss - args.ent_coef * entropy
            optimizer.zero_grad()
            torch.autograd.backward(loss)
            nn.utils.clip_grad_norm_([*actor_net.parameters(), *critic_net.parameters()], args.max_grad_norm)
            optimizer.step()

        progress.log(frames, stats, loss=loss.item())
        stopped = progress.done(frames)
        leave, interrupted_at = _run.checkpoint_and_reset(  # Ctrl-C: between two collections
            args, frames_before, frames, stopped, checkpoint, lambda seed: collector.reset(seed=seed), stats)
        if leave:
            break
        if stopped:
            break
    collector.shutdown()
    progress.close()

    # -- outputs ------------------------------------------------------------------------------------
    if stopped:
        checkpoint("end")
        torch.save({"actor": actor_net.state_dict(), "critic": critic_net.state_dict(), "hidden": args.hidden},
                   out / "model.pt")
    buffer.close()  # removes a memmap storage's scratch files
    return _progress.finish(out, "ppo", args, progress, frames, stats, stopped, interrupted_at)
