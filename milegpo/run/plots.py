"""Plots of a training run: the learning curve, the credit diagnostics and the credit of one trajectory.

They read the files a run writes (SB3's ``progress.csv``; ``last_batch.npz``, the
last iteration's :class:`~milegpo.credit.StepBatch`), so they also work on
a run folder after the fact: ``python -m milegpo.run.plots RUN_DIR``.
"""

from __future__ import annotations

import csv
import json
import math
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from milegpo.credit import CREDIT_METHODS, StepBatch, credit_of_trajectory, make_credit_config  # noqa: E402
from milegpo.credit.batch import load_step_batch  # noqa: E402
from milegpo.credit.memory import uses_memory  # noqa: E402
from milegpo.run_folder import (  # noqa: E402
    CREDIT_DIAGNOSTICS_PNG,
    EVAL_CURVE_FILE,
    LAST_BATCH_FILE,
    LEARNING_CURVE_PNG,
    PROGRESS_FILE,
    TRAJECTORY_CREDIT_PNG,
)

#: credit/* columns drawn in the diagnostics figure, with their axis titles.
CREDIT_PANELS = {
    "credit/num_milestones_kept": "milestones (all tasks)",
    "credit/num_trap_candidates": "traps (all tasks)",
    "credit/ties_broken": "GraphGPO ties\nbroken by MileGPO",
    "credit/pcc_keep_frac": "candidates\nkept by PCC",
    "credit/sign_flip_frac": "credit sign !=\nepisode sign",
}

METHOD_LABELS = {"grpo": "GRPO", "rloo": "RLOO", "gigpo": "GiGPO", "hgpo": "HGPO", "graphgpo": "GraphGPO",
                 "milegpo": "MileGPO", "gagpo": "GAGPO", "g2po": "G2PO"}
#: Characters of an action shown as a tick label.
ACTION_CHARS = 32


def read_progress(path: str | Path) -> dict[str, list[float]]:
    """Read an SB3 ``progress.csv`` into columns of floats (missing cells are NaN)."""
    columns: dict[str, list[float]] = {}
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            for key, value in row.items():
                columns.setdefault(key, []).append(_to_float(value))
    return columns


def plot_learning_curve(progress_csv: str | Path, out_png: str | Path, title: str = "",
                        eval_splits: Sequence[str] = ()) -> Path:
    """Success rate of the train rollouts and of every held-out split against env steps.

    Each split's points are its ``eval/<split>/success_rate`` column of ``progress.csv`` (row 0:
    the untrained policy); for a log without such columns, ``eval.jsonl`` beside it (one split).
    The legend is drawn below the axes, hiding no point.
    """
    data = read_progress(progress_csv)
    steps = data.get("time/total_timesteps", [])
    fig, ax = plt.subplots(figsize=(6, 4))
    train = [(s, v) for s, v in zip(steps, data.get("rollout/success_rate", [])) if not math.isnan(v)]
    series: list[tuple[str, str | None, list[tuple[float, float]]]] = [("train rollouts", None, train)]
    splits = list(eval_splits) or sorted(key.split("/")[1] for key in data
                                         if key.startswith("eval/") and key.endswith("/success_rate"))
    for split in splits:
        column = data.get(f"eval/{split}/success_rate", [])
        series.append((f"held-out {split}", "o", [(s, v) for s, v in zip(steps, column) if not math.isnan(v)]))
    eval_file = Path(progress_csv).with_name(EVAL_CURVE_FILE)
    if len(series) == 1 and eval_file.exists():
        rows = [json.loads(line) for line in eval_file.read_text().splitlines() if line.strip()]
        series.append(("held-out eval", "o", [(row["num_timesteps"], row["success_rate"]) for row in rows]))
    for label, marker, points in series:
        if points:
            ax.plot(*zip(*points), marker=marker, label=label)
    ax.set_xlabel("env steps")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    if any(points for _, _, points in series):
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=min(len(series), 3), frameon=False)
    ax.set_title(title or "learning curve")
    return _save(fig, out_png)


