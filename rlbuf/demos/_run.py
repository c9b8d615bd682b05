"""What the demos share: options, output folder, seeding, Ctrl-C, and where a run's checkpoints are.

The options are in ``rlbuf.demos._options`` (without torch: ``--help`` reads them); the progress
bar, curve and summary in ``rlbuf.demos._progress``; writing and resuming checkpoints in
``rlbuf.demos._checkpoint``.

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

import contextlib
import dataclasses
import json
import logging
import os
import random
import shlex
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
import torch

from rlbuf.demos._options import WINDOW, RunArgs
from rlbuf.errors import ConfigError
from rlbuf.stats import EpisodeStats
from rlbuf.storage import resolve_device

# Options that may differ when resuming (the others would make the resumed run another run).
RESUME_OVERRIDES = frozenset({"frames", "stop_after_frames", "device", "progress", "target_return",
                              "stop_at_target"})

ArgsT = TypeVar("ArgsT", bound="RunArgs")
CheckpointReason = Literal["scheduled", "interrupt", "end"]
"""Why a demo checkpoint was written: every ``--checkpoint-every`` frames, on Ctrl-C, at the end."""


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
    write_json(out / "config.json", {"demo": demo, **dataclasses.asdict(args), "out": str(out)})
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


# -- checkpoints of a run folder ----------------------------------------------------------------
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


def write_json(path: Path, value: Any) -> None:
    """Write ``value`` as JSON to ``path`` through a temporary sibling: whole or not at all."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(value, indent=1) + "\n", encoding="utf-8")
    os.replace(temporary, path)
