"""LLM policies: a causal LM + LoRA adapter acting on text (see :class:`LLMPolicy`).

``tiny_model`` builds a small offline model for tests and demos;
``smollm2_path`` converts the offline SmolLM2-135M-Instruct package to a local checkpoint.
"""

from milegpo.policies.llm_policy import LLMPolicy
from milegpo.policies.parsing import parse_action
from milegpo.policies.prompts import PROMPT_TEMPLATES, PromptBuilder
from milegpo.policies.sample import ActionSample
from milegpo.policies.scoring import completion_logprobs
from milegpo.policies.smollm import smollm2_path
from milegpo.policies.tiny import build_word_tokenizer, tiny_model

__all__ = [
    "PROMPT_TEMPLATES",
    "ActionSample",
    "LLMPolicy",
    "PromptBuilder",
    "build_word_tokenizer",
    "completion_logprobs",
    "parse_action",
    "smollm2_path",
    "tiny_model",
]
