"""DAgger on CartPole-v1: a PPO teacher labels the states a smaller student visits (DistillationBuffer).

Run it with ``rlbuf demo distill`` (``--help`` lists the options). Top to bottom:

1. the teacher: loaded from ``--teacher DIR`` (the ``model.pt`` of ``rlbuf demo ppo --out DIR``),
   or trained first by the PPO demo into ``OUT/teacher``;
2. each round, a TorchRL ``Collector`` runs the *student* (DAgger: the states come from the
   learner's own mistakes), the teacher labels every visited observation with its logits, and
   the round joins the ``rlbuf.DistillationBuffer`` (``expert_action`` = the teacher's
   choice, ``expert_logits`` as an extra field);
3. ``gradient_steps`` updates of the student on sampled batches: cross-entropy against the
   teacher's action probabilities;
4. at the end both policies are evaluated greedily on the same seeded episodes; the summary gives
   the student's return as a fraction of the teacher's.

Example (not run here: it trains a teacher first, about a minute)::

    rlbuf demo ppo --out runs/teacher
    rlbuf demo distill --teacher runs/teacher --out runs/distill
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torchrl.collectors import Collector

from rlbuf import ConfigError, DistillationBuffer, EpisodeStats
from rlbuf.demos import _checkpoint, _progress, _run, ppo
from rlbuf.demos._options import DistillArgs as Args
from rlbuf.demos._options import PPOArgs


def evaluate(net: nn.Module, episodes: int, seed: int) -> float:
    """Mean return of the greedy policy ``argmax net(obs)`` over ``episodes`` seeded episodes.

    Example:
        >>> always_left = nn.Linear(4, 2)
        >>> evaluate(always_left, episodes=2, seed=0) < 50
        True
    """
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * episodes)  # finished envs: masked out
    obs, _ = envs.reset(seed=seed)
    device = next(net.parameters()).device
    returns, running = np.zeros(episodes), np.ones(episodes, dtype=bool)
    while running.any():
        with torch.no_grad():
            action = net(torch.as_tensor(obs, device=device)).argmax(-1).cpu().numpy()
        obs, reward, terminated, truncated, _ = envs.step(action)
        returns += reward * running
        running &= ~(terminated | truncated)
    envs.close()
    return float(returns.mean())


def teacher_network(args: Args, out: Path) -> tuple[nn.Sequential, str]:
    """The teacher's actor network, loaded or trained (a killed teacher run is resumed)."""
    folder = Path(args.teacher) if args.teacher is not None else out / "teacher"
    if args.teacher is None and not (folder / "model.pt").exists():
        given: dict[str, Any] = {"progress": args.progress}
        if (folder / "config.json").exists():
            given["resume"] = str(folder)
        else:
            given.update(out=str(folder), seed=args.seed, device=args.device, storage=args.storage,
                         frames=args.teacher_frames, checkpoint_every=args.checkpoint_every)
        try:
            ppo.run(_run.resolve_args(PPOArgs, given, "ppo"))
        except _run.Interrupted as stop:  # continued by resuming this run, which resumes the teacher
            raise _run.Interrupted(stop.checkpoint, out, stop.frames, "distill") from None
    if not (folder / "model.pt").exists():
        raise ConfigError(f"--teacher {folder}: no model.pt (a finished `rlbuf demo ppo --out {folder}` run)")
    saved = torch.load(folder / "model.pt", weights_only=True)
    net = ppo.mlp(4, saved["hidden"], 2, 0.01)
    net.load_state_dict(saved["actor"])
    return net, str(folder)


