"""Saving and loading a group-RL algorithm as a checkpoint directory (:mod:`milegpo.algos.checkpoint`).

What :class:`~milegpo.algos.base.GroupRLAlgorithm`'s SB3-style ``save`` / ``load`` do, in
milegpo's checkpoint format: the LoRA adapter, the optimizer state and a JSON config with the
algorithm's and the policy's configs, the counters and the RNG states, so that a loaded
model resumes training exactly where it stopped. Nothing is pickled.

This module knows only what it is given: a :class:`RunState` (what the JSON config holds),
the policy and the optimizer. The algorithm builds the one and rebuilds itself from the
:class:`SavedRun` that :func:`read_saved_run` returns.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch as th

import milegpo
from milegpo.algos import checkpoint as ckpt
from milegpo.algos.counters import TrainingCounters
from milegpo.config import AlgoConfig, PolicyConfig
from milegpo.config.fields import from_dict, to_dict, with_overrides
from milegpo.config.policy import absolute_model_path
from milegpo.credit import MilestoneMemory


class AdapterHolder(Protocol):
    """A policy whose trained weights are a LoRA adapter folder (:class:`~milegpo.policies.LLMPolicy`)."""

    def save_adapter(self, path: str | os.PathLike) -> None: ...

    def load_adapter(self, path: str | os.PathLike) -> None: ...


@dataclasses.dataclass(frozen=True)
class RunState:
    """What a checkpoint's JSON config holds of a model: everything but the adapter and the optimizer.

    :param algorithm: the algorithm's class name (``MileGPO``, ...).
    :param policy_class: an alias of the algorithm's ``policy_aliases`` or ``module:qualname``.
    :param base_model: :func:`base_model_fingerprint` of the policy's base model.
    :param minibatch_rng: the state of the update's minibatch generator.
    :param credit_memory: MileGPO's milestone memory (:meth:`milegpo.credit.MilestoneMemory.to_dict`),
        None without one.
    """

    algorithm: str
    algo: AlgoConfig
    policy_class: str
    policy_config: PolicyConfig
    stats_window_size: int
    base_model: dict[str, Any]
    counters: TrainingCounters
    seed: int | None
    task_seed_base: int
    minibatch_rng: dict[str, Any]
    credit_memory: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class SavedRun:
    """A checkpoint's JSON config, read and checked against the loading class: what a model is rebuilt from.

    ``algo`` has the caller's overrides applied; ``policy_class`` is an alias or the imported
    class; ``task_seed_base`` and ``minibatch_rng`` are None in a checkpoint without them;
    ``behaviour_adapter`` is the folder of the adapter that samples the rollout that was in flight
    (``algo.max_staleness=1``), None when none was; ``credit_memory`` MileGPO's milestone memory, None
    when the run had none.
    """

    path: Path
    algo: AlgoConfig
    policy_class: str | type
    policy_config: PolicyConfig
    stats_window_size: int
    base_model: dict[str, Any]
    counters: TrainingCounters
    seed: int | None
    task_seed_base: int | None
    minibatch_rng: dict[str, Any] | None
    behaviour_adapter: Path | None
    credit_memory: MilestoneMemory | None = None


def policy_class_name(policy_class: type, aliases: Mapping[str, type]) -> str:
    """How a checkpoint names ``policy_class``: its alias, else ``module:qualname``."""
    return next((name for name, cls in aliases.items() if cls is policy_class),
                f"{policy_class.__module__}:{policy_class.__qualname__}")


def checkpoint_config(state: RunState) -> dict[str, Any]:
    """The JSON config of a checkpoint: the run's configs, counters, seeds and RNG state."""
    return {
        "format": ckpt.FORMAT,
        "format_version": ckpt.FORMAT_VERSION,
        "milegpo_version": milegpo.__version__,
        "algorithm": state.algorithm,
        "algo": to_dict(state.algo),
        "policy": {"class": state.policy_class, "config": to_dict(_with_absolute_model(state.policy_config))},
        "stats_window_size": state.stats_window_size,
        "base_model": state.base_model,
        "counters": dataclasses.asdict(state.counters),
        "seeds": {"seed": state.seed, "task_seed_base": state.task_seed_base},
        "rng": {"minibatch": state.minibatch_rng},
        "credit_memory": state.credit_memory,
    }


def _with_absolute_model(config: PolicyConfig) -> PolicyConfig:
    """``config`` with a local model path made absolute: the checkpoint loads from any directory."""
    return dataclasses.replace(config, model=absolute_model_path(config.model))


