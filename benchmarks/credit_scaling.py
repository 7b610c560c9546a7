"""How credit assignment grows with the batch: every method from ~1k to ~1M steps.

Two kinds of batch, each ``tasks x group`` trajectories of up to ``horizon`` steps:

* ``house``: random walks in a corridor house (a key in room 4, won in the last room
  carrying it), state keys = the room and what is carried, so the K rollouts of a task
  share states, loops and dead ends like real agents' rollouts;
* ``distinct``: the same walks with the step index in every observation, so no state
  repeats inside a trajectory and the graph is a deep layered DAG (the worst case for
  searches whose cost grows with graph depth).

Reports per method the median wall time and process CPU time of ``--repeats`` runs (one
warm-up first), microseconds per step, the peak memory the call allocates (tracemalloc,
a separate run), and the log-log slope of time against steps. Also the graph build on
``distinct`` batches at horizon 50 vs 200 (16 x 8 trajectories). With ``--verl-agent
PATH`` (a checkout of verl-agent, not part of this project) it times verl-agent's GiGPO
advantage function on the same house batches beside ours (same episodes; token length 1).

Writes ``benchmarks/results/credit_scaling.json`` (after every size, so a killed run keeps
what it measured) and ``credit_scaling.md``.

    python benchmarks/credit_scaling.py                       # 1k .. 1M steps
    python benchmarks/credit_scaling.py --max-steps 100000    # quicker
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import platform
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np

from milegpo.credit import CREDIT_METHODS, StepBatch, build_task_graph, compute_credit

RESULTS = Path(__file__).resolve().parent / "results"
#: (tasks, group, horizon): ~1k to ~1M steps (walks end early when they win: 1,100 tasks give just over 1M)
SIZES = [(1, 16, 64), (4, 16, 64), (16, 16, 64), (64, 16, 64), (256, 16, 64), (1100, 16, 64)]
ROOMS = 10


def house_batch(tasks: int, group: int, horizon: int, distinct: bool, seed: int = 0) -> StepBatch:
    """Random house walks of ``tasks x group`` trajectories, built as arrays (no per-step Python)."""
    rng = np.random.default_rng(seed)
    n_traj = tasks * group
    room = np.zeros(n_traj, dtype=np.int64)
    key = np.zeros(n_traj, dtype=bool)
    alive = np.ones(n_traj, dtype=bool)
    won = np.zeros(n_traj, dtype=bool)
    columns: dict[str, list[np.ndarray]] = {name: [] for name in ("traj", "step", "room", "key", "next_room",
                                                                  "next_key", "reward", "valid")}
    for t in range(horizon):
        ids = np.flatnonzero(alive)
        if len(ids) == 0:
            break
        move = rng.choice(4, size=len(ids), p=[0.45, 0.2, 0.1, 0.25])
        back = np.where(move == 1, np.maximum(room[ids] - 1, 0), room[ids])
        new_room = np.where(move == 0, np.minimum(room[ids] + 1, ROOMS), back)
        new_key = key[ids] | ((move == 2) & (room[ids] == 4))
        now_won = (new_room == ROOMS) & new_key
        for name, value in (("traj", ids), ("step", np.full(len(ids), t)), ("room", room[ids]), ("key", key[ids]),
                            ("next_room", new_room), ("next_key", new_key),
                            ("reward", np.where(now_won, 10.0, np.where(move == 3, -0.1, 0.0))), ("valid", move != 3)):
            columns[name].append(value)
        room[ids], key[ids] = new_room, new_key
        won[ids] = now_won
        alive[ids[now_won]] = False
    c = {name: np.concatenate(parts) for name, parts in columns.items()}
    order = np.lexsort((c["step"], c["traj"]))
    c = {name: value[order] for name, value in c.items()}
    task = c["traj"] // group

    def text(step: np.ndarray, rooms: np.ndarray, keys: np.ndarray) -> np.ndarray:
        out = np.empty(len(rooms), dtype=object)
        prefix = "Step {}: " if distinct else ""
        out[:] = [(prefix.format(s) if distinct else "") + f"House {q}: you are in room {r} of the corridor. "
                  f"You carry {'the brass key' if k else 'nothing'}."
                  for s, q, r, k in zip(step.tolist(), task.tolist(), rooms.tolist(), keys.tolist())]
        return out

    last = np.r_[c["traj"][1:] != c["traj"][:-1], True]
    outcomes = np.bincount(c["traj"], weights=c["reward"], minlength=n_traj)
    return StepBatch(task_ids=task, traj_ids=c["traj"], step_idx=c["step"],
                     state_keys=text(c["step"], c["room"], c["key"]),
                     next_state_keys=text(c["step"] + 1, c["next_room"], c["next_key"]),
                     actions=np.full(len(task), "", dtype=object), rewards=c["reward"], valid=c["valid"], dones=last,
                     outcomes=outcomes, success=won)


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median (wall, process CPU) seconds of ``repeats`` calls after one warm-up."""
    fn()
    wall, cpu = [], []
    for _ in range(repeats):
        gc.collect()
        w, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    return float(np.median(wall)), float(np.median(cpu))


