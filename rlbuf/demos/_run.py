"""What the demos share: options, output folder, seeding, progress bar, curve, summary, checkpoints.

A run writes into its output folder::

    OUT/
      config.json                the resolved options
      curve.png                  mean return of the last 20 episodes against frames
      summary.json               frames, time, returns, when the target was reached, versions
      model.pt                   the final networks (``torch.save`` of state dicts)
      checkpoints/frames-<N>/    the two newest checkpoints, each complete or absent:
        buffer/                  the buffer, by ``buffer.save`` (rlbuf's pickle-free format)
        state.pt                 networks, optimiser, RNG states (torch, numpy, python),
                                 episode statistics, curve history; loaded with weights_only
        meta.json                demo, frame count, options, SHA-256 of state.pt

Exact resume: checkpoints are written between two collections, and right after each one every
env is reset with a seed derived from ``(seed, frames)``; a fresh run does the same at frame 0.
So the env state (CartPole's physics, its generator, the time limit's step count) never needs
saving: a resumed run resets its envs exactly as the uninterrupted run did at that frame. The
cost: episodes running at a checkpoint are cut there; their last step bootstraps like any rollout
end, and they are left out of the episode statistics. The same cut happens where a run is
resumed from a Ctrl-C checkpoint: that run goes on correctly, but equals the uninterrupted one
only when the interrupt fell on a ``--checkpoint-every`` boundary (``--checkpoint-every`` cannot
change on ``--resume`` for the same reason).

Ctrl-C: inside ``stop_on_interrupt`` (the ``rlbuf`` command) a first Ctrl-C only sets a flag;
the demo polls it (``checkpoint_due``) between two collections, writes a checkpoint there, and
raises ``Interrupted`` after writing its outputs. A second Ctrl-C stops at once, without one.

Example:
    >>> from rlbuf.demos._run import env_seed
    >>> env_seed(1, 0) == env_seed(1, 0) != env_seed(1, 2048)
    True
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import random
import shlex
import shutil
import signal
import sys
import threading
import time
import typing
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
import torch

from rlbuf._base import RingBuffer
from rlbuf.checkpoint import load_state
from rlbuf.errors import CheckpointError, ConfigError
from rlbuf.stats import EpisodeStats
from rlbuf.storage import resolve_device

WINDOW = 20
"""Episodes averaged for the reported return (the issue's "last 20 episodes")."""

KEEP_CHECKPOINTS = 2

# Options that may differ when resuming (the others would make the resumed run another run).
RESUME_OVERRIDES = frozenset({"frames", "stop_after_frames", "device", "progress", "target_return",
                              "stop_at_target"})

ArgsT = TypeVar("ArgsT", bound="RunArgs")
CheckpointReason = Literal["scheduled", "interrupt", "end"]
"""Why a demo checkpoint was written: every ``--checkpoint-every`` frames, on Ctrl-C, at the end."""


def arg(default: Any, help: str) -> Any:
    """A dataclass field that is also a command-line option with this help text.

    Example:
        >>> from dataclasses import dataclass
        >>> @dataclass
        ... class Options:
        ...     lr: float = arg(1e-3, "learning rate")
        >>> Options().lr
        0.001
    """
    return field(default=default, metadata={"help": help})


@dataclass
class RunArgs:
    """Options every demo takes (each demo adds its hyper-parameters in a subclass)."""

    frames: int = arg(100_000, "environment frames to train for at most")
    seed: int = arg(1, "seed of torch, numpy, python, the envs and the buffer")
    device: str = arg("cpu", "training device (e.g. cuda); envs and collection stay on the CPU")
    storage: Literal["memory", "memmap"] = arg("memory", "where the buffer keeps its data: in memory, or in memory-mapped files")
    out: str | None = arg(None, "output folder (default: runs/<demo>-seed<seed>-<time>)")
    checkpoint_every: int = arg(25_000, "write a checkpoint every this many frames (0: only at the end)")
    resume: str | None = arg(None, "continue the run in this output folder from its newest checkpoint (a Ctrl-C "
                                   "writes one); exactly as if never stopped when that checkpoint is a scheduled "
                                   "one (--checkpoint-every), else with envs reset at that frame")
    stop_after_frames: int | None = arg(None, "debug: stop right after the first checkpoint at or past this "
                                              "many frames, as if killed there (then --resume)")
    target_return: float = arg(475.0, f"report when the mean return of the last {WINDOW} episodes reaches this")
    stop_at_target: bool = arg(True, "stop training once the target return is reached")
    progress: bool = arg(True, "show a progress bar")


def add_arguments(parser: argparse.ArgumentParser, args_type: type[RunArgs]) -> None:
    """Add one ``--option`` per field of ``args_type``; only options given on the line are parsed.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> add_arguments(parser, RunArgs)
        >>> vars(parser.parse_args(["--seed", "3", "--no-progress"]))
        {'seed': 3, 'progress': False}
    """
    hints = typing.get_type_hints(args_type)
    for item in fields(args_type):
        flag = "--" + item.name.replace("_", "-")
        hint = hints[item.name]
        if typing.get_origin(hint) is not typing.Literal:  # `int | None` -> int
            hint = next((t for t in typing.get_args(hint) if t is not type(None)), hint)
        help_text = item.metadata["help"] + ("" if item.default is None else f" (default: {item.default})")
        if hint is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                                help=help_text)
        elif typing.get_origin(hint) is typing.Literal:
            parser.add_argument(flag, choices=typing.get_args(hint), default=argparse.SUPPRESS, help=help_text)
        else:
            parser.add_argument(flag, type=hint, default=argparse.SUPPRESS, metavar=item.name.upper(), help=help_text)


