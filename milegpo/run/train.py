"""Training runs: one config in, one run folder out (what ``milegpo train`` does).

A run folder holds everything needed to read, plot, evaluate or resume the run (its
layout and file names: :mod:`milegpo.run_folder`).

A run killed at any moment (even ``kill -9``) resumes with ``train(config, run_dir,
resume=True)`` (``milegpo train --resume RUN_DIR``) from its newest intact
checkpoint: every log is first cut back to that checkpoint's iteration
(:mod:`milegpo.run.logs`), so after any number of kills each iteration is logged
exactly once. Resuming a finished run does nothing. The whole config is checked
(values, env, model, device) before anything is written.

:func:`train` resolves the run once into a :class:`~milegpo.run.plan.RunPlan` (the checked
settings and everything derived from them) and trains from the plan; the run folder's start
(new or resumed) is :mod:`milegpo.run.resume`, its end (final evaluation, plots) :mod:`milegpo.run.finish`.

The config is a :class:`~milegpo.config.run.TrainConfig`; ``milegpo train`` with no arguments
runs its ``cpu-demo`` preset (MileGPO in choose mode on the built-in House env with an offline
tiny model), the settings of the learning-efficiency benchmark. ``--preset paper-alfworld`` and
``--preset paper-webshop`` are the paper's GPU settings.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from milegpo.config.run import TrainConfig
from milegpo.config.warm_start import WarmStartConfig
from milegpo.envs import env_vocabulary, make_env
from milegpo.run.finish import finish_run, finished
from milegpo.run.heap import frozen_heap
from milegpo.run.plan import RunPlan, checked_settings, default_run_dir, set_torch_threads
from milegpo.run.resume import (
    RunFolderError,
    check_new_run_dir,
    latest_intact,
    lock_run_dir,
    remove_stale_saves,
    remove_untrained,
    start_over,
    stopped_message,
)
from milegpo.run_folder import (
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    ENV_ERRORS_FILE,
    EVAL_CURVE_FILE,
    FINAL_DIR,
    WARM_START_FILE,
    write_atomic,
)


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
    from milegpo.algos import distributed, preemption

    if restart and not resume:
        raise ValueError("--restart applies to a resumed run: milegpo train --resume RUN_DIR --restart")
    settings = checked_settings(config, verbose)
    set_torch_threads(settings)
    folder = str(run_dir or default_run_dir(settings))  # rank 0's is broadcast: the ranks' clocks may differ
    owns_group = distributed.launched_by_torchrun() and not distributed.group_initialized()
    world = distributed.init_from_environment(settings.run.device)
    try:
        with preemption.stop_on_signals():
            if settings.env.n_tasks % world.size:
                raise ValueError(f"n_tasks ({settings.env.n_tasks}) must be a multiple of the number of processes "
                                 f"({world.size}): each process plays whole task groups")
            plan = RunPlan.of(settings, Path(distributed.broadcast_from_main(folder, world)), world, resume, restart)
            return _train_in_folder(plan, progress_bar, verbose)
    finally:
        if owns_group:  # a rank that exits with its process group alive can abort in gloo's threads
            distributed.shutdown()


def _train_in_folder(plan: RunPlan, progress_bar: bool, verbose: int) -> Path:
    """:func:`train` in an initialised world (one process, or this rank of several): the run folder is
    checked and locked, then trained in."""
    run_dir = plan.run_dir
    if plan.resume and not (run_dir / CONFIG_FILE).exists():
        raise FileNotFoundError(f"{str(run_dir)!r} is not a run folder (no {CONFIG_FILE}); pass the folder `milegpo "
                                f"train` wrote")
    if not plan.resume and not (run_dir / CONFIG_FILE).exists():
        check_new_run_dir(run_dir)  # before the lock makes the folder: a file or a user's folder stays untouched
    lock = lock_run_dir(run_dir, plan.world, new_run=not plan.resume)
    created = lock is not None and lock.created_folder
    try:
        return _train_locked(plan, progress_bar, verbose, created)
    finally:
        if lock is not None:
            lock.release()


def _resume_point(plan: RunPlan, verbose: int, progress_bar: bool) -> tuple[bool, str | None]:
    """Where a resumed run continues: (finished already, the checkpoint to load or None to start over);
    the refusal of a folder with nothing to resume and something to lose is raised on every rank."""
    from milegpo.algos import distributed

    main = plan.world.is_main
    if main:
        remove_stale_saves(plan.run_dir, verbose)
    if finished(plan, verbose, progress_bar):
        return True, None
    checkpoint, refusal = None, None
    if main:
        checkpoint = latest_intact(plan.run_dir / CHECKPOINTS_DIR)
        refusal = None if checkpoint is not None else start_over(plan.run_dir, plan.restart, verbose)
    checkpoint, refusal = distributed.broadcast_from_main((checkpoint, refusal), plan.world)
    if refusal is not None:
        raise RunFolderError(refusal)
    return False, checkpoint


def _train_locked(plan: RunPlan, progress_bar: bool, verbose: int, created: bool) -> Path:
    """:func:`train` with the run folder's writer lock held (by rank 0)."""
    from milegpo.algos import distributed, preemption

    settings, run_dir, world = plan.settings, plan.run_dir, plan.world
    main = world.is_main
    verbose = verbose if main else 0
    checkpoint = None
    if plan.resume:
        done, checkpoint = _resume_point(plan, verbose, progress_bar)
        if done:
            return run_dir
    env = None
    try:
        if main:
            run_dir.mkdir(parents=True, exist_ok=True)
            write_atomic(run_dir / CONFIG_FILE, json.dumps(settings.to_dict(), indent=2) + "\n")
            _prepare_model(plan)
        distributed.barrier(world)  # the other ranks load the base model rank 0 may have just built
        env = plan.train_env()
        env.errors.path = run_dir / ENV_ERRORS_FILE
        device = distributed.rank_device(settings.run.device, world)
        if checkpoint is not None:
            from milegpo.algos import ALGORITHMS

            model = ALGORITHMS[settings.algo.method].load(checkpoint, env=env, device=device,
                                                          base_model=plan.base_model)
            if verbose:
                print(f"Resuming from {checkpoint} at {model.num_timesteps} env steps (iteration {model.iterations})")
        else:
            model = _start_model(plan, env, device, run_dir if main else None, verbose)
    except BaseException:
        if env is not None:
            env.close()
        if main and created:
            remove_untrained(run_dir)
        raise
    resumed = checkpoint is not None
    callbacks, eval_envs, saver = _outputs(plan, model, resumed, verbose)
    remaining = settings.run.total_timesteps - model.num_timesteps
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
                remove_untrained(run_dir)
            raise preemption.RunStopped(stopped_message(run_dir, model, saver, signum, created),
                                        signum or signal.SIGTERM)
        if main:
            model.save(run_dir / FINAL_DIR)
            finish_run(model, plan, verbose, progress_bar, logger=model.logger)
    distributed.barrier(world)  # the other ranks wait for rank 0's final save and evaluation
    return run_dir


