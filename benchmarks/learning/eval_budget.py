"""How many held-out episodes an evaluation point needs: the CI width each (tasks x copies) buys.

A held-out success rate is a mean over T tasks x C sampled copies per task. Its variance
has a between-task part (tasks differ in difficulty; only more tasks shrink it) and a
within-task part (the sampled policy wins some copies of a task and loses others; more
tasks or more copies shrink it):

    Var = s2_between / T + s2_within / (T C)

Both parts are estimated from the per-task results that training runs write to
``eval.jsonl`` (every point's ``per_task`` success, the mean over its C copies): the
within part as the mean over tasks of p (1 - p) C / (C - 1), the between part as the
variance of the per-task means minus within / C. The script prints, per env, the 95%
half-width of one point's success rate and the episodes it costs for several (T, C),
and writes them as JSON.

    python -m benchmarks.learning.eval_budget benchmarks/runs/learning_efficiency_paper_envs \\
        --out benchmarks/results/eval_budget.json
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from benchmarks import harness

BUDGETS = [(50, 4), (50, 2), (50, 1), (25, 4), (100, 1), (100, 2)]


def variance_parts(per_task: list[float], copies: int) -> tuple[float, float]:
    """(between-task, within-task) variance of one episode's success, from per-task means over ``copies``."""
    p = np.asarray(per_task, dtype=float)
    within = float(np.mean(p * (1 - p))) * copies / (copies - 1)
    between = max(float(np.var(p, ddof=1)) - within / copies, 0.0)
    return between, within


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("runs", help="a folder of run folders (<env>-<algo>-s<seed>/eval.jsonl)")
    parser.add_argument("--out", type=Path, help="write the table as JSON here")
    args = parser.parse_args()
    parts: dict[str, list[tuple[float, float]]] = defaultdict(list)
    copies_of: dict[str, int] = {}
    for eval_file in sorted(Path(args.runs).glob("*/eval.jsonl")):
        env = eval_file.parent.name.split("-")[0]
        for line in eval_file.read_text().splitlines():
            row = json.loads(line)
            per_task = [t["success"] for t in row.get("per_task", [])]
            if len(per_task) < 2:
                continue
            copies = row["n_episodes"] // len(per_task)
            if copies < 2:
                continue
            copies_of[env] = copies
            parts[env].append(variance_parts(per_task, copies))
    result = {}
    for env, values in parts.items():
        between, within = (float(np.mean(column)) for column in zip(*values))
        rows = []
        for tasks, copies in BUDGETS:
            half = 1.96 * np.sqrt(between / tasks + within / (tasks * copies))
            rows.append({"tasks": tasks, "copies": copies, "episodes": tasks * copies, "ci95_half_width": float(half)})
        result[env] = {"points": len(values), "copies_measured": copies_of[env], "s2_between": between,
                       "s2_within": within, "budgets": rows}
        print(f"{env}: {len(values)} evaluation points, between-task variance {between:.4f}, "
              f"within-task {within:.4f}")
        for row in rows:
            print(f"  {row['tasks']:>3} tasks x {row['copies']} copies = {row['episodes']:>3} episodes: "
                  f"success +/- {row['ci95_half_width']:.3f}")
    if args.out:
        harness.write_json(args.out, result)


if __name__ == "__main__":
    main()