def resolve_args(args_type: type[ArgsT], given: dict[str, Any], demo: str) -> ArgsT:
    """The options of a run: defaults updated with ``given``; on ``--resume`` the saved ones.

    Checked before anything is created: a device this machine lacks, or a ``--resume`` folder
    without a checkpoint, never leaves a folder behind.

    Raises:
        ConfigError: an option other than those in ``RESUME_OVERRIDES`` given with ``--resume``,
            a ``--resume`` folder of another demo or without a checkpoint, a ``--device`` this
            machine does not have, or a value out of range.

    Example:
        >>> resolve_args(RunArgs, {"seed": 3}, "ppo").seed
        3
    """
    resume = given.get("resume")
    if resume is None:
        args = args_type(**given)
    else:
        config = read_config(Path(resume))
        if config.get("demo") != demo:
            raise ConfigError(f"--resume {resume}: holds a {config.get('demo')!r} run, not {demo!r}")
        if not has_checkpoint(Path(resume)):
            raise ConfigError(f"--resume {resume}: no checkpoint to resume from (the run was stopped before its "
                              f"first one); start it again with another --out, or remove {resume}")
        refused = sorted(set(given) - RESUME_OVERRIDES - {"resume", "out"})
        if refused:
            flags = ", ".join("--" + name.replace("_", "-") for name in refused)
            raise ConfigError(f"{flags}: cannot change on --resume (the run continues with its saved options)")
        # stop_after_frames simulated a kill; the resumed run is not killed again unless asked to.
        saved = {k: v for k, v in config.items() if k in {f.name for f in fields(args_type)} - {"stop_after_frames"}}
        overrides = {k: v for k, v in given.items() if k in RESUME_OVERRIDES}
        args = args_type(**{**saved, **overrides, "resume": resume, "out": resume})
    for name in ("frames", "seed"):
        if getattr(args, name) < (1 if name == "frames" else 0):
            raise ConfigError(f"--{name}: expected a positive number, got {getattr(args, name)}")
    if args.checkpoint_every < 0:
        raise ConfigError(f"--checkpoint-every: expected 0 or more frames, got {args.checkpoint_every}")
    resolve_device(args.device, name="--device")
    return args


def read_config(run_dir: Path) -> dict[str, Any]:
    """The ``config.json`` of a demo output folder.

    Raises:
        ConfigError: missing or unreadable (not a demo output folder).

    Example:
        >>> import tempfile
        >>> read_config(Path(tempfile.mkdtemp()))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        rlbuf.errors.ConfigError: ...: not a demo output folder (...)
    """
    try:
        config = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ConfigError(f"{run_dir}: not a demo output folder ({error})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{run_dir / 'config.json'}: not a demo configuration")
    return config


