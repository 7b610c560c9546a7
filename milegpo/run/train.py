"""Training runs: one config in, one run folder out (what ``milegpo train`` does).

A run folder holds everything needed to read, plot, evaluate or resume the run (its
layout and file names: :mod:`milegpo.run_folder`).

A run killed at any moment (even ``kill -9``) resumes with ``train(config, run_dir,
resume=True)`` (``milegpo train --resume RUN_DIR``) from its newest intact
checkpoint: every log is first cut back to that checkpoint's iteration
(:mod:`milegpo.run.logs`), so after any number of kills each iteration is logged
exactly once. Resuming a finished run does nothing. The whole config is checked
(values, env, model, device) before anything is written.

The config is a :class:`~milegpo.run.config.TrainConfig`; ``milegpo train`` with no arguments
runs its ``cpu-demo`` preset (MileGPO in choose mode on the built-in House env with an offline
tiny model), the settings of the learning-efficiency benchmark. ``--preset paper-alfworld`` and
``--preset paper-webshop`` are the paper's GPU settings.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import sys
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from milegpo.config.policy import absolute_model_path
from milegpo.envs import env_vocabulary, make_env
from milegpo.envs.core import HELD_OUT_SPLIT
from milegpo.run.config import TrainConfig, eval_task_seeds
from milegpo.run.heap import frozen_heap
from milegpo.run_folder import (
    BASE_MODEL_DIR,
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    CREDIT_DIAGNOSTICS_PNG,
    ENV_ERRORS_FILE,
    EVAL_CURVE_FILE,
    EVAL_FINAL_FILE,
    FINAL_DIR,
    LAST_BATCH_FILE,
    LEARNING_CURVE_PNG,
    LOCK_FILE,
    PROGRESS_FILE,
    TRAJECTORY_CREDIT_PNG,
    WARM_START_FILE,
    write_atomic,
)

if TYPE_CHECKING:
    from milegpo.run.lock import RunFolderLock


def remember_env_module(config: TrainConfig) -> None:
    """Let a run's env module be imported from the folder it was trained from (``env.module_dir``): eval,
    resume, export and serve of a run of the user's own env work from any directory."""
    if config.env.module_dir is not None:
        from milegpo.envs.registration import remember_module_dir

        remember_module_dir(config.env.module_dir)


def with_env_module_dir(config: TrainConfig) -> TrainConfig:
    """``config`` with ``env.module_dir`` set to the folder the env's module was imported from when it is no
    installed package (checked setup has imported it)."""
    from milegpo.envs.registration import env_module_folder

    folder = env_module_folder(config.env.id)
    if config.env.module_dir is not None or folder is None:
        return config
    return config.replace(**{"env.module_dir": folder})


def run_base_model(config: TrainConfig, run_dir: str | Path) -> str:
    """The base model of a run folder's checkpoints: ``config.policy.model`` (a hub id, or a local path
    made absolute when the run started), else the folder's own ``base_model/`` wherever the folder is
    now: a run folder moved or copied, or used from another directory, loads its own base."""
    if config.policy.model is not None:
        return config.policy.model
    return str((Path(run_dir) / BASE_MODEL_DIR).resolve())


def with_absolute_model_path(config: TrainConfig) -> TrainConfig:
    """``config`` with a local ``policy.model`` path made absolute (a hub id unchanged): the run folder's
    config then names the same model from any working directory."""
    model = absolute_model_path(config.policy.model)
    return config if model == config.policy.model else config.replace(**{"policy.model": model})


def prepare_model(config: TrainConfig, run_dir: Path) -> str:
    """The model path of the run: ``config.policy.model``, or a tiny model built offline in the run folder."""
    target = run_base_model(config, run_dir)
    if config.policy.model is not None or (Path(target) / "config.json").exists():
        return target
    from milegpo.policies.tiny import env_tiny_model

    texts = env_vocabulary(config.env.id, config.env.kwargs_for(config.env.train_split), seed=config.run.seed)
    return env_tiny_model(texts, target, config.run.tiny_model, seed=config.run.seed)


def eval_seed(config: TrainConfig, split: str | None) -> int:
    """The seed of a split's sampled evaluation: fixed per (run seed, split), so a checkpoint's score on
    a split does not depend on what was evaluated before it."""
    return zlib.crc32(f"{config.run.seed}:{split}".encode())