def _outputs(plan: RunPlan, model: Any, resumed: bool, verbose: int) -> tuple[list[Any], list[Any], Any]:
    """What a run writes as it trains, on rank 0: the logs (cut back to the checkpoint on a resume), the
    kept batches, the checkpoints and the held-out evaluations. Returns the callbacks, the evaluation
    envs (to close) and the checkpoint saver (None on the other ranks, which log nothing)."""
    if not plan.world.is_main:
        from stable_baselines3.common.logger import Logger

        model.set_logger(Logger(folder=None, output_formats=[]))  # rank 0 logs for everyone
        return [], [], None
    from milegpo.algos import CheckpointCallback, EvalCallback
    from milegpo.algos.run_outputs import KeptBatchCallback
    from milegpo.run.logs import configure_run_logger, rollback_logs

    settings, run_dir = plan.settings, plan.run_dir
    if plan.resume:  # cut the logs back to the checkpoint (everything, when starting over)
        iteration = model.iterations if resumed else -1
        dropped = rollback_logs(run_dir, iteration, model.num_timesteps if resumed else -1)
        if verbose and any(dropped.values()):
            print(f"Logs cut back to iteration {iteration}: dropped " +
                  ", ".join(f"{n} row(s) of {name}" for name, n in dropped.items() if n))
    model.set_logger(configure_run_logger(run_dir, verbose=verbose, trackers=plan.trackers,
                                          config=settings.to_dict()))
    saver = CheckpointCallback(settings.run.checkpoint_freq, run_dir / CHECKPOINTS_DIR,
                               save_every_s=settings.run.checkpoint_every_s)
    callbacks: list[Any] = []
    if settings.run.keep_batch_every:  # before the saver: a checkpoint never precedes its iteration's kept batch
        callbacks.append(KeptBatchCallback(settings.run.keep_batch_every, run_dir))
    callbacks.append(saver)
    eval_envs = []
    for index, split in enumerate(plan.eval_splits):  # every split in the log rows, the first is eval.jsonl
        eval_envs.append(plan.eval_env(split))
        callbacks.append(EvalCallback(eval_envs[-1], eval_freq=settings.eval.freq, task_seeds=list(split.task_seeds),
                                      seed=split.seed, log_name=f"eval/{split.name}",
                                      curve_file=EVAL_CURVE_FILE if index == 0 else None, **plan.eval_sampling))
    return callbacks, eval_envs, saver


