"""Learning efficiency: GRPO vs GiGPO vs GraphGPO vs MileGPO at the same env-step budget.

Every (env, algorithm, seed) run uses the same tiny offline model (same
initial weights for a seed), the same hyperparameters and the same task draws;
only the credit function differs. Each run trains with ``milegpo.run.train.train``
and is evaluated greedily on held-out tasks of the in-distribution split during
training (the learning curve) and of both eval splits at the end.

WebShop and ALFWorld are the paper's benchmarks (settings in :data:`ENVS`: the papers'
WebShop reward, ALFWorld's real engine on the small generated task set where an untrained
policy already wins 10-15 %); House and TWX coin are this project's.

Outputs (committed): ``OUT.runs.jsonl`` (one line per finished run, appended as runs
finish: a killed benchmark started again skips what is there), ``OUT.json`` (all curves,
finals and the table), ``OUT.md`` (per env: mean ± std over seeds of AUC and final
held-out success, and MileGPO minus each other method as paired differences with 95 %
t intervals; each opt-in variant minus MileGPO and GraphGPO, also alone in ``OUT.variants.md``) and
``OUT.png`` (held-out success, and WebShop's score, against env steps).
Run folders go to ``benchmarks/runs/<out name>/`` (not committed).

    python -m benchmarks.learning.learning_efficiency --envs webshop alfworld --seeds 0 1 2 3 4 \
        --out benchmarks/results/learning_efficiency_paper_envs          # about 2.5 h on 2 cores
    python -m benchmarks.learning.learning_efficiency --envs alfworld webshop --seeds 0 1 2 3 4 --warm-start \
        --out benchmarks/results/learning_efficiency_warm_start        # from a policy with priors
    python -m benchmarks.learning.learning_efficiency --envs alfworld --algos milegpo_success_only --seeds 0 1 2 3 4 \
        --warm-start --out benchmarks/results/learning_efficiency_warm_start   # an opt-in variant (VARIANTS)
    python -m benchmarks.learning.learning_efficiency --envs alfworld webshop --algos milegpo_memory --seeds 0 1 2 3 4 \
        --workers 1 --out benchmarks/results/learning_efficiency_paper_envs   # the milestone memory, paired
                                     # with the MileGPO and GraphGPO runs there (its table: variant minus both)
    python -m benchmarks.learning.learning_efficiency --envs alfworld webshop --algos milegpo_memory milegpo graphgpo \
        --seeds 0 1 2 3 4 --warm-start --workers 1 --set run.keep_batch_every=1 \
        --out benchmarks/results/learning_efficiency_warm_start_memory   # the memory from the warm start, paired
                     # with MileGPO and GraphGPO by today's code (the warm start's policy changes with the code;
                     # every batch kept: benchmarks/credit/memory_quality.py scores the memory runs' own groups)
    python -m benchmarks.learning.learning_efficiency --envs house coin --steps 24000   # the House/coin table
    python -m benchmarks.learning.learning_efficiency --seeds 0 --steps 4000 --envs house   # a quick look
    python -m benchmarks.learning.learning_efficiency --envs alfworld --algos milegpo graphgpo --warm-start \
        --state-key observation --out benchmarks/results/learning_efficiency_paper_keys_warm_start
                                     # the paper's regime: steps grouped by their observation text
    python -m benchmarks.learning.learning_efficiency --envs coin --algos milegpo graphgpo --steps 24000 \
        --state-key observation --out benchmarks/results/learning_efficiency_paper_keys
    python -m benchmarks.learning.learning_efficiency --envs alfworld --algos gagpo --seeds 0 1 2 --warm-start \
        --out benchmarks/results/learning_efficiency_warm_start    # GAGPO beside the warm-start table
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import RESULTS, RUNS, parser, write_json, write_text
from milegpo.credit import CREDIT_METHODS
from milegpo.run.plots import METHOD_LABELS

#: the folder of this script and of its shared settings (``learning_efficiency.json``)
ROOT = Path(__file__).resolve().parent

#: Benchmark envs: settings (dotted TrainConfig names) shared by every algorithm on that env (they
#: override --config). ``algo.credit_preset`` applies to MileGPO only (the paper's per-env setting).
ENVS: dict[str, dict] = {
    "house": {"env.id": "milegpo/House-v0", "env.kwargs": {}, "eval.splits": ["eval_id", "eval_ood"]},
    "coin": {
        "env.id": "milegpo/TWX-coin-v0",
        "env.kwargs": {"numLocations": 5, "includeDoors": True, "numDistractorItems": 0, "max_episode_steps": 30},
        "eval.splits": ["eval_id", "eval_ood"],
    },
    # The paper's WebShop setup: horizon 15, reward 10 for a purchase scoring 1.0, success and score reported.
    "webshop": {
        "env.id": "milegpo/WebShop-v0",
        "env.kwargs": {"success_reward": 10.0, "max_episode_steps": 15},
        "eval.splits": ["eval"], "algo.credit_preset": "webshop",
        "policy.prompt_template": "{task} {history} {observation}", "policy.history_length": 2,
        "run.total_timesteps": 8_000, "eval.freq": 4,
    },
    # The real engine on the small generated task set (types 1-2: pick-and-place, look-at-in-light),
    # where the random policy wins 10-15% in 30 steps (the paper's 1.5B model starts near 13%).
    "alfworld": {
        "env.id": "milegpo/ALFWorld-v0",
        "env.kwargs": {"size": "small", "task_types": [1, 2], "max_episode_steps": 30},
        "eval.splits": ["eval_id", "eval_ood"], "algo.credit_preset": "alfworld",
        "policy.prompt_template": "{task} {history} {observation}", "policy.history_length": 2,
        "run.total_timesteps": 8_000, "eval.freq": 2, "eval.n_tasks": 12, "eval.copies": 6,
    },
    # All six ALFWorld task types on the small set (pick, look, clean, heat, cool, pick two).
    "alfworld-all": {
        "env.id": "milegpo/ALFWorld-v0",
        "env.kwargs": {"size": "small", "task_types": [1, 2, 3, 4, 5, 6], "max_episode_steps": 30},
        "eval.splits": ["eval_id", "eval_ood"], "algo.credit_preset": "alfworld",
        "policy.prompt_template": "{task} {history} {observation}", "policy.history_length": 2,
        "run.total_timesteps": 8_000, "eval.freq": 2, "eval.n_tasks": 12, "eval.copies": 6,
    },
}


#: ``--warm-start``: per env, the supervised warm start every run of that env starts from
#: (behaviour cloning of the env's scripted expert with epsilon-random steps; see
#: milegpo.algos.warm_start). Chosen so the untrained-by-RL policy starts near the papers'
#: starting points (ALFWorld 10-30 % success, WebShop > 5 %) with structured rollouts.
WARM_STARTS: dict[str, dict] = {
    "alfworld": {"episodes": 64, "epsilon": 0.7, "epochs": 10, "learning_rate": 0.01,
                 "env_kwargs": {"expert_type": "handcoded"}},
    "alfworld-all": {"episodes": 64, "epsilon": 0.7, "epochs": 10, "learning_rate": 0.01,
                     "env_kwargs": {"expert_type": "handcoded"}},
    "webshop": {"episodes": 64, "epsilon": 0.3, "epochs": 10, "learning_rate": 0.01},
    "house": {"episodes": 64, "epsilon": 0.7, "epochs": 10, "learning_rate": 0.01},
    "coin": {"episodes": 64, "epsilon": 0.7, "epochs": 10, "learning_rate": 0.01,
             "env_kwargs": {"gold_path": True}},  # the coin expert follows upstream's gold path
}


#: Opt-in variants of ours, run and tabulated like the methods: name -> (credit method, credit_kwargs, label).
VARIANTS: dict[str, tuple[str, dict, str]] = {
    "milegpo_success_only": ("milegpo", {"shape_failed_tasks": False}, "MileGPO, no shaping without a success (ours)"),
    # the milestone memory at the half-life chosen on the tuning envs (House, TWX coin), not retuned here
    "milegpo_memory": ("milegpo", {"memory_half_life": 2}, "MileGPO + memory, half-life 2 (ours)"),
}
#: Every name ``--algos`` takes, in table order, and its label.
ALGOS = list(CREDIT_METHODS) + list(VARIANTS)
LABELS = {**METHOD_LABELS, **{name: label for name, (_, _, label) in VARIANTS.items()}}


def job_config(name: str, config: dict) -> dict:
    """``config`` for the method or variant ``name`` (MileGPO's per-env preset kept only for MileGPO)."""
    method, credit_kwargs, _ = VARIANTS.get(name, (name, {}, name))
    config = {**config, "algo.method": method}
    if credit_kwargs:
        config["algo.credit_kwargs"] = {**config.get("algo.credit_kwargs", {}), **credit_kwargs}
    if method != "milegpo":
        config.pop("algo.credit_preset", None)
    return config


def run_values(name: str, env: str, seed: int, shared: dict) -> dict:
    """The settings (dotted names, over :func:`base_config`) of the run of method or variant ``name``
    on ``env`` with ``seed``."""
    return job_config(name, {"run.total_timesteps": 12_000, **shared, **ENVS[env], "run.seed": seed})


def warm_start_values(env: str, seed: int, algo: str = "milegpo") -> dict:
    """The settings of a ``--warm-start`` run of ``env``, ``algo`` and ``seed`` under the default
    shared config (other benchmarks build the same starting policy from them)."""
    shared = json.loads((ROOT / "learning_efficiency.json").read_text())
    return {**run_values(algo, env, seed, shared), "run.warm_start": WARM_STARTS[env]}


def make_config(values: dict) -> Any:
    """The TrainConfig of a run: the ``cpu-demo`` preset (``milegpo train``'s demo) with ``values``
    (dotted setting names) on top."""
    from milegpo.config.run import resolve_config

    return resolve_config("cpu-demo").replace(**values)


def starting_model(config: Any, folder: Path) -> Any:
    """The untrained (warm-started, when ``config`` says so) model a run of ``config`` starts
    from; its tiny LM is built in ``folder``."""
    from milegpo.envs import make_vec_env
    from milegpo.run.train import prepare_model, start_model

    env = make_vec_env(config.env.id, n_tasks=config.env.n_tasks, group_size=config.env.group_size,
                       seed=config.run.seed, env_kwargs=config.env.kwargs_for(config.env.train_split), subprocess=False)
    try:
        return start_model(config, env, prepare_model(config, folder))
    finally:
        env.close()


def run_one(job: dict) -> dict:
    """Train one (env, algo, seed) run in this process; return its curve and finals."""
    import torch

    torch.set_num_threads(1)
    from milegpo import train

    config = make_config(job["config"])
    run_dir = Path(job["run_dir"])
    # a run is done once it is in OUT.runs.jsonl; a folder left by a killed benchmark is started afresh
    shutil.rmtree(run_dir, ignore_errors=True)
    started = time.time()
    train(config, run_dir=run_dir, progress_bar=False, verbose=0)
    curve = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines() if line.strip()]
    finals = json.loads((run_dir / "eval_final.json").read_text())
    return {
        "env": job["env"], "algo": job["name"], "seed": config.run.seed, "wall_s": time.time() - started,
        "curve": [{"num_timesteps": row["num_timesteps"], "success_rate": row["success_rate"],
                   "mean_score": row.get("mean_score")} for row in curve],
        "final": {split: result["success_rate"] for split, result in finals.items()},
        "final_score": {split: result.get("mean_score") for split, result in finals.items()},
        "speed": _speed(run_dir / "progress.csv"), "budget": config.run.total_timesteps,
        **({"memory": memory} if (memory := _memory_stats(run_dir / "progress.csv")) else {}),
    }


