"""Draw the hindsight demo's comparison figure and print its table, from a ``compare.json``.

Input: the ``compare.json`` that ``python -m rlbuf.demos.her compare`` writes (every run's
final success rate, frames, minutes and curve, per variant), copied to
``docs/assets/hindsight_compare.json``. Run from the repository root::

    python docs/scripts/plot_hindsight.py docs/assets/hindsight_compare.json docs/assets/hindsight_compare.png

The figure is drawn by ``rlbuf.demos.her.plot_compare`` (the same as the command's own
``compare.png``); the table rows printed are those of docs/hindsight-demo.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

LABELS = {"hindsight": "with hindsight (`future`, ratio 0.8)", "no-hindsight": "without hindsight (`--no-hindsight`)"}


def table(results: dict[str, Any]) -> list[str]:
    """The Markdown rows: variant, success rate mean ± std, per seed, frames to 0.9, minutes."""
    seeds = max(len(result["runs"]) for result in results.values())
    rows = [f"| variant | success rate, mean ± std | seeds 1–{seeds} | last 20 ≥ 0.9 first at | minutes per run |",
            "|---|---|---|---|---|"]
    for variant, result in results.items():
        runs = result["runs"]
        seeds = ", ".join(f"{run['final']:.2f}" for run in runs)
        reached = [run["reached_at_frames"] for run in runs]
        first = ("never" if all(r is None for r in reached)
                 else ", ".join("never" if r is None else f"{r / 1000:.0f}k" for r in reached) + " frames")
        minutes = [run["minutes"] for run in runs]
        rows.append(f"| {LABELS.get(variant, variant)} | **{result['mean']:.2f} ± {result['std']:.2f}** | {seeds} | "
                    f"{first} | {min(minutes):.1f}–{max(minutes):.1f} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="compare.json of `python -m rlbuf.demos.her compare`")
    parser.add_argument("figure", type=Path, help="the PNG to write")
    options = parser.parse_args()
    results = json.loads(options.results.read_text(encoding="utf-8"))
    from rlbuf.demos.her import plot_compare  # imports torch: only once the arguments are good

    n_bits = {run.get("n_bits", 15) for result in results.values() for run in result["runs"]}.pop()
    plot_compare(results, options.figure, f"DQN on {n_bits}-bit flipping: a sparse reward")
    print("\n".join(table(results)))


if __name__ == "__main__":
    main()
