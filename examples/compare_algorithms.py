"""GRPO, GiGPO, GraphGPO and MileGPO side by side: same env, model, budget and seed.

The four algorithms share the rollouts, the buffer, the update and the logging and
differ only by their credit function, so one :class:`~milegpo.config.run.TrainConfig` with
another ``algo.method`` is a fair comparison. The base model is built (or named) once and
every run starts from it; every run draws the same tasks (same seed). Each run is a
normal run folder under ``--out`` (logs, plots, checkpoints). The shared setting is
``milegpo train``'s: a preset (default: the CPU demo, House with a tiny LM in choose mode) or
config files, with ``section.field=value`` overrides on top.

    python examples/compare_algorithms.py                        # House, tiny LM, 24k env steps each (3 min here)
    python examples/compare_algorithms.py run.total_timesteps=6000   # a quick look (measured: 86 s on 2 shared cores)
    python examples/compare_algorithms.py --preset paper-alfworld run.total_timesteps=200000   # GPU

One seed is an anecdote: for means and spreads over seeds, learning curves and the
README's table use ``benchmarks/learning/learning_efficiency.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from milegpo import TrainConfig, train
from milegpo.config.run import DEMO_PRESET, PRESETS, resolve_config
from milegpo.run.plots import METHOD_LABELS, read_progress
from milegpo.run.train import prepare_model

ALGOS = ("grpo", "gigpo", "graphgpo", "milegpo")


def last_train_success(run_dir: Path) -> float:
    """Success rate of the last iteration's training rollouts (sampled actions)."""
    values = read_progress(run_dir / "progress.csv").get("rollout/success_rate", [])
    return next((v for v in reversed(values) if not math.isnan(v)), math.nan)


def parse_config(argv: list[str] | None) -> tuple[TrainConfig, argparse.Namespace]:
    """The shared config, resolved as ``milegpo train`` resolves it (preset, files, overrides)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", metavar="section.field=VALUE", help="settings shared by the runs")
    parser.add_argument("--preset", choices=PRESETS, default=None, help=f"default: {DEMO_PRESET} unless --config")
    parser.add_argument("--config", action="append", default=[], help="YAML or JSON file of settings (repeatable)")
    parser.add_argument("--algos", nargs="+", choices=ALGOS, default=list(ALGOS))
    parser.add_argument("--out", default="runs/compare", help="folder of the runs")
    parser.add_argument("--no-progress-bar", action="store_true")
    args = parser.parse_args(argv)
    preset = args.preset or (None if args.config else DEMO_PRESET)
    return resolve_config(preset, args.config, args.overrides), args


def main(argv: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Train each algorithm once; print and return held-out success per algorithm and split."""
    shared, args = parse_config(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # one base model (out/base_model) for every algorithm
    shared = shared.replace(**{"policy.model": prepare_model(shared, out)})

    results: dict[str, dict[str, Any]] = {}
    for algo in args.algos:
        config = shared.replace(**{"algo.method": algo})
        started = time.perf_counter()
        run_dir = train(config, run_dir=out / algo, progress_bar=not args.no_progress_bar, verbose=0)
        final = json.loads((run_dir / "eval_final.json").read_text())
        results[algo] = {**{split: final[split]["success_rate"] for split in final},
                         "train_last": last_train_success(run_dir), "wall_s": time.perf_counter() - started}
        print(f"{METHOD_LABELS[algo]} done in {results[algo]['wall_s']:.0f} s", flush=True)

    splits = list(final)
    print(f"\nheld-out success on {shared.env.id}, {shared.run.total_timesteps} env steps, seed {shared.run.seed}:")
    print(f"{'algorithm':10s}" + "".join(f"{s:>10s}" for s in splits) + f"{'train*':>10s}{'time (s)':>10s}")
    for algo, row in results.items():
        print(f"{METHOD_LABELS[algo]:10s}" + "".join(f"{row[s]:10.3f}" for s in splits)
              + f"{row['train_last']:10.3f}{row['wall_s']:10.0f}")
    print("* success of the last iteration's training rollouts")
    return results


if __name__ == "__main__":
    main()
