"""GAGPO beside the other six methods on the credit-quality benchmark (same groups, same seeds).

The groups, the ground truth and the scores are those of ``credit_quality.py`` (random-policy
groups of 8 rollouts per task; pairwise accuracy and weighted agreement over same-state step
pairs whose true progress differs; trap credit): for a seed, the rollouts are the very ones
the committed ``credit_quality_hgpo_rloo`` results were scored on, so the rows of the six
methods repeat those numbers and GAGPO's stand beside them. GAGPO's ablations from its paper
are scored too (lambda 0 / 1, batch-wide or no normalisation, a broadcast episode term).

Each env is written as soon as it is done (``OUT.json`` and ``OUT.md``), with per env the
mean ± std over seeds and GAGPO's paired difference to each method with a 95 % t interval
over seeds.

    python -m benchmarks.credit.credit_quality_gagpo                           # ~20 min on one core
    python -m benchmarks.credit.credit_quality_gagpo --envs house --seeds 0    # a quick look
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from benchmarks import harness
from benchmarks.credit import credit_quality, ground_truth
from benchmarks.learning.learning_efficiency import t_quantile
from milegpo.credit import compute_credit

#: (label, credit method, config overrides): the seven methods as the credit-quality benchmark scores them
#: (MileGPO also gets the env's preset), then GAGPO's ablations.
VARIANTS = [variant for variant in credit_quality.VARIANTS
            if variant[0] in ("GRPO", "RLOO", "GiGPO", "HGPO", "GraphGPO", "MileGPO", "GAGPO")] + [
    ("GAGPO lambda=0 (one-step TD)", "gagpo", {"gae_lambda": 0.0}),
    ("GAGPO lambda=1 (Monte-Carlo)", "gagpo", {"gae_lambda": 1.0}),
    ("GAGPO batch normalisation", "gagpo", {"norm_scope": "batch"}),
    ("GAGPO no normalisation", "gagpo", {"norm_scope": "none"}),
    ("GAGPO + episode broadcast", "gagpo", {"w_episode": 1.0}),
]
METRICS = ("pairwise_accuracy", "weighted_agreement", "trap_credit")
SEEDS = {"alfworld": [0, 1, 2]}  # the committed results' seeds: ALFWorld's planner is slow


def score_seed(env_name: str, n_tasks: int, group_size: int, seed: int) -> dict:
    """Every variant's three scores on one seed's random-policy groups, and the share of steps
    taken from a state no other step of the task was taken from (GAGPO gives those no TD signal)."""
    groups = credit_quality.play_groups(env_name, n_tasks, group_size, seed)
    batch, dist, next_dist, horizon = groups.batch("env"), groups.dist, groups.next_dist, groups.horizon
    progress = dist - next_dist
    solved = np.unique(batch.task_ids[batch.success[batch.traj_ids]])
    scored = np.isin(batch.task_ids, solved)
    traps = ((next_dist > horizon) & (dist <= horizon)) | (progress <= -3)
    pairs = credit_quality.same_state_pairs(batch.task_ids, batch.state_keys, progress, scored)
    preset = {"preset": credit_quality.PRESET[env_name]} if env_name in credit_quality.PRESET else {}
    row: dict = {"seed": seed, "steps": batch.num_steps, "pairs": len(pairs[0]),
                 "tasks": len(np.unique(batch.task_ids)), "success_rate": float(batch.success.mean()),
                 "methods": {}}
    for label, method, overrides in VARIANTS:
        result = compute_credit(method, batch, {**(preset if method == "milegpo" else {}), **overrides})
        adv = result.advantages
        row["methods"][label] = {
            "pairwise_accuracy": credit_quality.pairwise_accuracy(adv, progress, pairs),
            "weighted_agreement": credit_quality.weighted_agreement(adv, progress, pairs),
            "trap_credit": credit_quality.trap_credit(batch.task_ids, batch.state_keys, adv, traps, scored)}
        if label == "GAGPO":
            row["frac_steps_without_peer"] = 1.0 - result.diagnostics["frac_steps_in_shared_groups"]
    return row


def paired(values: np.ndarray, base: np.ndarray) -> dict:
    """Mean of ``values - base`` over seeds and its 95 % t interval (NaN seeds left out)."""
    diff = (values - base)[np.isfinite(values - base)]
    if len(diff) < 2:
        return {"mean": float(np.mean(diff)) if len(diff) else float("nan"), "ci95": float("nan")}
    half = t_quantile(len(diff) - 1) * diff.std(ddof=1) / np.sqrt(len(diff))
    return {"mean": float(diff.mean()), "ci95": float(half)}


def summarize(per_seed: list[dict]) -> dict:
    """Per variant: mean ± std over seeds; per method: GAGPO minus it (paired over seeds)."""
    summary: dict = {"methods": {}, "gagpo_minus": {}}
    for label, _, _ in VARIANTS:
        summary["methods"][label] = {}
        for metric in METRICS:
            values = np.array([r["methods"][label][metric] for r in per_seed], dtype=float)
            summary["methods"][label][metric] = {"mean": float(np.nanmean(values)), "std": float(np.nanstd(values))}
    for label, method, _ in VARIANTS:
        if method != "gagpo":
            summary["gagpo_minus"][label] = {
                metric: paired(np.array([r["methods"]["GAGPO"][metric] for r in per_seed], dtype=float),
                               np.array([r["methods"][label][metric] for r in per_seed], dtype=float))
                for metric in METRICS}
    summary["frac_steps_without_peer"] = float(np.mean([r["frac_steps_without_peer"] for r in per_seed]))
    return summary


def cell(entry: dict) -> str:
    return f"{entry['mean']:.3f} ± {entry['std']:.3f}" if np.isfinite(entry["mean"]) else "–"


def write_tables(report: dict, path: Path) -> None:
    lines = ["### GAGPO beside the six methods (random-policy groups; mean ± std over seeds)", ""]
    for env_name, info in report["envs"].items():
        s = info["summary"]
        lines += [f"**{env_name}** ({ground_truth.ENVS[env_name][0]}, {info['tasks']} tasks × {info['group_size']}, "
                  f"seeds {info['seeds']}, rollout success {info['success_rate']:.2f}, "
                  f"{info['pairs']:.0f} same-state pairs per seed, steps without a same-state peer "
                  f"{s['frac_steps_without_peer']:.2f})", "",
                  "| credit | pairwise accuracy | weighted agreement | trap credit (std) |", "|---|---|---|---|"]
        for label, row in s["methods"].items():
            lines.append(f"| {label} | " + " | ".join(cell(row[m]) for m in METRICS) + " |")
        lines += ["", "GAGPO minus each method (paired over seeds, ± 95 % t interval):", "",
                  "| method | pairwise accuracy | weighted agreement | trap credit |", "|---|---|---|---|"]
        for label, row in s["gagpo_minus"].items():
            lines.append(f"| {label} | " + " | ".join(
                f"{row[m]['mean']:+.3f} ± {row[m]['ci95']:.3f}" if np.isfinite(row[m]["ci95"]) else "–"
                for m in METRICS) + " |")
        lines.append("")
    harness.write_text(path, "\n".join(lines))


def main() -> None:
    parser = harness.parser(__doc__, harness.RESULTS / "credit_quality_gagpo",
                            "OUT: the results' path without its suffix (OUT.json, OUT.md)")
    parser.add_argument("--envs", nargs="+", default=list(ground_truth.ENVS), choices=list(ground_truth.ENVS))
    parser.add_argument("--tasks", type=int, default=100, help="tasks per seed (ALFWorld's train split has 48)")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default: 0-4 (ALFWorld 0-2)")
    args = parser.parse_args()
    out = args.out
    report: dict = {"policy": "uniform random over admissible commands", "group_size": args.group_size, "envs": {}}
    if out.with_suffix(".json").exists():  # keep the envs already done
        report["envs"] = json.loads(out.with_suffix(".json").read_text()).get("envs", {})
    for env_name in args.envs:
        seeds = args.seeds if args.seeds is not None else SEEDS.get(env_name, [0, 1, 2, 3, 4])
        started = time.time()
        per_seed = []
        for seed in seeds:
            per_seed.append(score_seed(env_name, args.tasks, args.group_size, seed))
            print(f"{env_name} seed {seed}: {per_seed[-1]['pairs']} pairs, {time.time() - started:.0f} s", flush=True)
        report["envs"][env_name] = {
            "tasks": per_seed[0]["tasks"], "group_size": args.group_size, "seeds": seeds,
            "success_rate": float(np.mean([r["success_rate"] for r in per_seed])),
            "pairs": float(np.mean([r["pairs"] for r in per_seed])), "wall_s": time.time() - started,
            "summary": summarize(per_seed), "per_seed": per_seed}
        harness.write_json(out.with_suffix(".json"), report)
        write_tables(report, out.with_suffix(".md"))
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
