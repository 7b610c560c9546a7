"""One writer per run folder, and clean stops on SIGTERM / SIGINT.

Two processes training one run folder (two ``--resume``, a retried job) are refused at once in one line
naming the holder, and the run that holds the folder logs every iteration once. A run stopped by
SIGTERM at any point (in a rollout, an update, a checkpoint save) exits 143 with one line, and
``--resume`` continues it: every row once, and the final adapter equal to an uninterrupted run's,
tensor for tensor.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_resume import CONFIG, assert_same_weights, deterministic, jsonl, milegpo, rows

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}

# `milegpo train` sending itself SIGNAL at the N-th call of module.function (the rest of argv: train's)
SIGNAL_AT_CALL = """
import importlib, os, signal, sys
target, nth, signame = sys.argv[1], int(sys.argv[2]), sys.argv[3]
module_name, _, attribute = target.rpartition(":")
owner_name, _, function_name = attribute.rpartition(".")
module = importlib.import_module(module_name)
owner = getattr(module, owner_name) if owner_name else module
original, seen = getattr(owner, function_name), [0]
def signalling(*args, **kwargs):
    seen[0] += 1
    if seen[0] == nth:
        os.kill(os.getpid(), getattr(signal, signame))
    return original(*args, **kwargs)
setattr(owner, function_name, signalling)
from milegpo.cli import main
sys.exit(main(sys.argv[4:]))
"""


def train_signalled_at(target: str, nth: int, args: list[str], signame: str = "SIGTERM") -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", SIGNAL_AT_CALL, target, str(nth), signame, "train", *args, "--no-progress-bar"]
    return subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=600)


def iterations(run: Path) -> list[int]:
    return [int(r["time/iterations"]) for r in rows(run / "progress.csv")]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("reference")
    (folder / "config.json").write_text(json.dumps(CONFIG))
    subprocess.run(milegpo("train", "--preset", "cpu-demo", "--config", str(folder / "config.json"), "--run-dir",
                           str(folder / "run")), check=True, stdout=subprocess.DEVNULL, env=ENV)
    return folder / "run"


def new_run_args(tmp_path: Path, run: Path) -> list[str]:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    return ["--preset", "cpu-demo", "--config", str(config), "--run-dir", str(run)]


def assert_like_reference(run: Path, reference: Path) -> None:
    """Every row once, in order, with the uninterrupted run's values; the same final adapter."""
    want = rows(reference / "progress.csv")
    assert iterations(run) == list(range(len(want)))
    assert [deterministic(r) for r in rows(run / "progress.csv")] == [deterministic(r) for r in want]
    for name in ("eval.jsonl", "credit_diagnostics.jsonl"):
        lines = [[deterministic(r) for r in jsonl(folder / name)] for folder in (run, reference)]
        assert lines[0] == lines[1], name
    assert_same_weights(run, reference)


