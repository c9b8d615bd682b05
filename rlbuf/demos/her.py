"""DQN with hindsight experience replay on bit flipping: a sparse reward that only relabelled goals make learnable.

Run it with ``rlbuf demo her`` (``--help`` lists the options). The env
([`BitFlipEnv`][rlbuf.demos.bitflip.BitFlipEnv]) has ``n_bits`` bits and a random target; action
``i`` flips bit ``i``; the reward is 0 at the target and -1 everywhere else. With 15 bits a random
policy reaches the target in about one episode of 2,400, so plain DQN sees almost nothing but
-1 and learns nothing; relabelling a sampled transition with a goal its episode did reach
later (Andrychowicz et al., 2017) turns every episode into successes for some goal. The loop, top
to bottom:

1. ε-greedy actions for ``num_envs`` envs in a gymnasium ``SyncVectorEnv`` with
   ``AutoresetMode.DISABLED`` (the loop resets finished envs, and cuts every episode at a
   checkpoint, marking it ``truncated``); the Q-network sees ``concat(observation, desired_goal)``;
2. the [`Recorder`][rlbuf.gym.Recorder] stores each step in a ``ReplayBuffer`` built from the
   env's ``Dict`` space with ``hindsight=Hindsight(strategy, relabel_ratio, compute_reward)``
   (``--no-hindsight``: no relabelling, the same code otherwise); a success is ``terminated``,
   a time limit ``truncated``;
3. every ``train_every`` frames, ``gradient_steps`` double-DQN updates on sampled batches; in a
   fraction ``relabel_ratio`` of their rows the buffer has replaced ``desired_goal`` (of ``obs``
   and ``next_obs``) by an achieved goal of the same episode and recomputed the reward with the
   env's ``compute_reward``; ``batch.terminated`` is kept as stored, so a time limit bootstraps;
4. the target network follows the online one softly (``tau``) every ``target_every`` frames.

The curve and the summary report the success rate: the episode statistics are fed 1 at a step
that reaches the goal and 0 elsewhere, so an episode's "return" is 1 for a success, 0 for a
failure, and the mean of the last 20 is their success rate (``success_rate`` in the summary: of
the last 100).

Compare both variants over several seeds in one figure (see docs/hindsight-demo.md)::

    python -m rlbuf.demos.her compare --seeds 3 --out runs/her

Example (not run here: each run trains for minutes)::

    rlbuf demo her --out runs/her
    rlbuf demo her --no-hindsight --out runs/her-plain
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlbuf import EpisodeStats, Hindsight, ReplayBuffer
from rlbuf.demos import _checkpoint, _compare, _progress, _run
from rlbuf.demos._options import WINDOW
from rlbuf.demos._options import HERArgs as Args
from rlbuf.demos.bitflip import BitFlipEnv
from rlbuf.gym import Recorder

SUCCESS_WINDOW = 100
"""Episodes over which the summary's ``success_rate`` is taken (EpisodeStats' window)."""


def q_network(n_bits: int, hidden: int) -> nn.Sequential:
    """``concat(observation, desired_goal)`` (``2 n_bits``) -> one Q-value per bit to flip.

    Example:
        >>> q_network(5, 8)(torch.zeros(3, 10)).shape
        torch.Size([3, 5])
    """
    return nn.Sequential(nn.Linear(2 * n_bits, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, n_bits))


def q_input(obs: Any) -> torch.Tensor:
    """The Q-network's input from a goal observation (numpy dict of the envs, or a batch's TensorDict).

    Example:
        >>> obs = {"observation": np.ones((2, 3), np.float32), "desired_goal": np.zeros((2, 3), np.float32)}
        >>> q_input(obs).tolist()
        [[1.0, 1.0, 1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]]
    """
    return torch.cat([torch.as_tensor(obs["observation"]), torch.as_tensor(obs["desired_goal"])], dim=-1)


def epsilon(args: Args, frames: int) -> float:
    """The exploration rate after ``frames`` frames.

    Example:
        >>> epsilon(Args(), 0), epsilon(Args(), 10_000), epsilon(Args(), 100_000)
        (1.0, 0.525, 0.05)
    """
    fraction = min(1.0, frames / args.exploration_frames)
    return args.final_epsilon + (1.0 - fraction) * (1.0 - args.final_epsilon)


def make_envs(args: Args) -> gym.vector.SyncVectorEnv:
    """``num_envs`` bit-flipping envs that the loop resets (``DISABLED``: ``next_obs`` is always real).

    Example:
        >>> envs = make_envs(Args(num_envs=2, n_bits=4))
        >>> envs.metadata["autoreset_mode"], envs.single_action_space
        (<AutoresetMode.DISABLED: 'Disabled'>, Discrete(4))
    """
    return gym.vector.SyncVectorEnv([lambda: BitFlipEnv(args.n_bits)] * args.num_envs,
                                    autoreset_mode=gym.vector.AutoresetMode.DISABLED)


def success_rate(stats: EpisodeStats) -> float | None:
    """The fraction of the last ``SUCCESS_WINDOW`` finished episodes that reached their goal.

    Example:
        >>> stats = EpisodeStats(1)
        >>> for success in (1.0, 0.0, 1.0, 1.0):
        ...     stats.update(success, True)
        >>> success_rate(stats)
        0.75
    """
    returns = stats.recent_returns(SUCCESS_WINDOW)
    return float(np.mean(returns)) if returns else None


def run(args: Args) -> dict[str, Any]:
    """Train DQN (with or without hindsight) as ``args`` say; write curve, summary, model, checkpoints."""
    out = _run.setup(args, "her")
    device = torch.device(args.device)

    # -- setup: envs, networks, buffer, recorder ----------------------------------------------------
    envs = make_envs(args)
    q_net = q_network(args.n_bits, args.hidden).to(device)
    target_net = q_network(args.n_bits, args.hidden).to(device)
    target_net.load_state_dict(q_net.state_dict())
    optimizer = torch.optim.Adam(q_net.parameters(), lr=args.lr, fused=True)
    rng = np.random.default_rng(args.seed)  # ε-greedy draws
    stats = EpisodeStats(args.num_envs, window=SUCCESS_WINDOW)  # fed successes, not rewards: see the docstring
    hindsight = Hindsight(args.strategy, args.relabel_ratio, BitFlipEnv.compute_reward) if args.hindsight else None
    buffer = ReplayBuffer(args.buffer_size, observation_space=envs.single_observation_space,
                          action_space=envs.single_action_space, num_envs=args.num_envs, hindsight=hindsight,
                          storage=args.storage, device=device, seed=args.seed)
    recorder = Recorder(envs, buffer)

    frames, saved = 0, _checkpoint.resume(args, out, buffer)
    if saved is not None:
        q_net.load_state_dict(saved["models"]["q"])
        target_net.load_state_dict(saved["models"]["target"])
        optimizer.load_state_dict(saved["optimizer"])
        rng.bit_generator.state = saved["exploration_rng"]
        stats.load_state_dict(saved["stats"])
        _run.drop_running_episodes(stats)  # the envs restart below
        frames = saved["frames"]
    obs, _ = envs.reset(seed=_run.env_seed(args.seed, frames))  # see rlbuf.demos._run: exact resume
    progress = _progress.Progress(args, frames, None if saved is None else saved["progress"])

    def reset_envs(seed: int) -> None:
        nonlocal obs
        obs, _ = envs.reset(seed=seed)

    def checkpoint(reason: _run.CheckpointReason) -> Path:
        return _checkpoint.save_checkpoint(out, "her", args, frames, buffer, {
            "frames": frames, "progress": progress.state_dict(), "optimizer": optimizer.state_dict(),
            "models": {"q": q_net.state_dict(), "target": target_net.state_dict()}, "stats": stats.state_dict(),
            "exploration_rng": rng.bit_generator.state}, reason)

    # -- collect, learn, log ------------------------------------------------------------------------
    stopped, loss, interrupted_at = progress.done(frames), 0.0, None
    while not stopped:
        eps = epsilon(args, frames)
        with torch.no_grad():
            greedy = q_net(q_input(obs).to(device)).argmax(1).cpu().numpy()
        explore = rng.random(args.num_envs) < eps
        action = np.where(explore, rng.integers(0, args.n_bits, args.num_envs), greedy)
        next_obs, reward, terminated, truncated, info = envs.step(action)
        stats.update(terminated.astype(np.float32), terminated, truncated)  # return 1: reached the goal
        frames_before, frames = frames, frames + args.num_envs
        # The envs restart after a checkpoint (exact resume): the episodes running then end here,
        # cut like a time limit, so that no relabelled goal comes from the episode after the cut.
        cut = _run.crossed(frames_before, frames, args.checkpoint_every) or _run.interrupt_requested()
        recorder.record(obs, action, reward, next_obs, terminated, truncated | (cut & ~terminated), info)
        obs = next_obs
        done = terminated | truncated
        if done.any():
            obs, _ = envs.reset(options={"reset_mask": done})

        if _run.crossed(frames_before, frames, args.target_every):
            with torch.no_grad():
                for target_param, param in zip(target_net.parameters(), q_net.parameters(), strict=True):
                    target_param.lerp_(param, args.tau)
        if frames > args.learning_starts and _run.crossed(frames_before, frames, args.train_every):
            for _ in range(args.gradient_steps):
                batch = buffer.sample(args.batch_size)
                state, next_state = q_input(batch.obs), q_input(batch.next_obs)
                with torch.no_grad():
                    next_action = q_net(next_state).argmax(1, keepdim=True)
                    next_q = target_net(next_state).gather(1, next_action).squeeze(1)
                    target = batch.reward + args.gamma * (~batch.terminated) * next_q  # time limits bootstrap
                q = q_net(state).gather(1, batch.action.unsqueeze(1)).squeeze(1)
                loss_t = nn.functional.smooth_l1_loss(q, target)
                optimizer.zero_grad()
                torch.autograd.backward(loss_t)
                nn.utils.clip_grad_norm_(q_net.parameters(), 10.0)
                optimizer.step()
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
        torch.save({"q": q_net.state_dict(), "n_bits": args.n_bits, "hidden": args.hidden}, out / "model.pt")
    buffer.close()
    variant = f"hindsight ({args.strategy}, {args.relabel_ratio:g})" if args.hindsight else "no hindsight"
    return _progress.finish(out, "her", args, progress, frames, stats, stopped, interrupted_at,
                            title=f"DQN on {args.n_bits}-bit flipping, {variant} (seed {args.seed})",
                            ylabel=f"success rate, last {WINDOW} episodes", variant=variant,
                            success_rate=success_rate(stats), success_window=SUCCESS_WINDOW)


# -- both variants over several seeds, one figure --------------------------------------------------
def _entry(summary: dict[str, Any]) -> dict[str, Any]:
    """A run's entry in ``compare.json``: its bit count, final success rate, frames, minutes, frames to 0.9."""
    reached = summary["reached_target"]
    return {"n_bits": summary["args"]["n_bits"], "final": summary["success_rate"], "frames": summary["frames"],
            "minutes": round(summary["seconds"] / 60, 2),
            "reached_at_frames": None if reached is None else reached["frames"]}