# -- setup ---------------------------------------------------------------------------------------
def setup(args: RunArgs, demo: str) -> Path:
    """Seed everything, use one CPU thread, quiet TorchRL's logger, and make the output folder.

    Returns:
        The output folder (created; ``config.json`` written).

    Raises:
        ConfigError: a fresh run pointed at a folder that already holds a run.

    Example:
        >>> import tempfile
        >>> args = RunArgs(out=tempfile.mkdtemp() + "/run", seed=7)
        >>> out = setup(args, "ppo")
        >>> read_config(out)["demo"], read_config(out)["seed"]
        ('ppo', 7)
        >>> setup(args, "ppo")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        rlbuf.errors.ConfigError: --out .../run: already holds a run; pass --resume .../run to continue it, or another --out
    """
    torch.set_num_threads(1)  # measured fastest for these small networks on the 2-core machines
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    seed_all(args.seed)
    out = Path(args.out or f"runs/{demo}-seed{args.seed}-{time.strftime('%Y%m%d-%H%M%S')}")
    if args.resume is None and (out / "config.json").exists():
        raise ConfigError(f"--out {out}: already holds a run; pass --resume {out} to continue it, or another --out")
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "config.json", {"demo": demo, **dataclasses.asdict(args), "out": str(out)})
    return out


def seed_all(seed: int) -> None:
    """Seed torch, numpy's and python's global generators.

    Example:
        >>> seed_all(0); first = torch.rand(1)
        >>> seed_all(0); bool(torch.rand(1) == first)
        True
    """
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def env_seed(seed: int, frames: int) -> int:
    """The seed the envs are reset with at ``frames`` (run start and every checkpoint).

    Example:
        >>> env_seed(1, 0) == env_seed(1, 0) != env_seed(1, 2048)
        True
    """
    return int(np.random.SeedSequence([seed, frames]).generate_state(1)[0])


def drop_running_episodes(stats: EpisodeStats) -> None:
    """Forget the episodes in progress (after a reset cut them); finished ones stay.

    Example:
        >>> stats = EpisodeStats(2)
        >>> stats.update([1.0, 1.0], [True, False])
        >>> drop_running_episodes(stats)
        >>> stats.update([1.0, 1.0], [False, True])
        >>> stats.recent_returns()  # env 1's episode restarted at the cut
        [1.0, 1.0]
    """
    state = stats.state_dict()
    state["running_return"].zero_()
    state["running_length"].zero_()
    stats.load_state_dict(state)


def mean_return(stats: EpisodeStats) -> float | None:
    """Mean return of the last ``WINDOW`` finished episodes (``None`` before there are that many).

    Example:
        >>> stats = EpisodeStats(1)
        >>> stats.update(5.0, True)
        >>> print(mean_return(stats))
        None
        >>> for _ in range(WINDOW):
        ...     stats.update(10.0, True)
        >>> mean_return(stats)
        10.0
    """
    returns = stats.recent_returns(WINDOW)
    return float(np.mean(returns)) if len(returns) == WINDOW else None


def crossed(frames_before: int, frames: int, every: int) -> bool:
    """Whether a multiple of ``every`` lies in ``(frames_before, frames]`` (never when ``every`` is 0).

    Example:
        >>> crossed(1000, 1024, 256), crossed(1024, 1028, 256), crossed(0, 10**6, 0)
        (True, False, False)
    """
    return every > 0 and frames // every > frames_before // every


# -- Ctrl-C --------------------------------------------------------------------------------------
_interrupt = threading.Event()


class Interrupted(Exception):
    """A demo stopped on Ctrl-C after writing a checkpoint; the message says how to continue.

    Example:
        >>> print(Interrupted(Path("runs/x/checkpoints/frames-000000001024"), Path("runs/x"), 1024, "ppo"))
        interrupted at 1024 frames; checkpoint runs/x/checkpoints/frames-000000001024; continue with: rlbuf demo ppo --resume runs/x
    """

    def __init__(self, checkpoint: Path, run_dir: Path, frames: int, demo: str) -> None:
        self.checkpoint, self.run_dir, self.frames, self.demo = checkpoint, run_dir, frames, demo
        super().__init__(f"interrupted at {frames} frames; checkpoint {checkpoint}; continue with: "
                         f"{resume_command(demo, run_dir)}")