def base_model_fingerprint(model_config: Any, policy_config: PolicyConfig) -> dict[str, Any]:
    """What identifies the base model: its name/path (``policy_config.model``) and the architecture sizes
    of its ``transformers`` config ``model_config``."""
    keys = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "intermediate_size", "n_embd", "n_layer")
    return {"name_or_path": str(_with_absolute_model(policy_config).model),
            **{k: getattr(model_config, k) for k in keys if getattr(model_config, k, None) is not None}}


def save_checkpoint(path: str | os.PathLike, state: RunState, policy: AdapterHolder, optimizer: th.optim.Optimizer,
                    behaviour: AdapterHolder | None = None) -> None:
    """Write a checkpoint directory at ``path``, atomically (temporary directory + rename); with
    ``behaviour``, the adapter that samples the rollout in flight too."""
    ckpt.write_checkpoint(path, checkpoint_config(state), policy, optimizer, behaviour)


def read_saved_run(path: str | os.PathLike, algorithm: str, aliases: Mapping[str, type], base_model: str | None = None,
                   **overrides: Any) -> SavedRun:
    """The checkpoint at ``path`` read for class ``algorithm`` (its name), with ``overrides`` applied.

    :param aliases: the algorithm's ``policy_aliases`` (other policy classes are imported by name).
    :param base_model: the base model to load the adapter onto instead of the one the checkpoint
        names (a run folder's own base model after the folder moved); only its architecture must
        match the saved fingerprint (:func:`load_weights` checks it).
    :param overrides: :class:`~milegpo.config.AlgoConfig` fields to change (e.g. ``learning_rate``);
        ``policy_kwargs`` may be given only if equal to the saved policy config.
    Raises :class:`~milegpo.algos.checkpoint.CheckpointError` for a missing or corrupt checkpoint or one
    of another algorithm.
    """
    path = Path(path)
    config = ckpt.read_config(path)
    if config["algorithm"] != algorithm:
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
    if policy_class not in aliases:
        module, _, name = str(policy_class).partition(":")
        policy_class = getattr(importlib.import_module(module), name)
    try:
        counters = TrainingCounters.from_dict(config["counters"])
    except (TypeError, ValueError) as exc:
        raise ckpt.CheckpointError(f"checkpoint {str(path)!r} has unreadable counters: {exc}") from None
    seeds = config.get("seeds", {})
    task_seed_base = seeds.get("task_seed_base")
    behaviour = path / ckpt.BEHAVIOUR_ADAPTER_DIR
    try:
        memory = None if config.get("credit_memory") is None else MilestoneMemory.from_dict(config["credit_memory"])
    except ValueError as exc:
        raise ckpt.CheckpointError(f"checkpoint {str(path)!r}: {exc}") from None
    return SavedRun(path=path, algo=with_overrides(AlgoConfig, config["algo"], overrides, "algo"),
                    policy_class=policy_class, policy_config=saved_policy,
                    stats_window_size=int(config.get("stats_window_size", 100)), base_model=saved_fingerprint,
                    counters=counters, seed=seeds.get("seed"),
                    task_seed_base=None if task_seed_base is None else int(task_seed_base),
                    minibatch_rng=config.get("rng", {}).get("minibatch"),
                    behaviour_adapter=behaviour if behaviour.is_dir() else None, credit_memory=memory)


def load_weights(saved: SavedRun, fingerprint: dict[str, Any], policy: AdapterHolder,
                 optimizer: th.optim.Optimizer, device: th.device) -> None:
    """Load the saved adapter into ``policy`` and the optimizer state into ``optimizer``, once the
    policy's base model (``fingerprint``, :func:`base_model_fingerprint`) is the saved one.

    Raises :class:`~milegpo.algos.checkpoint.CheckpointError` for another base model or an adapter
    that does not fit.
    """
    if fingerprint != saved.base_model:
        raise ckpt.CheckpointError(
            f"checkpoint {str(saved.path)!r} was trained on base model {saved.base_model}, "
            f"but the policy loaded {fingerprint}"
        )
    load_adapter(policy, saved.path / ckpt.ADAPTER_DIR)
    ckpt.load_optimizer_state(saved.path, optimizer, device)


def load_adapter(policy: AdapterHolder, folder: Path) -> None:
    """Load the adapter saved in ``folder`` into ``policy``; :class:`~milegpo.algos.checkpoint.CheckpointError`
    when it does not fit."""
    try:
        policy.load_adapter(str(folder))
    except Exception as exc:
        raise ckpt.CheckpointError(
            f"the LoRA adapter in {str(folder)!r} does not fit the policy ({type(exc).__name__}: {exc})"
        ) from None