def _eval_env(config: TrainConfig, split: str | None):
    from milegpo.envs import make_vec_env  # imports SB3 and torch: not at module import

    return make_vec_env(config.env.id, n_tasks=config.eval.n_tasks, group_size=config.eval.copies, seed=config.run.seed,
                        env_kwargs=config.env.kwargs_for(split), subprocess=config.env.subprocess,
                        n_workers=config.env.n_workers, timeout=config.env.worker_timeout_s)


def default_run_dir(config: TrainConfig) -> Path:
    name = config.env.id.split("/")[-1].lower()
    return Path("runs") / f"{config.algo.method}-{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def train(config: TrainConfig, run_dir: str | Path | None = None, resume: bool = False, progress_bar: bool = True,
          verbose: int = 1, restart: bool = False) -> Path:
    """Train (or resume) a run and write its folder; returns the folder's path.

    Under ``torchrun --nproc_per_node N`` the run is data-parallel: the process group is
    initialised here (gloo on CPU, NCCL on GPU), each rank plays ``n_tasks / N`` of the
    task groups, the update is one update over all of them, and rank 0 alone writes the
    run folder, evaluates (held-out evaluation runs on rank 0 while the others wait) and
    checkpoints. A resume may use another number of ranks.

    A new run needs a new or empty ``run_dir``. ``resume`` with no intact checkpoint starts over only
    when the folder holds nothing to lose; otherwise it stops (:class:`RunFolderError`) unless
    ``restart`` is set, which moves the old logs and checkpoints into ``run_dir/previous-<time>/``.

    Raises ``ValueError`` for a bad config (before anything is written), :class:`RunFolderError`
    for a ``run_dir`` that would be overwritten, ``FileNotFoundError`` when ``resume`` names no
    run folder.
    """
    from milegpo.algos import distributed
    from milegpo.run.checks import check_setup, fit_splits_to_env
    from milegpo.run.tracking import check_available

    if restart and not resume:
        raise ValueError("--restart applies to a resumed run: milegpo train --resume RUN_DIR --restart")
    remember_env_module(config)
    config = fit_splits_to_env(config, verbose)
    check_setup(config)
    config = with_env_module_dir(config)
    check_available(config.run.report_to)
    config = with_absolute_model_path(config)
    set_torch_threads(config)
    from milegpo.algos import preemption

    owns_group = distributed.launched_by_torchrun() and not distributed.group_initialized()
    world = distributed.init_from_environment(config.run.device)
    try:
        with preemption.stop_on_signals():
            return _train_ranks(config, world, run_dir, resume, progress_bar, verbose, restart)
    finally:
        if owns_group:  # a rank that exits with its process group alive can abort in gloo's threads
            distributed.shutdown()


def set_torch_threads(config: TrainConfig) -> int:
    """Set torch's CPU threads for the run (``run.torch_threads``; null: 1 for the offline tiny model, torch's
    default for a named model); returns the number in use."""
    import torch

    threads = config.run.torch_threads or (1 if config.policy.model is None else None)
    if threads is not None:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def _lock_run_dir(run_dir: Path, world: Any) -> RunFolderLock | None:
    """Rank 0 takes the run folder's writer lock; every rank raises the refusal when another
    process holds it (:mod:`milegpo.run.lock`). Returns the held lock (None on the other ranks)."""
    from milegpo.algos import distributed
    from milegpo.run.lock import RunFolderBusyError, RunFolderLock

    lock, refusal = None, None
    if world.is_main:
        try:
            lock = RunFolderLock(run_dir).acquire()
        except RunFolderBusyError as exc:
            refusal = str(exc)
    refusal = distributed.broadcast_from_main(refusal, world)
    if refusal is not None:
        raise RunFolderBusyError(refusal)
    return lock


def _train_ranks(config: TrainConfig, world: Any, run_dir: str | Path | None, resume: bool, progress_bar: bool,
                 verbose: int, restart: bool = False) -> Path:
    """:func:`train` in an initialised world (one process, or this rank of several)."""
    from milegpo.algos import distributed

    if config.env.n_tasks % world.size:
        raise ValueError(f"n_tasks ({config.env.n_tasks}) must be a multiple of the number of processes "
                         f"({world.size}): "
                         "each process plays whole task groups")
    run_dir = Path(distributed.broadcast_from_main(str(run_dir or default_run_dir(config)), world))
    if resume and not (run_dir / CONFIG_FILE).exists():
        raise FileNotFoundError(f"{str(run_dir)!r} is not a run folder (no {CONFIG_FILE}); pass the folder `milegpo "
                                f"train` wrote")
    if not resume and not (run_dir / CONFIG_FILE).exists():
        check_new_run_dir(run_dir)  # before the lock makes the folder: a file or a user's folder stays untouched
    lock = _lock_run_dir(run_dir, world)
    created = lock is not None and lock.created_folder
    try:
        if not resume:  # again under the lock: another process may have started this run meanwhile
            check_new_run_dir(run_dir)
        return _train_locked(config, world, run_dir, resume, progress_bar, verbose, restart, created)
    finally:
        if lock is not None:
            lock.release()


