"""Saving and loading a group-RL algorithm as a checkpoint directory (:mod:`milegpo.algos.checkpoint`).

:func:`save_checkpoint` and :func:`load_checkpoint` are what
:class:`~milegpo.algos.base.GroupRLAlgorithm`'s SB3-style ``save`` / ``load`` do, in milegpo's
checkpoint format: the LoRA adapter, the optimizer
state and a JSON config with the algorithm's and the policy's configs, the counters
and the RNG states, so that a
loaded model resumes training exactly where it stopped. Nothing is pickled.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch as th

import milegpo
from milegpo.algos import checkpoint as ckpt
from milegpo.algos.counters import TrainingCounters
from milegpo.config import AlgoConfig, PolicyConfig
from milegpo.config.fields import from_dict, to_dict, with_overrides
from milegpo.config.policy import absolute_model_path
from milegpo.envs.vec_env import GroupedTextVecEnv

if TYPE_CHECKING:
    from milegpo.algos.base import GroupRLAlgorithm

logger = logging.getLogger(__name__)
Model = TypeVar("Model", bound="GroupRLAlgorithm")


def checkpoint_config(model: GroupRLAlgorithm) -> dict[str, Any]:
    """The JSON config of a checkpoint of ``model``: its configs, counters, seeds and RNG state."""
    policy_class = next((name for name, cls in model.policy_aliases.items() if cls is model.policy_class),
                        f"{model.policy_class.__module__}:{model.policy_class.__qualname__}")
    return {
        "format": ckpt.FORMAT,
        "format_version": ckpt.FORMAT_VERSION,
        "milegpo_version": milegpo.__version__,
        "algorithm": type(model).__name__,
        "algo": to_dict(model.config),
        "policy": {"class": policy_class, "config": to_dict(_with_absolute_model(model.policy_config))},
        "stats_window_size": model._stats_window_size,
        "base_model": base_model_fingerprint(model),
        "counters": dataclasses.asdict(TrainingCounters.of(model)),
        "seeds": {"seed": model.seed, "task_seed_base": model.task_seed_base},
        "rng": {"minibatch": model._rng.bit_generator.state},
    }


def _with_absolute_model(config: PolicyConfig) -> PolicyConfig:
    """``config`` with a local model path made absolute: the checkpoint loads from any directory."""
    return dataclasses.replace(config, model=absolute_model_path(config.model))


def base_model_fingerprint(model: GroupRLAlgorithm) -> dict[str, Any]:
    """What identifies the base model: its name/path and architecture sizes."""
    config = model.policy.model.config
    keys = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "intermediate_size", "n_embd", "n_layer")
    return {"name_or_path": str(_with_absolute_model(model.policy_config).model),
            **{k: getattr(config, k) for k in keys if getattr(config, k, None) is not None}}


def save_checkpoint(model: GroupRLAlgorithm, path: str | os.PathLike) -> None:
    """Write a checkpoint directory of ``model`` at ``path``, atomically (temporary directory + rename)."""
    ckpt.write_checkpoint(path, checkpoint_config(model), model.policy, model.optimizer)


def load_checkpoint(cls: type[Model], path: str | os.PathLike, env: GroupedTextVecEnv | None, device: th.device | str,
                    base_model: str | None = None, **overrides: Any) -> Model:
    """A ``cls`` model from the checkpoint at ``path``, ready to resume training where it stopped.

    :param env: the vec env to continue training on (None: prediction only).
    :param base_model: the base model to load the adapter onto instead of the one the checkpoint
        names (a run folder's own base model after the folder moved); only its architecture must
        match the saved fingerprint.
    :param overrides: :class:`~milegpo.config.AlgoConfig` fields to change (e.g. ``learning_rate``);
        ``policy_kwargs`` may be given only if equal to the saved policy config.
    Raises :class:`~milegpo.algos.checkpoint.CheckpointError` for a missing, corrupt or
    mismatching checkpoint (other algorithm, other base model, adapter that does not fit).
    """
    path = Path(path)
    config = ckpt.read_config(path)
    if config["algorithm"] != cls.__name__:
        raise ckpt.CheckpointError(
            f"checkpoint {str(path)!r} was saved by {config['algorithm']}; load it with "
            f"milegpo.{config['algorithm']}.load(...)"
        )
    saved_policy = from_dict(PolicyConfig, config["policy"]["config"], "policy")
    given = overrides.pop("policy_kwargs", saved_policy)
    if from_dict(PolicyConfig, given, "policy") != saved_policy:
        raise ValueError(f"policy_kwargs differ from the saved policy config: {to_dict(saved_policy)}")
    saved_fingerprint = dict(config["base_model"])
    if base_model is not None:
        saved_policy = dataclasses.replace(saved_policy, model=base_model)
        saved_fingerprint["name_or_path"] = str(_with_absolute_model(saved_policy).model)
    policy_class: str | type = config["policy"]["class"]
    if policy_class not in cls.policy_aliases:
        module, _, name = str(policy_class).partition(":")
        policy_class = getattr(importlib.import_module(module), name)
    algo = with_overrides(AlgoConfig, config["algo"], overrides, "algo")
    seeds = config.get("seeds", {})
    model = cls(policy_class, env, algo, policy_kwargs=saved_policy, device=device, seed=seeds.get("seed"),
                stats_window_size=int(config.get("stats_window_size", 100)), _init_setup_model=False)
    model.task_seed_base = int(seeds.get("task_seed_base", model.task_seed_base))
    model._setup_model()

    fingerprint = base_model_fingerprint(model)
    if fingerprint != saved_fingerprint:
        raise ckpt.CheckpointError(
            f"checkpoint {str(path)!r} was trained on base model {saved_fingerprint}, "
            f"but the policy loaded {fingerprint}"
        )
    try:
        model.policy.load_adapter(str(path / ckpt.ADAPTER_DIR))
    except Exception as exc:
        raise ckpt.CheckpointError(
            f"the LoRA adapter in {str(path / ckpt.ADAPTER_DIR)!r} does not fit the policy "
            f"({type(exc).__name__}: {exc})"
        ) from None
    ckpt.load_optimizer_state(path, model.optimizer, model.device)

    try:
        TrainingCounters.from_dict(config["counters"]).restore(model)
    except (TypeError, ValueError) as exc:
        raise ckpt.CheckpointError(f"checkpoint {str(path)!r} has unreadable counters: {exc}") from None
    state = config.get("rng", {}).get("minibatch")
    if state is not None:
        model._rng.bit_generator.state = state
    model.ep_info_buffer = deque(maxlen=model._stats_window_size)
    model.ep_success_buffer = deque(maxlen=model._stats_window_size)
    return model
