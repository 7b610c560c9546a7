"""Saving and loading a group-RL algorithm as a checkpoint directory (:mod:`milegpo.algos.checkpoint`).

:class:`CheckpointMixin` gives :class:`~milegpo.algos.base.GroupRLAlgorithm` SB3's
``save`` / ``load`` with milegpo's checkpoint format: the LoRA adapter, the optimizer
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
from typing import Any, TypeVar

import torch as th
from stable_baselines3.common.type_aliases import GymEnv

import milegpo
from milegpo.algos import checkpoint as ckpt
from milegpo.algos.counters import TrainingCounters
from milegpo.config import AlgoConfig, PolicyConfig
from milegpo.config.fields import from_dict, to_dict, with_overrides

logger = logging.getLogger(__name__)
SelfModel = TypeVar("SelfModel", bound="CheckpointMixin")


class CheckpointMixin:
    """``save`` / ``load`` of checkpoint directories for a GroupRLAlgorithm."""

    def _config(self) -> dict[str, Any]:
        policy_class = next((name for name, cls in self.policy_aliases.items() if cls is self.policy_class),
                            f"{self.policy_class.__module__}:{self.policy_class.__qualname__}")
        return {
            "format": ckpt.FORMAT,
            "format_version": ckpt.FORMAT_VERSION,
            "milegpo_version": milegpo.__version__,
            "algorithm": type(self).__name__,
            "algo": to_dict(self.config),
            "policy": {"class": policy_class, "config": to_dict(self.policy_config)},
            "stats_window_size": self._stats_window_size,
            "base_model": self._base_model_fingerprint(),
            "counters": dataclasses.asdict(TrainingCounters.of(self)),
            "seeds": {"seed": self.seed, "task_seed_base": self.task_seed_base},
            "rng": {"minibatch": self._rng.bit_generator.state},
        }

    def _base_model_fingerprint(self) -> dict[str, Any]:
        """What identifies the base model: its name/path and architecture sizes."""
        config = self.policy.model.config
        keys = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "n_embd", "n_layer")
        return {"name_or_path": str(self.policy_config.model),
                **{k: getattr(config, k) for k in keys if getattr(config, k, None) is not None}}

    def save(self, path: str | os.PathLike, exclude: Any = None, include: Any = None) -> None:  # type: ignore[override]
        """Save a checkpoint directory at ``path`` (LoRA adapter, optimizer state, JSON config and counters).

        Written atomically (temporary directory + rename). ``exclude``/``include`` of
        SB3's signature are not supported: the checkpoint content is fixed.
        """
        if exclude is not None or include is not None:
            raise ValueError("milegpo checkpoints have a fixed content: exclude/include are not supported")
        ckpt.write_checkpoint(path, self._config(), self.policy, self.optimizer)

    @classmethod
    def load(  # type: ignore[override]
        cls: type[SelfModel],
        path: str | os.PathLike,
        env: GymEnv | None = None,
        device: th.device | str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        **kwargs: Any,
    ) -> SelfModel:
        """Load a checkpoint saved by :meth:`save`; training resumes from its counters.

        :param env: the vec env to continue training on (None: prediction only).
        :param kwargs: :class:`~milegpo.config.AlgoConfig` fields to change (e.g. ``learning_rate``);
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
        if "policy_kwargs" in kwargs and from_dict(PolicyConfig, kwargs.pop("policy_kwargs"), "policy") != saved_policy:
            raise ValueError(f"policy_kwargs differ from the saved policy config: {to_dict(saved_policy)}")
        policy_class: str | type = config["policy"]["class"]
        if policy_class not in cls.policy_aliases:
            module, _, name = str(policy_class).partition(":")
            policy_class = getattr(importlib.import_module(module), name)
        algo = with_overrides(AlgoConfig, config["algo"], kwargs, "algo")
        seeds = config.get("seeds", {})
        model = cls(policy_class, env, algo, policy_kwargs=saved_policy, device=device,  # type: ignore[arg-type]
                    seed=seeds.get("seed"), stats_window_size=int(config.get("stats_window_size", 100)),
                    _init_setup_model=False)
        model.task_seed_base = int(seeds.get("task_seed_base", model.task_seed_base))
        model._setup_model()

        fingerprint = model._base_model_fingerprint()
        if fingerprint != config["base_model"]:
            raise ckpt.CheckpointError(
                f"checkpoint {str(path)!r} was trained on base model {config['base_model']}, "
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
