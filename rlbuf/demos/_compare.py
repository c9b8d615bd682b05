"""Several variants of one demo over several seeds, one run after the other, in one figure.

A demo describes what it compares in a [`Comparison`][rlbuf.demos._compare.Comparison]; its
``compare``, ``plot_compare`` and ``main`` (``python -m rlbuf.demos.<demo> compare``) call the
methods here. ``compare`` writes into its output folder::

    OUT/
      <variant>-seed<k>/    a full run each: a finished one is reused, a stopped one resumed
      compare.png           every seed's curve thin, each variant's mean thick
      compare.json          per variant: every run's entry and curve, mean and std of the finals
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlbuf.demos._run import Interrupted, latest_checkpoint, stop_on_interrupt


@dataclass(frozen=True)
class Variant:
    """One side of a comparison: its run folders' prefix, its options, its legend label and color.

    Example:
        >>> Variant("folded", {"fold_truncation": True}, "folded done", "tab:red").name
        'folded'
    """

    name: str
    options: dict[str, Any]
    label: str
    color: str


@dataclass(frozen=True)
class Comparison:
    """What a demo compares and how it shows it.

    ``run`` trains one run from its options (the demo's ``Args`` fields) and returns its summary;
    ``entry`` picks from a summary the fields of the run's entry in ``compare.json``, ``final``
    (the number compared) among them; ``line`` prints a variant on the command line, with the
    fields ``variant``, ``mean`` (mean ± std) and ``seeds`` (every final); ``number`` formats the
    finals there and in the legend.

    Example:
        >>> comparison = Comparison("demo", "Compare.", "runs/demo", (), lambda options: {},
        ...                         lambda summary: {}, "return", "{variant}: {mean} (seeds: {seeds})")
        >>> comparison.format({"runs": [{"final": 1.0}, {"final": None}], "mean": 1.0, "std": 0.0})
        '1.00 ± 0.00'
    """

    demo: str
    description: str
    default_out: str
    variants: tuple[Variant, ...]
    run: Callable[[dict[str, Any]], dict[str, Any]]
    entry: Callable[[dict[str, Any]], dict[str, Any]]
    ylabel: str
    line: str
    ylim: tuple[float, float] | None = None
    legend: str = "best"
    number: str = ".2f"

    def compare(self, seeds: int, out: Path, frames: int | None, extra: dict[str, Any] | None,
                title: str) -> dict[str, Any]:
        """Run every variant for ``seeds`` seeds, in sequence; write ``compare.png`` and ``compare.json``.

        Args:
            seeds: runs per variant, seeds 1 to ``seeds``.
            out: the output folder.
            frames: frames per run; None: the demo's default.
            extra: more options for every run.
            title: the figure's title.

        Returns:
            What ``compare.json`` holds: per variant, ``runs``, ``mean`` and ``std``.
        """
        results: dict[str, Any] = {}
        for variant in self.variants:
            runs = []
            for seed in range(1, seeds + 1):
                run_dir = out / f"{variant.name}-seed{seed}"
                summary = finished_summary(run_dir, frames)
                if summary is None:  # a fresh run, or the continuation of one stopped, interrupted or killed before
                    options: dict[str, Any] = {"seed": seed, "out": str(run_dir), **variant.options, **(extra or {})}
                    if frames is not None:
                        options["frames"] = frames
                    if (run_dir / "config.json").exists():
                        options["resume"] = str(run_dir)
                    summary = self.run(options)
                runs.append({"seed": seed, **self.entry(summary), "history": history(run_dir)})
            finals = [r["final"] for r in runs if r["final"] is not None]
            results[variant.name] = {"runs": runs, "mean": float(np.mean(finals)) if finals else None,
                                     "std": float(np.std(finals)) if finals else None}
        self.plot(results, out / "compare.png", title)
        (out / "compare.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
        return results

    def format(self, result: dict[str, Any]) -> str:
        """A variant's ``mean ± std`` in the comparison's number format, ``-`` without a final."""
        if result["mean"] is None:
            return "-"
        return f"{result['mean']:{self.number}} ± {result['std']:{self.number}}"

    def plot(self, results: dict[str, Any], path: Path, title: str) -> None:
        """Every variant's curves (every seed thin, the mean thick) in one PNG.

        Args:
            results: what ``compare`` returns (or ``compare.json`` holds).
            path: the PNG to write.
            title: the figure's title.

        Example:
            >>> import tempfile
            >>> path = Path(tempfile.mkdtemp()) / "compare.png"
            >>> run = {"seed": 1, "final": 1.0, "history": [[1000, 1.0, 0.1], [2000, 2.0, 1.0]]}
            >>> comparison = Comparison("demo", "Compare.", "runs/demo", (Variant("a", {}, "a", "tab:blue"),),
            ...                         lambda options: {}, lambda summary: {}, "return", "{variant}: {mean}")
            >>> comparison.plot({"a": {"runs": [run], "mean": 1.0, "std": 0.0}}, path, "a title")
            >>> path.read_bytes()[:4]
            b'\\x89PNG'
        """
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        colors = {variant.name: variant.color for variant in self.variants}
        labels = {variant.name: variant.label for variant in self.variants}
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
                summary = "" if result["mean"] is None else f": {self.format(result)}"
                axes.plot(x, y, color=colors.get(variant), linewidth=2,
                          label=f"{labels.get(variant, variant)}{summary} ({len(curves)} seeds)")
        axes.set_xlabel("frames")
        axes.set_ylabel(self.ylabel)
        if self.ylim is not None:
            axes.set_ylim(*self.ylim)
        axes.set_title(title)
        axes.grid(alpha=0.3)
        if axes.get_legend_handles_labels()[0]:  # no curve yet when the runs stopped before their first episodes
            axes.legend(loc=self.legend)
        figure.tight_layout()
        figure.savefig(path, dpi=100)
        plt.close(figure)

    def main(self, compare: Callable[[int, Path, int | None], dict[str, Any]], argv: list[str] | None) -> int:
        """``python -m rlbuf.demos.<demo> compare --seeds N --out DIR [--frames F]``; 130 on Ctrl-C.

        Args:
            compare: the demo's ``compare`` (seeds, output folder, frames per run).
            argv: the arguments; None: ``sys.argv``.

        Returns:
            The exit status: 0, or 130 when Ctrl-C stopped a run (the same command continues).
        """
        parser = argparse.ArgumentParser(prog=f"python -m rlbuf.demos.{self.demo}", description=self.description)
        parser.add_argument("command", choices=["compare"])
        parser.add_argument("--seeds", type=int, default=3, help="seeds per variant (default: 3)")
        parser.add_argument("--out", default=self.default_out, help="output folder")
        parser.add_argument("--frames", type=int, default=None, help="frames per run (default: the demo's)")
        options = parser.parse_args(argv)
        torch.set_num_threads(1)
        try:
            with stop_on_interrupt():  # Ctrl-C: the running run writes a checkpoint and stops
                report = compare(options.seeds, Path(options.out), options.frames)
        except Interrupted as stop:
            print(f"{parser.prog} compare: {stop.demo} in {stop.run_dir} interrupted at {stop.frames} frames; run "
                  "the same command again to continue (finished runs are reused, this one resumes)", file=sys.stderr)
            return 130
        for variant, result in report.items():
            finals = ", ".join("-" if r["final"] is None else f"{r['final']:{self.number}}" for r in result["runs"])
            print(self.line.format(variant=variant, mean=self.format(result), seeds=finals))
        print(f"figure: {Path(options.out) / 'compare.png'}")
        return 0


def finished_summary(run_dir: Path, frames: int | None) -> dict[str, Any] | None:
    """The summary of a run that finished (with ``frames`` frames, if given), to reuse; else None.

    Example:
        >>> import tempfile
        >>> finished_summary(Path(tempfile.mkdtemp()), None) is None   # no run there
        True
    """
    path = run_dir / "summary.json"
    summary: dict[str, Any] | None = json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
    if summary is None or summary["status"] != "finished" or (frames is not None and summary["args"]["frames"] != frames):
        return None
    return summary


def history(run_dir: Path) -> list[list[float | None]]:
    """The curve of a run (``[frames, seconds, value]`` points) from its newest checkpoint; [] without one.

    Example:
        >>> import tempfile
        >>> history(Path(tempfile.mkdtemp()))
        []
    """
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        return []
    state = torch.load(checkpoint / "state.pt", weights_only=True)
    return [list(point) for point in state["progress"]["history"]]