def _speed(progress_csv: Path) -> dict:
    from milegpo.run.plots import read_progress

    data = read_progress(progress_csv)
    out = {}
    for key in ("time/env_steps_per_s", "time/rollout_tokens_per_s", "time/update_tokens_per_s", "time/fps"):
        values = [v for v in data.get(key, []) if not np.isnan(v)]
        if values:
            out[key] = float(np.mean(values))
    return out


#: The milestone memory's per-iteration diagnostics (progress.csv columns) a run records, and how
#: each is reduced over the run's iterations.
MEMORY_COLUMNS = {"credit/memory_recurrence_rate": "last", "credit/memory_recurring_frac": "mean",
                  "credit/memory_evidence_share": "mean", "credit/memory_tasks": "max", "credit/memory_bytes": "max"}


def _memory_stats(progress_csv: Path) -> dict:
    """The milestone memory's diagnostics over a run (:data:`MEMORY_COLUMNS`: the run's task recurrence
    rate at its end, the mean share of a batch's tasks the memory held and of the evidence it gave, the
    most tasks and bytes it held); empty for a run without the memory."""
    from milegpo.run.plots import read_progress

    data = read_progress(progress_csv)
    out = {}
    for key, reduce in MEMORY_COLUMNS.items():
        values = [v for v in data.get(key, []) if not np.isnan(v)]
        if values:
            out[key.removeprefix("credit/")] = float({"last": values[-1], "mean": np.mean(values),
                                                      "max": np.max(values)}[reduce])
    return out