def run_base_model(config: TrainConfig, run_dir: str | Path) -> str:
    """The base model of a run folder's checkpoints: ``config.policy.model`` (a hub id, or a local path
    made absolute when the run started), else the folder's own ``base_model/`` wherever the folder is
    now: a run folder moved or copied, or used from another directory, loads its own base."""
    return RunPlan.of(config, run_dir).base_model


def prepare_model(config: TrainConfig, run_dir: Path) -> str:
    """The model path of a run of ``config``: ``config.policy.model``, or a tiny model built offline in the
    run folder."""
    plan = RunPlan.of(config, run_dir)
    _prepare_model(plan)
    return plan.base_model


def _prepare_model(plan: RunPlan) -> None:
    """Build the offline tiny model in the run folder when no model is named and none is there yet."""
    if plan.settings.policy.model is not None or (Path(plan.base_model) / "config.json").exists():
        return
    from milegpo.policies.tiny import env_tiny_model

    settings = plan.settings
    texts = env_vocabulary(settings.env.id, dict(plan.train_split.env_kwargs), seed=settings.run.seed)
    env_tiny_model(texts, plan.base_model, settings.run.tiny_model, seed=settings.run.seed)


def start_model(config: TrainConfig, env: Any, model_path: str, device: str = "cpu",
                run_dir: Path | None = None, verbose: int = 0) -> Any:
    """The untrained model a run of ``config`` starts from, on the vec env ``env``: built with
    the run's settings and seed, then warm-started when ``config.run.warm_start`` is set (its report
    goes to ``run_dir`` when given). What :func:`train` trains; benchmarks also sample from it."""
    plan = RunPlan.of(config.replace(**{"policy.model": model_path}), run_dir or ".")
    return _start_model(plan, env, device, run_dir, verbose)


def _start_model(plan: RunPlan, env: Any, device: str, report_dir: Path | None, verbose: int) -> Any:
    from milegpo.algos import ALGORITHMS

    settings = plan.settings
    model = ALGORITHMS[settings.algo.method]("LLMPolicy", env, settings.algo, policy_kwargs=plan.policy,
                                             verbose=verbose, seed=settings.run.seed, device=device)
    if plan.warm_start is not None:
        _warm_start(model, plan, plan.warm_start, report_dir, verbose)
    return model


def _warm_start(model: Any, plan: RunPlan, settings: WarmStartConfig, report_dir: Path | None, verbose: int) -> None:
    """Clone the env's noisy expert into the fresh policy (every rank alike: same seed, same
    demonstrations), and write the report to ``warm_start.json`` on the main rank."""
    from milegpo.algos.warm_start import warm_start

    env = make_env(plan.settings.env.id, **{**plan.train_split.env_kwargs, **settings.env_kwargs})
    try:
        report = warm_start(model.policy, env, settings, micro_batch_tokens=model.config.micro_batch_tokens)
    except NotImplementedError as error:
        raise ValueError(f"warm_start needs an env with a scripted expert: {error}") from error
    finally:
        env.close()
    if report_dir is not None:
        write_atomic(report_dir / WARM_START_FILE, json.dumps(report, indent=2) + "\n")
    if verbose:
        fit = report["epochs"][-1]
        print(f"Warm start: {report['steps']} demonstration steps (demonstrator success "
              f"{report['demonstrator']['success_rate']:.2f}), final nll {fit['nll']:.3f}, "
              f"{report['collect_seconds'] + report['fit_seconds']:.0f} s")
