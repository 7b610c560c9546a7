"""Saving and loading a group-RL algorithm as a checkpoint directory (:mod:`milegpo.algos.checkpoint`).

:class:`CheckpointMixin` gives :class:`~milegpo.algos.base.GroupRLAlgorithm` SB3's
``save`` / ``load`` with milegpo's checkpoint format: the LoRA adapter, the optimizer
state and a JSON config with the hyperparameters, counters and RNG states, so that a
loaded model resumes training exactly where it stopped. Nothing is pickled.
"""

from __future__ import annotations

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

logger = logging.getLogger(__name__)
SelfModel = TypeVar("SelfModel", bound="CheckpointMixin")

#: Constructor arguments saved in a checkpoint's config (all plain values).
HYPERPARAMETERS = (
    "learning_rate",
    "n_epochs",
    "batch_size",
    "mini_batch_tokens",
    "micro_batch_tokens",
    "clip_range",
    "loss_agg",
    "kl_coef",
    "ent_coef",
    "max_grad_norm",
    "weight_decay",
    "credit_kwargs",
    "credit_preset",
    "stats_window_size",
    "seed",
)
#: Where a hyperparameter lives on the algorithm when SB3 keeps it under another name.
_ATTRIBUTE = {"stats_window_size": "_stats_window_size"}


class CheckpointMixin:
    """``save`` / ``load`` of checkpoint directories for a GroupRLAlgorithm."""

    def _config(self) -> dict[str, Any]:
        hyper = {name: getattr(self, _ATTRIBUTE.get(name, name)) for name in HYPERPARAMETERS}
        if callable(hyper["learning_rate"]):  # a schedule is code, not JSON: store its current value
            hyper["learning_rate"] = float(self.lr_schedule(self._current_progress_remaining))
            logger.warning("the learning-rate schedule is saved as its current value %g", hyper["learning_rate"])
        policy_class = next((name for name, cls in self.policy_aliases.items() if cls is self.policy_class),
                            f"{self.policy_class.__module__}:{self.policy_class.__qualname__}")
        return {
            "format": ckpt.FORMAT,
            "format_version": ckpt.FORMAT_VERSION,
            "milegpo_version": milegpo.__version__,
            "algorithm": type(self).__name__,
            "credit_method": self.credit_method,
            "hyperparameters": hyper,
            "policy": {"class": policy_class, "kwargs": self.policy_kwargs},
            "base_model": self._base_model_fingerprint(),
            "counters": {
                "num_timesteps": self.num_timesteps,
                "n_updates": self._n_updates,
                "iterations": self._iterations,
                "skipped_steps": self._skipped_steps,
                "episode_num": self._episode_num,
                "total_timesteps": self._total_timesteps,
                "current_progress_remaining": self._current_progress_remaining,
                "time_elapsed_s": self.time_elapsed(),
            },
            "seeds": {"seed": self.seed, "task_seed_base": self.task_seed_base},
            "rng": {"minibatch": self._rng.bit_generator.state},
        }

    def _base_model_fingerprint(self) -> dict[str, Any]:
        """What identifies the base model: its name/path and architecture sizes."""
        config = self.policy.model.config
        keys = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "n_embd", "n_layer")
        return {"name_or_path": str(self.policy_kwargs.get("model", "")),
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
        :param kwargs: hyperparameters to change (e.g. ``learning_rate``); ``policy_kwargs``
            may be given only if equal to the saved ones.
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
        saved_policy_kwargs = config["policy"].get("kwargs") or {}
        if "policy_kwargs" in kwargs and kwargs.pop("policy_kwargs") != saved_policy_kwargs:
            raise ValueError(f"policy_kwargs differ from the saved ones: {saved_policy_kwargs}")
        policy_class: str | type = config["policy"]["class"]
        if policy_class not in cls.policy_aliases:
            module, _, name = str(policy_class).partition(":")
            policy_class = getattr(importlib.import_module(module), name)
        hyper = {**config["hyperparameters"], **kwargs}
        model = cls(policy_class, env, device=device, _init_setup_model=False)  # type: ignore[arg-type]
        for name, value in hyper.items():
            if name not in HYPERPARAMETERS:
                raise TypeError(f"{cls.__name__}.load() got an unexpected hyperparameter {name!r}")
            setattr(model, _ATTRIBUTE.get(name, name), value)
        model.policy_kwargs = dict(saved_policy_kwargs)
        model.credit_kwargs = dict(model.credit_kwargs or {})
        model.task_seed_base = int(config.get("seeds", {}).get("task_seed_base", model.task_seed_base))
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

        counters = config["counters"]
        model.num_timesteps = int(counters["num_timesteps"])
        model._n_updates = int(counters["n_updates"])
        model._iterations = int(counters["iterations"])
        model._skipped_steps = int(counters.get("skipped_steps", 0))
        model._episode_num = int(counters.get("episode_num", 0))
        model._total_timesteps = int(counters.get("total_timesteps", 0))
        model._current_progress_remaining = float(counters.get("current_progress_remaining", 1.0))
        model._elapsed_before = float(counters.get("time_elapsed_s", 0.0))
        state = config.get("rng", {}).get("minibatch")
        if state is not None:
            model._rng.bit_generator.state = state
        model.ep_info_buffer = deque(maxlen=model._stats_window_size)
        model.ep_success_buffer = deque(maxlen=model._stats_window_size)
        return model