def area_under_curve(curve: list[dict], budget: int, key: str = "success_rate") -> float:
    """Mean held-out ``key`` over [0, budget] env steps (trapezoids between the eval points;
    the curve is held flat from its last point before the budget to the budget)."""
    points = [(p["num_timesteps"], p[key]) for p in curve if p["num_timesteps"] <= budget and p.get(key) is not None]
    if not points:
        return float("nan")
    steps, values = (np.array(column, dtype=float) for column in zip(*points, (budget, points[-1][1])))
    return float(np.trapezoid(values, steps) / budget)


#: Two-sided 95% quantiles of Student's t by degrees of freedom (normal beyond 30).
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t_quantile(df: int) -> float:
    return T_975[max(k for k in T_975 if k <= df)] if df <= 30 else 1.96


def paired_difference(values: list[float], baseline: list[float]) -> dict:
    """Mean of the per-seed differences and its 95% t confidence interval."""
    diff = np.asarray(values, dtype=float) - np.asarray(baseline, dtype=float)
    mean = float(diff.mean())
    half = t_quantile(len(diff) - 1) * float(diff.std(ddof=1)) / np.sqrt(len(diff)) if len(diff) > 1 else float("nan")
    return {"mean": mean, "ci95": [mean - half, mean + half], "n": int(len(diff)),
            "wins": int((diff > 0).sum()), "losses": int((diff < 0).sum())}