def _train_locked(config: TrainConfig, world: Any, run_dir: Path, resume: bool, progress_bar: bool, verbose: int,
                  restart: bool, created: bool) -> Path:
    """:func:`train` with the run folder's writer lock held (by rank 0)."""
    from milegpo.algos import distributed, preemption

    main = world.is_main
    verbose = verbose if main else 0
    checkpoint = None
    if resume:
        if main:
            _remove_stale_saves(run_dir, verbose)
        if _finished(run_dir, config, verbose, main, progress_bar):
            return run_dir
        refusal = None
        if main:
            checkpoint = _latest_intact(run_dir / CHECKPOINTS_DIR)
            refusal = None if checkpoint is not None else _start_over(run_dir, restart, verbose)
        checkpoint, refusal = distributed.broadcast_from_main((checkpoint, refusal), world)
        if refusal is not None:
            raise RunFolderError(refusal)

    from milegpo.envs import make_vec_env

    env = None
    try:
        if main:
            run_dir.mkdir(parents=True, exist_ok=True)
            write_atomic(run_dir / CONFIG_FILE, json.dumps(config.to_dict(), indent=2) + "\n")
            model_path = prepare_model(config, run_dir)
        model_path = distributed.broadcast_from_main(model_path if main else None, world)
        env = make_vec_env(config.env.id, n_tasks=config.env.n_tasks // world.size, group_size=config.env.group_size,
                           seed=config.run.seed, env_kwargs=config.env.kwargs_for(config.env.train_split),
                           subprocess=config.env.subprocess, shard=(world.rank, world.size),
                           n_workers=config.env.n_workers, timeout=config.env.worker_timeout_s)
        env.errors.path = run_dir / ENV_ERRORS_FILE
        device = distributed.rank_device(config.run.device, world)
        if checkpoint is not None:
            from milegpo.algos import ALGORITHMS

            model = ALGORITHMS[config.algo.method].load(checkpoint, env=env, device=device,
                                                        base_model=run_base_model(config, run_dir))
            if verbose:
                print(f"Resuming from {checkpoint} at {model.num_timesteps} env steps (iteration {model.iterations})")
        else:
            model = start_model(config, env, model_path, device, run_dir if main else None, verbose)
    except BaseException:
        if env is not None:
            env.close()
        if main and created:
            _remove_untrained(run_dir)
        raise
    resumed = checkpoint is not None

    callbacks: list[Any] = []
    eval_envs: list[Any] = []
    if main:
        from milegpo.algos import CheckpointCallback, EvalCallback
        from milegpo.algos.run_outputs import KeptBatchCallback
        from milegpo.run.logs import configure_run_logger, rollback_logs

        if resume:  # cut the logs back to the checkpoint (everything, when starting over)
            iteration = model.iterations if resumed else -1
            dropped = rollback_logs(run_dir, iteration, model.num_timesteps if resumed else -1)
            if verbose and any(dropped.values()):
                print(f"Logs cut back to iteration {iteration}: dropped " +
                      ", ".join(f"{n} row(s) of {name}" for name, n in dropped.items() if n))
        model.set_logger(configure_run_logger(run_dir, verbose=verbose, report_to=config.run.report_to,
                                              config=config.to_dict()))
        saver = CheckpointCallback(config.run.checkpoint_freq, run_dir / CHECKPOINTS_DIR,
                                   save_every_s=config.run.checkpoint_every_s)
        if config.run.keep_batch_every:  # before the saver: a checkpoint never precedes its iteration's kept batch
            callbacks.append(KeptBatchCallback(config.run.keep_batch_every, run_dir))
        callbacks.append(saver)
        for index, split in enumerate(config.eval.splits):  # every split in the log rows, the first is eval.jsonl
            eval_envs.append(_eval_env(config, split))
            callbacks.append(EvalCallback(eval_envs[-1], eval_freq=config.eval.freq,
                                          task_seeds=eval_task_seeds(split, config.eval.n_tasks),
                                          seed=eval_seed(config, split), log_name=f"eval/{split}",
                                          curve_file=EVAL_CURVE_FILE if index == 0 else None,
                                          **_eval_sampling(config)))
    else:
        from stable_baselines3.common.logger import Logger

        model.set_logger(Logger(folder=None, output_formats=[]))  # rank 0 logs for everyone
    remaining = config.run.total_timesteps - model.num_timesteps
    with frozen_heap():  # the libraries' and the model's objects skip the run's full cycle collections
        try:
            if remaining > 0:
                model.learn(remaining, callback=callbacks, reset_num_timesteps=not resumed,
                            progress_bar=progress_bar and main)
        finally:
            env.close()
            for eval_env in eval_envs:
                eval_env.close()
        signum = preemption.stop_requested()
        if preemption.stop_agreed(world):  # stopped at a safe point: the last completed iteration is saved
            assert signum is not None or world.distributed
            if main and created and model.iterations == 0:
                _remove_untrained(run_dir)
            raise preemption.RunStopped(_stopped_message(run_dir, model, saver if main else None, signum, created),
                                        signum or signal.SIGTERM)
        if main:
            model.save(run_dir / FINAL_DIR)
            _finish(model, config, run_dir, verbose, progress_bar, logger=model.logger)
    distributed.barrier(world)  # the other ranks wait for rank 0's final save and evaluation
    return run_dir


