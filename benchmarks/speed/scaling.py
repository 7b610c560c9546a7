"""Data-parallel scaling: the same training run on 1, 2, ... processes launched by torchrun.

Each setting runs ``torchrun --nproc_per_node N -m milegpo train`` on the same global
batch (``--n-tasks`` task groups split over the N ranks) without evaluation, and reads
its ``progress.csv``: env steps per second over whole iterations (rollout, credit and
update time summed), the rollout's env steps/s and the update's tokens/s (both of all
ranks together), skipping the first iteration (warm-up); the median of ``--repeats``
interleaved runs. Results go to
``benchmarks/results/scaling.json`` and ``scaling.md``.

On this project's 2-core CPU machine two processes share the two cores that one
process already uses (torch threads), so the gain is capped; the same script runs on
N GPUs, e.g.::

    python -m benchmarks.speed.scaling --nprocs 1 2 4 8 --device cuda \\
        --model Qwen/Qwen2.5-1.5B-Instruct --mode generate --n-tasks 16 --steps 20000

    python -m benchmarks.speed.scaling                     # CPU: tiny LM, House, 1 vs 2 processes
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import harness


def run(nproc: int, args: argparse.Namespace, folder: Path) -> dict[str, float]:
    """One torchrun training run; its throughput figures."""
    run_dir = folder / f"nproc{nproc}"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
               "--master_port", str(29400 + nproc), "-m", "milegpo", "train",
               "--run-dir", str(run_dir), f"run.total_timesteps={args.steps}", f"env.n_tasks={args.n_tasks}",
               f"env.group_size={args.group_size}", "eval.splits=[]", "run.checkpoint_freq=1000",
               f"run.device={args.device}", f"policy.mode={args.mode}", "--no-progress-bar", *args.extra]
    if args.model:
        command += ["--policy.model", args.model]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, args.threads // nproc))}
    with harness.Stopwatch() as clock:
        subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    wall = clock.wall_s
    with open(run_dir / "progress.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("rollout/episodes")]
    warmup, rows = rows[0], rows[1:]
    seconds = [float(r["time/rollout_s"]) + float(r["time/credit_s"]) + float(r["time/update_s"]) for r in rows]
    return {
        "nproc": nproc,
        "iterations": len(rows) + 1,
        "env_steps_per_s": (int(rows[-1]["time/total_timesteps"]) - int(warmup["time/total_timesteps"])) / sum(seconds),
        "rollout_env_steps_per_s": statistics.median(float(r["time/env_steps_per_s"]) for r in rows),
        "update_tokens_per_s": statistics.median(float(r["time/update_tokens_per_s"]) for r in rows),
        "seconds_per_iteration": statistics.median(seconds),
        "command_wall_s": wall,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = harness.parser(__doc__, harness.RESULTS / "scaling", "results file stem (OUT.json, OUT.md)")
    parser.add_argument("--nprocs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=8000, help="env steps per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per setting (the median is reported)")
    parser.add_argument("--n-tasks", type=int, default=8, help="global task groups per iteration")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default=None, help="default: the offline tiny LM")
    parser.add_argument("--mode", default="choose")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="CPU threads shared by the processes (OMP_NUM_THREADS = threads / N)")
    parser.add_argument("extra", nargs="*", help="more `milegpo train` flags (after --)")
    args = parser.parse_args(argv)

    runs: dict[int, list[dict[str, float]]] = {n: [] for n in args.nprocs}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):  # interleaved, so slow phases of the machine hit every setting
            for n in args.nprocs:
                runs[n].append(run(n, args, Path(tmp) / str(repeat)))
    results = [{key: statistics.median(r[key] for r in runs[n]) for key in runs[n][0]} for n in args.nprocs]
    base = results[0]
    for r in results:
        r["speedup"] = r["env_steps_per_s"] / base["env_steps_per_s"]
        r["env_steps_per_s_runs"] = [round(x["env_steps_per_s"], 1) for x in runs[int(r["nproc"])]]
    report = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                          "load_1min": harness.load_1min()},
              "settings": {k: v for k, v in vars(args).items() if k != "out"}, "results": results}
    lines = [f"Median of {args.repeats} runs; env steps/s = env steps over the summed rollout + credit + update "
             "time of the iterations after the first.", "",
             "| processes | env steps/s | speed-up | rollout env steps/s | update tokens/s | s / iteration |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['nproc']:.0f} | {r['env_steps_per_s']:.0f} | {r['speedup']:.2f}x | "
              f"{r['rollout_env_steps_per_s']:.0f} | {r['update_tokens_per_s']:.0f} | "
              f"{r['seconds_per_iteration']:.2f} |"
              for r in results]
    harness.write_results(args.out, report, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return report


if __name__ == "__main__":
    main()