def run_metrics(run: dict) -> dict[str, float]:
    """The per-run numbers the table compares: AUC and final success per split (and score where there is one)."""
    out = {"auc": area_under_curve(run["curve"], run["budget"])}
    out.update({f"final {split}": value for split, value in run["final"].items()})
    if any(p.get("mean_score") is not None for p in run["curve"]) and run["env"] == "webshop":
        out["auc score"] = area_under_curve(run["curve"], run["budget"], "mean_score")
        out.update({f"final score {split}": value for split, value in run.get("final_score", {}).items()})
    return out


#: Each opt-in variant is compared with these methods (the variant minus each, paired by seed).
VARIANT_BASELINES = ("milegpo", "graphgpo")


def summarize(runs: list[dict]) -> dict:
    """Per env: mean ± std of every metric per algorithm; MileGPO minus each other algorithm, and each
    opt-in variant minus :data:`VARIANT_BASELINES`, as paired (same seed) differences with 95% CIs over
    the seeds both have; and the milestone memory's diagnostics over the runs that logged them."""
    table: dict = {}
    for env in sorted({r["env"] for r in runs}):
        by_algo = {algo: {r["seed"]: run_metrics(r) for r in runs if r["env"] == env and r["algo"] == algo}
                   for algo in ALGOS}
        by_algo = {algo: seeds for algo, seeds in by_algo.items() if seeds}
        rows = {}
        for algo, seeds in by_algo.items():
            metrics = next(iter(seeds.values())).keys()
            rows[algo] = {"n_seeds": len(seeds),
                          **{m: _mean_std([seeds[s][m] for s in sorted(seeds)]) for m in metrics}}
        milegpo_minus = {algo: _paired(by_algo["milegpo"], seeds) for algo, seeds in by_algo.items()
                         if "milegpo" in by_algo and algo != "milegpo"}
        variant_minus = {name: {base: _paired(by_algo[name], by_algo[base]) for base in VARIANT_BASELINES
                                if base in by_algo} for name in VARIANTS if name in by_algo}
        memory = {algo: _memory_summary([r["memory"] for r in runs
                                         if r["env"] == env and r["algo"] == algo and r.get("memory")])
                  for algo in by_algo}
        table[env] = {"algorithms": rows, "milegpo_minus": {a: d for a, d in milegpo_minus.items() if d},
                      "variant_minus": {name: {b: d for b, d in diffs.items() if d}
                                        for name, diffs in variant_minus.items() if any(diffs.values())},
                      "memory": {algo: stats for algo, stats in memory.items() if stats}}
    return table


