"""The ``rlbuf`` command (also ``python -m rlbuf``): demo training runs and checkpoint inspection.

::

    rlbuf demo ppo [options]        PPO on CartPole-v1 (rlbuf demo ppo --help for the options)
    rlbuf demo dqn [--prioritized]  double DQN on CartPole-v1
    rlbuf demo ppo-continuous [--fold-truncation]  PPO on Pendulum-v1 via a gymnasium vector env
    rlbuf demo distill [--teacher DIR]  DAgger from a PPO teacher into a smaller student
    rlbuf demo her [--no-hindsight] DQN with hindsight relabelling on 15-bit flipping
    rlbuf inspect PATH [--json]     a checkpoint's manifest, sizes, fields and checksums
    rlbuf --version                 prints rlbuf <version>

Only what a command needs is imported: ``--help`` (of every command and demo), ``--version`` and ``rlbuf inspect``
never import torch or TorchRL; the parser is built from ``rlbuf.demos._options`` and the demos'
docstrings, read from their source files, and ``rlbuf demo NAME`` imports that demo's module alone
once it runs.

Example:
    >>> options = build_parser().parse_args(["demo", "dqn", "--prioritized", "--seed", "2"])
    >>> options.demo, options.prioritized, options.seed
    ('dqn', True, 2)
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from rlbuf import __version__
from rlbuf.demos import DEMOS
from rlbuf.demos._options import ARGS, add_arguments
from rlbuf.errors import ConfigError, RlbufError


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``rlbuf`` command, with a ``--help`` on every command (imports no torch).

    Returns:
        The parser.

    Example:
        >>> build_parser().parse_args(["inspect", "ckpt", "--json"]).json
        True
        >>> build_parser().parse_args(["demo", "ppo", "--num-minibatches", "8"]).num_minibatches
        8
    """
    parser = argparse.ArgumentParser(prog="rlbuf", description="rlbuf: typed, fast RL buffers over TorchRL.")
    parser.add_argument("--version", action="version", version=f"rlbuf {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="train a demo agent (CartPole-v1; Pendulum-v1 for ppo-continuous, "
                                            "bit flipping for her)",
                               description="Train a demo agent on CartPole-v1 (ppo-continuous: on Pendulum-v1; "
                                           "her: on a bit-flipping goal env). "
                                           "Every demo writes a learning "
                                           "curve, a JSON summary, the final networks and checkpoints to --out, "
                                           "and continues a stopped run with --resume. Ctrl-C writes a checkpoint "
                                           "and prints the command that continues the run.")
    subparsers = demo.add_subparsers(dest="demo", required=True, metavar="DEMO", parser_class=_DemoParser)
    for name, summary in DEMOS.items():
        sub = subparsers.add_parser(name, help=summary, description=summary,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
        add_arguments(sub, ARGS[name])

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
    options = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if options.command == "inspect":
        from rlbuf._inspect import inspect_main

        return inspect_main(options.path, as_json=options.json)
    return _demo(options)


def _demo_module(name: str) -> Any:
    """The module of the demo ``name``: the name with ``_`` for ``-`` (imports torch and TorchRL)."""
    return importlib.import_module(_module_name(name))


def _module_name(name: str) -> str:
    return f"rlbuf.demos.{name.replace('-', '_')}"


class _DemoParser(argparse.ArgumentParser):
    """A demo's parser: its help shows the docstring of the demo's module, read when the help is printed."""

    def format_help(self) -> str:
        name = self.prog.rsplit(" ", 1)[-1]
        self.description = _description(name) or self.description
        return super().format_help()


def _description(name: str) -> str:
    """The docstring of the demo's module as plain text, read from its source without importing it (torch).

    Example:
        >>> _description("ppo").splitlines()[0]
        "PPO on CartPole-v1: a TorchRL collector, rlbuf's RolloutBuffer, the GAE transform, EpisodeStats."
    """
    import ast
    import importlib.util
    import re

    spec = importlib.util.find_spec(_module_name(name))
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return ""  # no source file (a frozen install): the one-line summary stands in
    with open(spec.origin, encoding="utf-8") as source:
        docstring = ast.get_docstring(ast.parse(source.read())) or ""
    # The docs site's cross-references ([`Recorder`][rlbuf.gym.Recorder]) and literals, as plain text.
    return re.sub(r"\[`?([^]`]+)`?\]\[[\w.]+\]", r"\1", docstring).replace("``", "")


def _demo(options: argparse.Namespace) -> int:
    from rlbuf.demos._options import WINDOW
    from rlbuf.demos._run import Interrupted, resolve_args, stop_on_interrupt

    module = _demo_module(options.demo)
    given: dict[str, Any] = {k: v for k, v in vars(options).items() if k not in ("command", "demo")}
    try:
        args = resolve_args(ARGS[options.demo], given, options.demo)
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
    if summary.get("success_rate") is not None:  # rlbuf demo her: its episode "returns" are successes
        print(f"  success rate of the last {summary['success_window']} episodes: {summary['success_rate']:.2f}")
    from pathlib import Path

    out = Path(summary["outputs"]["summary"]).parent.resolve()
    inspected = summary.get("inspect", out)  # apex: its checkpoints are a service's, each shard one rlbuf checkpoint
    print(f"outputs in {out}/: curve.png, summary.json, model.pt, checkpoints/ (rlbuf inspect {inspected})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