def plot_credit_diagnostics(progress_csv: str | Path, out_png: str | Path, title: str = "") -> Path:
    """One panel per logged credit diagnostic (see :data:`CREDIT_PANELS`) against env steps."""
    data = read_progress(progress_csv)
    steps = data.get("time/total_timesteps", [])
    panels = [(key, label) for key, label in CREDIT_PANELS.items() if key in data]
    if not panels:
        panels = [(key, key) for key in sorted(data) if key.startswith("credit/")]
    fig, axes = plt.subplots(max(len(panels), 1), 1, figsize=(6, 1.8 * max(len(panels), 1) + 0.6), sharex=True,
                             squeeze=False)
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


def pick_trajectory(batch: StepBatch) -> int:
    """A telling trajectory to plot: the longest success of a task whose group also failed,
    else the longest success, else the longest trajectory."""
    lengths = np.bincount(batch.traj_ids, minlength=batch.num_trajectories)
    task_of = np.zeros(batch.num_trajectories, dtype=np.int64)
    task_of[batch.traj_ids] = batch.task_ids
    mixed_tasks = {q for q in set(task_of.tolist()) if len(set(batch.success[task_of == q].tolist())) == 2}
    for candidates in ([i for i in range(batch.num_trajectories) if batch.success[i] and task_of[i] in mixed_tasks],
                       np.flatnonzero(batch.success).tolist(), list(range(batch.num_trajectories))):
        if candidates:
            return int(max(candidates, key=lambda i: lengths[i]))
    raise ValueError("the batch has no trajectories")