def _paired(runs: dict[int, dict], baseline: dict[int, dict]) -> dict:
    """Every metric of ``runs`` minus ``baseline`` (both by seed) as :func:`paired_difference` over the
    seeds both have; empty under 2 common seeds (no interval)."""
    common = sorted(set(runs) & set(baseline))
    if len(common) < 2:
        return {}
    return {m: paired_difference([runs[s][m] for s in common], [baseline[s][m] for s in common])
            for m in runs[common[0]]}


def _memory_summary(stats: list[dict]) -> dict:
    """Mean, least and most over runs of each memory diagnostic (:func:`_memory_stats`); empty for none."""
    keys = sorted({key for run in stats for key in run})
    return {key: {"mean": float(np.mean(values)), "min": float(np.min(values)), "max": float(np.max(values)),
                  "n": len(values)}
            for key in keys if (values := [run[key] for run in stats if key in run])}


def verdict(diff: dict) -> str:
    """``ahead`` where a paired difference's 95% interval is above 0, ``behind`` where it is below, else
    ``level`` (the counting of "Why MileGPO")."""
    low, high = diff["ci95"]
    return "ahead" if low > 0 else "behind" if high < 0 else "level"


def _mean_std(values: list[float]) -> dict:
    return {"mean": float(np.mean(values)), "std": float(np.std(values)), "values": [float(v) for v in values]}


def write_table(table: dict, path: Path) -> None:
    lines = []
    for env, entry in table.items():
        rows = entry["algorithms"]
        metrics = [k for k in next(iter(rows.values())) if k != "n_seeds"]
        lines += [f"**{env}** ({ENVS[env]['env.id']}; held-out success, mean ± std over seeds)", "",
                  "| algorithm | seeds | " + " | ".join(metrics) + " |", "|---|---|" + "---|" * len(metrics)]
        for algo, row in rows.items():
            lines.append(f"| {LABELS[algo]} | {row['n_seeds']} | "
                         + " | ".join(f"{row[m]['mean']:.3f} ± {row[m]['std']:.3f}" for m in metrics) + " |")
        if entry["milegpo_minus"]:
            lines += ["", "| MileGPO − | " + " | ".join(f"Δ {m} [95% CI] (wins/losses)" for m in metrics) + " |",
                      "|---|" + "---|" * len(metrics)]
            for algo, diffs in entry["milegpo_minus"].items():
                cells = [f"{d['mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] ({d['wins']}/{d['losses']})"
                         for d in (diffs[m] for m in metrics)]
                lines.append(f"| {LABELS[algo]} (n={diffs[metrics[0]]['n']}) | " + " | ".join(cells) + " |")
        lines += variant_lines(entry) + [""]
    write_text(path, "\n".join(lines))


def variant_lines(entry: dict) -> list[str]:
    """An env's opt-in variants (``entry`` of :func:`summarize`): each one's table minus MileGPO and GraphGPO
    with its count, and the milestone memory's diagnostics; none without a variant."""
    rows = entry["algorithms"]
    metrics = [k for k in next(iter(rows.values())) if k != "n_seeds"]
    lines = []
    for name, against in entry.get("variant_minus", {}).items():
        lines += _variant_lines(name, against, metrics)
    for algo, stats in entry.get("memory", {}).items():
        lines += ["", _memory_line(algo, stats)]
    return lines


def write_variant_table(table: dict, path: Path) -> bool:
    """The variants' part of :func:`write_table` alone (for the variant's own docs page), per env that has
    one; False (nothing written) where no env has a variant."""
    lines = []
    for env, entry in table.items():
        if entry.get("variant_minus"):
            lines += [f"**{env}** ({ENVS[env]['env.id']}; paired by seed: same initial weights and task draws)",
                      *variant_lines(entry), ""]
    if lines:
        write_text(path, "\n".join(lines))
    return bool(lines)


