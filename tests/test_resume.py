"""A run killed with SIGKILL at any moment resumes with every log intact.

The reference is the same config run without interruption: after kill -9 /
resume cycles, progress.csv, eval.jsonl and credit_diagnostics.jsonl hold each
iteration exactly once, in order, with the reference's values (everything but
wall-clock timings: the resumed run restores weights, optimizer, every RNG and
the task draw, so on the same CPU it repeats the same numbers), and the final
LoRA weights equal the reference's tensor by tensor.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

CONFIG = {"run": {"total_timesteps": 480, "checkpoint_freq": 2}, "env": {"n_tasks": 1, "group_size": 2,
          "kwargs": {"max_episode_steps": 8}}, "eval": {"freq": 2, "n_tasks": 2, "copies": 1}}


def milegpo(*args: str) -> list[str]:
    return [sys.executable, "-m", "milegpo", *args, "--no-progress-bar"]


def rows(path: Path) -> list[dict[str, str]]:
    with open(path) as f:
        return list(csv.DictReader(f))


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def deterministic(row: dict, timing_keys=("time/", "update_s", "_per_s")) -> dict:
    """A log row without its wall-clock values."""
    return {k: v for k, v in row.items() if not any(t in k for t in timing_keys)}


def final_weights(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "final" / "adapter" / "adapter_model.safetensors"))


def assert_same_weights(run_dir: Path, reference: Path) -> None:
    import torch

    got, want = final_weights(run_dir), final_weights(reference)
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[name], want[name]) for name in want), "the resumed run's final weights differ"
    # the adapter's config is the same file but for the base model's path (another run folder)
    configs = [json.loads((d / "final" / "adapter" / "adapter_config.json").read_text()) for d in (run_dir, reference)]
    for config in configs:
        config.pop("base_model_name_or_path")
    assert configs[0] == configs[1]


def hidden_folders(run_dir: Path) -> list[str]:
    """Hidden leftovers of interrupted saves (the run folder's writer lock file is meant to stay)."""
    return sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob(".*") if p.name != ".milegpo.lock")


# `milegpo train`, SIGKILLed by itself in the middle of its N-th checkpoint save whose temporary
# folder name contains MATCH: after the adapter is written, before the optimizer state is
KILL_DURING_SAVE = """
import os, signal, sys
import milegpo.algos.checkpoint as checkpoint
match, nth, seen, save = sys.argv[1], int(sys.argv[2]), [0], checkpoint._save_tensors
def killing_save(state, file):
    if match in str(file):
        seen[0] += 1
        if seen[0] == nth:
            os.kill(os.getpid(), signal.SIGKILL)
    return save(state, file)
checkpoint._save_tensors = killing_save
from milegpo.cli import main
sys.exit(main(sys.argv[3:]))
"""


def train_killed_during_save(match: str, nth: int, args: list[str]) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", KILL_DURING_SAVE, match, str(nth), "train", *args, "--no-progress-bar"]
    return subprocess.run(command, stdout=subprocess.DEVNULL, env=env, timeout=600).returncode


