"""A run's plan: its settings checked and resolved once, and everything a run derives from them.

:func:`checked_settings` turns a :class:`~milegpo.config.run.TrainConfig` into the settings a
run uses: fitted to an env without task splits, checked against the env registry, the model
files and torch (before anything is written), the user's env folder recorded and a local model
path made absolute. Those settings are what the run folder's ``config.json`` holds.

A :class:`RunPlan` is then everything derived from them: the env's constructor arguments per
split, each evaluation split's task seeds and sampling seed, where the checkpoints' base model
is, the run folder, this process's place among the ranks. Training, evaluation, resume and
export read the plan; no part of the run derives a setting again.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from milegpo.config.policy import PolicyConfig, absolute_model_path
from milegpo.config.run import TrainConfig, eval_task_seeds
from milegpo.config.warm_start import WarmStartConfig
from milegpo.options import parse_report_to
from milegpo.run_folder import BASE_MODEL_DIR

if TYPE_CHECKING:
    from milegpo.algos.distributed import World
    from milegpo.envs.vec_env import GroupedTextVecEnv


@dataclass(frozen=True)
class SplitPlan:
    """One task split as the run plays it.

    :param name: the split (None: the training split of an env without splits; ``held_out``: the
        evaluation seeds of such an env).
    :param env_kwargs: the env's constructor arguments on this split.
    :param task_seeds: the tasks an evaluation of the split plays (empty for the training split).
    :param seed: the seed of a sampled evaluation of the split: fixed per (run seed, split), so a
        checkpoint's score on a split does not depend on what was evaluated before it (None for the
        training split, whose draws the run seed seeds).
    """

    name: str | None
    env_kwargs: Mapping[str, Any]
    task_seeds: tuple[int, ...] = ()
    seed: int | None = None


def eval_split_plan(settings: TrainConfig, split: str | None, n_tasks: int | None = None) -> SplitPlan:
    """How an evaluation plays ``split``: its first ``n_tasks`` tasks (default ``eval.n_tasks``), or for
    ``held_out`` the first seeds training never draws."""
    seeds = eval_task_seeds(split, n_tasks or settings.eval.n_tasks)
    seed = zlib.crc32(f"{settings.run.seed}:{split}".encode())
    return SplitPlan(split, settings.env.kwargs_for(split), tuple(seeds), seed)


def _single_process() -> World:
    from milegpo.algos.distributed import World

    return World()


@dataclass(frozen=True)
class RunPlan:
    """Everything a run of ``settings`` does, derived once (:func:`RunPlan.of`).

    :param settings: the checked, resolved settings (the run folder's ``config.json``).
    :param run_dir: the run folder.
    :param train_split: the split training draws its tasks from.
    :param eval_splits: the held-out splits evaluated during and after training, in order (the first
        one's curve is ``eval.jsonl``).
    :param base_model: the model the checkpoints' adapters sit on: ``policy.model`` (a hub id or an
        absolute path), else the run folder's own ``base_model/`` wherever the folder is now.
    :param policy: the policy's settings, its model being ``base_model``.
    :param warm_start: the warm start's settings, its seed the run's unless set (None: no warm start).
    :param trackers: the experiment trackers beside ``progress.csv`` (``run.report_to``, checked and
        without repeats).
    :param world: this process's rank among the data-parallel processes.
    :param resume: continue the run in ``run_dir`` from its newest intact checkpoint.
    :param restart: with ``resume`` and no intact checkpoint: move the old logs aside and start over.
    """

    settings: TrainConfig
    run_dir: Path
    train_split: SplitPlan
    eval_splits: tuple[SplitPlan, ...]
    base_model: str
    policy: PolicyConfig
    warm_start: WarmStartConfig | None
    trackers: tuple[str, ...]
    world: World = field(default_factory=_single_process)
    resume: bool = False
    restart: bool = False

    @classmethod
    def of(cls, settings: TrainConfig, run_dir: str | Path, world: World | None = None, resume: bool = False,
           restart: bool = False) -> RunPlan:
        """The plan of a run of ``settings`` (checked by :func:`checked_settings`) in ``run_dir``."""
        train = SplitPlan(settings.env.train_split, settings.env.kwargs_for(settings.env.train_split))
        model = settings.policy.model
        base_model = model if model is not None else str((Path(run_dir) / BASE_MODEL_DIR).resolve())
        warm = settings.run.warm_start
        if warm is not None and warm.seed is None:
            warm = replace(warm, seed=settings.run.seed)
        return cls(settings, Path(run_dir), train, tuple(eval_split_plan(settings, split)
                                                         for split in settings.eval.splits),
                   base_model, replace(settings.policy, model=base_model), warm,
                   tuple(parse_report_to(settings.run.report_to)), world or _single_process(), resume, restart)

    @property
    def eval_sampling(self) -> dict[str, Any]:
        """How evaluations act: greedy when ``eval.temperature`` is None, else sampled at it."""
        if self.settings.eval.temperature is None:
            return {"deterministic": True}
        return {"deterministic": False, "temperature": self.settings.eval.temperature}

    def vec_env(self, split: SplitPlan, n_tasks: int, group_size: int,
                shard: tuple[int, int] = (0, 1)) -> GroupedTextVecEnv:
        """A grouped vec env of ``n_tasks`` x ``group_size`` envs on ``split``, in worker processes when
        ``env.subprocess`` is set."""
        from milegpo.envs import make_vec_env  # imports SB3 and torch: not at module import

        env = self.settings.env
        return make_vec_env(env.id, n_tasks=n_tasks, group_size=group_size, seed=self.settings.run.seed,
                            env_kwargs=dict(split.env_kwargs), subprocess=env.subprocess, shard=shard,
                            n_workers=env.n_workers, timeout=env.worker_timeout_s)

    def train_env(self) -> GroupedTextVecEnv:
        """This rank's share of the training tasks: ``env.n_tasks / world size`` groups."""
        env = self.settings.env
        return self.vec_env(self.train_split, env.n_tasks // self.world.size, env.group_size,
                            shard=(self.world.rank, self.world.size))

    def eval_env(self, split: SplitPlan) -> GroupedTextVecEnv:
        """The vec env of an evaluation of ``split``: ``eval.n_tasks`` x ``eval.copies`` envs."""
        return self.vec_env(split, self.settings.eval.n_tasks, self.settings.eval.copies)


def checked_settings(config: TrainConfig, verbose: int = 1) -> TrainConfig:
    """The settings a run of ``config`` uses, checked before anything is written.

    The trackers, the env, the model, the device and the sampler are checked (one ``ValueError``,
    ``UnknownEnvError`` or ``ImportError`` saying what to change; :func:`~milegpo.run.checks.check_setup`);
    an env without task splits trains on every task and evaluates on held-out seeds (said in one line);
    the folder a user's env module was imported from is recorded (``env.module_dir``) and a local model
    path made absolute, so the run folder's settings name the same env and model from any working directory.
    """
    from milegpo.run.checks import check_setup
    from milegpo.run.tracking import check_available

    check_available(parse_report_to(config.run.report_to))
    remember_env_module(config)  # the checks import a user's env module from the folder it was trained from
    changes = check_setup(config, verbose)
    model = absolute_model_path(config.policy.model)
    if model != config.policy.model:
        changes["policy.model"] = model
    return config.replace(**changes) if changes else config


def remember_env_module(settings: TrainConfig) -> None:
    """Let a run's env module be imported from the folder it was trained from (``env.module_dir``): eval,
    resume, export and serve of a run of the user's own env work from any directory."""
    if settings.env.module_dir is not None:
        from milegpo.envs.user_modules import remember_module_dir

        remember_module_dir(settings.env.module_dir)


def default_run_dir(settings: TrainConfig) -> Path:
    """``runs/<method>-<env>-<time>``: the run folder when none is given."""
    name = settings.env.id.split("/")[-1].lower()
    return Path("runs") / f"{settings.algo.method}-{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def set_torch_threads(settings: TrainConfig) -> int:
    """Set torch's CPU threads for the run (``run.torch_threads``; null: 1 for the offline tiny model, torch's
    default for a named model); returns the number in use."""
    import torch

    threads = settings.run.torch_threads or (1 if settings.policy.model is None else None)
    if threads is not None:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


__all__ = ["RunPlan", "SplitPlan", "checked_settings", "default_run_dir", "eval_split_plan", "remember_env_module",
           "set_torch_threads"]
