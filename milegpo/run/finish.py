"""The end of a run and what reads a finished one: the final held-out evaluation, the plots,
the trackers' last values, and a run folder loaded back (``milegpo eval``, ``export``, ``serve``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from milegpo.config.run import TrainConfig
from milegpo.options import HELD_OUT_SPLIT
from milegpo.run.plan import RunPlan, SplitPlan, eval_split_plan, remember_env_module
from milegpo.run_folder import (
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    CREDIT_DIAGNOSTICS_PNG,
    EVAL_FINAL_FILE,
    FINAL_DIR,
    LAST_BATCH_FILE,
    LEARNING_CURVE_PNG,
    PROGRESS_FILE,
    TRAJECTORY_CREDIT_PNG,
    write_atomic,
)


def evaluate_splits(model: Any, plan: RunPlan, splits: Sequence[SplitPlan],
                    progress: bool = False) -> dict[str, dict[str, Any]]:
    """Success on each split's tasks, acting as the plan's evaluations do (``eval.temperature``, each
    split's fixed seed)."""
    results = {}
    for split in splits:  # none: the run has no held-out evaluation
        env = plan.eval_env(split)
        try:
            result = model.evaluate(env, task_seeds=list(split.task_seeds), seed=split.seed, progress=progress,
                                    **plan.eval_sampling)
        finally:
            env.close()
        results[str(split.name)] = ({k: v for k, v in result.items() if k != "per_task"}
                                    | {"n_tasks": len(split.task_seeds)})
    return results


def evaluate_model(model: Any, config: TrainConfig, splits: list[str] | None = None,
                   n_tasks: int | None = None, progress: bool = False) -> dict[str, dict[str, Any]]:
    """Success on the first ``n_tasks`` tasks of each eval split (default ``config.eval``), sampled at
    ``config.eval.temperature`` (greedy when it is None) with the split's fixed seed."""
    plan = RunPlan.of(config, ".")
    chosen = [eval_split_plan(config, split, n_tasks) for split in (splits or config.eval.splits)]
    return evaluate_splits(model, plan, chosen, progress)


def finish_run(model: Any, plan: RunPlan, verbose: int, progress_bar: bool, logger: Any = None) -> None:
    """Final held-out evaluation and plots of a trained run; both go to the experiment trackers
    (those of ``logger``, or opened again for a run whose final evaluation a kill interrupted)."""
    from stable_baselines3.common.logger import Logger

    from milegpo.run.tracking import finish_trackers, tracker_formats

    settings, run_dir = plan.settings, plan.run_dir
    results = evaluate_splits(model, plan, plan.eval_splits, progress=progress_bar and bool(verbose))
    write_atomic(run_dir / EVAL_FINAL_FILE, json.dumps(results, indent=2) + "\n")
    write_plots_safely(run_dir)
    if logger is None:
        logger = Logger(folder=None, output_formats=tracker_formats(plan.trackers, run_dir, settings.to_dict()))
    plots = sorted(run_dir.glob("*.png")) + [run_dir / EVAL_FINAL_FILE]
    finish_trackers(logger, results, plots)
    if verbose:
        for split, result in results.items():
            name = "seeds" if split == HELD_OUT_SPLIT else split  # an env without splits: its held-out seeds
            print(f"held-out {name}: success {result['success_rate']:.3f} over {result['n_tasks']} tasks x "
                  f"{settings.eval.copies}")
        print(f"Run folder: {run_dir}")


def finished(plan: RunPlan, verbose: int, progress_bar: bool = True) -> bool:
    """Whether the run folder's final checkpoint already reached ``run.total_timesteps``; if only its
    final evaluation is missing (killed during it), rank 0 runs that."""
    from milegpo.algos import ALGORITHMS
    from milegpo.algos.checkpoint import CheckpointError, read_config

    settings, run_dir = plan.settings, plan.run_dir
    try:
        counters = read_config(run_dir / FINAL_DIR)["counters"]
    except CheckpointError:
        return False
    if counters["num_timesteps"] < settings.run.total_timesteps:
        return False
    if not plan.world.is_main:
        return True
    if (run_dir / EVAL_FINAL_FILE).exists():
        missing = [name for name in _expected_plots(run_dir) if not (run_dir / name).exists()]
        if missing and write_plots_safely(run_dir):
            print(f"Wrote the missing plot(s) {', '.join(missing)} of {run_dir}")
        print(f"{run_dir} is finished ({counters['num_timesteps']} of {settings.run.total_timesteps} env steps): "
              f"nothing to do. To train further: milegpo train --resume {run_dir} run.total_timesteps=N (N > "
              f"{counters['num_timesteps']})")
        return True
    model = ALGORITHMS[settings.algo.method].load(run_dir / FINAL_DIR, device=settings.run.device,
                                                  base_model=plan.base_model)
    finish_run(model, plan, verbose, progress_bar)
    return True


def load_run(run_dir: str | Path) -> tuple[TrainConfig, Any]:
    """The settings and the final (or latest) model of a run folder."""
    from milegpo.algos import ALGORITHMS, latest_checkpoint

    run_dir = Path(run_dir)
    if not (run_dir / CONFIG_FILE).exists():
        raise FileNotFoundError(f"{str(run_dir)!r} is not a run folder (no {CONFIG_FILE}); pass the folder `milegpo "
                                f"train` wrote")
    settings = TrainConfig.from_file(run_dir / CONFIG_FILE)
    remember_env_module(settings)
    checkpoint = run_dir / FINAL_DIR if (run_dir / FINAL_DIR).exists() else latest_checkpoint(run_dir / CHECKPOINTS_DIR)
    if checkpoint is None:
        raise FileNotFoundError(f"run folder {str(run_dir)!r} has no checkpoint yet ({FINAL_DIR}/ or "
                                f"{CHECKPOINTS_DIR}/)")
    plan = RunPlan.of(settings, run_dir)
    return settings, ALGORITHMS[settings.algo.method].load(checkpoint, device=settings.run.device,
                                                           base_model=plan.base_model)


def _has_progress(run_dir: Path) -> bool:
    """Whether the run logged a row: the learning-curve and credit plots need one."""
    progress = run_dir / PROGRESS_FILE
    return progress.exists() and progress.stat().st_size > 0


def _expected_plots(run_dir: Path) -> list[str]:
    """The plots :func:`write_plots` makes for this run folder's files."""
    from milegpo.run.plots import trajectory_credit_unplottable

    names = [LEARNING_CURVE_PNG, CREDIT_DIAGNOSTICS_PNG] if _has_progress(run_dir) else []
    drawn = (run_dir / LAST_BATCH_FILE).exists() and trajectory_credit_unplottable(run_dir) is None
    return names + ([TRAJECTORY_CREDIT_PNG] if drawn else [])


def write_plots_safely(run_dir: Path) -> bool:
    """:func:`write_plots` after training: a plot that fails is a warning, never a failed run
    (the model and its evaluation are written by then); ``--resume`` of the run writes it later."""
    try:
        write_plots(run_dir)
        return True
    except Exception as exc:
        print(f"warning: plotting {run_dir} failed ({type(exc).__name__}: {exc}); the trained run is complete. "
              f"`milegpo train --resume {run_dir}` writes the missing plots", file=sys.stderr)
        return False


def write_plots(run_dir: Path) -> None:
    """The run folder's plots from its logs: the learning curve, the credit diagnostics and the last
    batch's trajectory credit."""
    from milegpo.run.plots import (
        plot_credit_diagnostics,
        plot_learning_curve,
        plot_run_trajectory_credit,
    )

    progress = run_dir / PROGRESS_FILE
    if _has_progress(run_dir):
        config = TrainConfig.from_file(run_dir / CONFIG_FILE) if (run_dir / CONFIG_FILE).exists() else TrainConfig()
        plot_learning_curve(progress, run_dir / LEARNING_CURVE_PNG, title=run_dir.name, eval_splits=config.eval.splits)
        plot_credit_diagnostics(progress, run_dir / CREDIT_DIAGNOSTICS_PNG, title=run_dir.name)
    plot_run_trajectory_credit(run_dir)  # trajectory_credit.png from last_batch.npz (nothing without one)
