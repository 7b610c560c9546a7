"""Env throughput of GroupedTextVecEnv: in-process vs subprocess workers, random admissible actions.

    python -m benchmarks.speed.env_speed                         # milegpo/House-v0
    python -m benchmarks.speed.env_speed --env-id milegpo/ALFWorld-v0 --seconds 60
    python -m benchmarks.speed.env_speed --env-id milegpo/TWX-coin-v0 --workers 0,1,2,4

Each configuration (``0`` = in-process, ``N`` = N worker processes) runs
``n_tasks x group_size`` envs for ``--seconds`` of rollouts: random admissible
commands, a group reset whenever all episodes are over (reset time included).
Reported: env steps/s (stepped active envs), resets/s, vec-env start-up time.
Results are merged by env id into ``benchmarks/results/env_speed.json``.
"""

from __future__ import annotations

import json
import os
import platform
import time

import numpy as np

from benchmarks import harness
from milegpo.cli import env_kwargs_type
from milegpo.envs import make_vec_env


def measure(env_id: str, env_kwargs: dict, n_workers: int, n_tasks: int, group_size: int, seconds: float,
            seed: int = 0) -> dict:
    """Run one configuration; ``n_workers == 0`` means in-process."""
    start = time.perf_counter()
    venv = make_vec_env(env_id, n_tasks=n_tasks, group_size=group_size, seed=seed, env_kwargs=env_kwargs,
                        subprocess=n_workers > 0, n_workers=n_workers or None)
    startup = time.perf_counter() - start
    rng = np.random.default_rng(seed)
    steps = resets = errors = wins = episodes = 0
    try:
        t0 = time.perf_counter()
        venv.reset()
        infos, resets = venv.reset_infos, 1
        while time.perf_counter() - t0 < seconds:
            if not venv.active.any():
                episodes += venv.num_envs
                wins += sum(bool(info.get("won")) for info in infos)
                venv.reset()
                infos, resets = venv.reset_infos, resets + 1
                continue
            steps += int(venv.active.sum())
            actions = [str(rng.choice(info["admissible_commands"])) if info.get("admissible_commands") else "look"
                       for info in infos]
            _, _, _, infos = venv.step(actions)
            errors += sum("env_error" in info and not info.get("inactive") for info in infos)
        elapsed = time.perf_counter() - t0
    finally:
        venv.close()
    return {
        "mode": "in-process" if n_workers == 0 else "subprocess",
        "workers": n_workers,
        "env_steps_per_s": round(steps / elapsed, 1),
        "resets_per_s": round(resets * venv.num_envs / elapsed, 1),
        "startup_s": round(startup, 2),
        "env_steps": steps,
        "episodes": episodes,
        "random_success_rate": round(wins / episodes, 4) if episodes else None,
        "env_errors": errors,
    }


def main() -> None:
    parser = harness.parser(__doc__, harness.RESULTS / "env_speed.json",
                            "the results file, merged by env id (default: %(default)s)")
    parser.add_argument("--env-id", default="milegpo/House-v0")
    parser.add_argument("--env-kwargs", type=env_kwargs_type, default={})
    parser.add_argument("--n-tasks", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--workers", default="0,1,2", help="comma list; 0 = in-process")
    parser.add_argument("--seconds", type=float, default=10.0, help="rollout time per configuration")
    args = parser.parse_args()

    rows = [measure(args.env_id, args.env_kwargs, int(w), args.n_tasks, args.group_size, args.seconds)
            for w in args.workers.split(",")]
    print(f"{args.env_id}  {args.n_tasks} tasks x group {args.group_size}, {args.seconds:g} s each, "
          f"{os.cpu_count()} CPUs")
    print(f"{'mode':<11} {'workers':>7} {'env steps/s':>12} {'resets/s':>9} {'startup s':>9} {'errors':>6}")
    for row in rows:
        print(f"{row['mode']:<11} {row['workers']:>7} {row['env_steps_per_s']:>12.1f} {row['resets_per_s']:>9.1f} "
              f"{row['startup_s']:>9.2f} {row['env_errors']:>6}")

    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    results[args.env_id] = {
        "env_kwargs": args.env_kwargs, "n_tasks": args.n_tasks, "group_size": args.group_size,
        "seconds_per_config": args.seconds, "cpus": os.cpu_count(), "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "load_1min": harness.load_1min(), "rows": rows,
    }
    harness.write_json(args.out, results)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
