"""``TrainConfig``: everything that defines a training run, as plain values (saved as the run's ``config.json``).

It is the one description of a run's settings: ``milegpo train`` builds its flags from
it, :meth:`TrainConfig.validate` checks every field (no I/O, no torch) and
:mod:`milegpo.train` turns it into a run folder. The defaults are the CPU demo's.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from milegpo.credit import CREDIT_METHODS
from milegpo.options import (CANDIDATE_SCORES, CREDIT_PRESETS, MODES, ROLLOUT_BACKENDS, check_backend_for_mode,
                             check_choice)

#: (field, smallest allowed value) of the integer fields
_MIN_INTS = {"n_tasks": 1, "group_size": 1, "total_timesteps": 1, "n_epochs": 1, "micro_batch_tokens": 1,
             "lora_r": 1, "history_length": 0, "max_prompt_tokens": 1, "max_new_tokens": 1, "n_eval_tasks": 1,
             "eval_copies": 1, "eval_freq": 1, "checkpoint_freq": 1, "tiny_hidden_size": 1, "tiny_layers": 1,
             "tiny_heads": 1}


@dataclass
class TrainConfig:
    """Everything that defines a training run (plain values only: it is saved as JSON)."""

    algo: str = "milegpo"
    env: str = "milegpo/House-v0"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    #: train/eval split names passed as the env's ``split`` kwarg (None: env has no splits)
    train_split: str | None = "train"
    eval_splits: list[str] = field(default_factory=lambda: ["eval_id", "eval_ood"])
    #: a hub name or local path of a causal LM; None builds the offline tiny model
    model: str | None = None
    mode: str = "choose"
    n_tasks: int = 4
    group_size: int = 8
    total_timesteps: int = 24_000
    learning_rate: float = 3e-3
    n_epochs: int = 1
    batch_size: int | None = 256
    kl_coef: float = 0.0
    ent_coef: float = 0.0
    #: tokens per forward/backward pass (gradient accumulation: a memory knob, not a hyperparameter)
    micro_batch_tokens: int = 8192
    gradient_checkpointing: bool = False
    clip_range: float = 0.2
    lora_r: int = 16
    lora_alpha: int = 32
    #: prompt template: a family name of milegpo.policies.PROMPT_TEMPLATES or a format string
    prompt_template: str | None = "{task} {observation}"
    history_length: int = 0
    max_prompt_tokens: int = 2048
    #: choose mode: score a command by the "sum" or the "mean" of its token log-probs
    #: ("mean" keeps a randomly initialised tiny LM from always picking the shortest command)
    candidate_score: str = "mean"
    temperature: float = 1.0
    #: held-out evaluation: sample at this temperature (the paper: 0.4; the demo's
    #: memoryless policy needs its training temperature 1.0 to escape loops); None = greedy
    eval_temperature: float | None = 1.0
    max_new_tokens: int = 512
    #: generate mode: who samples the replies, "hf" (the trainer's model) or "vllm" (a colocated engine)
    rollout_backend: str = "hf"
    #: more vllm.LLM arguments (e.g. {"gpu_memory_utilization": 0.4})
    vllm_kwargs: dict[str, Any] = field(default_factory=dict)
    think: bool = False
    dtype: str | None = None
    credit_preset: str | None = None
    credit_kwargs: dict[str, Any] = field(default_factory=dict)
    n_eval_tasks: int = 50
    #: episodes per held-out task (sampled evaluation is noisy: several copies per task)
    eval_copies: int = 2
    eval_freq: int = 5
    checkpoint_freq: int = 5
    subprocess: bool = False
    device: str = "auto"
    seed: int = 0
    #: experiment trackers beside progress.csv: "tensorboard", "wandb", "mlflow" (milegpo.tracking)
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    #: supervised warm start before RL: behaviour cloning of the env's noisy scripted expert,
    #: the keys of milegpo.algos.warm_start.WarmStartConfig (episodes, epsilon, epochs, ...); None: off
    warm_start: dict[str, Any] | None = None
    #: tiny model size (used only when ``model`` is None)
    tiny_hidden_size: int = 32
    tiny_layers: int = 1
    tiny_heads: int = 2

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """Build a config, refusing unknown keys with the list of valid ones."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"unknown config key(s) {unknown}; valid keys: {sorted(names)}")
        return cls(**values)

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field and what it accepts (no I/O, no torch)."""
        if self.algo not in CREDIT_METHODS:
            raise ValueError(f"algo must be one of {list(CREDIT_METHODS)}, got {self.algo!r}")
        check_choice("mode", self.mode, MODES)
        for name, smallest in _MIN_INTS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < smallest:
                raise ValueError(f"{name} must be an integer >= {smallest}, got {value!r}")
        if self.batch_size is not None and (not isinstance(self.batch_size, int) or self.batch_size < 1):
            raise ValueError(f"batch_size must be an integer >= 1 or null (the whole rollout), got {self.batch_size!r}")
        for name in ("learning_rate", "temperature", "clip_range", "lora_alpha"):
            if not _number(getattr(self, name)) or getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a number > 0, got {getattr(self, name)!r}")
        for name in ("kl_coef", "ent_coef"):
            if not _number(getattr(self, name)) or getattr(self, name) < 0:
                raise ValueError(f"{name} must be a number >= 0, got {getattr(self, name)!r}")
        if self.eval_temperature is not None and (not _number(self.eval_temperature) or self.eval_temperature <= 0):
            raise ValueError(f"eval_temperature must be > 0, or null for greedy evaluation, got {self.eval_temperature!r}")
        check_choice("candidate_score", self.candidate_score, CANDIDATE_SCORES)
        check_choice("rollout_backend", self.rollout_backend, ROLLOUT_BACKENDS)
        check_backend_for_mode(self.rollout_backend, self.mode)
        if self.credit_preset is not None:
            check_choice("credit_preset", self.credit_preset, CREDIT_PRESETS)
        if self.warm_start is not None:
            from milegpo.algos.warm_start import WarmStartConfig

            if not isinstance(self.warm_start, dict):
                raise ValueError(f"warm_start must be a dict of WarmStartConfig fields or null, got {self.warm_start!r}")
            WarmStartConfig.from_dict(self.warm_start)
        if not isinstance(self.eval_splits, list):
            raise ValueError(f"eval_splits must be a list of split names (may be empty), got {self.eval_splits!r}")
        if not isinstance(self.report_to, list):
            raise ValueError(f"report_to must be a list of tracker names, got {self.report_to!r}")
        from milegpo.tracking import parse_report_to

        parse_report_to(self.report_to)
        if self.device != "auto" and not str(self.device).startswith(("cpu", "cuda", "mps", "xpu")):
            raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")

    @classmethod
    def from_file(cls, path: str | Path) -> TrainConfig:
        try:
            values = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"cannot read config file {str(path)!r}: {error}") from error
        return cls.from_dict(values)

    def env_kwargs_for(self, split: str | None) -> dict[str, Any]:
        kwargs = dict(self.env_kwargs)
        if split is not None:
            kwargs["split"] = split
        return kwargs

    def policy_kwargs(self, model_path: str) -> dict[str, Any]:
        return {
            "model": model_path,
            "mode": self.mode,
            "lora": {"r": self.lora_r, "alpha": self.lora_alpha},
            "dtype": self.dtype,
            "prompt_template": self.prompt_template,
            "history_length": self.history_length,
            "max_prompt_tokens": self.max_prompt_tokens,
            "candidate_score": self.candidate_score,
            "temperature": self.temperature,
            "max_new_tokens": self.max_new_tokens,
            "think": self.think,
            "gradient_checkpointing": self.gradient_checkpointing,
            "seed": self.seed,
            **({"rollout_backend": self.rollout_backend, "vllm_kwargs": dict(self.vllm_kwargs)}
               if self.rollout_backend != "hf" else {}),
        }


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
