"""--report-to wandb,mlflow: every log row, the config and the final results reach the trackers
(W&B offline, MLflow in a local file store; both real packages, no network)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from milegpo.options import parse_report_to

CONFIG = {"run": {"total_timesteps": 240, "checkpoint_freq": 2}, "env": {"n_tasks": 1, "group_size": 2,
          "kwargs": {"max_episode_steps": 8}}, "eval": {"freq": 2, "n_tasks": 2, "copies": 1}}


def test_report_to_is_checked() -> None:
    assert parse_report_to("tensorboard, WANDB,mlflow,wandb") == ["tensorboard", "wandb", "mlflow"]
    assert parse_report_to("none") == []
    with pytest.raises(ValueError, match="unknown tracker"):
        parse_report_to("tensorboard,comet")


@pytest.mark.slow
def test_wandb_offline_and_mlflow_default_store_get_the_run(tmp_path: Path) -> None:
    mlflow = pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    run = tmp_path / "run"
    # MLflow with no URI set: its default store (sqlite:///mlflow.db in the working directory), as a user gets it
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update({"OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true",
                "MLFLOW_EXPERIMENT_NAME": "milegpo-test"})
    subprocess.run([sys.executable, "-m", "milegpo", "train", "--config", str(tmp_path / "config.json"),
                    "--preset", "cpu-demo", "--run-dir", str(run), "run.report_to=[tensorboard,wandb,mlflow]",
                    "--no-progress-bar"],
                   check=True, stdout=subprocess.DEVNULL, env=env, timeout=600, cwd=tmp_path)
    with open(run / "progress.csv") as f:
        rows = list(csv.DictReader(f))
    ids = json.loads((run / "trackers.json").read_text())
    final = json.loads((run / "eval_final.json").read_text())

    # MLflow: the config as params, every row's metrics at its env step, the final results and the plots
    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    record = client.get_run(ids["mlflow"])
    params = record.data.params
    assert params["algo.method"] == "milegpo" and params["run.report_to"] == '["tensorboard", "wandb", "mlflow"]'
    history = client.get_metric_history(ids["mlflow"], "rollout/success_rate")
    want = [(int(r["time/total_timesteps"]),
             float(r["rollout/success_rate"])) for r in rows if r["rollout/success_rate"]]
    assert sorted((m.step, m.value) for m in history) == sorted(want)
    credit = client.get_metric_history(ids["mlflow"], "credit/num_milestones_kept")
    assert len(credit) == len(want)  # the credit diagnostics of every iteration
    assert record.data.metrics["final/eval_id/success_rate"] == pytest.approx(final["eval_id"]["success_rate"])
    assert {"learning_curve.png", "eval_final.json"} <= {a.path for a in client.list_artifacts(ids["mlflow"])}
    assert record.info.status == "FINISHED"

    # W&B offline: one run with the kept id, its records holding the logged keys and the config
    files = list((run / "wandb").glob(f"offline-run-*-{ids['wandb']}/run-{ids['wandb']}.wandb"))
    assert len(files) == 1
    data = files[0].read_bytes()
    for needle in (b"rollout/success_rate", b"credit/num_milestones_kept", b"eval/eval_id/success_rate",
                   b"eval/eval_ood/success_rate",
                   b"final/eval_id/success_rate", b"learning_curve", b"milegpo/House-v0"):
        assert needle in data, needle


def test_a_tracking_store_that_does_not_work_stops_the_run_before_it_starts(tmp_path: Path) -> None:
    # mlflow's file store refuses to open unless MLFLOW_ALLOW_FILE_STORE is set: one line, no folder, no W&B run
    pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update({"OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "MLFLOW_TRACKING_URI": f"file:{tmp_path / 'mlruns'}"})
    result = subprocess.run([sys.executable, "-m", "milegpo", "train", "--run-dir", str(tmp_path / "run"),
                             "run.report_to=[wandb,mlflow]", "--no-progress-bar"], capture_output=True, text=True,
                            env=env, timeout=300, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: run.report_to mlflow: the MLflow tracking store")
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists() and not (tmp_path / "wandb").exists()