def resume_command(demo: str, run_dir: Path) -> str:
    """The command line that continues the run in ``run_dir``.

    Example:
        >>> resume_command("dqn", Path("runs/my run"))
        "rlbuf demo dqn --resume 'runs/my run'"
    """
    return f"rlbuf demo {demo} --resume {shlex.quote(str(run_dir))}"


@contextlib.contextmanager
def stop_on_interrupt() -> Iterator[None]:
    """Turn a first Ctrl-C (SIGINT) into a request the demo polls; a second one interrupts at once.

    Example:
        >>> with stop_on_interrupt():
        ...     signal.raise_signal(signal.SIGINT)
        ...     interrupt_requested()
        True
        >>> interrupt_requested()
        False
    """
    if threading.current_thread() is not threading.main_thread():  # only the main thread gets signals
        yield
        return
    previous = signal.getsignal(signal.SIGINT)

    def request(signum: int, frame: Any) -> None:
        _interrupt.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C: KeyboardInterrupt

    _interrupt.clear()
    signal.signal(signal.SIGINT, request)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _interrupt.clear()


def interrupt_requested() -> bool:
    """Whether Ctrl-C was pressed inside ``stop_on_interrupt``: checkpoint now, then stop."""
    return _interrupt.is_set()


def checkpoint_due(args: RunArgs, frames_before: int, frames: int, stopped: bool) -> CheckpointReason | None:
    """Why to write a checkpoint after the step from ``frames_before`` to ``frames``, if at all:
    on Ctrl-C, or every ``--checkpoint-every`` frames; never once the run is done (it writes its
    ``"end"`` checkpoint then).

    Example:
        >>> args = RunArgs(checkpoint_every=1000)
        >>> checkpoint_due(args, 900, 1100, False), checkpoint_due(args, 1100, 1200, False)
        ('scheduled', None)
        >>> with stop_on_interrupt():
        ...     signal.raise_signal(signal.SIGINT)
        ...     checkpoint_due(args, 1100, 1200, False), checkpoint_due(args, 1100, 1200, True)
        ('interrupt', None)
    """
    if stopped:
        return None
    if interrupt_requested():
        return "interrupt"
    return "scheduled" if crossed(frames_before, frames, args.checkpoint_every) else None


def checkpoint_and_reset(args: RunArgs, frames_before: int, frames: int, stopped: bool,
                         checkpoint: Callable[[CheckpointReason], Path], reset_envs: Callable[[int], object],
                         stats: EpisodeStats) -> tuple[bool, Path | None]:
    """After a collection: write the checkpoint due (``checkpoint_due``), then reset the envs with
    ``env_seed(seed, frames)`` and forget the episodes that cut, as a run resumed there will.

    Args:
        args: the run's options (``checkpoint_every``, ``stop_after_frames``, ``seed``).
        frames_before: frames done before this collection.
        frames: frames done after it.
        stopped: whether the run is done (it writes its ``"end"`` checkpoint itself).
        checkpoint: writes a checkpoint for a reason and returns its folder.
        reset_envs: resets the envs with the seed it is given.
        stats: the episode statistics the envs feed.

    Returns:
        ``(leave, interrupted_at)``: whether the training loop ends here (Ctrl-C, or
        ``--stop-after-frames`` reached), and the Ctrl-C checkpoint, if one was written.

    Example:
        >>> args, seeds = RunArgs(checkpoint_every=1000, stop_after_frames=2000), []
        >>> step = lambda before, now: checkpoint_and_reset(args, before, now, False, lambda reason: Path(reason),
        ...                                                  seeds.append, EpisodeStats(1))
        >>> step(900, 1100), step(1100, 1200), seeds == [env_seed(1, 1100)]
        ((False, None), (False, None), True)
        >>> step(1900, 2100), len(seeds)  # --stop-after-frames: leave without a reset
        ((True, None), 1)
        >>> with stop_on_interrupt():
        ...     signal.raise_signal(signal.SIGINT)
        ...     step(1100, 1200)
        (True, PosixPath('interrupt'))
    """
    reason = checkpoint_due(args, frames_before, frames, stopped)
    if reason is None:
        return False, None
    path = checkpoint(reason)
    if reason == "interrupt":
        return True, path
    if args.stop_after_frames is not None and frames >= args.stop_after_frames:
        return True, None
    reset_envs(env_seed(args.seed, frames))
    drop_running_episodes(stats)
    return False, None