def _remove_untrained(run_dir: Path) -> None:
    """Remove a new run's folder that trained nothing (no checkpoint): no stray folder is left behind."""
    if not any((run_dir / CHECKPOINTS_DIR).glob("*")):
        shutil.rmtree(run_dir, ignore_errors=True)


def _stopped_message(run_dir: Path, model: Any, saver: Any, signum: signal.Signals | None, created: bool) -> str:
    """The one line of a run stopped on a signal: what is saved and how to continue (a new run stopped
    before its first iteration ended is removed, as any new run that trained nothing)."""
    name = signum.name if signum is not None else "a stop request"
    where = f"iteration {model.iterations}, {model.num_timesteps} env steps"
    if saver is not None and saver.last_path is not None:
        return (f"stopped on {name} at {where}: checkpoint {saver.last_path}; continue with milegpo train --resume "
                f"{run_dir}")
    if model.iterations == 0 and created:
        return (f"stopped on {name} before the first iteration ended: nothing was trained, so the new run folder "
                f"{run_dir} is removed; run the same command again to start over")
    if model.iterations == 0:
        return (f"stopped on {name} before the first iteration ended: nothing trained to save; start the run over "
                f"with milegpo train --resume {run_dir} --restart")
    return f"stopped on {name} at {where}; continue with milegpo train --resume {run_dir}"


def start_model(config: TrainConfig, env: Any, model_path: str, device: str = "cpu",
                run_dir: Path | None = None, verbose: int = 0) -> Any:
    """The untrained model a run of ``config`` starts from, on the vec env ``env``: built with
    the run's settings and seed, then warm-started when ``config.run.warm_start`` is set (its report
    goes to ``run_dir`` when given). What :func:`train` trains; benchmarks also sample from it."""
    model = _new_model(config, env, model_path, verbose, device)
    if config.run.warm_start is not None:
        _warm_start(model, config, run_dir, verbose)
    return model


def _new_model(config: TrainConfig, env: Any, model_path: str, verbose: int, device: str) -> Any:
    from milegpo.algos import ALGORITHMS

    policy = dataclasses.replace(config.policy, model=model_path)
    return ALGORITHMS[config.algo.method]("LLMPolicy", env, config.algo, policy_kwargs=policy, verbose=verbose,
                                          seed=config.run.seed, device=device)


