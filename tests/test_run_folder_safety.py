"""A user's data is never lost: export replaces only its own output, resume never wipes logs, a new
run never writes into a used folder, and run folders work from any directory and after a move.

Everything runs through the command line as a user would, on one tiny run trained once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from milegpo.cli import main

TINY = ["run.total_timesteps=24", "env.n_tasks=1", "env.group_size=2", "env.kwargs={max_episode_steps: 6}",
        "eval.n_tasks=1", "eval.copies=1", "eval.splits=[eval_id]", "run.tiny_model.hidden_size=64",
        "--no-progress-bar"]


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (hidden ones too) with the SHA-256 of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run, trained with a relative --run-dir from its own working directory."""
    work = tmp_path_factory.mktemp("work")
    subprocess.run([sys.executable, "-m", "milegpo", "train", *TINY, "--run-dir", "run"], cwd=work, check=True,
                   stdout=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    return work / "run"


@pytest.fixture
def runs(trained: Path, tmp_path: Path) -> Path:
    """``runs/`` holding a copy of the trained run (``runs/a``), a sibling run and a user's file."""
    root = tmp_path / "runs"
    shutil.copytree(trained, root / "a")
    shutil.copytree(trained, root / "sibling")
    (root / "notes.txt").write_text("my notes\n")
    return root


@pytest.mark.parametrize("target, reason", [
    ("a", "is the run folder itself"),
    (".", "contains the run folder"),
    ("a/final/export", "is inside the run folder"),
    ("sibling", "holds no milegpo export"),
    ("notes.txt", "is a file"),
])
def test_export_overwrite_refuses_what_it_did_not_write(runs: Path, target: str, reason: str,
                                                       capsys: pytest.CaptureFixture) -> None:
    before = snapshot(runs)
    assert main(["export", str(runs / "a"), str(runs / target), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and reason in err and err.count("\n") == 1
    assert snapshot(runs) == before


def test_export_replaces_a_previous_export_only_with_overwrite_and_atomically(
        runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    import milegpo.run.export as export

    out = tmp_path / "exported"
    assert main(["export", str(runs / "a"), str(out)]) == 0
    first = snapshot(out)
    assert main(["export", str(runs / "a"), str(out)]) == 2
    assert "holds a previous export: pass --overwrite" in capsys.readouterr().err and snapshot(out) == first

    def failing(path: Path, lora: object) -> None:
        raise RuntimeError("the adapter config check failed")

    monkeypatch.setattr(export, "_check_adapter_config", failing)
    with pytest.raises(RuntimeError, match="check failed"):
        main(["export", str(runs / "a"), str(out), "--overwrite"])
    assert snapshot(out) == first and sorted(p.name for p in tmp_path.iterdir()) == ["exported", "runs"]
    monkeypatch.undo()

    before = snapshot(runs)
    assert main(["export", str(runs / "a"), str(out), "--overwrite", "--merged"]) == 0
    assert json.loads((out / "milegpo_export.json").read_text())["merged"] is True
    assert not (out / "adapter_config.json").exists() and snapshot(runs) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported", "runs"]  # no temporary folder left


def test_a_new_run_never_writes_into_a_used_folder(runs: Path, capsys: pytest.CaptureFixture) -> None:
    before = snapshot(runs)
    for target, reason in (("a", "is already a run folder: continue it with --resume"),
                           (".", "is not empty and no run folder"), ("notes.txt", "is a file")):
        assert main(["train", *TINY, "--run-dir", str(runs / target)]) == 2
        assert reason in capsys.readouterr().err
    assert snapshot(runs) == before


def test_resume_without_an_intact_checkpoint_keeps_the_logs(runs: Path, capsys: pytest.CaptureFixture) -> None:
    run = runs / "a"
    shutil.rmtree(run / "final")
    damaged = sorted(f"corrupt-{p.name}" for p in (run / "checkpoints").iterdir())
    assert damaged
    for checkpoint in (run / "checkpoints").iterdir():  # every checkpoint damaged
        (checkpoint / "optimizer.pt").write_bytes(b"")
    progress = (run / "progress.csv").read_text()

    assert main(["train", "--resume", str(run), "--no-progress-bar"]) == 2
    err = capsys.readouterr().err.splitlines()
    message = err[-1]
    assert message.startswith("error: ") and "no intact checkpoint" in message and "progress.csv (3 rows)" in message
    assert "--restart" in message and "nothing was changed" in message
    assert (run / "progress.csv").read_text() == progress  # the damaged checkpoints are moved aside, not deleted
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == damaged

    assert main(["train", "--resume", str(run), "--restart", "--no-progress-bar"]) == 0
    out = capsys.readouterr().out
    aside = next(run.glob("previous-*"))
    assert f"earlier logs and checkpoints are in {aside}" in out
    assert (aside / "progress.csv").read_text() == progress
    assert sorted(p.name for p in (aside / "checkpoints").iterdir()) == damaged
    assert (run / "final" / "config.json").exists() and (run / "progress.csv").read_text().count("\n") == 4


def test_restart_needs_resume(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", *TINY, "--run-dir", str(tmp_path / "r"), "--restart"]) == 2
    assert "--restart applies to a resumed run" in capsys.readouterr().err


def test_a_run_folder_works_from_anywhere_and_after_a_move(trained: Path, tmp_path: Path) -> None:
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    elsewhere, moved = tmp_path / "elsewhere", tmp_path / "moved" / "run"
    elsewhere.mkdir()
    shutil.copytree(trained, moved)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def milegpo(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "milegpo", *args], cwd=elsewhere, env=env, capture_output=True,
                              text=True, timeout=600)

    for run in (trained, moved):  # from another directory: the run where it was trained, and a moved copy
        result = milegpo("eval", os.path.relpath(run, elsewhere))
        assert result.returncode == 0 and "eval_id: success" in result.stdout, result.stderr[-2000:]
    original = trained.with_name("run-gone")
    trained.rename(original)  # the folder the run was trained in is gone: the copy must not need it
    try:
        assert milegpo("export", os.path.relpath(moved, elsewhere), "exported").returncode == 0
        result = milegpo("train", "--resume", str(moved), "run.total_timesteps=48", "--no-progress-bar")
        assert result.returncode == 0 and "Resuming from" in result.stdout, result.stderr[-2000:]
    finally:
        original.rename(trained)
    final = json.loads((moved / "final" / "config.json").read_text())
    assert final["policy"]["config"]["model"] == str((moved / "base_model").resolve())

    # the export carries its base model: moved again, it loads with peft from its own folder
    carried = tmp_path / "carried"
    shutil.move(elsewhere / "exported", carried)
    base = AutoModelForCausalLM.from_pretrained(carried / "base_model")
    model = PeftModel.from_pretrained(base, carried)
    trained_weights = load_file(str(trained / "final" / "adapter" / "adapter_model.safetensors"))
    exported = load_file(str(carried / "adapter_model.safetensors"))
    assert model.peft_config["default"].r == 16 and exported.keys() == trained_weights.keys()
    assert all((exported[k] == trained_weights[k]).all() for k in exported)


def test_save_never_replaces_a_folder_that_is_no_checkpoint(trained: Path, tmp_path: Path) -> None:
    from milegpo.run.finish import load_run

    _, model = load_run(trained)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work\n")
    with pytest.raises(FileExistsError, match="is not a milegpo checkpoint"):
        model.save(mine)
    assert (mine / "thesis.tex").read_text() == "years of work\n"
    model.save(tmp_path / "ckpt")
    model.save(tmp_path / "ckpt")  # an earlier checkpoint is replaced
    assert (tmp_path / "ckpt" / "config.json").exists()