def _variant_lines(name: str, against: dict, metrics: list[str]) -> list[str]:
    """The table of the variant ``name`` minus each baseline (a verdict per cell) and its count."""
    lines = ["", f"| {LABELS[name]} − | " + " | ".join(f"Δ {m} [95% CI] (wins/losses)" for m in metrics) + " |",
             "|---|" + "---|" * len(metrics)]
    counts = {"ahead": 0, "level": 0, "behind": 0}
    for base, diffs in against.items():
        cells = []
        for d in (diffs[m] for m in metrics):
            counts[verdict(d)] += 1
            cells.append(f"{d['mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] ({d['wins']}/{d['losses']}) "
                         f"{verdict(d)}")
        lines.append(f"| {LABELS[base]} (n={diffs[metrics[0]]['n']}) | " + " | ".join(cells) + " |")
    lines += ["", f"{LABELS[name]} against {' and '.join(LABELS[b] for b in against)}: ahead in {counts['ahead']}, "
                  f"level in {counts['level']}, behind in {counts['behind']} of {sum(counts.values())} "
                  "(ahead/behind: the 95% interval above/below 0)."]
    return lines


def _memory_line(algo: str, stats: dict) -> str:
    """One sentence of the memory's diagnostics over ``algo``'s runs: mean [least, most] over seeds."""
    def said(key: str, scale: float = 1.0, form: str = ".3f") -> str:
        s = stats[key]
        return f"{s['mean'] * scale:{form}} [{s['min'] * scale:{form}}, {s['max'] * scale:{form}}]"

    parts = [f"task recurrence rate over the run (of the tasks a batch played, the share the memory held) "
             f"{said('memory_recurrence_rate')}",
             f"share of the evidence from memory (mean over iterations) {said('memory_evidence_share')}"]
    if "memory_tasks" in stats:
        parts.append(f"most tasks held {said('memory_tasks', form='.0f')}")
    if "memory_bytes" in stats:
        parts.append(f"most bytes held (MB) {said('memory_bytes', 1e-6, '.2f')}")
    n = stats["memory_recurrence_rate"]["n"]
    seeds = f"{n} seed{'s' if n != 1 else ''}"
    return f"{LABELS[algo]}, the memory as the runs saw it (mean [least, most] over {seeds}): {'; '.join(parts)}."


