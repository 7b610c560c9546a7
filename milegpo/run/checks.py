"""The checks of a run's settings that need the env registry, the model files or torch.

:func:`check_setup` runs them before a run folder is made, so a bad config leaves nothing
behind; each failure is one ``ValueError`` (or ``UnknownEnvError``) saying what to change. The
checks of a room's own things live in that room (the model and the device in
:mod:`milegpo.policies.model`); this module asks each in turn.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from milegpo.config.run import EnvConfig, EvalConfig, TrainConfig
from milegpo.envs import UnknownEnvError
from milegpo.options import HELD_OUT_SEEDS_START, HELD_OUT_SPLIT

#: a first reset at least this slow (seconds) is reported with what the run's setup will reset next
SLOW_RESET_S = 1.0


def check_setup(config: TrainConfig, verbose: int = 1) -> dict[str, Any]:
    """Check what a run of ``config`` needs: the env (made once per split it will be made with, and reset
    once), the model, the device and the sampler. Returns the settings to change (dotted names):

    - an env without task splits (no ``split`` argument), with the split settings left at their defaults,
      trains on every task (``env.train_split`` null) and evaluates on held-out task seeds (``eval.splits``
      ``[held_out]``), said in one line; settings the user changed are kept and checked;
    - ``env.module_dir``: the folder the env's module was imported from when it is no installed package.

    A run's own env module must be importable first (:func:`~milegpo.run.plan.checked_settings` and
    :func:`~milegpo.run.finish.load_run` remember the folder it was trained from).
    """
    from milegpo.envs.registration import make_env, takes_split
    from milegpo.envs.user_modules import env_module_folder
    from milegpo.envs.vocabulary import VOCABULARY_EPISODES
    from milegpo.policies.model import check_device, check_model_loads, check_torchvision

    env_config = config.env
    changes: dict[str, Any] = {}
    train_split, eval_splits = env_config.train_split, config.eval.splits
    try:
        splitless = not takes_split(env_config.id)
    except (UnknownEnvError, ImportError):
        splitless = False  # making the env below reports it, first and alone
    if splitless and train_split == EnvConfig().train_split:
        train_split = changes["env.train_split"] = None
    if splitless and eval_splits == EvalConfig().splits:
        eval_splits = changes["eval.splits"] = [HELD_OUT_SPLIT]
    if changes and verbose:
        print(f"{env_config.id} has no task splits: training on all its tasks, evaluating on held-out task seeds "
              f"(eval split {HELD_OUT_SPLIT!r}, seeds from {HELD_OUT_SEEDS_START}, which training never draws; an "
              "env with a finite task list repeats its tasks there)")
    for split in dict.fromkeys([train_split, *eval_splits]):
        kwargs = env_config.kwargs_for(split)
        where = f"{env_config.id}" + (f" (split {split!r})" if split is not None else "")
        try:
            env = make_env(env_config.id, **kwargs)
        except UnknownEnvError:
            raise
        except ImportError as exc:
            raise ValueError(f"{env_config.id} needs a package that is not installed: {exc}") from None
        except (TypeError, ValueError, FileNotFoundError, KeyError) as exc:
            if split is not None and "split" in str(exc):
                raise ValueError(f"{env_config.id} does not take split={split!r} ({exc}): it has no task splits. "
                                 f"Train with env.train_split=null and evaluate on its held-out seeds with "
                                 f"eval.splits=[{HELD_OUT_SPLIT}] (milegpo eval --split {HELD_OUT_SPLIT})") from None
            raise ValueError(f"cannot make {env_config.id} with env_kwargs {kwargs}: {type(exc).__name__}: {exc}. "
                             "Check env.kwargs (the env's constructor arguments)") from None
        try:  # one reset (task seed 0): it must start, and in choose mode list its commands
            start = time.perf_counter()
            try:
                _, info = env.reset(seed=0)
            except Exception as exc:
                raise ValueError(f"{where} failed at its first reset: {type(exc).__name__}: {exc}") from None
            seconds = time.perf_counter() - start
            if seconds >= SLOW_RESET_S and split == train_split:
                builds_vocabulary = config.policy.model is None and not hasattr(env, "vocabulary")
                vocabulary = VOCABULARY_EPISODES if builds_vocabulary else 0
                resets = (vocabulary + len(eval_splits) * config.eval.n_tasks * config.eval.copies
                          + env_config.n_tasks * env_config.group_size)
                print(f"note: one reset of {where} took {seconds:.1f} s; before the first update the run resets it "
                      f"about {resets} times (the tiny model's vocabulary episodes when policy.model is null, the "
                      "untrained policy's evaluation, the first batch)", file=sys.stderr)
            if config.policy.mode == "choose" and not info.get("admissible_commands"):
                raise ValueError(f"{where} lists no admissible commands (info['admissible_commands'] is "
                                 f"{info.get('admissible_commands')!r}): mode 'choose' scores them; use "
                                 "policy.mode=generate for a free-text env")
        finally:
            env.close()
    folder = env_module_folder(env_config.id)  # the checks above imported the env's module
    if env_config.module_dir is None and folder is not None:
        changes["env.module_dir"] = folder
    check_torchvision()
    if config.policy.model is not None:
        check_model_loads(config.policy.model)
    check_device(config.run.device)
    if config.policy.sampler.backend == "vllm":
        from milegpo.policies.vllm_sampler import import_vllm

        try:
            import_vllm()
        except ImportError as exc:
            raise ValueError(str(exc)) from None
    return changes
