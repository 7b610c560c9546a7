"""`milegpo train` / `milegpo eval` end to end on a tiny budget: run folder, resume, errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from milegpo.cli import main

TINY = ["env.n_tasks=1", "env.group_size=2", "eval.n_tasks=2", "--no-progress-bar",
        "env.kwargs={max_episode_steps: 8}"]


def checkpoint_steps(run_dir: Path) -> list[int]:
    return sorted(int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").glob("checkpoint_*_steps"))


def test_train_writes_the_run_folder_resumes_and_evaluates(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    assert main(["train", "run.total_timesteps=80", "--run-dir", str(run), *TINY]) == 0
    for name in ("config.json", "progress.csv", "eval.jsonl", "eval_final.json", "learning_curve.png",
                 "credit_diagnostics.png", "trajectory_credit.png", "final/config.json", "base_model/config.json"):
        assert (run / name).exists(), name
    config = json.loads((run / "config.json").read_text())
    assert config["algo"]["method"] == "milegpo" and config["env"]["kwargs"] == {"max_episode_steps": 8}
    first = checkpoint_steps(run)
    assert first and first[-1] >= 80

    assert main(["train", "--resume", str(run), "--run.total_timesteps", "160", "--no-progress-bar"]) == 0
    assert "Resuming" in capsys.readouterr().out
    resumed = json.loads((run / "final" / "config.json").read_text())
    assert resumed["counters"]["num_timesteps"] >= 160  # continued from the checkpoint to the new budget

    assert main(["eval", str(run), "--split", "eval_ood", "--n-tasks", "2"]) == 0
    assert "eval_ood: success" in capsys.readouterr().out


def test_train_refuses_bad_config_with_the_valid_keys(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"algo": {"learning_rat": 0.1}}')
    assert main(["train", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "algo.learning_rat" in err and "unknown setting" in err


def test_train_and_eval_refuse_unknown_env_and_missing_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", "env.id=nope/Nothing-v0", "--run-dir", str(tmp_path / "r")]) == 2
    assert "Registered text envs" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "missing")]) == 2
    assert "not a run folder" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--policy.model", "/nonexistent/path"], "model path '/nonexistent/path' does not exist"),
    (["env.kwargs={bogus: 1}"], "unexpected keyword argument 'bogus'. Check env.kwargs"),
    (["env.id=milegpo/TextWorld-v0", "env.train_split=valid"], "it has no task splits. Train with "
                                                               "env.train_split=null"),
    (["env.id=milegpo/TextWorld-v0"], "game_files must be"),  # splits fitted to the env: its next need shows
    (["env.id=milegpo/TextWorld-v0", "env.train_split=null", "eval.splits=[]"], "game_files must be"),
    (["run.total_timesteps=-5"], "run.total_timesteps must be an integer >= 1, got -5"),
    (["--env.group_size", "-3"], "env.group_size must be an integer >= 1, got -3"),
    (["algo.learning_rate=-1"], "algo.learning_rate must be a number >= 0"),
    (["algo.learning_rate=abc"], "algo.learning_rate: Value 'abc' of type 'str' could not be converted to Float"),
    (["algo.lr=1"], "algo.lr: unknown setting 'lr'"),
    (["run.device=tpu"], "run.device must be 'auto', 'cpu', 'cuda'"),
    (["--algo.learning_rate", "1e-3", "algo.learning_rate=1e-2"], "algo.learning_rate given more than once"),
    (["run.seed=1", "run.seed=2"], "run.seed given more than once"),
    (["algo.learning_rate=0"], "algo.learning_rate must be > 0 for a training run"),
    (["env.n_tasks=0"], "env.n_tasks must be an integer >= 1, got 0"),
    (["env.worker_timeout_s=0"], "env.worker_timeout_s must be a number > 0"),
])
def test_bad_settings_are_one_error_line_and_leave_no_run_folder(
        flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    assert main(["train", *flags, "--run-dir", str(run), "--no-progress-bar"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert not run.exists()


def test_cuda_without_a_gpu_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["train", "run.device=cuda", "--run-dir", str(tmp_path / "run")]) == 2
    assert "no usable CUDA device" in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_a_folder_with_logs_is_resumed_not_overwritten(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "progress.csv").write_text("time/iterations\n0\n")
    assert main(["train", "--run-dir", str(run), "--no-progress-bar"]) == 2
    assert "choose a new or empty folder" in capsys.readouterr().err
    assert (run / "progress.csv").read_text() == "time/iterations\n0\n"
    (run / "config.json").write_text("{}")
    assert main(["train", "--run-dir", str(run), "--no-progress-bar"]) == 2
    assert f"continue it with --resume {run}" in capsys.readouterr().err


def test_eval_gives_one_number_per_checkpoint_and_split(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Seeded per split: the same split scores the same whether other splits ran before or not."""
    run = tmp_path / "run"
    assert main(["train", "run.total_timesteps=40", "--run-dir", str(run), *TINY]) == 0
    capsys.readouterr()

    def scores(*splits: str) -> dict[str, str]:
        assert main(["eval", str(run), "--n-tasks", "6", *[f"--split={s}" for s in splits]]) == 0
        return {line.split(":")[0]: line for line in capsys.readouterr().out.splitlines() if "success" in line}

    both = scores("eval_id", "eval_ood")
    assert scores("eval_ood")["eval_ood"] == both["eval_ood"]
    assert scores("eval_id")["eval_id"] == both["eval_id"]
    assert "sampled at T=1" in both["eval_id"]
    assert main(["eval", str(run), "--n-tasks", "6", "--split", "eval_id", "--greedy"]) == 0
    assert "(greedy)" in capsys.readouterr().out


