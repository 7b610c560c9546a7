"""``TrainConfig``: everything that defines a training run, as plain values (saved as the run's ``config.json``).

It is the one description of a run's settings: ``milegpo train`` builds its flags from
it, :meth:`TrainConfig.validate` checks every field (no I/O, no torch) and
:mod:`milegpo.run.train` turns it into a run folder. The defaults are the CPU demo's.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from milegpo.credit import CREDIT_METHODS
from milegpo.options import (
    CANDIDATE_SCORES,
    CREDIT_PRESETS,
    MODES,
    ROLLOUT_BACKENDS,
    check_backend_for_mode,
    check_choice,
    check_known_keys,
)

#: (field, smallest allowed value) of the integer fields
_MIN_INTS = {"n_tasks": 1, "group_size": 1, "total_timesteps": 1, "n_epochs": 1, "micro_batch_tokens": 1,
             "lora_r": 1, "history_length": 0, "max_prompt_tokens": 1, "max_new_tokens": 1, "n_eval_tasks": 1,
             "eval_copies": 1, "eval_freq": 1, "checkpoint_freq": 1, "tiny_hidden_size": 1, "tiny_layers": 1,
             "tiny_heads": 1}


@dataclass
class TrainConfig:
    """Everything that defines a training run (plain values only: it is saved as JSON).

    The defaults are the CPU demo's (MileGPO on House with the offline tiny model); the
    paper's GPU setting is in the README.

    > What is trained, on what

    :param algo: the credit method: ``"milegpo"``, ``"graphgpo"``, ``"hgpo"``, ``"gigpo"``,
        ``"rloo"`` or ``"grpo"`` (the trainer is the same; only the step advantages differ).
    :param env: a registered env id (an unknown one is refused with the list of registered ids).
    :param env_kwargs: the env's constructor arguments (e.g. ``{"max_episode_steps": 30}``).
    :param train_split: the env's ``split`` kwarg for training; None: the env has no splits.
    :param eval_splits: held-out splits evaluated during and after training (may be empty).
    :param n_tasks: tasks per iteration (a multiple of the number of processes).
    :param group_size: rollouts per task: the group the credit compares (the paper: 8).
    :param total_timesteps: training budget in env steps (of active envs).
    :param credit_preset: MileGPO's per-env settings, ``"alfworld"`` or ``"webshop"`` (no-op for the baselines).
    :param credit_kwargs: overrides of the credit config's fields (``milegpo.credit.make_credit_config``).

    > The model

    :param model: a hub name or local path of a causal LM; None builds the offline tiny model.
    :param tiny_hidden_size: the tiny model's width (only when ``model`` is None).
    :param tiny_layers: its layers.
    :param tiny_heads: its attention heads.
    :param lora_r: LoRA rank (only the adapter is trained).
    :param lora_alpha: LoRA alpha.
    :param dtype: None (bf16 on CUDA, fp32 on CPU), ``"float32"``, ``"bfloat16"``, ``"float16"``.
    :param gradient_checkpointing: recompute activations in the backward pass (memory for time).
    :param device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"``.
    :param warm_start: supervised warm start before RL: behaviour cloning of the env's noisy
        scripted expert, the keys of :class:`milegpo.algos.warm_start.WarmStartConfig`
        (``episodes``, ``epsilon``, ``epochs``, ...); None: RL from the model as it is.

    > Acting (rollouts)

    :param mode: ``"choose"`` (score the admissible commands) or ``"generate"`` (free text, ``<action>`` tags).
    :param prompt_template: a family of ``milegpo.policies.PROMPT_TEMPLATES`` or a format string.
    :param history_length: past (observation, action) steps shown in the prompt.
    :param max_prompt_tokens: prompt budget (the oldest history is dropped first).
    :param candidate_score: choose mode: a command's score is the ``"sum"`` or the ``"mean"`` of its
        token log-probs (``"mean"`` keeps a random tiny LM from always picking the shortest command).
    :param temperature: sampling temperature of the rollouts (and of the log-probs the update uses).
    :param max_new_tokens: generate mode: the longest reply.
    :param think: generate mode: ask for ``<think>...</think>`` before the action.
    :param rollout_backend: generate mode: who samples the replies, ``"hf"`` (the trainer's model)
        or ``"vllm"`` (a colocated engine).
    :param vllm_kwargs: more ``vllm.LLM`` arguments (e.g. ``{"gpu_memory_utilization": 0.4}``).
    :param subprocess: run the envs in worker processes (slow engines: ALFWorld, WebShop); the only
        mode with hang and crash protection (a worker silent for 120 s, or dead, is restarted).

    > The update

    :param learning_rate: AdamW learning rate (the paper: 1e-6 for a 1.5B model; tiny CPU models ~3e-3).
    :param n_epochs: passes over each rollout's steps.
    :param batch_size: steps per minibatch (one optimizer step); None: the whole rollout.
    :param micro_batch_tokens: tokens per forward/backward pass (gradient accumulation:
        a memory knob, not a hyperparameter).
    :param clip_range: PPO ratio clip.
    :param kl_coef: weight of the k3 KL to the base model (the paper: 0.01; 0 skips its forward pass).
    :param ent_coef: entropy bonus weight.

    > Evaluation

    :param n_eval_tasks: held-out tasks per evaluation (task seeds ``0..n_eval_tasks-1``).
    :param eval_copies: episodes per held-out task (sampled evaluation is noisy).
    :param eval_freq: evaluate every this many iterations (and before the first, and at the end).
    :param eval_temperature: sampling temperature of the evaluation (the paper: 0.4; the demo's
        memoryless policy needs 1.0 to escape loops); None: greedy.

    > The run

    :param checkpoint_freq: save a checkpoint every this many iterations (a killed run resumes from it).
    :param seed: seeds the model's adapter, the task draws and the sampling.
    :param report_to: trackers beside ``progress.csv``: ``"tensorboard"``, ``"wandb"``, ``"mlflow"``.
    """

    # what is trained, on what
    algo: str = "milegpo"
    env: str = "milegpo/House-v0"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    train_split: str | None = "train"
    eval_splits: list[str] = field(default_factory=lambda: ["eval_id", "eval_ood"])
    n_tasks: int = 4
    group_size: int = 8
    total_timesteps: int = 24_000
    credit_preset: str | None = None
    credit_kwargs: dict[str, Any] = field(default_factory=dict)
    # the model
    model: str | None = None
    tiny_hidden_size: int = 32
    tiny_layers: int = 1
    tiny_heads: int = 2
    lora_r: int = 16
    lora_alpha: int = 32
    dtype: str | None = None
    gradient_checkpointing: bool = False
    device: str = "auto"
    warm_start: dict[str, Any] | None = None
    # acting (rollouts)
    mode: str = "choose"
    prompt_template: str | None = "{task} {observation}"
    history_length: int = 0
    max_prompt_tokens: int = 2048
    candidate_score: str = "mean"
    temperature: float = 1.0
    max_new_tokens: int = 512
    think: bool = False
    rollout_backend: str = "hf"
    vllm_kwargs: dict[str, Any] = field(default_factory=dict)
    subprocess: bool = False
    # the update
    learning_rate: float = 3e-3
    n_epochs: int = 1
    batch_size: int | None = 256
    micro_batch_tokens: int = 8192
    clip_range: float = 0.2
    kl_coef: float = 0.0
    ent_coef: float = 0.0
    # evaluation
    n_eval_tasks: int = 50
    eval_copies: int = 2
    eval_freq: int = 5
    eval_temperature: float | None = 1.0
    # the run
    checkpoint_freq: int = 5
    seed: int = 0
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])

    @classmethod
    def field_help(cls) -> dict[str, str]:
        """Each field's description from the class docstring (the help of ``milegpo train``'s flags)."""
        found = {}
        for name, text in re.findall(r":param (\w+): (.*?)(?=\n\s*:param |\n\s*>|\Z)", cls.__doc__ or "", re.S):
            found[name] = " ".join(re.sub(r":\w+:`~?([^`]*)`", r"\1", text).replace("``", "").split())
        return found

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """Build a config, refusing unknown keys with the list of valid ones."""
        check_known_keys(cls, values, "config")
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
        from milegpo.run.tracking import parse_report_to

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
        """The env's constructor arguments for a task split (``split`` added to ``env_kwargs``; None: none)."""
        kwargs = dict(self.env_kwargs)
        if split is not None:
            kwargs["split"] = split
        return kwargs

    def policy_kwargs(self, model_path: str) -> dict[str, Any]:
        """The ``policy_kwargs`` of the algorithm this config builds, for the model at ``model_path``."""
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
    """A finite int or float (not a bool): ``nan <= 0`` is False, so NaN must be refused here."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