def train_until_killed(run_dir: Path, args: list[str], min_rows: int, timeout: float = 180) -> int:
    """Start `milegpo train`, SIGKILL it once progress.csv has ``min_rows`` rows; its return code."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(milegpo("train", *args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    progress, deadline = run_dir / "progress.csv", time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        if progress.exists() and progress.read_text().count("\n") > min_rows:
            process.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    process.wait(timeout=60)
    return process.returncode


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("reference")
    (folder / "config.json").write_text(json.dumps(CONFIG))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(milegpo("train", "--preset", "cpu-demo", "--config", str(folder / "config.json"), "--run-dir",
                           str(folder / "run")),
                   check=True, stdout=subprocess.DEVNULL, env=env)
    return folder / "run"


@pytest.mark.slow
def test_kill_9_and_resume_keeps_every_log_whole(reference: Path, tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    run = tmp_path / "run"
    assert train_until_killed(run, ["--preset", "cpu-demo", "--config", str(config), "--run-dir", str(run)],
                              min_rows=6) == -signal.SIGKILL
    assert train_until_killed(run, ["--resume", str(run)], min_rows=14) == -signal.SIGKILL
    subprocess.run(milegpo("train", "--resume", str(run)), check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})

    got, want = rows(run / "progress.csv"), rows(reference / "progress.csv")
    assert [int(r["time/iterations"]) for r in got] == list(range(len(want)))  # each iteration once, in order
    assert [deterministic(r) for r in got] == [deterministic(r) for r in want]
    elapsed = [int(r["time/time_elapsed"]) for r in got if r["time/time_elapsed"]]
    assert elapsed == sorted(elapsed)  # the clock continues across sessions
    for name in ("eval.jsonl", "credit_diagnostics.jsonl"):
        lines = [[deterministic(r) for r in jsonl(folder / name)] for folder in (run, reference)]
        assert lines[0] == lines[1], name
    assert json.loads((run / "eval_final.json").read_text()) == json.loads((reference / "eval_final.json").read_text())
    assert_same_weights(run, reference)
    assert hidden_folders(run) == []

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run)).Reload()
    steps = [event.step for event in events.Scalars("rollout/success_rate")]
    assert steps == [int(r["time/total_timesteps"]) for r in want if r["rollout/success_rate"]]
    # and in the event files themselves (three sessions, three files): each step once
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    files = sorted(run.glob("events.out.tfevents.*"))
    events = [event for path in files for event in EventFileLoader(str(path)).Load()]
    raw = [event.step for event in events if event.WhichOneof("what") == "summary"
           and any(v.tag == "rollout/success_rate" for v in event.summary.value)]
    assert len(list(run.glob("events.out.tfevents.*"))) == 3 and sorted(raw) == steps


@pytest.mark.slow
def test_saves_killed_midway_leave_nothing_behind_after_resume(reference: Path, tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    run = tmp_path / "run"
    # killed in its 3rd periodic checkpoint save, then (resumed) in the final save
    assert train_killed_during_save(".checkpoint_", 3, ["--preset", "cpu-demo", "--config", str(config), "--run-dir",
                                                        str(run)]) == -signal.SIGKILL
    assert [p for p in hidden_folders(run) if ".tmp-" in p]  # the unfinished save is there
    assert train_killed_during_save(".final.tmp-", 1, ["--resume", str(run)]) == -signal.SIGKILL
    assert any(p.startswith(".final.tmp-") for p in hidden_folders(run))
    result = subprocess.run(milegpo("train", "--resume", str(run)), capture_output=True, text=True, check=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.stdout.count("Cleaned up 1 checkpoint save(s) a killed run left unfinished") == 1
    assert hidden_folders(run) == []
    want = rows(reference / "progress.csv")
    assert [deterministic(r) for r in rows(run / "progress.csv")] == [deterministic(r) for r in want]
    assert_same_weights(run, reference)


@pytest.mark.slow
def test_resuming_a_finished_run_changes_nothing(reference: Path, tmp_path: Path) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(reference, run)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    result = subprocess.run(milegpo("train", "--resume", str(run)), capture_output=True, text=True, check=True)
    assert "is finished" in result.stdout and "nothing to do" in result.stdout
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


def test_corrupt_latest_checkpoint_falls_back_to_an_intact_one(reference: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture) -> None:
    import shutil

    from milegpo.cli import main

    run = tmp_path / "run"
    shutil.copytree(reference, run)
    shutil.rmtree(run / "final")
    newest, older = sorted((run / "checkpoints").iterdir(), key=lambda p: int(p.name.split("_")[1]), reverse=True)
    (newest / "optimizer.pt").write_bytes((newest / "optimizer.pt").read_bytes()[:100])  # a half-written file
    config = json.loads((run / "config.json").read_text())
    assert main(["train", "--resume", str(run), f"run.total_timesteps={config['run']['total_timesteps']}",
                 "--no-progress-bar"]) == 0
    captured = capsys.readouterr()
    assert "is corrupt: optimizer.pt has 100 bytes" in captured.err and f"Resuming from {older}" in captured.out
    assert (run / "checkpoints" / f"corrupt-{newest.name}").exists()
    iterations = [int(r["time/iterations"]) for r in rows(run / "progress.csv")]
    assert iterations == list(range(len(iterations)))


@pytest.mark.slow
def test_resuming_a_finished_run_writes_its_missing_plots(reference: Path, tmp_path: Path) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(reference, run)
    (run / "learning_curve.png").unlink()  # e.g. plotting failed after training (a warning, exit 0)
    result = subprocess.run(milegpo("train", "--resume", str(run)), capture_output=True, text=True, check=True)
    assert "Wrote the missing plot(s) learning_curve.png" in result.stdout and "is finished" in result.stdout
    assert (run / "learning_curve.png").stat().st_size > 0
