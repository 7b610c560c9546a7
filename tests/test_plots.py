"""The run plots read what a run writes: progress.csv columns, eval.jsonl, credit diagnostics."""

from __future__ import annotations

import json
import math
from pathlib import Path

from milegpo.credit import StepBatch, compute_credit
from milegpo.run.plots import (
    CREDIT_PANELS,
    plot_credit_diagnostics,
    plot_learning_curve,
    read_progress,
)

PNG_MAGIC = b"\x89PNG"


def write_run(folder: Path) -> Path:
    progress = folder / "progress.csv"
    progress.write_text(
        "time/total_timesteps,rollout/success_rate,credit/ties_broken,credit/sign_flip_frac\n"
        "100,0.1,0.5,\n"
        "200,0.3,0.6,0.05\n"
    )
    rows = [{"num_timesteps": 0, "success_rate": 0.05}, {"num_timesteps": 200, "success_rate": 0.2}]
    (folder / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return progress


def test_read_progress_gives_float_columns_with_nan_for_empty_cells(tmp_path: Path) -> None:
    data = read_progress(write_run(tmp_path))
    assert data["time/total_timesteps"] == [100.0, 200.0]
    assert math.isnan(data["credit/sign_flip_frac"][0]) and data["credit/sign_flip_frac"][1] == 0.05


def test_learning_curve_and_credit_plots_are_written(tmp_path: Path) -> None:
    progress = write_run(tmp_path)
    for plot, name in ((plot_learning_curve, "curve.png"), (plot_credit_diagnostics, "credit.png")):
        out = plot(progress, tmp_path / name)
        assert out.read_bytes()[:4] == PNG_MAGIC


def test_credit_panels_name_diagnostics_that_milegpo_returns() -> None:
    batch = StepBatch.from_trajectories([["s0", "a", "b"], ["s0", "c", "c"], ["s0", "a", "c"]],
                                        success=[True, False, False])
    diagnostics = compute_credit("milegpo", batch).diagnostics
    missing = [key for key in CREDIT_PANELS if key.removeprefix("credit/") not in diagnostics]
    assert not missing, f"plot panels for diagnostics the credit function does not return: {missing}"