def plot_trajectory_credit(batch: StepBatch, traj_id: int | None, out_png: str | Path,
                           methods: Iterable[str] = CREDIT_METHODS,
                           configs: Mapping[str, Any] | None = None, title: str = "") -> Path:
    """The per-step credit of one trajectory under each method, as grouped bars over its steps.

    The credit of a step depends on the whole batch (its group, the task graph), so the
    methods are run on ``batch`` and the rows of ``traj_id`` are drawn; the actions are the
    x tick labels (invalid ones in red) and the title gives the trajectory's outcome.

    :param traj_id: the trajectory to draw; None picks one with :func:`pick_trajectory`.
    :param configs: config or overrides per method (e.g. ``{"milegpo": {"preset": "webshop"}}``).
    """
    methods = list(methods)
    traj_id = pick_trajectory(batch) if traj_id is None else int(traj_id)
    credit = credit_of_trajectory(batch, traj_id, methods, configs)
    rows = np.flatnonzero(batch.traj_ids == traj_id)
    rows = rows[np.argsort(batch.step_idx[rows], kind="stable")]
    n_steps = len(rows)
    # one panel per method, each on its own scale: the methods' advantages differ in scale (RLOO's
    # are raw returns, the others normalised), so on one axis the largest would flatten the rest
    fig, axes = plt.subplots(len(methods), 1, figsize=(min(max(7.0, 0.3 * n_steps + 2.5), 30.0),
                                                       1.2 * len(methods) + 2.2), sharex=True, squeeze=False)
    x = np.arange(n_steps)
    won = bool(batch.success[traj_id])
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, (ax, method) in enumerate(zip(axes[:, 0], methods)):
        ax.bar(x, credit[method], 0.8, color=colors[k % len(colors)])
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_ylabel(METHOD_LABELS.get(method, method), rotation=0, ha="right", va="center", fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(axis="y", alpha=0.3)
        ax.set_facecolor("#eef7ee" if won else "#f9ecec")
    bottom = axes[-1, 0]
    if all(np.allclose(values, 0.0) for values in credit.values()):
        axes[0, 0].text(0.5, 0.5, "every step gets 0: the outcomes of this task's group do not differ",
                        transform=axes[0, 0].transAxes, ha="center", va="center", fontsize=9)
    bottom.set_xticks(x)
    bottom.set_xticklabels([f"{t}: {_shorten(a)}" for t, a in enumerate(batch.actions[rows])], rotation=60,
                           ha="right", fontsize=7)
    for label, valid in zip(bottom.get_xticklabels(), batch.valid[rows]):
        if not valid:
            label.set_color("red")
    bottom.set_xlabel("step: action (red: invalid)")
    outcome = f"{'success' if won else 'failure'}, return {batch.outcomes[traj_id]:g}, {n_steps} steps"
    heading = f"trajectory {traj_id} of task {batch.task_ids[rows[0]]}: {outcome}; step advantage per method"
    axes[0, 0].set_title(f"{title}\n{heading}" if title else heading, fontsize=10)
    return _save(fig, out_png)


def plot_run_trajectory_credit(run_dir: str | Path, traj_id: int | None = None) -> Path | None:
    """``trajectory_credit.png`` of a run folder from its ``last_batch.npz`` (None if it has none, or if
    :func:`trajectory_credit_unplottable` says why not: then one line on stderr says so).

    The trained method gets the run's credit preset and ``credit_kwargs`` (from
    ``config.json``); MileGPO gets the run's preset in any case.
    """
    run_dir = Path(run_dir)
    if not (run_dir / LAST_BATCH_FILE).exists():
        return None
    why_not = trajectory_credit_unplottable(run_dir)
    if why_not is not None:
        print(f"note: {run_dir / TRAJECTORY_CREDIT_PNG} is not drawn: {why_not}", file=sys.stderr)
        return None
    batch, meta = load_step_batch(run_dir / LAST_BATCH_FILE)
    title = f"{run_dir.name}, iteration {meta['iteration']}" if "iteration" in meta else run_dir.name
    return plot_trajectory_credit(batch, traj_id, run_dir / TRAJECTORY_CREDIT_PNG, configs=_run_credit_configs(run_dir),
                                  title=title)


def trajectory_credit_unplottable(run_dir: str | Path) -> str | None:
    """Why the run folder's ``trajectory_credit.png`` cannot be drawn, None when it can: MileGPO with the
    milestone memory credits from earlier iterations' counts, which ``last_batch.npz`` does not hold, so
    its credit cannot be recomputed from the batch."""
    milegpo_config = _run_credit_configs(Path(run_dir)).get("milegpo")
    if milegpo_config is None or not uses_memory(make_credit_config("milegpo", **milegpo_config)):
        return None
    return ("the run's MileGPO credit reads the milestone memory of earlier iterations, which last_batch.npz does not "
            "keep (credit_diagnostics.jsonl has the credit each iteration logged)")


def _run_credit_configs(run_dir: Path) -> dict[str, dict[str, Any]]:
    """The credit overrides of the run folder's ``config.json`` by method (none without one)."""
    configs: dict[str, dict[str, Any]] = {}
    if (run_dir / "config.json").exists():
        algo = json.loads((run_dir / "config.json").read_text()).get("algo", {})
        if algo.get("credit_preset"):
            configs["milegpo"] = {"preset": algo["credit_preset"]}
        method = algo.get("method")
        if method in CREDIT_METHODS:
            configs[method] = {**configs.get(method, {}), **(algo.get("credit_kwargs") or {})}
    return configs


def _shorten(text: object) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= ACTION_CHARS else text[: ACTION_CHARS - 3] + "..."


def _to_float(value: str | None) -> float:
    try:
        return float(value) if value not in (None, "") else math.nan
    except ValueError:
        return math.nan


def _save(fig: plt.Figure, out_png: str | Path) -> Path:
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}.png")  # renamed over: a reader never sees half a plot
    try:
        fig.savefig(tmp, dpi=120)
        os.replace(tmp, out)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return out


def main(argv: list[str] | None = None) -> None:
    run_dir = Path((argv or sys.argv[1:] or ["."])[0])
    progress = run_dir / PROGRESS_FILE
    print(plot_learning_curve(progress, run_dir / LEARNING_CURVE_PNG))
    print(plot_credit_diagnostics(progress, run_dir / CREDIT_DIAGNOSTICS_PNG))
    trajectory_png = plot_run_trajectory_credit(run_dir)
    if trajectory_png is not None:
        print(trajectory_png)


if __name__ == "__main__":
    main()
