"""The policy's settings: :class:`PolicyConfig` with its :class:`LoraConfig` and :class:`SamplerConfig`.

Torch-free, so the command line and the run config can read them without loading a model.
The defaults are the paper's setting (free-text actions with ``<think>`` reasoning, the last
two steps in the prompt, a 2048-token prompt and a 512-token reply).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from milegpo.config.fields import check_int, check_number, check_type
from milegpo.options import (
    ACTION_PARSERS,
    CANDIDATE_SCORES,
    MODES,
    PROMPT_FORMATS,
    ROLLOUT_BACKENDS,
    check_backend_for_mode,
    check_choice,
)


@dataclass(frozen=True)
class LoraConfig:
    """The LoRA adapter (the only weights that are trained).

    :param r: rank.
    :param alpha: scale numerator (the update is scaled by alpha / r).
    :param dropout: dropout on the adapter's input.
    :param target_modules: module names to adapt; null: a per-architecture default
        (the attention and MLP projections of Llama / Qwen / Mistral / Gemma / GPT-2), else "all-linear".
    """

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] | None = None

    def __post_init__(self) -> None:
        check_int("lora.r", self.r, 1)
        check_number("lora.alpha", self.alpha)
        check_number("lora.dropout", self.dropout, positive=False)
        if self.dropout >= 1:
            raise ValueError(f"lora.dropout must be < 1, got {self.dropout!r}")
        if self.target_modules is not None and not (
                isinstance(self.target_modules, list) and all(isinstance(m, str) for m in self.target_modules)):
            raise ValueError(f"lora.target_modules must be a list of module names or null, got {self.target_modules!r}")


@dataclass(frozen=True)
class SamplerConfig:
    """Who samples generate-mode replies.

    :param backend: ``"hf"`` (the trainer's model) or ``"vllm"`` (a colocated vLLM engine that
        gets the adapter after every update; ``pip install 'milegpo[vllm]'``).
    :param vllm_kwargs: more ``vllm.LLM`` arguments (e.g. ``{gpu_memory_utilization: 0.4}``).
    :param trust_logprobs: keep the sampler's log-probs as the behaviour log-probs instead of
        recomputing them with the trainer's model (saves a forward pass per step; verl recomputes).
    """

    backend: str = "hf"
    vllm_kwargs: dict[str, Any] = field(default_factory=dict)
    trust_logprobs: bool = False

    def __post_init__(self) -> None:
        check_choice("sampler.backend", self.backend, ROLLOUT_BACKENDS)
        check_type("sampler.vllm_kwargs", self.vllm_kwargs, dict, "a mapping")
        check_type("sampler.trust_logprobs", self.trust_logprobs, bool, "true or false")


def absolute_model_path(model: str | None) -> str | None:
    """A model that is a local path, made absolute (it then names the same folder from any working
    directory); a hub id, or None, unchanged."""
    if model is None or not os.path.exists(os.path.expanduser(model)):
        return model
    return os.path.abspath(os.path.realpath(os.path.expanduser(model)))


@dataclass(frozen=True)
class PolicyConfig:
    """How the LLM policy reads, acts and is optimised (:class:`~milegpo.policies.LLMPolicy`).

    :param model: a hub name or local folder of a causal LM and its tokenizer; in a run config,
        null builds the offline tiny model (``run.tiny_model``).
    :param mode: ``"generate"`` (the model writes a reply ending in ``<action>...</action>``) or
        ``"choose"`` (the env lists admissible commands; the policy samples one by their scores).
    :param lora: the adapter (:class:`LoraConfig`).
    :param dtype: null (bf16 on CUDA, fp32 on CPU), ``"float32"``, ``"bfloat16"``, ``"float16"``.
    :param prompt_format: ``"template"``: each step is one user message made from ``prompt_template``
        (task, the last steps as text, observation, instructions: the paper's layout);
        ``"chat"``: the episode is one conversation, the env's opening messages (or the task and first
        observation) then the model's replies and the env's observations as turns, through the tokenizer's
        chat template (multi-turn envs, SkyRL-Gym datasets); each trajectory is then scored in one
        forward pass where its turns extend each other.
    :param action_parser: how a generated reply becomes the env's action: ``"auto"`` (the env's
        ``action_format``), ``"tags"`` (the content of ``<action>…</action>``), ``"message"`` (the whole
        reply: the env parses it), ``"tools"`` (the reply's tool call, read by the tokenizer's own
        response template when it has one) or ``"module:function"`` (``function(reply) -> action``,
        None when it finds none).
    :param prompt_template: template format: a family of ``milegpo.policies.PROMPT_TEMPLATES`` (``default``,
        ``alfworld``, ``webshop``) or a format string with named fields; null: ``default``.
    :param history_length: past steps shown in the prompt (template: (observation, action) pairs; chat:
        (reply, observation) turns).
    :param max_prompt_tokens: prompt budget (the oldest history is dropped first).
    :param max_new_tokens: generate mode: the longest reply.
    :param temperature: sampling temperature of the rollouts (and of the log-probs the update uses).
    :param think: generate mode: ask for ``<think>...</think>`` reasoning before the action.
    :param candidate_score: choose mode: a command's score is the ``"sum"`` or the ``"mean"`` of its
        token log-probs (``"mean"`` removes the preference for short commands).
    :param max_batch_tokens: padded tokens per scoring forward pass; null: 4096 on a CPU, 16384 on a GPU.
    :param gradient_checkpointing: recompute activations in the backward pass (memory for time).
    :param optimizer_class: the optimizer over the LoRA parameters, as ``"module:Name"``.
    :param optimizer_kwargs: its extra arguments (``lr`` comes from ``algo.learning_rate``).
    :param sampler: who samples generate-mode replies (:class:`SamplerConfig`).
    """

    model: str | None = None
    mode: str = "generate"
    lora: LoraConfig = field(default_factory=LoraConfig)
    dtype: str | None = None
    prompt_format: str = "template"
    action_parser: str = "auto"
    prompt_template: str | None = None
    history_length: int = 2
    max_prompt_tokens: int = 2048
    max_new_tokens: int = 512
    temperature: float = 1.0
    think: bool = True
    candidate_score: str = "sum"
    max_batch_tokens: int | None = None
    gradient_checkpointing: bool = False
    optimizer_class: str = "torch.optim:AdamW"
    optimizer_kwargs: dict[str, Any] = field(default_factory=dict)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)

    def __post_init__(self) -> None:
        check_type("policy.model", self.model, str, "a model name or path", optional=True)
        check_choice("policy.mode", self.mode, MODES)
        check_type("policy.lora", self.lora, LoraConfig, "a LoraConfig")
        check_choice("policy.dtype", self.dtype, (None, "auto", "float32", "fp32", "bfloat16", "bf16", "float16",
                                                  "fp16"))
        check_choice("policy.prompt_format", self.prompt_format, PROMPT_FORMATS)
        if self.action_parser not in ACTION_PARSERS and ":" not in str(self.action_parser):
            raise ValueError(f"policy.action_parser must be one of {list(ACTION_PARSERS)} or 'module:function', "
                             f"got {self.action_parser!r}")
        check_type("policy.prompt_template", self.prompt_template, str, "a template family or string", optional=True)
        check_int("policy.history_length", self.history_length, 0)
        check_int("policy.max_prompt_tokens", self.max_prompt_tokens, 1)
        check_int("policy.max_new_tokens", self.max_new_tokens, 1)
        check_number("policy.temperature", self.temperature)
        check_type("policy.think", self.think, bool, "true or false")
        check_choice("policy.candidate_score", self.candidate_score, CANDIDATE_SCORES)
        check_int("policy.max_batch_tokens", self.max_batch_tokens, 1, optional=True)
        check_type("policy.gradient_checkpointing", self.gradient_checkpointing, bool, "true or false")
        check_type("policy.optimizer_class", self.optimizer_class, str, "a 'module:Name' path")
        check_type("policy.optimizer_kwargs", self.optimizer_kwargs, dict, "a mapping")
        check_type("policy.sampler", self.sampler, SamplerConfig, "a SamplerConfig")
        check_backend_for_mode(self.sampler.backend, self.mode)
