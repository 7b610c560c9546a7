"""Rollout speed of generate mode: the HF loop vs the vLLM engine, on SmolLM2-135M-Instruct.

Two measurements per backend, both with the real policy (``LLMPolicy.act``), SmolLM2-135M
in float32 (this CPU), sampling at temperature 1.0:

* ``act``: one batched call on ``--envs`` House prompts (history 2, the default prompt),
  up to ``--new-tokens`` tokens each; generated tokens per second and seconds per call
  (median of ``--repeats`` calls after one warm-up call);
* ``rollout``: one MileGPO rollout iteration on House (``--envs`` = tasks x 8 copies,
  horizon ``--horizon``, the second of two, no update between): ``time/rollout_s`` of
  the trainer, the behaviour log-probs recomputed by the trainer included (vLLM).

Results are appended under ``--label`` (e.g. ``hf-before``) to
``benchmarks/results/rollout_speed.json`` and the table is rewritten to ``rollout_speed.md``.

    python -m benchmarks.speed.rollout_speed --backend hf --label hf
    python -m benchmarks.speed.rollout_speed --backend vllm --label vllm
    python -m benchmarks.speed.rollout_speed --backend vllm --trust-sampler-logprobs --label "vllm, trusted log-probs"

On a CPU the prompt prefill dominates (135M parameters x 2 FLOPs x every prompt token),
so the trainer's recomputation of the behaviour log-probs costs about as much as the
generation itself; on a GPU it is one batched forward pass beside hundreds of decode steps.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics

import numpy as np
import torch as th

from benchmarks import harness


def house_prompts(n: int) -> tuple[list[str], list[dict], list[list[tuple[str, str]]]]:
    from milegpo.envs.house import HouseEnv

    env = HouseEnv()
    observations, infos = [], []
    for seed in range(n):
        obs, info = env.reset(seed=seed)
        observations.append(obs)
        infos.append(info)
    return observations, infos, [[] for _ in range(n)]


def policy_kwargs(args: argparse.Namespace, model: str) -> dict:
    kwargs = {"model": model, "mode": "generate", "think": False, "max_new_tokens": args.new_tokens,
              "history_length": 2, "dtype": "float32", "lora": {"r": 16, "alpha": 32}}
    if args.backend != "hf":  # the HF loop is the default (and the only backend before the sampler room)
        kwargs["sampler"] = {"backend": args.backend}
        kwargs["trust_sampler_logprobs"] = args.trust_sampler_logprobs
    return kwargs


def measure_act(args: argparse.Namespace, model: str) -> dict[str, float]:
    from milegpo.envs.core import TextSpace
    from milegpo.policies import LLMPolicy

    policy = LLMPolicy(TextSpace(), TextSpace(), lambda _: 1e-5, device="cpu", **policy_kwargs(args, model))
    observations, infos, histories = house_prompts(args.envs)
    times, tokens = [], []
    for call in range(args.repeats + 1):
        with harness.Stopwatch() as clock:
            samples = policy.act(observations, infos, histories)
        if call:  # the first call warms up (and starts the vLLM engine)
            times.append(clock.wall_s)
            tokens.append(sum(len(s.action_ids) for s in samples))
    getattr(policy, "close", lambda: None)()
    return {"act_s": statistics.median(times), "generated_tokens_per_s": sum(tokens) / sum(times),
            "mean_reply_tokens": float(np.mean(tokens)) / args.envs}


def measure_rollout(args: argparse.Namespace, model: str) -> dict[str, float]:
    """Seconds of one rollout iteration (the second of two: the first warms up); no update in between."""
    from milegpo.algos import MileGPO
    from milegpo.envs.vec_env import make_vec_env

    env = make_vec_env("milegpo/House-v0", n_tasks=args.envs // 8, group_size=8, seed=0,
                       env_kwargs={"max_episode_steps": args.horizon})
    algo = MileGPO("LLMPolicy", env, learning_rate=1e-5, kl_coef=0.0, seed=0, device="cpu",
                   policy_kwargs=policy_kwargs(args, model))
    _, callback = algo._setup_learn(10**9, None)
    for _ in range(2):
        algo.collect_rollouts(env, callback, algo.rollout_buffer, 0)
    log = algo.last_rollout_log
    env.close()
    getattr(algo.policy, "close", lambda: None)()
    return {"rollout_s": log["time/rollout_s"], "rollout_env_steps_per_s": log["time/env_steps_per_s"]}


def main(argv: list[str] | None = None) -> dict:
    parser = harness.parser(__doc__, harness.RESULTS / "rollout_speed",
                            "OUT: the results' path without its suffix (OUT.json, rows merged by setting; OUT.md)")
    parser.add_argument("--backend", default="hf", choices=("hf", "vllm"))
    parser.add_argument("--label", default=None, help="row name in the results (default: the backend)")
    parser.add_argument("--envs", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--horizon", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--skip-rollout", action="store_true")
    parser.add_argument("--trust-sampler-logprobs", action="store_true",
                        help="vllm: keep vLLM's log-probs (no recomputation by the trainer)")
    args = parser.parse_args(argv)
    th.set_num_threads(args.threads)
    from milegpo.policies.smollm import smollm2_path

    model = smollm2_path()
    row = {"label": args.label or args.backend, "backend": args.backend, "envs": args.envs,
           "new_tokens": args.new_tokens, **measure_act(args, model), "load_1min": harness.load_1min()}
    if not args.skip_rollout:
        row.update(measure_rollout(args, model))
    out = args.out.with_suffix(".json")
    report = json.loads(out.read_text()) if out.exists() else {"machine": platform.platform(), "rows": []}
    report["rows"] = [r for r in report["rows"] if (r["label"], r["envs"], r["new_tokens"]) !=
                      (row["label"], row["envs"], row["new_tokens"])] + [row]
    lines = ["| setting | envs x new tokens | generated tok/s | s per act call | mean reply tokens | rollout s (House, "
             "horizon 2) |",
             "|---|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['label']} | {r['envs']} x {r['new_tokens']} | {r['generated_tokens_per_s']:.0f} | "
                     f"{r['act_s']:.1f} | {r['mean_reply_tokens']:.0f} | {r.get('rollout_s', float('nan')):.1f} |")
    harness.write_results(out, report, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return report


if __name__ == "__main__":
    main()
