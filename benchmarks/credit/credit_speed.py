"""Speed of the credit functions on synthetic grouped rollouts.

Each task is a small house: rooms ``0..R`` on a corridor, a key in room 4; the task is
won by reaching room ``R`` carrying the key. Each of the ``K`` trajectories of a task
takes random actions (forward / back / pick up / an invalid action that leaves the
state unchanged) for up to ``H`` steps, so the graphs have loops, dead ends, shared
prefixes and self-loops like real rollouts. State keys are observation-like strings.

Sizes: 16 tasks x 8 trajectories x 50 steps (the paper's batch) and 10x the tasks.
Reports the median wall time of several runs of each method, plus the graph build
alone, and writes ``benchmarks/results/credit_speed.json``.

    python -m benchmarks.credit.credit_speed [--repeats 7]
"""

from __future__ import annotations

import os
import platform

import numpy as np

from benchmarks import harness
from milegpo.credit import CREDIT_METHODS, StepBatch, build_task_graph, compute_credit


def synthetic_batch(num_tasks: int, group: int = 8, horizon: int = 50, rooms: int = 10, seed: int = 0) -> StepBatch:
    """Random rollouts of ``num_tasks`` house tasks, ``group`` trajectories each."""
    rng = np.random.default_rng(seed)
    states, success, task_ids, rewards, valid = [], [], [], [], []
    for q in range(num_tasks):
        for _ in range(group):
            room, key = 0, False
            keys = [f"House {q}: you are in room {room} of the corridor. You carry nothing."]
            rew, val, won = [], [], False
            for _ in range(horizon):
                move = rng.choice(4, p=[0.45, 0.2, 0.1, 0.25])
                if move == 0:
                    room = min(room + 1, rooms)
                elif move == 1:
                    room = max(room - 1, 0)
                elif move == 2 and room == 4:
                    key = True
                won = room == rooms and key
                keys.append(f"House {q}: you are in room {room} of the corridor. "
                            f"You carry {'the brass key' if key else 'nothing'}.")
                rew.append(10.0 if won else (-0.1 if move == 3 else 0.0))
                val.append(move != 3)
                if won:
                    break
            states.append(keys)
            success.append(won)
            task_ids.append(q)
            rewards.append(rew)
            valid.append(val)
    return StepBatch.from_trajectories(states, success, task_ids=task_ids, rewards=rewards, valid=valid)


def median_ms(fn, repeats: int) -> float:
    """Median wall milliseconds of ``repeats`` calls after a warm-up."""
    return 1000.0 * harness.timed(fn, repeats)[0]


def main() -> None:
    parser = harness.parser(__doc__, harness.RESULTS / "credit_speed.json")
    parser.add_argument("--repeats", type=int, default=11)
    args = parser.parse_args()
    rows = []
    for num_tasks in (16, 160):
        batch = synthetic_batch(num_tasks)
        graph = build_task_graph(batch)
        entry = {
            "num_tasks": num_tasks, "group": 8, "horizon": 50, "num_trajectories": batch.num_trajectories,
            "num_steps": batch.num_steps, "success_rate": float(batch.success.mean()),
            "num_nodes": int(graph.num_nodes), "num_edges": int(graph.num_edges),
            "graph_build_ms": median_ms(lambda b=batch: build_task_graph(b), args.repeats),
            "ms": {m: median_ms(lambda m=m, b=batch: compute_credit(m, b), args.repeats) for m in CREDIT_METHODS},
        }
        entry["milegpo_over_graphgpo"] = entry["ms"]["milegpo"] / entry["ms"]["graphgpo"]
        rows.append(entry)
        print(f"{num_tasks:4d} tasks, {batch.num_steps:6d} steps, {graph.num_nodes} nodes: graph "
              f"{entry['graph_build_ms']:.1f} ms | " + " | ".join(f"{m} {t:.1f} ms" for m, t in entry["ms"].items())
              + f" | milegpo/graphgpo {entry['milegpo_over_graphgpo']:.2f}x")
    result = {"benchmark": "credit_speed", "repeats": args.repeats, "statistic": "median wall time (ms)",
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
                          "note": "2-core machine shared with other jobs", "load_1min": harness.load_1min()},
              "results": rows}
    harness.write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