_COMPARISON = _compare.Comparison(
    demo="her",
    description="Run DQN on bit flipping with and without hindsight over several seeds, in sequence, and plot "
                "both in one figure.",
    default_out="runs/her-compare",
    variants=(_compare.Variant("hindsight", {"hindsight": True}, "with hindsight (future, 0.8)", "tab:blue"),
              _compare.Variant("no-hindsight", {"hindsight": False}, "without hindsight", "tab:red")),
    run=lambda options: run(Args(**options)), entry=_entry,
    ylabel=f"success rate, last {WINDOW} episodes", line="{variant}: success rate {mean} (seeds: {seeds})",
    ylim=(-0.03, 1.03), legend="center right", number=".2f")


def compare(seeds: int, out: Path, frames: int | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run DQN with and without hindsight for ``seeds`` seeds each, one run after the other; plot both.

    Writes ``out/<variant>-seed<k>/`` (each a full run; a finished one is reused, a stopped one
    resumed), ``out/compare.png`` and ``out/compare.json``: per variant, every run's final
    success rate, frames, minutes and curve, and the mean and std of the final success rates.

    Args:
        seeds: runs of each variant (``hindsight``, ``no-hindsight``), seeds 1 to ``seeds``.
        out: the output folder.
        frames: frames per run; None: the demo's default.
        extra: more options for every run (``HERArgs`` fields; ``n_bits`` also names the figure).

    Returns:
        What ``compare.json`` holds; ``final`` is a run's success rate.

    Example (not run here)::

        python -m rlbuf.demos.her compare --seeds 3 --out runs/her
    """
    n_bits = Args(**(extra or {})).n_bits
    return _COMPARISON.compare(seeds, out, frames, extra, f"DQN on {n_bits}-bit flipping: a sparse reward")


def main(argv: list[str] | None = None) -> int:
    """``python -m rlbuf.demos.her compare --seeds N --out DIR [--frames F]``; 130 on Ctrl-C."""
    return _COMPARISON.main(compare, argv)


def plot_compare(results: dict[str, Any], path: Path, title: str = "DQN on bit flipping") -> None:
    """Both variants' success-rate curves (every seed thin, the mean thick) in one PNG.

    Args:
        results: what ``compare`` returns, or a ``compare.json`` read (docs/scripts/plot_hindsight.py).
        path: the PNG to write.
        title: the figure's title.
    """
    _COMPARISON.plot(results, path, title)


if __name__ == "__main__":
    sys.exit(main())