def _warm_start(model: Any, config: TrainConfig, run_dir: Path | None, verbose: int) -> None:
    """Clone the env's noisy expert into the fresh policy (every rank alike: same seed, same
    demonstrations), and write the report to ``warm_start.json`` on the main rank."""
    from milegpo.algos.warm_start import warm_start

    settings = config.run.warm_start
    assert settings is not None
    if settings.seed is None:
        settings = dataclasses.replace(settings, seed=config.run.seed)
    env = make_env(config.env.id, **{**config.env.kwargs_for(config.env.train_split), **settings.env_kwargs})
    try:
        report = warm_start(model.policy, env, settings, micro_batch_tokens=model.config.micro_batch_tokens)
    except NotImplementedError as error:
        raise ValueError(f"warm_start needs an env with a scripted expert: {error}") from error
    finally:
        env.close()
    if run_dir is not None:
        write_atomic(run_dir / WARM_START_FILE, json.dumps(report, indent=2) + "\n")
    if verbose:
        fit = report["epochs"][-1]
        print(f"Warm start: {report['steps']} demonstration steps (demonstrator success "
              f"{report['demonstrator']['success_rate']:.2f}), final nll {fit['nll']:.3f}, "
              f"{report['collect_seconds'] + report['fit_seconds']:.0f} s")


def _remove_stale_saves(run_dir: Path, verbose: int) -> None:
    """Delete the temporary folders of checkpoint saves a kill interrupted (run folder and checkpoints/)."""
    from milegpo.algos.checkpoint import remove_stale_saves

    done = remove_stale_saves(run_dir) + remove_stale_saves(run_dir / CHECKPOINTS_DIR)
    if done and verbose:
        print(f"Cleaned up {len(done)} checkpoint save(s) a killed run left unfinished: " + "; ".join(done))


class RunFolderError(ValueError):
    """A run folder that training would overwrite or wipe: the message names what is there and the choices."""


def check_new_run_dir(run_dir: Path) -> None:
    """A new run writes only into a new or empty folder: never over another run or a user's files."""
    if not run_dir.exists() or (run_dir.is_dir() and all(child.name == LOCK_FILE for child in run_dir.iterdir())):
        return
    if (run_dir / CONFIG_FILE).exists():
        raise RunFolderError(f"{str(run_dir)!r} is already a run folder: continue it with --resume {run_dir}, "
                             "or choose another --run-dir")
    what = "a file" if not run_dir.is_dir() else "not empty and no run folder"
    raise RunFolderError(f"--run-dir {str(run_dir)!r} is {what}: choose a new or empty folder")


def _start_over(run_dir: Path, restart: bool, verbose: int) -> str | None:
    """A resume that found no intact checkpoint: start from scratch when the folder holds nothing to
    lose, or after ``restart`` moved its contents aside; else the refusal to raise (None: go on)."""
    from milegpo.run.logs import move_logs_aside, run_contents

    found = run_contents(run_dir)
    if found and not restart:
        shown = ", ".join(found[:6]) + (f" and {len(found) - 6} more" if len(found) > 6 else "")
        return (f"{run_dir} has no intact checkpoint to resume from (found {shown}); nothing was changed. "
                f"Train anew with --run-dir NEW_DIR, or start this run over with --resume {run_dir} --restart "
                f"(its logs and checkpoints move to {run_dir}/previous-<time>/, nothing is deleted)")
    if found:
        aside = move_logs_aside(run_dir)
        print(f"Restarting {run_dir} from scratch: its earlier logs and checkpoints are in {aside}")
    elif verbose:
        print(f"{run_dir} has no checkpoint and no logs yet: starting the run from the beginning")
    return None


def _latest_intact(folder: Path) -> str | None:
    """The newest checkpoint of ``folder`` that reads back intact; a corrupt one is moved aside
    to ``corrupt-<name>`` with a warning and the next older one tried. None when there is none."""
    from milegpo.algos.checkpoint import CheckpointError, checkpoints, read_config

    for path in checkpoints(folder):
        try:
            read_config(path)  # complete, and every file as written (its manifest)
        except CheckpointError as exc:
            aside = path.with_name(f"corrupt-{path.name}")
            os.replace(path, aside)
            print(f"warning: {exc}. Moved it to {aside}; trying the next older checkpoint", file=sys.stderr)
            continue
        return str(path)
    return None


