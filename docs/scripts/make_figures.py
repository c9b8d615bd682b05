"""Draw the figures of the documentation (matplotlib only; no torch needed).

Run from the repository root after changing a figure, and commit the output::

    python docs/scripts/make_figures.py          # writes docs/assets/gae_boundaries.svg

The SVG is written with fixed metadata and hash salt, so rerunning it without changes
produces the same bytes (a clean ``git diff``).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

ASSETS = Path(__file__).resolve().parent.parent / "assets"

# One env, ten steps: episode A terminates at t=3, episode B is cut by a time limit at t=7,
# episode C is still running when the rollout ends after t=9.
STEPS = 10
TERMINATED, TRUNCATED = 3, 7
EPISODE_COLOURS = ("#cfe3f7", "#fde2c4", "#d9f0d3")
BORDERS = ("#2b6cb0", "#c05621", "#2f855a")
RED, GREY, INK = "#c53030", "#718096", "#1a202c"


def _episode(t: int) -> int:
    return 0 if t <= TERMINATED else 1 if t <= TRUNCATED else 2


def gae_boundaries(path: Path) -> None:
    """Where GAE bootstraps, where it does not, and where the λ-trace stops."""
    plt.rcParams.update({"svg.fonttype": "path", "svg.hashsalt": "rlbuf", "font.size": 10,
                         "font.family": "DejaVu Sans"})
    fig, ax = plt.subplots(figsize=(11, 4.3))
    ax.set_xlim(-0.8, STEPS + 1.3)
    ax.set_ylim(-2.55, 2.35)
    ax.axis("off")

    for t in range(STEPS):
        e = _episode(t)
        ax.add_patch(FancyBboxPatch((t - 0.38, -0.32), 0.76, 0.64, boxstyle="round,pad=0.02",
                                    facecolor=EPISODE_COLOURS[e], edgecolor=BORDERS[e], linewidth=1.4))
        ax.text(t, 0, f"$s_{{{t}}}$", ha="center", va="center", color=INK, fontsize=12)
        ax.text(t, -0.55, f"t={t}", ha="center", va="top", color=GREY, fontsize=8)

    for label, first, last, e in (("episode A", 0, TERMINATED, 0), ("episode B", TERMINATED + 1, TRUNCATED, 1),
                                  ("episode C", TRUNCATED + 1, STEPS - 1, 2)):
        ax.text((first + last) / 2, 2.15, label, ha="center", va="center", color=BORDERS[e], fontweight="bold")

    # Bootstrap: what δ_t adds as γ·V(next). Drawn above the steps.
    for t in range(STEPS):
        if t == TERMINATED:
            ax.text(t, 1.05, "terminated\nno bootstrap:\n$\\gamma V \\cdot 0$", ha="center", va="center",
                    color=RED, fontsize=8.5)
            continue
        if t == TRUNCATED:
            continue
        if t == STEPS - 1:
            ax.annotate("", xy=(t, 0.36), xytext=(t + 0.95, 0.95),
                        arrowprops={"arrowstyle": "->", "color": BORDERS[2], "lw": 1.2})
            ax.text(t + 1.0, 1.1, "last_value\n$V(s_{10})$", ha="center", va="bottom", color=BORDERS[2], fontsize=8.5)
            continue
        ax.add_patch(FancyArrowPatch((t + 0.9, 0.36), (t + 0.1, 0.36), connectionstyle="arc3,rad=0.55",
                                     arrowstyle="->", mutation_scale=9, color=GREY, lw=1.0))
        if t == 0:
            ax.text(t + 0.5, 0.72, "$\\gamma V(s_{t+1})$", ha="center", va="bottom", color=GREY, fontsize=8.5)
    # A timeout bootstraps from the final observation, which is not the next stored obs.
    t = TRUNCATED
    ax.add_patch(FancyBboxPatch((t + 0.02, 1.05), 0.8, 0.55, boxstyle="round,pad=0.02", facecolor="white",
                                edgecolor=BORDERS[1], linewidth=1.2, linestyle="--"))
    ax.text(t + 0.42, 1.325, "$s^{final}_{8}$", ha="center", va="center", color=BORDERS[1], fontsize=11)
    ax.annotate("", xy=(t, 0.36), xytext=(t + 0.3, 1.03),
                arrowprops={"arrowstyle": "->", "color": BORDERS[1], "lw": 1.3})
    ax.text(t - 0.5, 1.33, "truncated:\nbootstrap\n$\\gamma V(s^{final})$", ha="right", va="center",
            color=BORDERS[1], fontsize=8.5)

    # λ-trace: advantage[t] += γλ·advantage[t+1], drawn below the steps; cut at episode ends.
    for t in range(STEPS - 1):
        cut = t in (TERMINATED, TRUNCATED)
        ax.add_patch(FancyArrowPatch((t + 0.85, -1.05), (t + 0.15, -1.05), arrowstyle="->", mutation_scale=10,
                                     color=RED if cut else INK, lw=1.2, linestyle=":" if cut else "-"))
        if cut:
            ax.text(t + 0.5, -1.05, "✕", ha="center", va="center", color=RED, fontsize=13, fontweight="bold")
        else:
            ax.text(t + 0.5, -1.28, "γλ", ha="center", va="top", color=INK, fontsize=8)
    ax.text(-0.75, -1.05, "λ-trace", ha="left", va="center", color=INK, fontsize=9, fontweight="bold")
    ax.text(-0.75, 0.75, "bootstrap", ha="left", va="center", color=INK, fontsize=9, fontweight="bold")

    ax.text(STEPS / 2 - 0.5, -2.05,
            "$\\delta_t = r_t + \\gamma\\, V_{next}(t)\\,(1-\\mathrm{terminated}_t) - V(s_t)$      "
            "$A_t = \\delta_t + \\gamma\\lambda\\,(1-\\mathrm{done}_t)\\,A_{t+1}$",
            ha="center", va="center", color=INK, fontsize=10.5)
    ax.text(STEPS / 2 - 0.5, -2.45, "$s_8$ is the reset observation of episode C; "
            "$s^{final}_8$ is the observation the time limit cut off (TorchRL: (\"next\", \"observation\") at t=7)",
            ha="center", va="center", color=GREY, fontsize=8.5)

    fig.tight_layout(pad=0.2)
    fig.savefig(path, format="svg", metadata={"Date": None, "Creator": None})
    plt.close(fig)


def main() -> None:
    ASSETS.mkdir(parents=True, exist_ok=True)
    gae_boundaries(ASSETS / "gae_boundaries.svg")
    print(f"wrote {ASSETS / 'gae_boundaries.svg'}")


if __name__ == "__main__":
    main()
