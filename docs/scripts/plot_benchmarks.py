"""Plot benchmark ratios (rlbuf time ÷ peer time) as a horizontal bar chart.

Input: a small JSON file, filled by hand from the tables that ``benchmarks/*.py`` print::

    {
      "source": "benchmarks/*.py, 2-core x86 VM, torch 2.13 CPU, 1 thread",
      "peer": "Stable-Baselines3",
      "ratios":  {"replay · add 1 · obs (48,) f32": 1.78, "rollout · GAE": 0.41},
      "targets": {"replay · add 1 · obs (48,) f32": 2.0,  "rollout · GAE": 0.5}
    }

``targets`` is optional (a tick per bar: the goal from DESIGN.md). Below 1 means rlbuf is
faster than the peer. Run from the repository root::

    python docs/scripts/plot_benchmarks.py docs/assets/benchmarks.json docs/assets/benchmarks.png
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, NullFormatter

FASTER, SLOWER, TARGET = "#2f855a", "#c53030", "#1a202c"


def plot(data: dict[str, object], out: Path) -> None:
    """Draw the chart of ``data`` (the JSON above) into ``out`` (PNG or SVG by suffix)."""
    ratios = data["ratios"]
    targets = data.get("targets", {})
    if not isinstance(ratios, dict) or not ratios or not isinstance(targets, dict):
        raise SystemExit("ratios: expected a non-empty mapping of label -> ratio; targets: a mapping")
    labels = list(ratios)
    values = [float(ratios[label]) for label in labels]
    if any(not math.isfinite(v) or v <= 0 for v in values):
        raise SystemExit(f"ratios: expected positive numbers, got {values}")

    plt.rcParams.update({"svg.hashsalt": "rlbuf", "font.size": 9})
    fig, ax = plt.subplots(figsize=(8.5, 0.38 * len(labels) + 1.6))
    y = list(range(len(labels)))
    # Green: meets its target (or, without one, at least as fast as the peer); red: misses it.
    goals = [float(targets.get(label, 1.0)) for label in labels]
    ax.barh(y, values, color=[FASTER if v <= g else SLOWER for v, g in zip(values, goals, strict=True)],
            height=0.6)
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        end = value
        if label in targets:
            goal = float(targets[label])
            ax.plot([goal, goal], [i - 0.38, i + 0.38], color=TARGET, lw=1.6)
            end = max(end, goal)
        ax.text(end * 1.05, i, f"{value:.2f}×", va="center", fontsize=8)
    ax.axvline(1.0, color="#718096", lw=1, ls="--")
    ax.set_xscale("log")
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    lo = min([*values, *(float(t) for t in targets.values()), 1.0])
    hi = max([*values, *(float(t) for t in targets.values()), 1.0])
    left, right = lo / 1.6, hi * 2.0
    # Labels at powers of two only: the log axis' default minor labels (3×10⁻¹, 4×10⁻¹ ...) overlap.
    ax.set_xticks([2.0**k for k in range(math.floor(math.log2(left)), math.ceil(math.log2(right)) + 1)])
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}×"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(left, right)  # after the ticks, which widen the view to the outer powers of two
    peer = data.get("peer", "peer")
    ax.set_xlabel(f"rlbuf time ÷ {peer} time (log scale; < 1: rlbuf faster"
                  + ("; black tick: target)" if targets else ")"))
    ax.spines[["top", "right"]].set_visible(False)
    if data.get("source"):
        fig.text(0.01, 0.005, str(data["source"]), fontsize=7, color="#4a5568", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(out, dpi=144, metadata={"Software": None} if out.suffix == ".png" else {"Date": None})
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", type=Path, help="ratios file (see the module docstring)")
    parser.add_argument("out", type=Path, help="output image (.png or .svg)")
    args = parser.parse_args()
    plot(json.loads(args.json.read_text(encoding="utf-8")), args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