# -- progress, curve, summary --------------------------------------------------------------------
class Progress:
    """A tqdm bar (frames, fps, recent return) and the learning-curve history.

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
        self.bar = tqdm(total=args.frames, initial=frames, unit="frame", unit_scale=True, dynamic_ncols=True,
                        disable=not args.progress, file=sys.stderr)

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
        self.bar.update(frames - self.bar.n)
        shown = {"return": "-" if recent is None else f"{recent:.1f}", "episodes": stats.episodes_finished}
        self.bar.set_postfix({**shown, **{k: f"{v:.3g}" for k, v in postfix.items()}}, refresh=False)
        return recent

    def done(self, frames: int) -> bool:
        """Whether the run is over at ``frames``: ``--frames`` done, or the target reached with ``--stop-at-target``."""
        return frames >= self.args.frames or (self.reached is not None and self.args.stop_at_target)

    def state_dict(self) -> dict[str, Any]:
        """History, elapsed time and target, for the checkpoint."""
        return {"history": self.history, "reached": self.reached, "elapsed": self.seconds,
                "resumed_at": self.resumed_at}

    def close(self) -> None:
        """Close the bar (at 100 % when the run stopped early, at its target)."""
        if self.bar.total is not None and self.bar.n < self.bar.total:
            self.bar.total = self.bar.n
            self.bar.refresh()
        self.bar.close()


def plot_curve(history: list[list[float | None]], path: Path, title: str, target: float) -> None:
    """Save the learning curve (mean return of the last episodes against frames) as a PNG.

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
                  label=f"mean return, last {WINDOW} episodes")
    axes.axhline(target, color="tab:gray", linestyle="--", linewidth=1, label=f"target {target:g}")
    axes.set_xlabel("frames")
    axes.set_ylabel("episode return")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def finish(out: Path, demo: str, args: RunArgs, progress: Progress, frames: int, stats: EpisodeStats,
           stopped: bool, interrupted_at: Path | None, title: str | None = None, **extra: Any) -> dict[str, Any]:
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
               args.target_return)
    _write_json(out / "summary.json", summary)
    if interrupted_at is not None:
        raise Interrupted(interrupted_at, out, frames, demo)
    return summary


# -- checkpoints ---------------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """The global generators' states: torch (and CUDA), numpy, python.

    Example:
        >>> state = rng_state()
        >>> draws = torch.rand(1), np.random.rand(), random.random()
        >>> set_rng_state(state)
        >>> (torch.rand(1), np.random.rand(), random.random()) == draws
        True
    """
    numpy_state = np.random.get_state(legacy=False)
    assert isinstance(numpy_state, dict)
    numpy_state["state"]["key"] = torch.from_numpy(numpy_state["state"]["key"].astype(np.int64))
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": numpy_state, "python": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` returned (see there for an example)."""
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])
    numpy_state = dict(state["numpy"])
    numpy_state["state"] = {**numpy_state["state"], "key": numpy_state["state"]["key"].numpy().astype(np.uint32)}
    np.random.set_state(numpy_state)
    random.setstate(state["python"])