def plot(runs: list[dict], path: Path) -> None:
    """Held-out success against env steps per env (mean ± std over seeds); WebShop's score too."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(env, "success_rate") for env in sorted({r["env"] for r in runs})]
    panels += [(env, "mean_score") for env, _ in panels if env == "webshop"]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (env, key) in zip(axes[0], panels):
        n_seeds = 0
        for algo in ALGOS:
            group = [r for r in runs if r["env"] == env and r["algo"] == algo and r["curve"]]
            if not group:
                continue
            n_seeds = max(n_seeds, len(group))
            length = min(len(r["curve"]) for r in group)
            steps = np.mean([[p["num_timesteps"] for p in r["curve"][:length]] for r in group], axis=0)
            values = np.array([[p[key] for p in r["curve"][:length]] for r in group], dtype=float)
            mean, std = values.mean(axis=0), values.std(axis=0)
            ax.plot(steps, mean, label=LABELS[algo], marker="o", markersize=3)
            ax.fill_between(steps, mean - std, mean + std, alpha=0.15)
        split = ENVS[env]["eval.splits"][0]
        ax.set_title(f"{ENVS[env]['env.id']}\n(held-out {split}, {n_seeds} seeds)", fontsize=10)
        ax.set_xlabel("env steps")
        ax.set_ylabel("success rate" if key == "success_rate" else "mean score")
        ax.set_ylim(bottom=-0.02)
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()  # one legend under the panels, off the curves
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06 * (1 + (len(labels) - 1) // 4), 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def read_runs(path: Path) -> list[dict]:
    """The finished runs recorded in ``path`` (a JSON line each; a half-written last line is ignored). A run
    filed twice (two benchmark processes on one file) stops the script, naming it: its table would count
    one line of it, silently."""
    if not path.exists():
        return []
    runs = []
    for line in path.read_text().splitlines():
        try:
            runs.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    keys = [(r.get("env"), r["algo"], r["seed"]) for r in runs]
    twice = sorted({key for key in keys if keys.count(key) > 1}, key=str)
    if twice:
        raise SystemExit(f"{path} has runs filed more than once (env, algorithm, seed): {twice[:5]}; keep one line "
                         "of each and run again")
    return runs


def write_report(out: Path, shared: dict | None = None) -> None:
    """OUT.json (table + runs), OUT.md, OUT.png and, where a variant ran, OUT.variants.md (its comparisons
    alone) from the runs recorded in OUT.runs.jsonl."""
    runs = sorted(read_runs(out.with_suffix(".runs.jsonl")), key=lambda r: (r["env"], r["algo"], r["seed"]))
    table = summarize(runs)
    report = {"cpus": os.cpu_count(), "table": table, "runs": runs}
    if shared is None and out.with_suffix(".json").exists():  # --summarize-only: the runs' config stays recorded
        shared = json.loads(out.with_suffix(".json").read_text()).get("shared_config")
    if shared is not None:
        report["shared_config"] = shared
    write_json(out.with_suffix(".json"), report)
    write_table(table, out.with_suffix(".md"))
    write_variant_table(table, out.with_suffix(".variants.md"))
    plot(runs, out.with_suffix(".png"))


def main() -> None:
    arguments = parser(__doc__, RESULTS / "learning_efficiency", "output path prefix")
    arguments.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    arguments.add_argument("--algos", nargs="+", default=list(CREDIT_METHODS), choices=ALGOS,
                        help=f"credit methods, or variants of ours: {', '.join(VARIANTS)}")
    arguments.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    arguments.add_argument("--steps", type=int, default=None,
                        help="env-step budget per run (default: the env's, else 12,000)")
    arguments.add_argument("--workers", type=int, default=2, help="runs in parallel (one torch thread each)")
    arguments.add_argument("--config", default=str(ROOT / "learning_efficiency.json"),
                        help="JSON file of settings (dotted names over the cpu-demo preset) shared by every run")
    arguments.add_argument("--set", nargs="*", default=[], metavar="KEY=JSON",
                        help="override single settings of --config, e.g. algo.learning_rate=0.003")
    arguments.add_argument("--warm-start", action="store_true",
                        help="every run starts from the env's supervised warm start (WARM_STARTS)")
    arguments.add_argument("--state-key", choices=["env", "observation"], default="env",
                        help="the envs' state keys: their own (default) or the observation text exactly (the "
                             "paper's and verl-agent's regime; env.kwargs.state_key)")
    arguments.add_argument("--summarize-only", action="store_true", help="redo table and plot from OUT.runs.jsonl")
    args = arguments.parse_args()
    if args.summarize_only:
        write_report(Path(args.out))
        print(Path(args.out).with_suffix(".md").read_text())
        return

    shared = json.loads(Path(args.config).read_text()) if args.config else {}
    shared.update({key: json.loads(value) for key, value in (item.split("=", 1) for item in args.set)})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    runs_file = out.with_suffix(".runs.jsonl")
    done = {(r["env"], r["algo"], r["seed"]) for r in read_runs(runs_file)}
    jobs = []
    for seed in args.seeds:  # seed-major: an interrupted benchmark leaves whole seeds
        for env in args.envs:
            for algo in args.algos:
                if (env, algo, seed) in done:
                    continue
                config = run_values(algo, env, seed, shared)
                if args.warm_start:
                    config["run.warm_start"] = WARM_STARTS[env]
                if args.steps is not None:
                    config["run.total_timesteps"] = args.steps
                if args.state_key != "env":
                    config["env.kwargs"] = {**config["env.kwargs"], "state_key": args.state_key}
                run_dir = RUNS / out.name / f"{env}-{algo}-s{seed}"
                jobs.append({"env": env, "name": algo, "config": config, "run_dir": str(run_dir)})
    print(f"{len(jobs)} runs to do, {len(done)} already in {runs_file}", flush=True)
    started = time.time()
    context = multiprocessing.get_context("spawn")
    with context.Pool(args.workers, maxtasksperchild=1) as pool:
        for result in pool.imap_unordered(run_one, jobs):
            result["workers"] = args.workers
            with runs_file.open("a") as f:  # one line per finished run: a killed benchmark resumes from here
                f.write(json.dumps(result) + "\n")
            print(f"{result['env']:8s} {LABELS[result['algo']]:8s} seed {result['seed']}: "
                  f"final {result['final']}  ({result['wall_s']:.0f} s)", flush=True)
    write_report(out, shared)
    print(out.with_suffix(".md").read_text())
    print(f"wall clock {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
