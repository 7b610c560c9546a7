"""The checks of a run's config that need the env registry, the model files or torch.

:func:`check_setup` runs them before a run folder is made, so a bad config leaves nothing
behind; each failure is one ``ValueError`` (or ``UnknownEnvError``) saying what to change.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from milegpo.envs import UnknownEnvError, make_env
from milegpo.envs.core import HELD_OUT_SEEDS_START, HELD_OUT_SPLIT
from milegpo.run.config import EnvConfig, EvalConfig, TrainConfig


def check_setup(config: TrainConfig) -> None:
    """Checks that need the env registry, the model files and torch; ``ValueError`` with what to do.

    Run before a run folder is made, so a bad config leaves nothing behind.
    """
    check_env(config)
    from milegpo.policies.model import check_torchvision

    check_torchvision()
    _check_model(config.policy.model)
    _check_device(config.run.device)
    if config.policy.sampler.backend == "vllm":
        from milegpo.policies.vllm_sampler import import_vllm

        try:
            import_vllm()
        except ImportError as exc:
            raise ValueError(str(exc)) from None


def fit_splits_to_env(config: TrainConfig, verbose: int = 1) -> TrainConfig:
    """``config`` for an env without task splits (no ``split`` argument): left at their defaults,
    ``env.train_split`` becomes null (train on every task) and ``eval.splits`` becomes ``[held_out]``
    (the same distribution on task seeds training never draws); said in one line. Settings the
    user changed are kept (and checked by :func:`check_env`). An env id that names nothing (an unknown
    id, a hub game the hub does not have) or needs a package that is not installed is left to
    :func:`check_env`, which reports it first and alone."""
    from milegpo.envs.registration import takes_split

    try:
        if takes_split(config.env.id):
            return config
    except (UnknownEnvError, ImportError):
        return config  # check_env reports it
    changes: dict[str, Any] = {}
    if config.env.train_split == EnvConfig().train_split:
        changes["env.train_split"] = None
    if config.eval.splits == EvalConfig().splits:
        changes["eval.splits"] = [HELD_OUT_SPLIT]
    if changes and verbose:
        print(f"{config.env.id} has no task splits: training on all its tasks, evaluating on held-out task seeds "
              f"(eval split {HELD_OUT_SPLIT!r}, seeds from {HELD_OUT_SEEDS_START}, which training never draws; an "
              "env with a finite task list repeats its tasks there)")
    return config.replace(**changes) if changes else config


def check_env(config: TrainConfig) -> None:
    """Make the env once per split it will be made with (unknown id, bad kwargs, no splits)."""
    for split in dict.fromkeys([config.env.train_split, *config.eval.splits]):
        kwargs = config.env.kwargs_for(split)
        try:
            env = make_env(config.env.id, **kwargs)
        except UnknownEnvError:
            raise
        except ImportError as exc:
            raise ValueError(f"{config.env.id} needs a package that is not installed: {exc}") from None
        except (TypeError, ValueError, FileNotFoundError, KeyError) as exc:
            if split is not None and "split" in str(exc):
                raise ValueError(f"{config.env.id} does not take split={split!r} ({exc}): it has no task splits. "
                                 f"Train with env.train_split=null and evaluate on its held-out seeds with "
                                 f"eval.splits=[{HELD_OUT_SPLIT}] (milegpo eval --split {HELD_OUT_SPLIT})") from None
            raise ValueError(f"cannot make {config.env.id} with env_kwargs {kwargs}: {type(exc).__name__}: {exc}. "
                             "Check env.kwargs (the env's constructor arguments)") from None
        try:
            _check_first_state(env, config, split)
        finally:
            env.close()


#: a first reset at least this slow (seconds) is reported with what the run's setup will reset next
SLOW_RESET_S = 1.0


def _resets_before_first_update(env: Any, config: TrainConfig) -> int:
    """How many env resets come before the first update: vocabulary episodes, evaluation, first batch."""
    from milegpo.envs.vocabulary import VOCABULARY_EPISODES

    vocabulary = VOCABULARY_EPISODES if config.policy.model is None and not hasattr(env, "vocabulary") else 0
    evaluation = len(config.eval.splits) * config.eval.n_tasks * config.eval.copies
    return vocabulary + evaluation + config.env.n_tasks * config.env.group_size


def _check_first_state(env: Any, config: TrainConfig, split: str | None) -> None:
    """One reset of the env (task seed 0): it must start, and in choose mode list its commands."""
    where = f"{config.env.id}" + (f" (split {split!r})" if split is not None else "")
    start = time.perf_counter()
    try:
        _, info = env.reset(seed=0)
    except Exception as exc:
        raise ValueError(f"{where} failed at its first reset: {type(exc).__name__}: {exc}") from None
    seconds = time.perf_counter() - start
    if seconds >= SLOW_RESET_S and split == config.env.train_split:
        print(f"note: one reset of {where} took {seconds:.1f} s; before the first update the run resets it about "
              f"{_resets_before_first_update(env, config)} times (the tiny model's vocabulary episodes when "
              "policy.model is null, the untrained policy's evaluation, the first batch)", file=sys.stderr)
    if config.policy.mode == "choose" and not info.get("admissible_commands"):
        raise ValueError(f"{where} lists no admissible commands (info['admissible_commands'] is "
                         f"{info.get('admissible_commands')!r}): mode 'choose' scores them; use policy.mode=generate "
                         "for a free-text env")


def _check_model(model: str | None) -> None:
    """A model path must exist, a hub name must load (from the local cache, or a hub that answers)."""
    if model is None:
        return
    from milegpo.policies.model import check_model_source

    check_model_source(model)
    from transformers import AutoConfig

    local = os.path.exists(os.path.expanduser(model))
    try:
        AutoConfig.from_pretrained(os.path.expanduser(model))
    except (OSError, ValueError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        where = "the folder" if local else "the hub name"
        raise ValueError(f"cannot load model {model!r}: {first_line}. Check {where}") from None


def _check_device(device: str) -> None:
    """An explicit CUDA device must exist (``auto`` picks CUDA when there is one, else the CPU)."""
    if not str(device).startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but this machine has no usable CUDA device "
                         f"(torch {torch.__version__}): use run.device=cpu, or run.device=auto to take a GPU when "
                         f"there is one")
    index = int(device.split(":")[1]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r} does not exist: this machine has {torch.cuda.device_count()} CUDA "
                         f"device(s)")
