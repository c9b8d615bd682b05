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

import argparse
import json
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
from rlbuf.demos import _checkpoint, _progress, _run
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
def compare(seeds: int, out: Path, frames: int | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the bootstrapped and the folded variant for ``seeds`` seeds each, in sequence; plot both.

    Writes ``out/<variant>-seed<k>/`` (each a full run) and ``out/compare.png``, ``out/compare.json``
    (the final mean return of the last 20 episodes of every run, mean and std per variant).

    Example (not run here)::

        python -m rlbuf.demos.ppo_continuous compare --seeds 3 --out runs/pendulum
    """
    results: dict[str, Any] = {}
    for variant, fold in (("bootstrapped", False), ("folded", True)):
        runs = []
        for seed in range(1, seeds + 1):
            run_dir = out / f"{variant}-seed{seed}"
            summary = _finished_summary(run_dir, frames)
            if summary is None:  # a fresh run, or the continuation of one stopped, interrupted or killed before
                options: dict[str, Any] = {"seed": seed, "out": str(run_dir), "fold_truncation": fold,
                                           **(extra or {})}
                if frames is not None:
                    options["frames"] = frames
                if (run_dir / "config.json").exists():
                    options["resume"] = str(run_dir)
                summary = run(Args(**options))
            runs.append({"seed": seed, "final": summary[f"mean_return_last_{WINDOW}"],
                         "minutes": round(summary["seconds"] / 60, 2), "frames": summary["frames"],
                         "history": _history(run_dir)})
        finals = [r["final"] for r in runs if r["final"] is not None]
        results[variant] = {"runs": runs, "mean": float(np.mean(finals)) if finals else None,
                            "std": float(np.std(finals)) if finals else None}
    plot_compare(results, out / "compare.png")
    (out / "compare.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return results


def _finished_summary(run_dir: Path, frames: int | None) -> dict[str, Any] | None:
    """The summary of a run that finished (with ``frames`` frames, if given), to reuse; else None."""
    path = run_dir / "summary.json"
    summary: dict[str, Any] | None = json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
    if summary is None or summary["status"] != "finished" or (frames is not None and summary["args"]["frames"] != frames):
        return None
    return summary


def _history(run_dir: Path) -> list[list[float | None]]:
    checkpoint = _run.latest_checkpoint(run_dir)
    if checkpoint is None:
        return []
    state = torch.load(checkpoint / "state.pt", weights_only=True)
    return [list(point) for point in state["progress"]["history"]]


def plot_compare(results: dict[str, Any], path: Path) -> None:
    """Both variants' curves (every seed thin, the mean thick) in one PNG.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "compare.png"
        >>> run = {"seed": 1, "final": -200.0, "history": [[2048, 1.0, -900.0], [4096, 2.0, -200.0]]}
        >>> plot_compare({"bootstrapped": {"runs": [run], "mean": -200.0, "std": 0.0}}, path)
        >>> path.read_bytes()[:4]
        b'\\x89PNG'
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"bootstrapped": "tab:blue", "folded": "tab:red"}
    labels = {"bootstrapped": "rlbuf: timeouts bootstrap", "folded": "folded done (timeout = death)"}
    figure, axes = plt.subplots(figsize=(7, 4))
    for variant, result in results.items():
        curves = [[(p[0], p[2]) for p in run["history"] if p[2] is not None] for run in result["runs"]]
        for curve in curves:
            if curve:
                axes.plot(*zip(*curve, strict=True), color=colors.get(variant), alpha=0.3, linewidth=0.8)
        shortest = min((len(c) for c in curves if c), default=0)
        if shortest:
            x = [p[0] for p in curves[0][-shortest:]]
            y = np.mean([[p[1] for p in c[-shortest:]] for c in curves if c], axis=0)
            summary = "" if result["mean"] is None else f": {result['mean']:.0f} ± {result['std']:.0f}"
            axes.plot(x, y, color=colors.get(variant), linewidth=2,
                      label=f"{labels.get(variant, variant)}{summary} ({len(curves)} seeds)")
    axes.set_xlabel("frames")
    axes.set_ylabel(f"mean return, last {WINDOW} episodes")
    axes.set_title("PPO on Pendulum-v1: every episode ends by its time limit")
    axes.grid(alpha=0.3)
    if axes.get_legend_handles_labels()[0]:  # no curve yet when the run stopped before its first episodes
        axes.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    """``python -m rlbuf.demos.ppo_continuous compare --seeds N --out DIR [--frames F]``; 130 on Ctrl-C."""
    parser = argparse.ArgumentParser(prog="python -m rlbuf.demos.ppo_continuous",
                                     description="Run the bootstrapped and the folded PPO on Pendulum-v1 over "
                                                 "several seeds, in sequence, and plot both in one figure.")
    parser.add_argument("command", choices=["compare"])
    parser.add_argument("--seeds", type=int, default=3, help="seeds per variant (default: 3)")
    parser.add_argument("--out", default="runs/pendulum-compare", help="output folder")
    parser.add_argument("--frames", type=int, default=None, help="frames per run (default: the demo's)")
    options = parser.parse_args(argv)
    torch.set_num_threads(1)
    try:
        with _run.stop_on_interrupt():  # Ctrl-C: the running run writes a checkpoint and stops
            report = compare(options.seeds, Path(options.out), options.frames)
    except _run.Interrupted as stop:
        print(f"{parser.prog} compare: {stop.demo} in {stop.run_dir} interrupted at {stop.frames} frames; run the "
              "same command again to continue (finished runs are reused, this one resumes)", file=sys.stderr)
        return 130
    for variant, result in report.items():
        finals = ", ".join("-" if r["final"] is None else f"{r['final']:.0f}" for r in result["runs"])
        shown = "-" if result["mean"] is None else f"{result['mean']:.0f} ± {result['std']:.0f}"
        print(f"{variant}: {shown} (seeds: {finals})")
    print(f"figure: {Path(options.out) / 'compare.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
