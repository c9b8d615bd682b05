"""The ``rlbuf`` command (also ``python -m rlbuf``): demo training runs and checkpoint inspection.

::

    rlbuf demo ppo [options]        PPO on CartPole-v1 (rlbuf demo ppo --help for the options)
    rlbuf demo dqn [--prioritized]  double DQN on CartPole-v1
    rlbuf demo ppo-continuous [--fold-truncation]  PPO on Pendulum-v1 via a gymnasium vector env
    rlbuf demo distill [--teacher DIR]  DAgger from a PPO teacher into a smaller student
    rlbuf inspect PATH [--json]     a checkpoint's manifest, sizes, fields and checksums

Only what a command needs is imported: ``rlbuf --help`` and ``rlbuf inspect`` never import torch
or TorchRL, and ``rlbuf demo NAME`` imports that demo's module alone.

Example:
    >>> options = build_parser().parse_args(["demo", "dqn", "--prioritized", "--seed", "2"])
    >>> options.demo, options.prioritized, options.seed
    ('dqn', True, 2)
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rlbuf.demos import DEMOS
from rlbuf.errors import ConfigError, RlbufError


def build_parser(demos: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser of the ``rlbuf`` command, with a ``--help`` on every command.

    Args:
        demos: the demos whose options are added, which imports their modules (torch, TorchRL);
            None for all of them. The others are listed by name and description only.

    Returns:
        The parser.

    Example:
        >>> build_parser().parse_args(["inspect", "ckpt", "--json"]).json
        True
        >>> build_parser(demos=[]).parse_args(["demo", "ppo"]).demo
        'ppo'
    """
    with_options = set(DEMOS if demos is None else demos)
    parser = argparse.ArgumentParser(prog="rlbuf", description="rlbuf: typed, fast RL buffers over TorchRL.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="train a demo agent (CartPole-v1; Pendulum-v1 for ppo-continuous)",
                               description="Train a demo agent on CartPole-v1 (ppo-continuous: on Pendulum-v1). "
                                           "Every demo writes a learning "
                                           "curve, a JSON summary, the final networks and checkpoints to --out, "
                                           "and continues a stopped run with --resume. Ctrl-C writes a checkpoint "
                                           "and prints the command that continues the run.")
    subparsers = demo.add_subparsers(dest="demo", required=True, metavar="DEMO")
    for name, description in DEMOS.items():
        if name not in with_options:
            subparsers.add_parser(name, help=description, description=description)
            continue
        from rlbuf.demos._run import add_arguments

        module = _demo_module(name)
        sub = subparsers.add_parser(name, help=description, description=(module.__doc__ or "").replace("``", ""),
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
        add_arguments(sub, module.Args)

    inspect = commands.add_parser("inspect", help="show and verify a checkpoint",
                                  description="Print a checkpoint's manifest as a table: kind, sizes, devices, "
                                              "fields, versions and the checksum of every file. PATH is a buffer "
                                              "checkpoint (buffer.save), a demo checkpoint, or a demo output "
                                              "folder (its newest checkpoint). Exits with 1 if it is damaged.")
    inspect.add_argument("path", metavar="PATH", help="checkpoint directory or demo output folder")
    inspect.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``rlbuf`` command; return its exit status (0 ok, 1 failed, 2 bad usage, 130 Ctrl-C).

    Example:
        >>> main(["inspect", "/nonexistent", "--json"])  # doctest: +ELLIPSIS
        {..."ok": false...}
        1
    """
    args = list(sys.argv[1:] if argv is None else argv)
    # Only the demo being run needs its options (and its imports).
    wanted = args[1:2] if args[:1] == ["demo"] else []
    options = build_parser(demos=wanted).parse_args(args)
    if options.command == "inspect":
        from rlbuf._inspect import inspect_main

        return inspect_main(options.path, as_json=options.json)
    return _demo(options)


def _demo_module(name: str) -> Any:
    """The module of the demo ``name``: the name with ``_`` for ``-`` (imports torch and TorchRL)."""
    return importlib.import_module(f"rlbuf.demos.{name.replace('-', '_')}")


def _demo(options: argparse.Namespace) -> int:
    from rlbuf.demos._run import WINDOW, Interrupted, resolve_args, stop_on_interrupt

    module = _demo_module(options.demo)
    given: dict[str, Any] = {k: v for k, v in vars(options).items() if k not in ("command", "demo")}
    try:
        args = resolve_args(module.Args, given, options.demo)
        with stop_on_interrupt():
            summary: dict[str, Any] = module.run(args)
    except Interrupted as stop:
        print(f"rlbuf demo {options.demo}: {stop}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print(f"rlbuf demo {options.demo}: stopped at once by Ctrl-C, without a checkpoint at this point "
              f"(--resume continues from the newest one, if any)", file=sys.stderr)
        return 130
    except RlbufError as error:
        print(f"rlbuf demo {options.demo}: {error}", file=sys.stderr)
        return 2 if isinstance(error, ConfigError) else 1
    recent = summary[f"mean_return_last_{WINDOW}"]
    reached = summary["reached_target"]
    print(f"{options.demo}: {summary['status']} after {summary['frames']} frames in {summary['seconds']:.1f} s; "
          f"mean return of the last {WINDOW} episodes: {'-' if recent is None else f'{recent:.1f}'}")
    if reached is not None:
        print(f"  reached {summary['target_return']:g} at {reached['frames']} frames, {reached['seconds']:.1f} s")
    for key in ("teacher_return", "student_return"):
        if key in summary:
            print(f"  {key.replace('_', ' ')}: {summary[key]:.1f}")
    out = Path(summary["outputs"]["summary"]).parent.resolve()
    print(f"outputs in {out}/: curve.png, summary.json, model.pt, checkpoints/ (rlbuf inspect {out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
