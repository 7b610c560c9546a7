"""Plots of a training run: the learning curve and the credit diagnostics.

Both read the files a run writes (SB3's ``progress.csv``), so they also work on
a run folder after the fact: ``python -m milegpo.plots RUN_DIR``.
"""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

#: credit/* columns drawn in the diagnostics figure, with their axis titles.
CREDIT_PANELS = {
    "credit/n_milestones": "milestones found per task",
    "credit/n_traps": "traps found per task",
    "credit/ties_broken": "GraphGPO ties broken by MileGPO",
    "credit/pcc_kept": "milestone candidates kept by PCC",
    "credit/sign_flip_frac": "steps whose credit sign differs from the episode",
}


def read_progress(path: str | Path) -> dict[str, list[float]]:
    """Read an SB3 ``progress.csv`` into columns of floats (missing cells are NaN)."""
    columns: dict[str, list[float]] = {}
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            for key, value in row.items():
                columns.setdefault(key, []).append(_to_float(value))
    return columns


def plot_learning_curve(progress_csv: str | Path, out_png: str | Path, title: str = "") -> Path:
    """Success rate (train rollouts and, when logged, held-out eval) against env steps."""
    data = read_progress(progress_csv)
    steps = data.get("time/total_timesteps", [])
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("rollout/success_rate", "train rollouts"), ("eval/success_rate", "held-out eval")):
        points = [(s, v) for s, v in zip(steps, data.get(key, [])) if not math.isnan(v)]
        if points:
            ax.plot(*zip(*points), marker="o" if key.startswith("eval") else None, label=label)
    ax.set_xlabel("env steps")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title or "learning curve")
    return _save(fig, out_png)


def plot_credit_diagnostics(progress_csv: str | Path, out_png: str | Path, title: str = "") -> Path:
    """One panel per logged credit diagnostic (see :data:`CREDIT_PANELS`) against env steps."""
    data = read_progress(progress_csv)
    steps = data.get("time/total_timesteps", [])
    panels = [(key, label) for key, label in CREDIT_PANELS.items() if key in data]
    if not panels:
        panels = [(key, key) for key in sorted(data) if key.startswith("credit/")]
    fig, axes = plt.subplots(max(len(panels), 1), 1, figsize=(6, 1.8 * max(len(panels), 1) + 0.6), sharex=True, squeeze=False)
    for ax, (key, label) in zip(axes[:, 0], panels):
        points = [(s, v) for s, v in zip(steps, data[key]) if not math.isnan(v)]
        if points:
            ax.plot(*zip(*points))
        ax.set_ylabel(label, fontsize=7)
        ax.grid(alpha=0.3)
    if not panels:
        axes[0, 0].text(0.5, 0.5, "no credit diagnostics logged", ha="center", va="center")
    axes[-1, 0].set_xlabel("env steps")
    fig.suptitle(title or "credit diagnostics")
    return _save(fig, out_png)


def _to_float(value: str | None) -> float:
    try:
        return float(value) if value not in (None, "") else math.nan
    except ValueError:
        return math.nan


def _save(fig: plt.Figure, out_png: str | Path) -> Path:
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    run_dir = Path((argv or sys.argv[1:] or ["."])[0])
    progress = run_dir / "progress.csv"
    print(plot_learning_curve(progress, run_dir / "learning_curve.png"))
    print(plot_credit_diagnostics(progress, run_dir / "credit_diagnostics.png"))


if __name__ == "__main__":
    main()
