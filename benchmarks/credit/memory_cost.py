"""What MileGPO's milestone memory costs: wall time per step and bytes per task.

The batches are ``benchmarks/credit/credit_speed.py``'s synthetic house rollouts at its sizes (16 tasks x 8
trajectories x up to 50 steps, the paper's batch, and 10x the tasks). Every iteration draws the
same tasks again with new random rollouts (``seed`` = the iteration), so every task recurs every
iteration: the memory is as full and as often read as it can be (the worst case of its cost).

For each size, after ``--warm`` iterations that fill the memory, the median wall time
(``time.perf_counter``) of MileGPO's credit without memory (``compute_credit``) and with it
(``milegpo_with_memory``: the read, the credit and the memory's advance), per step, and the median
of each iteration's difference of the two (timed back to back: the overhead, which is not the
difference of the two medians); the memory's bytes per task
(:attr:`~milegpo.credit.memory.MilestoneMemory.nbytes`: count arrays, key strings and the tuples
that list them) and per task in a checkpoint (its JSON). Half-life ``inf`` (nothing decays away:
the largest memory). Writes ``benchmarks/results/memory_cost.{json,md}``.

    python -m benchmarks.credit.memory_cost [--repeats 7] [--warm 8]
"""

from __future__ import annotations

import json
import os
import platform

import numpy as np

from benchmarks.credit.credit_speed import synthetic_batch
from benchmarks.harness import RESULTS, Stopwatch, load_1min, parser, write_results
from milegpo.credit import MileGPOConfig, MilestoneMemory, compute_credit
from milegpo.credit.memory import milegpo_with_memory


def seconds(fn) -> float:
    """Wall seconds of one call of ``fn``."""
    with Stopwatch() as clock:
        fn()
    return clock.wall_s


def measure(num_tasks: int, warm: int, repeats: int) -> dict:
    """One size: the memory after ``warm`` iterations, then ``repeats`` timed iterations of each credit."""
    config = MileGPOConfig(memory_half_life=float("inf"))
    memory = MilestoneMemory()
    for iteration in range(warm):
        _, memory = milegpo_with_memory(synthetic_batch(num_tasks, seed=iteration), config, memory)
    plain, remembered, steps = [], [], []
    for iteration in range(warm, warm + repeats):
        batch = synthetic_batch(num_tasks, seed=iteration)
        steps.append(batch.num_steps)
        plain.append(seconds(lambda b=batch: compute_credit("milegpo", b)) / batch.num_steps)
        remembered.append(seconds(lambda b=batch, m=memory: milegpo_with_memory(b, config, m)) / batch.num_steps)
        _, memory = milegpo_with_memory(batch, config, memory)
    states = [len(entry.counts.node_keys) for entry in memory.tasks.values()]
    edges = [len(entry.counts.edge_keys) for entry in memory.tasks.values()]
    return {"num_tasks": num_tasks, "group": 8, "horizon": 50, "iterations": warm + repeats,
            "steps_per_iteration": float(np.mean(steps)),
            "us_per_step_milegpo": 1e6 * float(np.median(plain)),
            "us_per_step_with_memory": 1e6 * float(np.median(remembered)),
            "overhead_us_per_step": 1e6 * float(np.median(np.array(remembered) - np.array(plain))),
            "states_per_task": float(np.mean(states)), "edges_per_task": float(np.mean(edges)),
            "bytes_per_task": memory.nbytes / len(memory.tasks),
            "json_bytes_per_task": len(json.dumps(memory.to_dict())) / len(memory.tasks)}


def markdown(result: dict) -> str:
    """The table the docs include."""
    lines = ["| tasks x 8 | steps / iteration | MileGPO µs/step | with memory µs/step "
             "| overhead µs/step (median of per-iteration differences) "
             "| states / task | edges / task | bytes / task | checkpoint JSON bytes / task |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in result["results"]:
        lines.append(f"| {r['num_tasks']} | {r['steps_per_iteration']:.0f} | {r['us_per_step_milegpo']:.1f} "
                     f"| {r['us_per_step_with_memory']:.1f} | {r['overhead_us_per_step']:+.1f} "
                     f"| {r['states_per_task']:.0f} | {r['edges_per_task']:.0f} | {r['bytes_per_task']:.0f} "
                     f"| {r['json_bytes_per_task']:.0f} |")
    return (f"Milestone memory cost (wall time, {result['statistic']}; {result['machine']['note']}; "
            "every task recurs every iteration, half-life inf: the worst case)\n\n" + "\n".join(lines) + "\n")


def main() -> None:
    arguments = parser(__doc__, RESULTS / "memory_cost")
    arguments.add_argument("--repeats", type=int, default=7)
    arguments.add_argument("--warm", type=int, default=8)
    args = arguments.parse_args()
    rows = [measure(num_tasks, args.warm, args.repeats) for num_tasks in (16, 160)]
    for r in rows:
        print(r)
    result = {"benchmark": "memory_cost", "statistic": f"median over {args.repeats} iterations after {args.warm}",
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
                          "note": "2-core machine shared with other jobs", "load_1min": load_1min()},
              "results": rows}
    write_results(args.out, result, markdown(result))
    print(f"wrote {args.out}.json/.md")


if __name__ == "__main__":
    main()
