"""Data parallelism on torch.distributed (gloo, 2 CPU processes launched by torchrun).

N processes on a global batch must equal 1 process on the same batch: the same LoRA
weights after an update, the same logged credit diagnostics and rollout statistics.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch as th

WORKER = str(Path(__file__).with_name("distributed_worker.py"))
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def torchrun(*args: str, nproc: int = 2, timeout: float = 300) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
               "--master_port", str(29500 + os.getpid() % 1000), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=ENV)


@pytest.mark.slow
def test_two_ranks_update_like_one_process(model_path: str, tmp_path: Path) -> None:
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    subprocess.run([sys.executable, WORKER, "update", model_path, str(one)], check=True, env=ENV, timeout=300)
    result = torchrun(WORKER, "update", model_path, str(two))
    assert result.returncode == 0, result.stderr[-3000:]
    single, double = th.load(one), th.load(two)
    assert single["n_updates"] == double["n_updates"] >= 2 * 4  # 2 epochs of several minibatches of 7 steps
    # The loss and gradient of each minibatch are sums of per-rank shares normalised by the
    # global minibatch: equal up to float32 rounding (~1e-7 relative). The weights after 2 x
    # 11 AdamW steps at lr 1e-2 differ by up to ~6e-6 (measured): Adam divides each element's
    # step by its gradient's running RMS, which magnifies rounding where gradients are ~0.
    assert single["train"] == pytest.approx(double["train"], rel=1e-5, abs=1e-7)
    for name, grad in single["grads"].items():
        th.testing.assert_close(double["grads"][name], grad, rtol=1e-4, atol=1e-7)
    for name, weight in single["weights"].items():
        th.testing.assert_close(double["weights"][name], weight, rtol=0, atol=2e-5)
    assert single["diagnostics"] == pytest.approx(double["diagnostics"], rel=1e-9, abs=1e-12)
    assert single["stats"] == pytest.approx(double["stats"])
    assert single["stats"]["episodes"] == 12


@pytest.mark.slow
def test_torchrun_train_writes_one_run_folder_and_resumes_on_another_world_size(tmp_path: Path) -> None:
    run = tmp_path / "run"
    flags = ["env.n_tasks=2", "env.group_size=2", "eval.n_tasks=2", "run.checkpoint_freq=2", "eval.freq=2",
             "env.kwargs={max_episode_steps: 8}", "--no-progress-bar"]
    result = torchrun("-m", "milegpo", "train", "run.total_timesteps=96", "--run-dir", str(run), *flags)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(run / "progress.csv") as f:
        rows = list(csv.DictReader(f))
    trained = rows[1:]
    assert [int(r["time/iterations"]) for r in rows] == list(range(len(rows)))
    assert all(int(r["rollout/episodes"]) == 4 for r in trained)  # both ranks' episodes in each row
    steps = [int(r["time/total_timesteps"]) for r in trained]
    assert steps[0] == 32 and all(b - a == 32 for a, b in zip(steps, steps[1:]))  # 2 ranks x 2 envs x 8 steps
    assert (run / "final" / "config.json").exists() and (run / "eval_final.json").exists()
    assert sorted(p.name for p in run.iterdir() if p.suffix == ".csv") == ["progress.csv"]

    resumed = subprocess.run([sys.executable, "-m", "milegpo", "train", "--resume", str(run), "run.total_timesteps=160",
                              "--no-progress-bar"], capture_output=True, text=True, env=ENV, timeout=300)
    assert resumed.returncode == 0 and "Resuming from" in resumed.stdout, resumed.stderr[-3000:]
    final = json.loads((run / "final" / "config.json").read_text())["counters"]["num_timesteps"]
    assert final >= 160


def test_n_tasks_must_split_evenly_over_ranks(tmp_path: Path) -> None:
    result = torchrun("-m", "milegpo", "train", "env.n_tasks=3", "--run-dir", str(tmp_path / "run"),
                      "--no-progress-bar", timeout=120)
    assert result.returncode != 0 and "must be a multiple of the number of processes (2)" in result.stderr


def test_a_rank_that_raises_ends_the_run(model_path: str, tmp_path: Path) -> None:
    start = time.monotonic()
    result = torchrun(WORKER, "crash", model_path, "-", timeout=240)
    assert result.returncode != 0 and "rank 1 failed on purpose" in result.stderr
    assert time.monotonic() - start < 180  # ended, not hung in a collective