def test_progress_rows_hold_their_own_iteration_eval(tmp_path: Path) -> None:
    """Row 0 is the untrained policy's evaluation; row k's eval/* is that of the weights after update k."""
    import csv

    run = tmp_path / "run"
    assert main(["train", "run.total_timesteps=64", "--run-dir", str(run), "eval.freq=2", *TINY]) == 0
    with open(run / "progress.csv") as f:
        progress = list(csv.DictReader(f))
    evals = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    assert progress[0]["time/iterations"] == "0" and progress[0]["rollout/success_rate"] == ""
    by_iteration = {int(r["time/iterations"]): r for r in progress}
    assert sorted(by_iteration) == list(range(len(progress)))  # no row without an iteration
    for row in evals:
        assert float(by_iteration[row["iteration"]]["eval/eval_id/success_rate"]) == pytest.approx(row["success_rate"])
    assert [r["iteration"] for r in evals] == sorted({0, *range(2, len(progress), 2), len(progress) - 1})


def test_every_setting_is_documented_and_has_a_flag() -> None:
    from milegpo.cli import build_parser
    from milegpo.config.run import leaves

    train = build_parser()._subparsers._group_actions[0].choices["train"]
    helps = {action.dest: action.help for action in train._actions}
    settings = list(leaves())
    assert len(settings) > 50
    for name, _, text in settings:
        assert text and "%" not in text, name  # argparse would choke on a lone %
        assert helps[name].startswith(text.replace("%", "%%")), name
    for name in ("algo.mini_batch_tokens", "algo.micro_batch_tokens", "algo.loss_agg", "algo.max_grad_norm",
                 "algo.weight_decay", "policy.optimizer_class", "policy.optimizer_kwargs", "policy.lora.dropout",
                 "policy.lora.target_modules", "policy.max_batch_tokens", "policy.sampler.trust_logprobs"):
        assert name in helps  # the ten settings that earlier versions could not set from the command line


def test_print_config_layers_preset_file_and_overrides(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import yaml

    file = tmp_path / "mine.yaml"
    file.write_text("algo: {learning_rate: 2.0e-5, method: grpo}\npolicy: {lora: {target_modules: [q_proj]}}\n")
    assert main(["train", "--preset", "cpu-demo", "--config", str(file), "algo.learning_rate=3e-5",
                 "--policy.lora.dropout", "0.1", "--print-config"]) == 0
    config = yaml.safe_load(capsys.readouterr().out)
    assert config["algo"]["learning_rate"] == 3e-5 and config["algo"]["method"] == "grpo"  # override > file
    assert config["policy"]["lora"] == {"r": 16, "alpha": 32, "dropout": 0.1, "target_modules": ["q_proj"]}
    assert config["policy"]["mode"] == "choose"  # the preset under the file
    assert main(["train", "--config", str(file), "--print-config"]) == 0
    # a file alone: the defaults under it
    assert yaml.safe_load(capsys.readouterr().out)["policy"]["mode"] == "generate"


@pytest.mark.parametrize("old, new", [("--lr", "--algo.learning_rate"), ("--steps", "--run.total_timesteps"),
                                      ("--env", "--env.id"), ("--rollout-backend", "--policy.sampler.backend")])
def test_old_flags_name_their_new_setting(old: str, new: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["train", old, "1"])
    assert exit_info.value.code == 2 and f"{old} is now {new}" in capsys.readouterr().err


def test_a_flat_config_file_of_earlier_versions_names_the_new_settings(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture) -> None:
    old = tmp_path / "old.json"
    old.write_text('{"learning_rate": 0.1, "eval_splits": []}')
    assert main(["train", "--config", str(old)]) == 2
    err = capsys.readouterr().err
    assert "learning_rate is now algo.learning_rate" in err and "eval_splits is now eval.splits" in err


@pytest.mark.parametrize("text, where", [("env: [1, 2\n", "line 2, column 1"),
                                         ("env:\n  id: x\n bad: 1\n", "line 3, column 2")])
def test_a_config_file_that_does_not_parse_is_one_line_naming_where(text: str, where: str, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    assert main(["train", "--config", str(bad), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"config file {str(bad)!r} is not valid YAML ({where}:" in err, err


def test_a_dead_mlflow_server_is_reported_in_seconds(tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}"}
    env.pop("MLFLOW_HTTP_REQUEST_MAX_RETRIES", None)
    # MLflow's own retries with back-off would take minutes: the check makes one quick try
    result = subprocess.run([sys.executable, "-m", "milegpo", "train", "run.report_to=[mlflow]", "--run-dir",
                             str(tmp_path / "run")], capture_output=True, text=True, env=env, timeout=90)
    assert result.returncode == 2
    assert f"the MLflow tracking store 'http://127.0.0.1:{port}' does not work" in result.stderr
    assert not (tmp_path / "run").exists()