def _finished(run_dir: Path, config: TrainConfig, verbose: int, main: bool = True, progress_bar: bool = True) -> bool:
    """Whether a run folder's final checkpoint already reached ``config.run.total_timesteps``;
    if only its final evaluation is missing (killed during it), rank 0 runs that."""
    from milegpo.algos import ALGORITHMS
    from milegpo.algos.checkpoint import CheckpointError, read_config

    try:
        counters = read_config(run_dir / FINAL_DIR)["counters"]
    except CheckpointError:
        return False
    if counters["num_timesteps"] < config.run.total_timesteps:
        return False
    if not main:
        return True
    if (run_dir / EVAL_FINAL_FILE).exists():
        missing = [name for name in _expected_plots(run_dir) if not (run_dir / name).exists()]
        if missing and write_plots_safely(run_dir):
            print(f"Wrote the missing plot(s) {', '.join(missing)} of {run_dir}")
        print(f"{run_dir} is finished ({counters['num_timesteps']} of {config.run.total_timesteps} env steps): "
              f"nothing to do. To train further: milegpo train --resume {run_dir} run.total_timesteps=N (N > "
              f"{counters['num_timesteps']})")
        return True
    model = ALGORITHMS[config.algo.method].load(run_dir / FINAL_DIR, device=config.run.device,
                                                base_model=run_base_model(config, run_dir))
    _finish(model, config, run_dir, verbose, progress_bar)
    return True


def _finish(model: Any, config: TrainConfig, run_dir: Path, verbose: int, progress_bar: bool,
            logger: Any = None) -> None:
    """Final held-out evaluation and plots of a trained run; both go to the experiment trackers
    (those of ``logger``, or opened again for a run whose final evaluation a kill interrupted)."""
    from stable_baselines3.common.logger import Logger

    from milegpo.run.tracking import finish_trackers, tracker_formats

    results = evaluate_model(model, config, progress=progress_bar and bool(verbose))
    write_atomic(run_dir / EVAL_FINAL_FILE, json.dumps(results, indent=2) + "\n")
    write_plots_safely(run_dir)
    if logger is None:
        logger = Logger(folder=None, output_formats=tracker_formats(config.run.report_to, run_dir, config.to_dict()))
    plots = sorted(run_dir.glob("*.png")) + [run_dir / EVAL_FINAL_FILE]
    finish_trackers(logger, results, plots)
    if verbose:
        for split, result in results.items():
            name = "seeds" if split == HELD_OUT_SPLIT else split  # an env without splits: its held-out seeds
            print(f"held-out {name}: success {result['success_rate']:.3f} over {result['n_tasks']} tasks x "
                  f"{config.eval.copies}")
        print(f"Run folder: {run_dir}")


def _eval_sampling(config: TrainConfig) -> dict[str, Any]:
    """Greedy when ``eval_temperature`` is None, else sampled at that temperature."""
    if config.eval.temperature is None:
        return {"deterministic": True}
    return {"deterministic": False, "temperature": config.eval.temperature}


def evaluate_model(model: Any, config: TrainConfig, splits: list[str] | None = None,
                   n_tasks: int | None = None, progress: bool = False) -> dict[str, dict[str, Any]]:
    """Success on the first ``n_tasks`` tasks of each eval split, sampled at ``config.eval.temperature``
    (greedy when it is None) with the split's fixed :func:`eval_seed`."""
    results = {}
    for split in splits or config.eval.splits:  # none: the run has no held-out evaluation
        env = _eval_env(config, split)
        try:
            result = model.evaluate(env, task_seeds=eval_task_seeds(split, n_tasks or config.eval.n_tasks),
                                    seed=eval_seed(config, split), progress=progress, **_eval_sampling(config))
        finally:
            env.close()
        results[str(split)] = {k: v for k,
                               v in result.items() if k != "per_task"} | {"n_tasks": n_tasks or config.eval.n_tasks}
    return results


def load_run(run_dir: str | Path) -> tuple[TrainConfig, Any]:
    """The config and the final (or latest) model of a run folder."""
    from milegpo.algos import ALGORITHMS, latest_checkpoint

    run_dir = Path(run_dir)
    if not (run_dir / CONFIG_FILE).exists():
        raise FileNotFoundError(f"{str(run_dir)!r} is not a run folder (no {CONFIG_FILE}); pass the folder `milegpo "
                                f"train` wrote")
    config = TrainConfig.from_file(run_dir / CONFIG_FILE)
    remember_env_module(config)
    checkpoint = run_dir / FINAL_DIR if (run_dir / FINAL_DIR).exists() else latest_checkpoint(run_dir / CHECKPOINTS_DIR)
    if checkpoint is None:
        raise FileNotFoundError(f"run folder {str(run_dir)!r} has no checkpoint yet ({FINAL_DIR}/ or "
                                f"{CHECKPOINTS_DIR}/)")
    return config, ALGORITHMS[config.algo.method].load(checkpoint, device=config.run.device,
                                                       base_model=run_base_model(config, run_dir))


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
