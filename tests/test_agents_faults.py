"""Faults of an agent program end its episode, not the training: a program that raises, one that hangs past the
env's timeout and one that never calls the model each give one console line, training goes on, and what was
played and logged before stays (the faulty episode's earlier steps, every iteration's log row)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_raising_a_hanging_and_a_silent_program_each_give_one_line_and_training_goes_on(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-m", "milegpo", "train", "env.id=agent_programs:FaultyAgentEnv", "env.n_tasks=4",
         "env.group_size=2", "env.train_split=null", "eval.splits=[]", "policy.mode=generate",
         "policy.prompt_format=chat", "policy.max_new_tokens=2", "run.total_timesteps=20", "--run-dir", "run",
         "--no-progress-bar"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    failures = [line for line in result.stderr.splitlines() if " failed: " in line]
    kinds = {kind: [line for line in failures if f"failed: {kind}: " in line]
             for kind in ("AgentRaised", "AgentTimedOut", "AgentNeverCalledModel")}
    assert all(len(lines) == 1 for lines in kinds.values()), failures  # one line per kind, however often
    assert len(failures) == 3, failures
    assert "the agent program raised ValueError: the agent broke" in kinds["AgentRaised"][0]
    assert "within 2 s (the env's timeout)" in kinds["AgentTimedOut"][0]
    assert "returned 1.0 without calling the model" in kinds["AgentNeverCalledModel"][0]
    run = tmp_path / "run"
    rows = list(csv.DictReader((run / "progress.csv").open()))
    iterations = [row for row in rows if row.get("rollout/episodes")]
    assert len(iterations) >= 2  # every task group faults in every rollout: training went on
    assert all(float(row["rollout/env_errors"]) == 6 for row in iterations)  # 3 faulty tasks x 2 copies
    # the steps before a fault are kept: ok 2 steps, raise and hang their first (the failed one is dropped), silent 0
    assert all(float(row["rollout/episodes"]) == 8 and float(row["rollout/ep_len_mean"]) == 1.0 for row in iterations)
    assert all(float(row["rollout/success_rate"]) == 0.25 for row in iterations)  # the ok episodes won
    assert (run / "final").is_dir()
    tracebacks = (run / "env_errors.log").read_text()
    assert "ValueError: the agent broke" in tracebacks and "AgentTimedOut" in tracebacks
