"""A demo's progress bar, learning curve and summary.

Example:
    >>> progress = Progress(RunArgs(progress=False), 0)
    >>> progress.log(100, EpisodeStats(1)) is None   # fewer than 20 episodes: no mean yet
    True
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import torch

from rlbuf.demos._options import WINDOW, RunArgs
from rlbuf.demos._run import Interrupted, mean_return, write_json
from rlbuf.stats import EpisodeStats


class Progress:
    """Progress on stderr (frames, fps, recent return) and the learning-curve history.

    With ``progress=None`` (the default) a tqdm bar when stderr is a terminal; else, in a log,
    one plain line each tenth of ``frames`` (no ``\\r`` frames). ``True``: always the bar;
    ``False``: nothing. A run stopped before its end (Ctrl-C, ``--stop-after-frames``) leaves
    the bar where it stood; one done early, at its target, closes it at 100 %.

    Args:
        args: the run's options (``frames``, ``progress``, ``target_return``).
        frames: frames already done (non-zero when resuming).
        state: a ``state_dict`` from the checkpoint, when resuming.

    Example:
        >>> progress = Progress(RunArgs(progress=False), 0)
        >>> stats = EpisodeStats(1)
        >>> for _ in range(WINDOW):
        ...     stats.update(500.0, True)
        >>> progress.log(1_000, stats)
        500.0
        >>> progress.reached["frames"], progress.done(1_000)
        (1000, True)
    """

    def __init__(self, args: RunArgs, frames: int, state: dict[str, Any] | None = None) -> None:
        from tqdm import tqdm

        self.args = args
        self.history: list[list[float | None]] = [] if state is None else [list(p) for p in state["history"]]
        self.reached: dict[str, float] | None = None if state is None else state["reached"]
        self.resumed_at: list[int] = [] if state is None else [*state["resumed_at"], frames]
        self._elapsed = 0.0 if state is None else float(state["elapsed"])
        self._started = time.perf_counter()
        self._frames = frames
        bar = sys.stderr.isatty() if args.progress is None else args.progress
        self._lines = args.progress is None and not bar
        self._next_line = self._tenth_after(frames)
        self.bar = tqdm(total=args.frames, initial=frames, unit="frame", unit_scale=True, dynamic_ncols=True,
                        disable=not bar, file=sys.stderr)

    @property
    def seconds(self) -> float:
        """Training time so far, over every resumed part of the run."""
        return self._elapsed + time.perf_counter() - self._started

    def log(self, frames: int, stats: EpisodeStats, **postfix: float) -> float | None:
        """Advance to ``frames``, record a curve point; return the recent mean return."""
        recent = mean_return(stats)
        self.history.append([frames, round(self.seconds, 3), recent])
        if recent is not None and self.reached is None and recent >= self.args.target_return:
            self.reached = {"frames": frames, "seconds": round(self.seconds, 3)}
        self._frames = frames
        self.bar.update(frames - self.bar.n)
        shown = {"return": "-" if recent is None else f"{recent:.1f}", "episodes": stats.episodes_finished}
        self.bar.set_postfix({**shown, **{k: f"{v:.3g}" for k, v in postfix.items()}}, refresh=False)
        if self._lines and frames >= self._next_line:
            self._next_line = self._tenth_after(frames)
            print(f"{frames}/{self.args.frames} frames ({100 * frames // self.args.frames}%), {self.seconds:.1f} s, "
                  f"mean return {shown['return']} ({shown['episodes']} episodes)", file=sys.stderr, flush=True)
        return recent

    def _tenth_after(self, frames: int) -> int:
        """The first tenth of ``--frames`` past ``frames``: where the next plain progress line is due."""
        return (frames * 10 // self.args.frames + 1) * self.args.frames // 10

    def done(self, frames: int) -> bool:
        """Whether the run is over at ``frames``: ``--frames`` done, or the target reached with ``--stop-at-target``."""
        return frames >= self.args.frames or (self.reached is not None and self.args.stop_at_target)

    def state_dict(self) -> dict[str, Any]:
        """History, elapsed time and target, for the checkpoint."""
        return {"history": self.history, "reached": self.reached, "elapsed": self.seconds,
                "resumed_at": self.resumed_at}

    def close(self) -> None:
        """Close the bar: at 100 % when the run is done (early, at its target, too), else where it stands."""
        if self.done(self._frames) and self.bar.total is not None and self._frames < self.bar.total:
            self.bar.total = self._frames
            self.bar.refresh()
        self.bar.close()


def plot_curve(history: list[list[float | None]], path: Path, title: str, target: float,
               ylabel: str = "episode return") -> None:
    """Save the learning curve (mean return of the last episodes against frames) as a PNG.

    ``ylabel`` names what the episode statistics were fed (``rlbuf demo her``: a success rate).

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "curve.png"
        >>> plot_curve([[1000, 1.0, None], [2000, 2.0, 30.5]], path, "demo", target=475)
        >>> path.read_bytes()[:4]
        b'\\x89PNG'
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [(p[0], p[2]) for p in history if p[2] is not None]
    figure, axes = plt.subplots(figsize=(7, 4))
    if points:
        axes.plot([p[0] for p in points], [p[1] for p in points], color="tab:blue",
                  label=f"mean return, last {WINDOW} episodes" if ylabel == "episode return" else ylabel)
    axes.axhline(target, color="tab:gray", linestyle="--", linewidth=1, label=f"target {target:g}")
    axes.set_xlabel("frames")
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def finish(out: Path, demo: str, args: RunArgs, progress: Progress, frames: int, stats: EpisodeStats,
           stopped: bool, interrupted_at: Path | None, title: str | None = None, ylabel: str = "episode return",
           **extra: Any) -> dict[str, Any]:
    """Write ``summary.json`` and ``curve.png`` into ``out``; return the summary, or raise after a Ctrl-C.

    Args:
        out: the run's output folder.
        demo: the demo's name (in the summary, the default title and the resume command).
        args: the run's options.
        progress: the run's progress (time, curve history, when the target was reached).
        frames: frames done.
        stats: the episode statistics.
        stopped: whether the run is done (``"finished"``); else it was ``"interrupted"`` by a
            Ctrl-C or ``"stopped"`` by ``--stop-after-frames``.
        interrupted_at: the Ctrl-C checkpoint, if one was written.
        title: the curve's title (default: ``"<demo> on CartPole-v1 (seed <seed>)"``).
        ylabel: the curve's y-axis label.
        extra: more fields for the summary.

    Raises:
        Interrupted: after writing the outputs, when ``interrupted_at`` is given.

    Example:
        >>> import tempfile
        >>> out = Path(tempfile.mkdtemp())
        >>> stats = EpisodeStats(1)
        >>> stats.update(10.0, True)
        >>> progress = Progress(RunArgs(progress=False), 0)
        >>> _ = progress.log(100, stats)
        >>> summary = finish(out, "demo", RunArgs(), progress, 100, stats, True, None)
        >>> summary["status"], summary["episodes"], sorted(p.name for p in out.iterdir())
        ('finished', 1, ['curve.png', 'summary.json'])
        >>> finish(out, "demo", RunArgs(), progress, 100, stats, False, out / "checkpoints" / "frames-100")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        rlbuf.demos._run.Interrupted: interrupted at 100 frames; ...
    """
    import tensordict
    import torchrl

    from rlbuf import __version__

    status = "finished" if stopped else "interrupted" if interrupted_at is not None else "stopped"
    summary = {
        "demo": demo,
        "status": status,
        "frames": frames,
        "seconds": round(progress.seconds, 3),
        "episodes": stats.episodes_finished,
        f"mean_return_last_{WINDOW}": mean_return(stats),
        "target_return": args.target_return,
        "reached_target": progress.reached,
        "resumed_at_frames": progress.resumed_at,
        **extra,
        "args": dataclasses.asdict(args),
        "versions": {"rlbuf": __version__, "torch": torch.__version__, "torchrl": torchrl.__version__,
                     "tensordict": tensordict.__version__},
        "outputs": {"curve": str(out / "curve.png"), "summary": str(out / "summary.json"),
                    "model": str(out / "model.pt"), "checkpoints": str(out / "checkpoints")},
    }
    plot_curve(progress.history, out / "curve.png", title or f"{demo} on CartPole-v1 (seed {args.seed})",
               args.target_return, ylabel)
    write_json(out / "summary.json", summary)
    if interrupted_at is not None:
        raise Interrupted(interrupted_at, out, frames, demo)
    return summary


