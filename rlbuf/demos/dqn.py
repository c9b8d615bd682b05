"""Double DQN on CartPole-v1 with a target network and rlbuf's ReplayBuffer (``--prioritized``: PER).

Run it with ``rlbuf demo dqn`` (``--help`` lists the options). The loop, top to bottom:

1. ε-greedy actions for ``num_envs`` CartPoles (a gymnasium ``SyncVectorEnv``; done envs are
   reset by the loop, so ``next_obs`` of a truncated step is the real final observation);
2. ``buffer.add(obs, action, reward, next_obs, terminated, truncated)``: timeouts are stored as
   truncations, not deaths;
3. every ``train_every`` frames, ``gradient_steps`` updates on sampled batches: the online
   network picks the next action, the target network values it (double DQN), and only
   ``batch.terminated`` stops the bootstrap: an episode cut at 500 steps still bootstraps. With
   ``--prioritized`` the loss is weighted by ``batch.weight`` and the priorities become
   ``|TD error|``;
4. every ``target_every`` frames the target network moves a fraction ``tau`` towards the online
   one. These soft updates are what made the default run reach 475 on every seed tried; hard
   copies (``--tau 1``) learned as fast but kept collapsing.

Example (not run here: it trains for about a minute)::

    rlbuf demo dqn --out runs/dqn
    rlbuf demo dqn --prioritized --seed 2
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlbuf import EpisodeStats, ReplayBuffer
from rlbuf.demos import _checkpoint, _progress, _run
from rlbuf.demos._options import DQNArgs as Args


def q_network(hidden: int) -> nn.Sequential:
    """Observation (4) -> one Q-value per action (2).

    Example:
        >>> q_network(8)(torch.zeros(3, 4)).shape
        torch.Size([3, 2])
    """
    return nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 2))


def epsilon(args: Args, frames: int) -> float:
    """The exploration rate after ``frames`` frames.

    Example:
        >>> epsilon(Args(), 0), epsilon(Args(), 5_000), epsilon(Args(), 100_000)
        (1.0, 0.505, 0.01)
    """
    fraction = min(1.0, frames / args.exploration_frames)
    return args.final_epsilon + (1.0 - fraction) * (1.0 - args.final_epsilon)


def run(args: Args) -> dict[str, Any]:
    """Train DQN as ``args`` say; write curve, summary, model and checkpoints; return the summary."""
    out = _run.setup(args, "dqn")
    device = torch.device(args.device)

    # -- setup: envs, networks, buffer --------------------------------------------------------
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * args.num_envs,
                                    autoreset_mode=gym.vector.AutoresetMode.DISABLED)
    q_net = q_network(args.hidden).to(device)
    target_net = q_network(args.hidden).to(device)
    target_net.load_state_dict(q_net.state_dict())
    optimizer = torch.optim.Adam(q_net.parameters(), lr=args.lr, fused=True)
    rng = np.random.default_rng(args.seed)  # ε-greedy draws
    stats = EpisodeStats(args.num_envs)
    buffer = ReplayBuffer(args.buffer_size, obs_shape=(4,), action_shape=(), action_dtype=torch.int64,
                          num_envs=args.num_envs, prioritized=args.prioritized,
                          alpha=args.alpha if args.prioritized else None, beta=args.beta if args.prioritized else None,
                          storage=args.storage, device=device, seed=args.seed, stats=stats)

    frames, saved = 0, _checkpoint.resume(args, out, buffer)
    if saved is not None:
        q_net.load_state_dict(saved["models"]["q"])
        target_net.load_state_dict(saved["models"]["target"])
        optimizer.load_state_dict(saved["optimizer"])
        rng.bit_generator.state = saved["exploration_rng"]
        frames = saved["frames"]
        _run.drop_running_episodes(stats)  # the envs restart below
    obs, _ = envs.reset(seed=_run.env_seed(args.seed, frames))  # see rlbuf.demos._run: exact resume
    progress = _progress.Progress(args, frames, None if saved is None else saved["progress"])

    def reset_envs(seed: int) -> None:
        nonlocal obs
        obs, _ = envs.reset(seed=seed)

    def checkpoint(reason: _run.CheckpointReason) -> Path:
        return _checkpoint.save_checkpoint(out, "dqn", args, frames, buffer, {
            "frames": frames, "progress": progress.state_dict(), "optimizer": optimizer.state_dict(),
            "models": {"q": q_net.state_dict(), "target": target_net.state_dict()},
            "exploration_rng": rng.bit_generator.state}, reason)

    # -- collect, learn, log ------------------------------------------------------------------------
    stopped, loss, interrupted_at = progress.done(frames), 0.0, None
    while not stopped:
        eps = epsilon(args, frames)
        with torch.no_grad():
            greedy = q_net(torch.as_tensor(obs, device=device)).argmax(1).cpu().numpy()
        explore = rng.random(args.num_envs) < eps
        action = np.where(explore, rng.integers(0, 2, args.num_envs), greedy)
        next_obs, reward, terminated, truncated, _ = envs.step(action)
        buffer.add(obs, action, reward, next_obs, terminated, truncated)  # next_obs: the final one at a timeout
        obs = next_obs
        done = terminated | truncated
        if done.any():
            obs, _ = envs.reset(options={"reset_mask": done})
        frames_before, frames = frames, frames + args.num_envs

        if _run.crossed(frames_before, frames, args.target_every):
            with torch.no_grad():
                for target_param, param in zip(target_net.parameters(), q_net.parameters(), strict=True):
                    target_param.lerp_(param, args.tau)
        if frames > args.learning_starts and _run.crossed(frames_before, frames, args.train_every):
            for _ in range(args.gradient_steps):
                batch = buffer.sample(args.batch_size)
                with torch.no_grad():
                    next_action = q_net(batch.next_obs).argmax(1, keepdim=True)
                    next_q = target_net(batch.next_obs).gather(1, next_action).squeeze(1)
                    target = batch.reward + args.gamma * (~batch.terminated) * next_q  # timeouts bootstrap
                q = q_net(batch.obs).gather(1, batch.action.unsqueeze(1)).squeeze(1)
                loss_t = (batch.weight * nn.functional.smooth_l1_loss(q, target, reduction="none")).mean()
                optimizer.zero_grad()
                torch.autograd.backward(loss_t)
                nn.utils.clip_grad_norm_(q_net.parameters(), 10.0)
                optimizer.step()
                if args.prioritized:
                    buffer.update_priority(batch.index, (q - target).abs().detach() + 1e-6)
            loss = loss_t.item()

        if _run.crossed(frames_before, frames, 1_000) or frames >= args.frames:
            progress.log(frames, stats, loss=loss, eps=eps)
            stopped = progress.done(frames)
        leave, interrupted_at = _run.checkpoint_and_reset(  # Ctrl-C: between two env steps
            args, frames_before, frames, stopped, checkpoint, reset_envs, stats)
        if leave:
            break
    envs.close()
    progress.close()

    # -- outputs ------------------------------------------------------------------------------------
    if stopped:
        checkpoint("end")
        torch.save({"q": q_net.state_dict(), "hidden": args.hidden}, out / "model.pt")
    buffer.close()  # removes a memmap storage's scratch files
    return _progress.finish(out, "dqn", args, progress, frames, stats, stopped, interrupted_at)
