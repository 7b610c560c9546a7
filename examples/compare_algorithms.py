"""GRPO, GiGPO, GraphGPO and MileGPO side by side: same env, model, budget and seed.

The four algorithms share the rollouts, the buffer, the update and the logging and
differ only by their credit function, so one :class:`~milegpo.run.train.TrainConfig` with
another ``algo`` is a fair comparison. The base model is built (or named) once and
every run starts from it; every run draws the same tasks (same seed). Each run is a
normal run folder under ``--out`` (logs, plots, checkpoints). The shared setting is
:class:`TrainConfig`'s defaults (the CPU demo: House, a tiny LM, choose mode) or a
config file; flags override single fields.

    python examples/compare_algorithms.py                     # House, tiny LM, 24k env steps each (3 min here)
    python examples/compare_algorithms.py --steps 6000        # a quick look (measured: 86 s on 2 shared cores)
    python examples/compare_algorithms.py --config configs/paper_alfworld_gpu.json --steps 200000   # GPU

One seed is an anecdote: for means and spreads over seeds, learning curves and the
README's table use ``benchmarks/learning_efficiency.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

from milegpo import TrainConfig, train
from milegpo.run.plots import METHOD_LABELS, read_progress
from milegpo.run.train import prepare_model

ALGOS = ("grpo", "gigpo", "graphgpo", "milegpo")
#: The flags that override a TrainConfig field of the same name.
CONFIG_FLAGS = ("env", "env_kwargs", "eval_splits", "total_timesteps", "n_tasks", "group_size", "n_eval_tasks", "model",
                "device", "seed")


def last_train_success(run_dir: Path) -> float:
    """Success rate of the last iteration's training rollouts (sampled actions)."""
    values = read_progress(run_dir / "progress.csv").get("rollout/success_rate", [])
    return next((v for v in reversed(values) if not math.isnan(v)), math.nan)


def parse_config(argv: list[str] | None) -> tuple[TrainConfig, argparse.Namespace]:
    """The shared TrainConfig: ``--config`` with the flags that were given on top."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="JSON file of TrainConfig fields shared by the runs (default: the CPU demo)")
    parser.add_argument("--algos", nargs="+", choices=ALGOS, default=list(ALGOS))
    parser.add_argument("--out", default="runs/compare", help="folder of the runs")
    parser.add_argument("--no-progress-bar", action="store_true")
    fields = parser.add_argument_group("TrainConfig fields (override --config)")
    fields.add_argument("--env", help="registered env id")
    fields.add_argument("--env-kwargs", type=json.loads, help="JSON object of env arguments")
    fields.add_argument("--eval-splits", nargs="+", help="held-out splits")
    fields.add_argument("--steps", dest="total_timesteps", type=int, help="env-step budget of each run")
    fields.add_argument("--n-tasks", type=int, help="tasks per iteration")
    fields.add_argument("--group-size", type=int, help="rollouts per task (K)")
    fields.add_argument("--n-eval-tasks", type=int, help="held-out tasks per split")
    fields.add_argument("--model", help="hub name or local path of a causal LM (default: a tiny offline LM)")
    fields.add_argument("--device", help="auto | cpu | cuda")
    fields.add_argument("--seed", type=int)
    args = parser.parse_args(argv)
    overrides = {name: getattr(args, name) for name in CONFIG_FLAGS if getattr(args, name) is not None}
    config = TrainConfig.from_file(args.config) if args.config else TrainConfig()
    return TrainConfig.from_dict({**dataclasses.asdict(config), **overrides}), args


def main(argv: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Train each algorithm once; print and return held-out success per algorithm and split."""
    shared, args = parse_config(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shared.model = prepare_model(shared, out)  # one base model (out/base_model) for every algorithm

    results: dict[str, dict[str, Any]] = {}
    for algo in args.algos:
        config = dataclasses.replace(shared, algo=algo)
        started = time.perf_counter()
        run_dir = train(config, run_dir=out / algo, progress_bar=not args.no_progress_bar, verbose=0)
        final = json.loads((run_dir / "eval_final.json").read_text())
        results[algo] = {**{split: final[split]["success_rate"] for split in final},
                         "train_last": last_train_success(run_dir), "wall_s": time.perf_counter() - started}
        print(f"{METHOD_LABELS[algo]} done in {results[algo]['wall_s']:.0f} s", flush=True)

    splits = list(final)
    print(f"\nheld-out success on {shared.env}, {shared.total_timesteps} env steps, seed {shared.seed}:")
    print(f"{'algorithm':10s}" + "".join(f"{s:>10s}" for s in splits) + f"{'train*':>10s}{'time (s)':>10s}")
    for algo, row in results.items():
        print(f"{METHOD_LABELS[algo]:10s}" + "".join(f"{row[s]:10.3f}" for s in splits)
              + f"{row['train_last']:10.3f}{row['wall_s']:10.0f}")
    print("* success of the last iteration's training rollouts")
    return results


if __name__ == "__main__":
    main()