def peak_mb(fn: Callable[[], object]) -> float:
    gc.collect()
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2 ** 20


def slope(steps: list[int], seconds: list[float]) -> float:
    """Least-squares slope of log(time) on log(steps)."""
    return float(np.polyfit(np.log(steps), np.log(seconds), 1)[0])


def verl_agent_gigpo(path: Path) -> Callable[[StepBatch], object]:
    """verl-agent's ``compute_gigpo_outcome_advantage`` (gigpo/core_gigpo.py of a checkout) on a StepBatch,
    inputs laid out as its trainer passes them (token length 1; the episode reward on each row)."""
    import torch

    spec = importlib.util.spec_from_file_location("verl_agent_core_gigpo", path / "gigpo" / "core_gigpo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def run(batch: StepBatch) -> object:
        from milegpo.credit.gigpo import discounted_returns

        n = batch.num_steps
        return module.compute_gigpo_outcome_advantage(
            token_level_rewards=torch.as_tensor(batch.outcomes[batch.traj_ids], dtype=torch.float32).view(n, 1),
            step_rewards=torch.as_tensor(discounted_returns(batch, 0.95), dtype=torch.float32),
            response_mask=torch.ones(n, 1), anchor_obs=batch.state_keys, index=batch.task_ids.astype(object),
            traj_index=batch.traj_ids.astype(object), mode="mean_std_norm")

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-steps", type=int, default=2_000_000, help="skip sizes whose batch exceeds this")
    parser.add_argument("--verl-agent", type=Path, default=None, help="a verl-agent checkout, for its GiGPO")
    parser.add_argument("--out", type=Path, default=RESULTS / "credit_scaling.json")
    args = parser.parse_args()
    reference = verl_agent_gigpo(args.verl_agent) if args.verl_agent else None
    result: dict[str, object] = {
        "benchmark": "credit_scaling", "repeats": args.repeats,
        "statistic": "median wall and process CPU seconds per call, after one warm-up",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
                    "load_1min_at_start": os.getloadavg()[0]},
        "runs": [],
    }
    runs: list[dict[str, object]] = result["runs"]  # type: ignore[assignment]

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        args.out.with_suffix(".md").write_text(markdown(result))

    for kind in ("house", "distinct"):
        for tasks, group, horizon in SIZES:
            batch = house_batch(tasks, group, horizon, distinct=kind == "distinct")
            if batch.num_steps > args.max_steps:
                continue
            repeats = args.repeats if batch.num_steps < 200_000 else max(1, args.repeats // 2)
            entry: dict[str, object] = {"kind": kind, "tasks": tasks, "group": group, "horizon": horizon,
                                        "steps": batch.num_steps, "methods": {}}
            build = timed(lambda b=batch: build_task_graph(b), repeats)
            graph = build_task_graph(batch)
            entry.update(nodes=graph.num_nodes, edges=graph.num_edges, graph_build_s=build[0])
            for method in CREDIT_METHODS:
                wall, cpu = timed(lambda m=method, b=batch: compute_credit(m, b), repeats)
                entry["methods"][method] = {  # type: ignore[index]
                    "wall_s": wall, "cpu_s": cpu, "us_per_step": 1e6 * wall / batch.num_steps,
                    "peak_mb": peak_mb(lambda m=method, b=batch: compute_credit(m, b))}
            if reference is not None and kind == "house" and batch.num_steps <= 300_000:
                wall, cpu = timed(lambda b=batch: reference(b), max(1, repeats // 2))
                ours = entry["methods"]["gigpo"]["wall_s"]  # type: ignore[index]
                entry["verl_agent_gigpo"] = {"wall_s": wall, "cpu_s": cpu, "ratio_to_ours": wall / ours}
            runs.append(entry)
            print(f"{kind:8s} {batch.num_steps:8d} steps {graph.num_nodes:8d} nodes: " + " | ".join(
                f"{m} {v['us_per_step']:.2f}" for m, v in entry["methods"].items())  # type: ignore[union-attr]
                + " us/step" + (f" | verl-agent GiGPO {entry['verl_agent_gigpo']['ratio_to_ours']:.1f}x ours"
                                if "verl_agent_gigpo" in entry else ""), flush=True)
            save()
    slopes: dict[str, dict[str, float]] = {}
    for kind in ("house", "distinct"):
        rows = [r for r in runs if r["kind"] == kind]
        if len(rows) >= 2:
            steps = [int(r["steps"]) for r in rows]  # type: ignore[call-overload]
            slopes[kind] = {m: slope(steps, [r["methods"][m]["wall_s"] for r in rows])  # type: ignore[index]
                            for m in CREDIT_METHODS}
            slopes[kind]["graph_build"] = slope(steps,
                                                [float(r["graph_build_s"]) for r in rows])  # type: ignore[arg-type]
    result["loglog_slope"] = slopes
    depth: dict[str, object] = {}
    batches = {horizon: house_batch(16, 8, horizon, distinct=True, seed=1) for horizon in (50, 200)}
    samples: dict[int, list[float]] = {50: [], 200: []}
    for _ in range(max(args.repeats, 11)):  # interleaved: a load change hits both horizons alike
        for horizon, batch in batches.items():
            samples[horizon].append(timed(lambda b=batch: build_task_graph(b), 1)[0])
    for horizon, batch in batches.items():
        depth[str(horizon)] = {"steps": batch.num_steps, "graph_build_s": float(np.median(samples[horizon]))}
    depth["growth"] = depth["200"]["graph_build_s"] / depth["50"]["graph_build_s"]  # type: ignore[assignment]
    depth["steps_ratio"] = depth["200"]["steps"] / depth["50"]["steps"]  # type: ignore[assignment]
    result["distinct_graph_build_horizon_50_vs_200"] = depth
    result["rank_gather"] = rank_gather_cost(args.repeats)
    result["machine"]["load_1min_at_end"] = os.getloadavg()[0]  # type: ignore[index]
    save()
    print("log-log slope of time vs steps:", json.dumps(slopes, indent=1))
    print(f"distinct states, graph build T=50 -> T=200: {depth['growth']:.2f}x for {depth['steps_ratio']:.2f}x the "
          f"steps")


def rank_gather_cost(repeats: int) -> dict[str, float]:
    """What the data-parallel trainer's diagnostics cost rank 0 per rank: each rank's StepBatch is
    pickled to rank 0 (torch.distributed.gather_object), merged, and credited again there.
    Measured on one rank's batch of the paper's shape (16 tasks x 8 x up to 50 steps)."""
    import pickle

    from milegpo.algos.distributed import merge_step_batches

    batch = house_batch(16, 8, 50, distinct=False, seed=2)
    payload = len(pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL))
    merge_s = timed(lambda: merge_step_batches([batch] * 8, 16), repeats)[0] / 8
    return {"steps_per_rank": batch.num_steps, "pickled_bytes_per_step": payload / batch.num_steps,
            "merge_s_per_rank": merge_s}


def markdown(result: dict[str, object]) -> str:
    lines = ["### Credit assignment: time per step from ~1k to ~1M steps", "",
             f"Median of {result['repeats']} calls (fewer above 200k steps) on {result['machine']['cpus']} cores "  # type: ignore[index]
             f"(1-min load at start {result['machine']['load_1min_at_start']:.2f}). "  # type: ignore[index]
             "µs per step, and peak MB allocated.",
             "", "| batch | steps | nodes | " + " | ".join(CREDIT_METHODS) + " | peak MB (milegpo) |",
             "|---|---:|---:|" + "---:|" * len(CREDIT_METHODS) + "---:|"]
    for r in result["runs"]:  # type: ignore[attr-defined]
        m = r["methods"]
        lines.append(f"| {r['kind']} {r['tasks']}x{r['group']}x{r['horizon']} | {r['steps']:,} | {r['nodes']:,} | "
                     + " | ".join(f"{m[k]['us_per_step']:.2f}" for k in CREDIT_METHODS)
                     + f" | {m['milegpo']['peak_mb']:.0f} |")
    for kind, s in (result.get("loglog_slope") or {}).items():  # type: ignore[union-attr]
        lines += ["", f"log-log slope, {kind}: " + ", ".join(f"{k} {v:.3f}" for k, v in s.items())]
    ref = [r for r in result["runs"] if "verl_agent_gigpo" in r]  # type: ignore[attr-defined]
    if ref:
        lines += ["", "verl-agent's GiGPO advantage function on the same house batches (its "
                  "`compute_gigpo_outcome_advantage`, token length 1), time relative to ours: "
                  + ", ".join(f"{r['steps']:,} steps {r['verl_agent_gigpo']['ratio_to_ours']:.1f}x" for r in ref)]
    gather = result.get("rank_gather")
    if gather:
        lines += ["", f"Data-parallel diagnostics: one rank's batch ({gather['steps_per_rank']:,} steps) pickles to "  # type: ignore[index]
                  f"{gather['pickled_bytes_per_step']:.0f} bytes per step for rank 0; merging costs "  # type: ignore[index]
                  f"{1e3 * gather['merge_s_per_rank']:.1f} ms per rank."]  # type: ignore[index]
    depth = result.get("distinct_graph_build_horizon_50_vs_200")
    if depth:
        lines += ["", f"Distinct states, graph build at horizon 50 vs 200 (16 x 8 trajectories): "
                  f"{depth['growth']:.2f}x the time for {depth['steps_ratio']:.2f}x the steps."]  # type: ignore[index]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
