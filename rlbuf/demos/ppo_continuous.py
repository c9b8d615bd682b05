"""PPO on Pendulum-v1, CleanRL-style: a gymnasium vector env, the Recorder, the RolloutBuffer, GAE.

Run it with ``rlbuf demo ppo-continuous`` (``--help`` lists the options). Every Pendulum
episode ends by its 200-step time limit, none by termination: exactly the case where treating
a timeout as a death (CleanRL's folded ``done``) biases every value target near the end of
an episode. ``--fold-truncation`` runs that baseline on the same code path. The loop, top to
bottom:

1. ``num_envs`` Pendulums in a gymnasium ``SyncVectorEnv`` with ``AutoresetMode.SAME_STEP``:
   an ending step returns the reset observation and puts the final one in
   ``info["final_obs"]``;
2. each step, observations are normalised (running mean and variance, as CleanRL's
   ``NormalizeObservation``) and rewards scaled (as ``NormalizeReward``); the
   [`Recorder`][rlbuf.gym.Recorder] stores the step and, where an env was truncated, asks the
   critic for V(final observation) — normalised the same way — as ``bootstrap_value``;
3. ``compute_returns_and_advantages`` runs GAE: a truncated step bootstraps from its final
   observation's value, the λ-trace stops at the episode boundary;
4. ``epochs`` passes of shuffled minibatches (one ``minibatches()`` call per epoch) update the
   Gaussian actor and the critic with the clipped objective, as CleanRL's
   ``ppo_continuous_action.py``.

The episode statistics see the raw rewards (fed before the scaling), so the curve shows real
Pendulum returns (about -1200 for a random policy, -150 to -200 when solved).

Compare both over several seeds in one figure (3 to 11 minutes per run with the defaults on a
shared 2-core machine; measured over 6 seeds: -174 ± 13 bootstrapped, -961 ± 108 folded, every
seed separated; see docs/coming-from/cleanrl.md)::

    python -m rlbuf.demos.ppo_continuous compare --seeds 3 --out runs/pendulum

Example (not run here: each run trains for minutes)::

    rlbuf demo ppo-continuous --out runs/pendulum-bootstrap
    rlbuf demo ppo-continuous --fold-truncation --out runs/pendulum-folded
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.wrappers.utils import update_mean_var_count_from_moments
from torch import nn

from rlbuf import EpisodeStats, RolloutBuffer
from rlbuf.demos import _checkpoint, _compare, _progress, _run
from rlbuf.demos._options import WINDOW
from rlbuf.demos._options import PPOContinuousArgs as Args
from rlbuf.demos.ppo import mlp
from rlbuf.gym import Recorder


class RunningNorm:
    """A running mean and variance over batches (Chan's parallel update), as gymnasium's ``RunningMeanStd``.

    Example:
        >>> norm = RunningNorm(())
        >>> norm.update(np.array([1.0, 3.0]))
        >>> round(float(norm.mean), 3), round(float(norm.var), 3)
        (2.0, 1.0)
    """

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = 1e-4

    def update(self, batch: np.ndarray[Any, Any]) -> None:
        """Fold a batch ``[n, *shape]`` into the running moments (gymnasium's own update)."""
        self.mean, self.var, self.count = update_mean_var_count_from_moments(
            self.mean, self.var, self.count, batch.mean(0), batch.var(0), batch.shape[0])

    def state_dict(self) -> dict[str, Any]:
        """The moments, for a checkpoint."""
        return {"mean": torch.tensor(self.mean), "var": torch.tensor(self.var), "count": torch.tensor(self.count, dtype=torch.float64)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict``."""
        self.mean, self.var, self.count = state["mean"].numpy(), state["var"].numpy(), float(state["count"])


class GaussianActor(nn.Module):
    """A diagonal Gaussian policy: a state-dependent mean, a learned state-independent log-std (as CleanRL).

    Example:
        >>> actor = GaussianActor(3, 8, 1)
        >>> round(float(actor.log_prob(torch.zeros(1, 1), torch.zeros(1, 1))[0].detach()), 4)
        -0.9189
    """

    def __init__(self, obs_size: int, hidden: int, action_size: int) -> None:
        super().__init__()
        self.mean = mlp(obs_size, hidden, action_size, 0.01)
        self.log_std = nn.Parameter(torch.zeros(action_size))

    def log_prob(self, action: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        """The log-density of ``action`` around ``mean``, summed over action dims: ``[B]``."""
        log_std = self.log_std
        return (-0.5 * ((action - mean) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)


def make_envs(num_envs: int) -> gym.vector.SyncVectorEnv:
    """``num_envs`` Pendulum-v1 envs that reset in the step that ends an episode (``SAME_STEP``).

    Example:
        >>> envs = make_envs(2)
        >>> envs.metadata["autoreset_mode"], envs.single_observation_space.shape
        (<AutoresetMode.SAME_STEP: 'SameStep'>, (3,))
    """
    return gym.vector.SyncVectorEnv([lambda: gym.make("Pendulum-v1")] * num_envs,
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def run(args: Args) -> dict[str, Any]:
    """Train PPO as ``args`` say; write curve, summary, model and checkpoints; return the summary."""
    out = _run.setup(args, "ppo-continuous")
    device = torch.device(args.device)

    # -- setup: envs, normalisers, networks, buffer, recorder ---------------------------------------
    envs = make_envs(args.num_envs)
    obs_size = int(np.prod(envs.single_observation_space.shape))
    action_size = int(np.prod(envs.single_action_space.shape))
    low, high = envs.single_action_space.low, envs.single_action_space.high
    obs_norm, return_norm = RunningNorm((obs_size,)), RunningNorm(())
    discounted = np.zeros(args.num_envs)
    actor = GaussianActor(obs_size, args.hidden, action_size).to(device)
    critic = mlp(obs_size, args.hidden, 1, 1.0).to(device)
    parameters = [*actor.parameters(), *critic.parameters()]
    optimizer = torch.optim.Adam(parameters, lr=args.lr, eps=1e-5)
    stats = EpisodeStats(args.num_envs)  # fed with raw rewards: real Pendulum returns
    buffer = RolloutBuffer(args.num_steps, args.num_envs, observation_space=envs.single_observation_space,
                           action_space=envs.single_action_space, storage=args.storage, storing_device=device,
                           seed=args.seed)

    def normalized(obs: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return np.clip((obs - obs_norm.mean) / np.sqrt(obs_norm.var + 1e-8), -10, 10).astype(np.float32)

    def bootstrap(final_obs: np.ndarray[Any, Any]) -> torch.Tensor:
        # The final observation is raw (info["final_obs"]): normalise it as the policy's inputs were.
        with torch.no_grad():
            values: torch.Tensor = critic(torch.as_tensor(normalized(final_obs), device=device)).squeeze(-1)
        return values

    recorder = Recorder(envs, buffer, bootstrap=bootstrap)

    frames, saved = 0, _checkpoint.resume(args, out, buffer)
    if saved is not None:
        actor.load_state_dict(saved["models"]["actor"])
        critic.load_state_dict(saved["models"]["critic"])
        optimizer.load_state_dict(saved["optimizer"])
        obs_norm.load_state_dict(saved["obs_norm"])
        return_norm.load_state_dict(saved["return_norm"])
        stats.load_state_dict(saved["stats"])
        _run.drop_running_episodes(stats)  # as the uninterrupted run did right after saving
        frames = saved["frames"]
    progress = _progress.Progress(args, frames, None if saved is None else saved["progress"])
    raw_obs, _ = envs.reset(seed=_run.env_seed(args.seed, frames))  # see rlbuf.demos._run: exact resume
    obs_norm.update(raw_obs)

    def reset_envs(seed: int) -> None:
        nonlocal raw_obs
        raw_obs, _ = envs.reset(seed=seed)
        obs_norm.update(raw_obs)
        discounted[:] = 0.0

    def checkpoint(reason: _run.CheckpointReason) -> Path:
        return _checkpoint.save_checkpoint(out, "ppo-continuous", args, frames, buffer, {
            "frames": frames, "progress": progress.state_dict(), "optimizer": optimizer.state_dict(),
            "obs_norm": obs_norm.state_dict(), "return_norm": return_norm.state_dict(), "stats": stats.state_dict(),
            "models": {"actor": actor.state_dict(), "critic": critic.state_dict()}}, reason)

    # -- collect, learn, log ------------------------------------------------------------------------
    loss = torch.zeros(())
    stopped, interrupted_at = progress.done(frames), None
    while not stopped:
        frames_before = frames
        for group in optimizer.param_groups:
            group["lr"] = args.lr * max(0.0, 1.0 - frames_before / args.frames)
        buffer.clear()
        obs = normalized(raw_obs)
        for _ in range(args.num_steps):
            with torch.no_grad():
                obs_t = torch.as_tensor(obs, device=device)
                mean = actor.mean(obs_t)
                action = mean + actor.log_std.exp() * torch.randn_like(mean)
                log_prob = actor.log_prob(action, mean)
                value = critic(obs_t).squeeze(-1)
            raw_obs, reward, terminated, truncated, info = envs.step(np.clip(action.cpu().numpy(), low, high))
            stats.update(reward, terminated, truncated)
            done = terminated | truncated
            discounted = discounted * args.gamma + reward  # NormalizeReward: scale by the return's std
            return_norm.update(discounted)
            discounted[done] = 0.0
            scaled = np.clip(reward / np.sqrt(return_norm.var + 1e-8), -10, 10).astype(np.float32)
            if args.fold_truncation:  # the baseline: a timeout ends the value target like a death
                terminated, truncated = done, np.zeros_like(done)
            recorder.record(obs, action, scaled, raw_obs, terminated, truncated, info, value=value, log_prob=log_prob)
            obs_norm.update(raw_obs)
            obs = normalized(raw_obs)
        frames += args.num_steps * args.num_envs
        with torch.no_grad():
            last_value = critic(torch.as_tensor(obs, device=device)).squeeze(-1)
        buffer.compute_returns_and_advantages(last_value, gamma=args.gamma, gae_lambda=args.gae_lambda)

        for _ in range(args.epochs):
            approx_kl = 0.0
            for batch in buffer.minibatches(num_minibatches=args.num_minibatches):  # one call per epoch
                log_ratio = actor.log_prob(batch.action, actor.mean(batch.obs)) - batch.log_prob
                ratio = log_ratio.exp()
                approx_kl = float(((ratio - 1) - log_ratio).mean().detach())
                advantage = (batch.advantage - batch.advantage.mean()) / (batch.advantage.std() + 1e-8)
                policy_loss = -torch.min(ratio * advantage,
                                         ratio.clamp(1 - args.clip, 1 + args.clip) * advantage).mean()
                new_value = critic(batch.obs).squeeze(-1)
                clipped = batch.value + (new_value - batch.value).clamp(-args.clip, args.clip)
                value_loss = 0.5 * torch.max((new_value - batch.returns) ** 2, (clipped - batch.returns) ** 2).mean()
                entropy = (0.5 + 0.5 * math.log(2 * math.pi) + actor.log_std).sum()  # a diagonal Gaussian's
                loss = policy_loss + args.vf_coef * value_loss - args.ent_coef * entropy
                optimizer.zero_grad()
                torch.autograd.backward(loss)
                nn.utils.clip_grad_norm_(parameters, args.max_grad_norm)
                optimizer.step()
            if args.target_kl is not None and approx_kl > args.target_kl:
                break

        progress.log(frames, stats, loss=loss.item())
        stopped = progress.done(frames)
        leave, interrupted_at = _run.checkpoint_and_reset(  # Ctrl-C: between two rollouts
            args, frames_before, frames, stopped, checkpoint, reset_envs, stats)
        if leave:
            break
    envs.close()
    progress.close()

    # -- outputs ------------------------------------------------------------------------------------
    if stopped:
        checkpoint("end")
        torch.save({"actor": actor.state_dict(), "critic": critic.state_dict(), "obs_norm": obs_norm.state_dict(),
                    "hidden": args.hidden},
                   out / "model.pt")
    buffer.close()
    variant = "folded (timeout = death)" if args.fold_truncation else "bootstrapped timeouts"
    return _progress.finish(out, "ppo-continuous", args, progress, frames, stats, stopped, interrupted_at,
                       title=f"PPO on Pendulum-v1, {variant} (seed {args.seed})", variant=variant)


# -- both variants over several seeds, one figure --------------------------------------------------
def _entry(summary: dict[str, Any]) -> dict[str, Any]:
    """A run's entry in ``compare.json``: its final mean return, minutes and frames."""
    return {"final": summary[f"mean_return_last_{WINDOW}"], "minutes": round(summary["seconds"] / 60, 2),
            "frames": summary["frames"]}


_COMPARISON = _compare.Comparison(
    demo="ppo_continuous",
    description="Run the bootstrapped and the folded PPO on Pendulum-v1 over several seeds, in sequence, and plot "
                "both in one figure.",
    default_out="runs/pendulum-compare",
    variants=(_compare.Variant("bootstrapped", {"fold_truncation": False}, "rlbuf: timeouts bootstrap", "tab:blue"),
              _compare.Variant("folded", {"fold_truncation": True}, "folded done (timeout = death)", "tab:red")),
    run=lambda options: run(Args(**options)), entry=_entry,
    ylabel=f"mean return, last {WINDOW} episodes", line="{variant}: {mean} (seeds: {seeds})",
    legend="lower right", number=".0f")
_TITLE = "PPO on Pendulum-v1: every episode ends by its time limit"


def compare(seeds: int, out: Path, frames: int | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the bootstrapped and the folded variant for ``seeds`` seeds each, in sequence; plot both.

    Writes ``out/<variant>-seed<k>/`` (each a full run; a finished one is reused, a stopped one
    resumed) and ``out/compare.png``, ``out/compare.json`` (the final mean return of the last 20
    episodes of every run, mean and std per variant).

    Args:
        seeds: runs of each variant (``bootstrapped``, ``folded``), seeds 1 to ``seeds``.
        out: the output folder.
        frames: frames per run; None: the demo's default.
        extra: more options for every run (``PPOContinuousArgs`` fields).

    Returns:
        What ``compare.json`` holds; ``final`` is a run's mean return of its last 20 episodes.

    Example (not run here)::

        python -m rlbuf.demos.ppo_continuous compare --seeds 3 --out runs/pendulum
    """
    return _COMPARISON.compare(seeds, out, frames, extra, _TITLE)


def main(argv: list[str] | None = None) -> int:
    """``python -m rlbuf.demos.ppo_continuous compare --seeds N --out DIR [--frames F]``; 130 on Ctrl-C."""
    return _COMPARISON.main(compare, argv)


def plot_compare(results: dict[str, Any], path: Path) -> None:
    """Both variants' return curves (every seed thin, the mean thick) in one PNG, titled ``_TITLE``.

    Args:
        results: what ``compare`` returns, or a ``compare.json`` read.
        path: the PNG to write.
    """
    _COMPARISON.plot(results, path, _TITLE)


if __name__ == "__main__":
    sys.exit(main())