def run(args: Args) -> dict[str, Any]:
    """Distill a PPO teacher into a student by DAgger; write outputs; return the summary."""
    out = _run.setup(args, "distill")
    device = torch.device(args.device)
    frames_per_round = args.num_envs * args.num_steps

    # -- setup: teacher, student, buffer --------------------------------------------------------
    teacher_net, teacher_from = teacher_network(args, out)
    teacher_net.to(device)
    _run.seed_all(args.seed)  # the student's run is the same whether the teacher was trained, resumed or loaded
    env = ppo.make_env(args.num_envs)
    student_net = ppo.mlp(4, args.hidden, 2, 0.01).to(device)
    student = ppo.make_actor(student_net, env)
    optimizer = torch.optim.Adam(student_net.parameters(), lr=args.lr, fused=True)
    stats = EpisodeStats(args.num_envs)
    # One add per round, so a round's num_envs * num_steps observations are the rows of an add.
    buffer = DistillationBuffer(args.buffer_size, obs_shape=(4,), action_shape=(), action_dtype=torch.int64,
                                num_envs=frames_per_round, extra_fields={"expert_logits": ((2,), torch.float32)},
                                storage=args.storage, storing_device=device, seed=args.seed)

    frames, saved = 0, _checkpoint.resume(args, out, buffer)
    if saved is not None:
        student_net.load_state_dict(saved["models"]["student"])
        optimizer.load_state_dict(saved["optimizer"])
        stats.load_state_dict(saved["stats"])
        frames = saved["frames"]
        _run.drop_running_episodes(stats)  # the envs restart below
    remaining = -(-max(0, args.frames - frames) // frames_per_round) * frames_per_round
    collector = Collector(env, student, frames_per_batch=frames_per_round, total_frames=max(remaining, frames_per_round),
                          policy_device=device, storing_device=device, auto_register_policy_transforms=False)
    collector.reset(seed=_run.env_seed(args.seed, frames))  # see rlbuf.demos._run: exact resume
    progress = _progress.Progress(args, frames, None if saved is None else saved["progress"])

    def checkpoint(reason: _run.CheckpointReason) -> Path:
        return _checkpoint.save_checkpoint(out, "distill", args, frames, buffer, {
            "frames": frames, "progress": progress.state_dict(), "optimizer": optimizer.state_dict(),
            "models": {"student": student_net.state_dict()}, "stats": stats.state_dict()}, reason)

    # -- collect (student acts, teacher labels), learn, log -------------------------------------------
    stopped, interrupted_at = progress.done(frames), None
    for rollout in () if stopped else collector:
        frames_before, frames = frames, frames + rollout.numel()
        obs = rollout["observation"].reshape(-1, 4)
        with torch.no_grad():
            teacher_logits = teacher_net(obs)
        buffer.add(obs, teacher_logits.argmax(-1), expert_logits=teacher_logits)
        for t in range(args.num_steps):
            stats.update(rollout["next", "reward"][:, t, 0], rollout["next", "terminated"][:, t, 0],
                         rollout["next", "truncated"][:, t, 0])

        for _ in range(args.gradient_steps):
            batch = buffer.sample(args.batch_size)
            teacher_probs = batch.expert_logits.softmax(-1)
            loss = -(teacher_probs * student_net(batch.obs).log_softmax(-1)).sum(-1).mean()
            optimizer.zero_grad()
            torch.autograd.backward(loss)
            optimizer.step()

        progress.log(frames, stats, loss=loss.item())
        stopped = progress.done(frames)
        leave, interrupted_at = _run.checkpoint_and_reset(  # Ctrl-C: between two rounds
            args, frames_before, frames, stopped, checkpoint, lambda seed: collector.reset(seed=seed), stats)
        if leave:
            break
        if stopped:
            break
    collector.shutdown()
    progress.close()

    # -- evaluate, outputs ----------------------------------------------------------------------------
    extra: dict[str, Any] = {"teacher": teacher_from}
    if stopped:
        checkpoint("end")
        torch.save({"student": student_net.state_dict(), "hidden": args.hidden}, out / "model.pt")
        eval_seed = args.seed + 10_000  # episodes the training never saw
        teacher_return = evaluate(teacher_net, args.eval_episodes, eval_seed)
        student_return = evaluate(student_net, args.eval_episodes, eval_seed)
        extra.update(teacher_return=teacher_return, student_return=student_return,
                     student_fraction=student_return / teacher_return,
                     parameters={"teacher": sum(p.numel() for p in teacher_net.parameters()),
                                 "student": sum(p.numel() for p in student_net.parameters())})
    buffer.close()  # removes a memmap storage's scratch files
    return _progress.finish(out, "distill", args, progress, frames, stats, stopped, interrupted_at, **extra)