def save_checkpoint(out: Path, demo: str, args: RunArgs, frames: int, buffer: RingBuffer[Any],
                    state: dict[str, Any], reason: CheckpointReason = "scheduled") -> Path:
    """Write ``out/checkpoints/frames-<frames>`` whole or not at all; keep the newest two.

    ``state`` holds what the demo needs back (state dicts of networks and optimisers, counters);
    the global RNG states are added here. It must load with ``torch.load(weights_only=True)``.
    ``reason`` (recorded in ``meta.json``) says why it was written, for ``--resume`` to report.

    Example:
        >>> import tempfile
        >>> from rlbuf import ReplayBuffer
        >>> args = RunArgs(out=tempfile.mkdtemp() + "/run", progress=False)
        >>> out = setup(args, "demo")
        >>> buffer = ReplayBuffer(8, obs_shape=(1,), action_shape=(), seed=0)
        >>> buffer.add(torch.zeros(1), 0.0, 1.0, torch.ones(1), False)
        >>> path = save_checkpoint(out, "demo", args, 100, buffer, {"frames": 100})
        >>> path.name, latest_checkpoint(out) == path, read_meta(path)["frames"]
        ('frames-000000000100', True, 100)
        >>> resumed = ReplayBuffer(8, obs_shape=(1,), action_shape=(), seed=0)
        >>> resume(dataclasses.replace(args, resume=str(out)), out, resumed)["frames"], len(resumed)  # doctest: +ELLIPSIS
        resuming .../run from checkpoints/frames-000000000100 (scheduled): 100 of 100000 frames done
        (100, 1)
    """
    root = out / "checkpoints"
    final = root / f"frames-{frames:012d}"
    staging = root / f".frames-{frames:012d}.tmp-{uuid.uuid4().hex[:8]}"
    staging.mkdir(parents=True)
    try:
        buffer.save(staging / "buffer")
        torch.save({**state, "rng": rng_state()}, staging / "state.pt")
        digest = _sha256(staging / "state.pt")
        _write_json(staging / "meta.json", {"demo": demo, "frames": frames, "state_sha256": digest,
                                            "reason": reason, "args": dataclasses.asdict(args)})
        if final.exists():
            shutil.rmtree(final)
        os.rename(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for old in [*sorted(root.glob("frames-*"))[:-KEEP_CHECKPOINTS], *root.glob(".frames-*.tmp-*")]:
        shutil.rmtree(old, ignore_errors=True)  # older checkpoints, and saves a kill interrupted
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run folder (``None``: killed before the first one)."""
    found = sorted((run_dir / "checkpoints").glob("frames-*"))
    return found[-1] if found else None


def has_checkpoint(run_dir: Path) -> bool:
    """Whether ``--resume run_dir`` has something to resume: a checkpoint of the run, or of a run
    it started in a subfolder (the teacher of ``rlbuf demo distill``).

    Example:
        >>> import tempfile
        >>> run_dir = Path(tempfile.mkdtemp())
        >>> has_checkpoint(run_dir)
        False
        >>> (run_dir / "teacher" / "checkpoints" / "frames-000000000512").mkdir(parents=True)
        >>> has_checkpoint(run_dir)
        True
    """
    return latest_checkpoint(run_dir) is not None or any(run_dir.glob("*/checkpoints/frames-*"))


def read_meta(checkpoint: Path) -> dict[str, Any]:
    """The ``meta.json`` of a demo checkpoint.

    Raises:
        CheckpointError: missing or not valid JSON.
    """
    try:
        meta = json.loads((checkpoint / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{checkpoint / 'meta.json'}: unreadable ({error})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("args"), dict):
        raise CheckpointError(f"{checkpoint / 'meta.json'}: not a demo checkpoint")
    return meta


def resume(args: RunArgs, out: Path, buffer: RingBuffer[Any]) -> dict[str, Any] | None:
    """On ``--resume``, restore the newest checkpoint: ``buffer`` (with the stats it feeds), the
    global RNGs; print what was resumed; return the demo's saved state. ``None`` for a fresh run,
    or a run whose only checkpoints are in a subfolder (a finished teacher: this stage starts at 0).

    Raises:
        CheckpointError: a checksum or the format does not match.
    """
    if args.resume is None:
        return None
    checkpoint = latest_checkpoint(out)
    if checkpoint is None:
        print(f"resuming {out}: no checkpoint of this stage yet, it starts at frame 0", flush=True)
        return None
    meta = read_meta(checkpoint)
    if _sha256(checkpoint / "state.pt") != meta.get("state_sha256"):
        raise CheckpointError(f"{checkpoint / 'state.pt'}: SHA-256 mismatch (corrupted)")
    # Into the buffer built by the demo (not Cls.load) so the EpisodeStats it feeds come back too.
    buffer.load_state_dict(load_state(checkpoint / "buffer", kind=type(buffer).__name__))
    state: dict[str, Any] = torch.load(checkpoint / "state.pt", weights_only=True)
    set_rng_state(state["rng"])
    print(f"resuming {out} from checkpoints/{checkpoint.name} ({meta.get('reason', 'scheduled')}): "
          f"{state['frames']} of {args.frames} frames done", flush=True)
    return state


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _write_json(path: Path, value: Any) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(value, indent=1) + "\n", encoding="utf-8")
    os.replace(temporary, path)