# ------------------------------------------------------------------------------------------- SIGTERM
@pytest.mark.slow
@pytest.mark.parametrize("target, nth", [
    ("milegpo.algos.base:GroupRLAlgorithm._record_episode", 9),   # in a rollout (iteration 5)
    ("milegpo.algos.update:run_update", 7),                        # in an update
    ("milegpo.algos.checkpoint:_save_tensors", 2),                 # in a checkpoint save (iteration 4)
])
def test_sigterm_saves_and_resume_continues_exactly(reference: Path, tmp_path: Path, target: str, nth: int) -> None:
    run = tmp_path / "run"
    stopped = train_signalled_at(target, nth, new_run_args(tmp_path, run))
    assert stopped.returncode == 143, stopped.stderr
    lines = [line for line in stopped.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("stopped on SIGTERM at iteration "), stopped.stderr
    assert f"continue with milegpo train --resume {run}" in lines[-1]
    assert not (run / "final").exists()
    done = iterations(run)
    assert done == list(range(len(done))) and len(done) > 1  # rows up to the saved iteration, once each

    resumed = subprocess.run(milegpo("train", "--resume", str(run)), capture_output=True, text=True, env=ENV)
    assert resumed.returncode == 0, resumed.stderr
    assert_like_reference(run, reference)


@pytest.mark.slow
def test_sigint_stops_like_sigterm_with_its_own_code(tmp_path: Path) -> None:
    run = tmp_path / "run"
    stopped = train_signalled_at("milegpo.algos.update:run_update", 3, new_run_args(tmp_path, run), "SIGINT")
    assert stopped.returncode == 130, stopped.stderr
    assert "stopped on SIGINT at iteration 3" in stopped.stderr
    assert (run / "checkpoints" / f"checkpoint_{3 * 16}_steps").is_dir()


@pytest.mark.slow
def test_sigterm_before_the_first_iteration_leaves_no_folder(tmp_path: Path) -> None:
    run = tmp_path / "run"
    stopped = train_signalled_at("milegpo.algos.base:GroupRLAlgorithm._record_episode", 1, new_run_args(tmp_path, run))
    assert stopped.returncode == 143, stopped.stderr
    assert "before the first iteration ended: nothing was trained" in stopped.stderr
    assert not run.exists()


# ------------------------------------------------------------------------------------- one writer
def start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(milegpo("train", *args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=ENV)


def wait_for(path: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def assert_refused(process: subprocess.Popen, run: Path) -> None:
    _, err = process.communicate(timeout=120)
    assert process.returncode == 1, err
    assert err.count("\n") == 1 and err.startswith(f"error: {run} is being trained by pid "), err


@pytest.mark.slow
def test_two_resumes_started_together_one_refuses_and_rows_stay_whole(tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = subprocess.run(milegpo("train", *new_run_args(tmp_path, run), "run.total_timesteps=160"),
                           stdout=subprocess.DEVNULL, env=ENV)
    assert first.returncode == 0
    processes = [start(["--resume", str(run), "run.total_timesteps=480"]) for _ in range(2)]
    outcomes = sorted((p.wait(timeout=600), p) for p in processes)
    (ok, winner), (refused, loser) = outcomes[0], outcomes[1]
    assert (ok, refused) == (0, 1), winner.stderr.read() if winner.stderr else ""
    assert_refused(loser, run)
    assert iterations(run) == list(range(31))
    assert [r["iteration"] for r in jsonl(run / "credit_diagnostics.jsonl")] == list(range(1, 31))


@pytest.mark.slow
def test_a_second_writer_started_later_is_refused_at_once(tmp_path: Path) -> None:
    run = tmp_path / "run"
    holder = start([*new_run_args(tmp_path, run), "run.total_timesteps=1000000"])  # still training when asked
    wait_for(run / "progress.csv")
    started = time.monotonic()
    for args in (["--resume", str(run)], ["--preset", "cpu-demo", "--run-dir", str(run)]):
        assert_refused(start(args), run)
    assert time.monotonic() - started < 60  # refused, not waited for
    holder.send_signal(signal.SIGTERM)
    assert holder.wait(timeout=600) == 143
    done = iterations(run)
    assert done == list(range(len(done))) and len(done) > 1
    assert [r["iteration"] for r in jsonl(run / "credit_diagnostics.jsonl")] == done[1:]


@pytest.mark.slow
def test_two_new_runs_started_together_on_one_folder(tmp_path: Path) -> None:
    run = tmp_path / "run"
    processes = [start(new_run_args(tmp_path, run)) for _ in range(2)]
    codes = sorted(p.wait(timeout=600) for p in processes)
    assert codes == [0, 1]
    loser = next(p for p in processes if p.returncode == 1)
    assert_refused(loser, run)
    assert iterations(run) == list(range(31))


@pytest.mark.slow
def test_kill_9_of_the_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    run = tmp_path / "run"
    holder = start(new_run_args(tmp_path, run))
    wait_for(run / "checkpoints" / "checkpoint_32_steps" / "config.json")  # a complete checkpoint (iteration 2)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=60)
    resumed = subprocess.run(milegpo("train", "--resume", str(run)), capture_output=True, text=True, env=ENV)
    assert resumed.returncode == 0, resumed.stderr
    assert iterations(run) == list(range(31))


def test_the_python_api_is_refused_while_another_process_holds_the_folder(tmp_path: Path) -> None:
    from milegpo.config.run import TrainConfig, resolve_config
    from milegpo.run.lock import RunFolderBusyError, RunFolderLock
    from milegpo.run.train import train

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(resolve_config("cpu-demo").to_dict()))
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from milegpo.run.lock import RunFolderLock; "
                               "lock = RunFolderLock(sys.argv[1]).acquire(); print('held', flush=True); "
                               "time.sleep(60)", str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        config = TrainConfig.from_file(run / "config.json")
        with pytest.raises(RunFolderBusyError, match=f"is being trained by pid {holder.pid} on "):
            train(config, run, resume=True, progress_bar=False, verbose=0)
        with pytest.raises(RunFolderBusyError):
            RunFolderLock(run).acquire()
    finally:
        holder.kill()
        holder.wait()
    with RunFolderLock(run) as lock:  # the OS dropped the dead holder's lock
        assert lock.held
    assert sorted(p.name for p in run.iterdir()) == [".milegpo.lock", "config.json"]  # nothing else was written


# ------------------------------------------------------------------------------------- checkpoints
@pytest.mark.slow
def test_checkpoints_with_a_behaviour_adapter_rotate(tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = subprocess.run(milegpo("train", *new_run_args(tmp_path, run), "algo.max_staleness=1",
                                  "run.checkpoint_freq=1"), capture_output=True, text=True, env=ENV)
    assert done.returncode == 0, done.stderr
    kept = sorted((run / "checkpoints").iterdir())
    assert len(kept) == 2, kept
    assert any((path / "behaviour_adapter").is_dir() for path in kept)  # the kind that was never rotated before


def test_time_based_checkpoints(tmp_path: Path) -> None:
    from milegpo import MileGPO, make_vec_env
    from milegpo.algos import CheckpointCallback

    env = make_vec_env("milegpo/House-v0", n_tasks=1, group_size=2, env_kwargs={"max_episode_steps": 4})
    model = MileGPO("LLMPolicy", env, seed=0, batch_size=8)
    every_iteration = CheckpointCallback(1000, tmp_path / "timed", keep_last=None, save_every_s=1e-9)
    never_due = CheckpointCallback(1000, tmp_path / "counted", keep_last=None, save_every_s=3600)
    model.learn(24, callback=[every_iteration, never_due])
    assert len(list((tmp_path / "timed").iterdir())) == model.iterations >= 3
    assert len(list((tmp_path / "counted").iterdir())) == 2  # the first iteration (kill-safe early) and the last
    with pytest.raises(ValueError, match="save_every_s must be > 0"):
        CheckpointCallback(1, tmp_path, save_every_s=0)



@pytest.mark.slow
def test_an_async_run_resumed_after_sigterm_repeats_its_episodes(tmp_path: Path) -> None:
    """Async calls group envs by timing, so behaviour log-probs (and the update) carry float noise: the
    episodes, credit and evaluations repeat exactly, the adapter to float32 noise (documented bound 1e-5)."""
    import torch
    from safetensors.torch import load_file

    async_config = {**CONFIG, "env": {**CONFIG["env"], "n_tasks": 2, "subprocess": True, "n_workers": 2},
                    "algo": {"rollout": "async"}}
    runs = {}
    for name in ("reference", "resumed"):
        config = tmp_path / f"{name}.json"
        config.write_text(json.dumps(async_config))
        runs[name] = run = tmp_path / name
        args = ["--preset", "cpu-demo", "--config", str(config), "--run-dir", str(run)]
        if name == "resumed":
            assert train_signalled_at("milegpo.algos.update:run_update", 4, args).returncode == 143
            args = ["--resume", str(run)]
        done = subprocess.run(milegpo("train", *args), capture_output=True, text=True, env=ENV)
        assert done.returncode == 0, done.stderr
    got, want = rows(runs["resumed"] / "progress.csv"), rows(runs["reference"] / "progress.csv")
    same = ("rollout/", "credit/", "eval/")
    assert [{k: v for k, v in r.items() if k.startswith(same)} for r in got] == [
        {k: v for k, v in r.items() if k.startswith(same)} for r in want]
    assert [deterministic(r) for r in jsonl(runs["resumed"] / "eval.jsonl")] == [
        deterministic(r) for r in jsonl(runs["reference"] / "eval.jsonl")]
    weights = [load_file(str(run / "final" / "adapter" / "adapter_model.safetensors")) for run in runs.values()]
    assert max(float(torch.max(torch.abs(weights[0][k] - weights[1][k]))) for k in weights[0]) < 1e-5
