"""A run that keeps batches (``run.keep_batch_every``), killed with SIGKILL and resumed, ends with the
same kept files as the same run never interrupted: the same iterations, each with the same steps,
observations and credit config, and no temporary file of a copy a kill cut short.

Killed at three moments: at a random one (once its log has some rows), in the middle of copying a
kept batch, and right after a kept batch is written but before that iteration's checkpoint (the
resume then plays the iteration again and keeps it again). The reference and the runs use the same
config, so on the same CPU they repeat the same numbers (tests/test_resume.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_resume import milegpo, train_until_killed

from milegpo.algos.checkpoint import read_config
from milegpo.credit import StepBatch
from milegpo.credit.batch import load_step_batch

CONFIG = {"run": {"total_timesteps": 480, "checkpoint_freq": 2, "keep_batch_every": 3},
          "env": {"n_tasks": 1, "group_size": 2, "kwargs": {"max_episode_steps": 8}},
          "eval": {"freq": 4, "n_tasks": 2, "copies": 1}}

# `milegpo train`, SIGKILLed by itself at its N-th kept batch: "during" the copy (a half-written
# temporary file is left), or "after" it (the kept file is complete, the iteration's checkpoint not yet saved)
KILL_AT_KEEP = """
import os, signal, sys
from pathlib import Path
import milegpo.algos.run_outputs as outputs
mode, nth, seen, keep = sys.argv[1], int(sys.argv[2]), [0], outputs.keep_batch
def killing_keep(run_dir, iteration):
    seen[0] += 1
    if seen[0] == nth and mode == "during":
        folder = Path(run_dir) / "batches"
        folder.mkdir(exist_ok=True)
        (folder / f".iteration_{iteration:06d}.npz.tmp-{os.getpid()}").write_bytes(b"PK half a zip")
        os.kill(os.getpid(), signal.SIGKILL)
    kept = keep(run_dir, iteration)
    if seen[0] == nth:
        os.kill(os.getpid(), signal.SIGKILL)
    return kept
outputs.keep_batch = killing_keep
from milegpo.cli import main
sys.exit(main(sys.argv[3:]))
"""


def environment() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def kept_files(run: Path) -> dict[str, tuple[StepBatch, dict]]:
    """Every file of ``run/batches/`` by name, read back (a temporary file fails to read)."""
    return {path.name: load_step_batch(path) for path in sorted((run / "batches").iterdir())}


def assert_same_kept_files(run: Path, reference: Path) -> None:
    got, want = kept_files(run), kept_files(reference)
    assert list(got) == list(want)
    for name, (batch, meta) in want.items():
        other, other_meta = got[name]
        assert other_meta == meta, name
        for field in dataclasses.fields(StepBatch):
            assert np.array_equal(getattr(other, field.name), getattr(batch, field.name)), (name, field.name)
    assert load_step_batch(run / "last_batch.npz")[1] == load_step_batch(reference / "last_batch.npz")[1]


def train_killed_at_keep(mode: str, nth: int, args: list[str]) -> int:
    command = [sys.executable, "-c", KILL_AT_KEEP, mode, str(nth), "train", *args, "--no-progress-bar"]
    return subprocess.run(command, stdout=subprocess.DEVNULL, env=environment(), timeout=600).returncode


def new_run_args(tmp_path: Path) -> list[str]:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    return ["--preset", "cpu-demo", "--config", str(config), "--run-dir", str(tmp_path / "run")]


def finish(run: Path) -> None:
    subprocess.run(milegpo("train", "--resume", str(run)), check=True, stdout=subprocess.DEVNULL, env=environment())


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("reference")
    subprocess.run(milegpo("train", *new_run_args(folder)), check=True, stdout=subprocess.DEVNULL, env=environment())
    run = folder / "run"
    iterations = len((run / "progress.csv").read_text().splitlines()) - 2  # the header and row 0
    assert sorted(p.name for p in (run / "batches").iterdir()) == sorted(
        f"iteration_{i:06d}.npz" for i in range(1, iterations + 1) if i % 3 == 0 or i == iterations)
    return run


@pytest.mark.slow
def test_kill_9_at_any_moment_and_resume_keeps_the_same_batches(reference: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert train_until_killed(run, new_run_args(tmp_path), min_rows=8, timeout=300) == -signal.SIGKILL
    assert train_until_killed(run, ["--resume", str(run)], min_rows=17, timeout=300) == -signal.SIGKILL
    finish(run)
    assert_same_kept_files(run, reference)


@pytest.mark.slow
def test_kill_9_while_copying_a_kept_batch_leaves_no_half_file(reference: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert train_killed_at_keep("during", 3, new_run_args(tmp_path)) == -signal.SIGKILL
    assert [p.name for p in (run / "batches").iterdir() if ".tmp-" in p.name]  # the half copy is there
    finish(run)
    assert not [p for p in (run / "batches").iterdir() if ".tmp-" in p.name]
    assert_same_kept_files(run, reference)


@pytest.mark.slow
def test_kill_9_between_a_kept_batch_and_its_checkpoint_keeps_it_once(reference: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert train_killed_at_keep("after", 2, new_run_args(tmp_path)) == -signal.SIGKILL  # at iteration 6
    assert (run / "batches" / "iteration_000006.npz").exists()
    saved = [read_config(path)["counters"]["iterations"] for path in (run / "checkpoints").iterdir()
             if not path.name.startswith(".")]
    assert max(saved) == 4  # iteration 6's checkpoint was never saved: the resume plays 5 and 6 again
    finish(run)
    assert_same_kept_files(run, reference)
