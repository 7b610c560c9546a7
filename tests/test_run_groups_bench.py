"""A training run's kept groups replayed with the ground truth (``benchmarks/credit/run_groups.py``):
the replay is the run's own episodes, or one error naming where it is not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's root: the benchmarks package

from benchmarks.credit import run_groups  # noqa: E402
from milegpo.credit.batch import load_step_batch, save_step_batch  # noqa: E402
from milegpo.inspect.runfiles import kept_iterations  # noqa: E402


def train(run: Path, *settings: str) -> Path:
    """A short House run of the benchmark's House settings (horizon 30) that keeps every batch."""
    subprocess.run([sys.executable, "-m", "milegpo", "train", "--preset", "cpu-demo", "--run-dir", str(run),
                    "--no-progress-bar", "run.total_timesteps=300", "env.n_tasks=2", "env.group_size=4",
                    "env.kwargs={max_episode_steps: 30}", "eval.splits=[]", *settings],
                   check=True, stdout=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    return run


@pytest.fixture(scope="module")
def house_run(tmp_path_factory) -> Path:
    return train(tmp_path_factory.mktemp("runs") / "house", "run.keep_batch_every=1")


def test_the_replay_is_the_runs_own_episodes_with_their_true_distances(house_run):
    sequence = run_groups.replay_run("house", house_run)
    kept = kept_iterations(house_run)
    assert len(sequence) == len(kept) >= 2
    for groups, path in zip(sequence, kept.values()):
        batch, meta = load_step_batch(path)
        replayed = groups.batch("env")
        for name in ("state_keys", "next_state_keys", "actions", "rewards", "valid", "dones", "step_idx"):
            np.testing.assert_array_equal(getattr(replayed, name), getattr(batch, name), err_msg=name)
        np.testing.assert_array_equal(replayed.success, batch.success)
        # a group's task is its seed modulo House's 1,000 train tasks
        assert set(replayed.task_ids.tolist()) == {seed % 1000 for seed in meta["task_seeds"]}
        assert len(groups.dist) == batch.num_steps and np.all(groups.dist >= 0)
        assert np.all(groups.dist[batch.dones & batch.success[batch.traj_ids]] == 1)  # one step from the win


def test_a_batch_the_env_does_not_replay_stops_naming_the_step(house_run, tmp_path):
    run = tmp_path / "house"
    subprocess.run(["cp", "-r", str(house_run), str(run)], check=True)
    path = kept_iterations(run)[2]
    batch, meta = load_step_batch(path)
    batch.rewards[3] += 1.0
    save_step_batch(batch, path, meta)
    with pytest.raises(run_groups.ReplayError, match=r"iteration 2, trajectory \d+, step \d+: reward"):
        run_groups.replay_run("house", run)


def test_a_run_without_every_batch_or_of_another_env_is_refused(tmp_path, house_run):
    sparse = train(tmp_path / "sparse", "run.keep_batch_every=5")
    with pytest.raises(run_groups.ReplayError, match="keep_batch_every=1"):
        run_groups.replay_run("house", sparse)
    with pytest.raises(run_groups.ReplayError, match="not the benchmark's 'coin'"):
        run_groups.replay_run("coin", house_run)
