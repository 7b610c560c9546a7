"""`milegpo train` / `milegpo eval` end to end on a tiny budget: run folder, resume, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from milegpo.cli import main

TINY = ["--n-tasks", "1", "--group-size", "2", "--n-eval-tasks", "2", "--no-progress-bar",
        "--env-kwargs", '{"max_episode_steps": 8}']


def checkpoint_steps(run_dir: Path) -> list[int]:
    return sorted(int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").glob("checkpoint_*_steps"))


def test_train_writes_the_run_folder_resumes_and_evaluates(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    assert main(["train", "--steps", "80", "--run-dir", str(run), *TINY]) == 0
    for name in ("config.json", "progress.csv", "eval.jsonl", "eval_final.json", "learning_curve.png",
                 "credit_diagnostics.png", "trajectory_credit.png", "final/config.json", "base_model/config.json"):
        assert (run / name).exists(), name
    config = json.loads((run / "config.json").read_text())
    assert config["algo"] == "milegpo" and config["env_kwargs"] == {"max_episode_steps": 8}
    first = checkpoint_steps(run)
    assert first and first[-1] >= 80

    assert main(["train", "--resume", str(run), "--steps", "160", "--no-progress-bar"]) == 0
    assert "Resuming" in capsys.readouterr().out
    resumed = json.loads((run / "final" / "config.json").read_text())
    assert resumed["counters"]["num_timesteps"] >= 160  # continued from the checkpoint to the new budget

    assert main(["eval", str(run), "--split", "eval_ood", "--n-tasks", "2"]) == 0
    assert "eval_ood: success" in capsys.readouterr().out


def test_train_refuses_bad_config_with_the_valid_keys(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"learning_rat": 0.1}')
    assert main(["train", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "learning_rat" in err and "learning_rate" in err


def test_train_and_eval_refuse_unknown_env_and_missing_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", "--env", "nope/Nothing-v0", "--run-dir", str(tmp_path / "r")]) == 2
    assert "Registered text envs" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "missing")]) == 2
    assert "not a run folder" in capsys.readouterr().err
