"""The per-call work of acting, vectorised or kept, against what it replaced: choose mode's draws, the
packed candidate scoring, the kept candidate scores, the prompt's chat wrapping and token ids."""

from __future__ import annotations

import numpy as np
import pytest
import torch as th
from transformers import AutoModelForCausalLM, AutoTokenizer

from milegpo.config import LoraConfig
from milegpo.policies import PromptBuilder, tiny_model
from milegpo.policies import candidate_scoring as scoring
from milegpo.policies.model import load_lora_model, merged_forwards
from milegpo.policies.prompt_tokens import (
    CandidateTokens,
    KeptPromptBuilder,
    RenderedChatTemplate,
    fast_backend,
    split_chat_template,
)
from milegpo.policies.prompts import INSTRUCTIONS
from milegpo.policies.sampling import choose_candidates, chosen_log_probs

TEXTS = ["you are in the hall . you see a red box and a door to the kitchen", "go to kitchen", "open red box",
         "Your task : put the apple in the fridge", "Step observation action"]


def per_row_choice(scores, temperature, deterministic, rngs):
    """Choose mode's draw as it was, one row at a time (``Generator.choice`` on the row's softmax)."""
    chosen, logps = [], []
    for k, s in enumerate(scores):
        log_pi = th.log_softmax(s.float() / temperature, dim=-1)
        if deterministic:
            c = int(log_pi.argmax())
        else:
            rng = rngs[k] if isinstance(rngs, list) else rngs
            p = log_pi.exp().numpy().astype(np.float64)
            c = int(rng.choice(len(s), p=p / p.sum()))
        chosen.append(c)
        logps.append(np.float32(log_pi[c].item()))
    return chosen, np.array(logps, dtype=np.float32)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("shared", [True, False])
def test_choose_candidates_draws_as_the_per_row_choice(deterministic, shared):
    g = th.Generator().manual_seed(0)
    for trial in range(40):
        rows = [th.randn(int(th.randint(1, 14, (1,), generator=g)), generator=g) * 3 for _ in range(37)]
        rngs_a = np.random.default_rng(trial) if shared else [np.random.default_rng([trial, k]) for k in range(37)]
        rngs_b = np.random.default_rng(trial) if shared else [np.random.default_rng([trial, k]) for k in range(37)]
        temperature = 0.4 + trial / 20
        expected = per_row_choice(rows, temperature, deterministic, rngs_a)
        got = choose_candidates(rows, temperature, deterministic, rngs_b)
        assert got[0] == expected[0]
        assert np.array_equal(got[1], expected[1])
    if shared and not deterministic:  # the shared generator advanced by one draw per row, as before
        assert rngs_a.random() == rngs_b.random()


def test_choose_candidates_one_candidate_and_ties():
    chosen, logp = choose_candidates([th.tensor([2.0]), th.tensor([1.0, 1.0])], 1.0, True, np.random.default_rng(0))
    assert chosen == [0, 0] and logp[0] == 0.0 and np.isclose(logp[1], np.log(0.5))


def per_row_units(scores, chosen, temperature):
    """The update's choose-mode units as they were: one softmax and two indexed writes per row."""
    logp, entropy = th.zeros((len(scores), 1)), th.zeros((len(scores), 1))
    for i, (sc, c) in enumerate(zip(scores, chosen)):
        log_pi = th.log_softmax(sc / temperature, dim=-1)
        logp[i, 0] = log_pi[c]
        entropy[i, 0] = -(log_pi.exp() * log_pi).sum()
    return logp, entropy


def test_chosen_log_probs_equal_the_per_row_units_and_their_gradients():
    g = th.Generator().manual_seed(3)
    leaves = [th.randn(int(th.randint(1, 9, (1,), generator=g)), generator=g, requires_grad=True) for _ in range(23)]
    scores = leaves + leaves[:5]  # rows sharing a tensor (identical prompts scored once)
    chosen = [int(th.randint(len(s), (1,), generator=g)) for s in scores]
    weights = th.randn(len(scores), 2, generator=g)
    old_logp, old_entropy = per_row_units(scores, chosen, 0.7)
    old_grads = th.autograd.grad((th.cat([old_logp, old_entropy], 1) * weights).sum(), leaves)
    logp, entropy = chosen_log_probs(scores, chosen, 0.7, with_entropy=True)
    grads = th.autograd.grad((th.cat([logp, entropy], 1) * weights).sum(), leaves)
    th.testing.assert_close(logp, old_logp, atol=1e-6, rtol=0)
    th.testing.assert_close(entropy, old_entropy, atol=1e-6, rtol=0)
    for a, b in zip(grads, old_grads):
        assert th.isfinite(a).all()
        th.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert chosen_log_probs(scores, chosen, 0.7)[1] is None


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def lora_model(request, tmp_path_factory):
    path = tiny_model(TEXTS, tmp_path_factory.mktemp(request.param), arch=request.param, seed=5)
    _, model, _, _ = load_lora_model(path, LoraConfig(r=4, alpha=8), "cpu", None, False, 0)
    g = th.Generator().manual_seed(0)
    with th.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(th.randn(p.shape, generator=g) * 0.1)
    return model


def rows(vocab: int, seed: int = 0):
    g = th.Generator().manual_seed(seed)
    prompts = [th.randint(4, vocab, (n,), generator=g).tolist() for n in (6, 1, 14, 9, 3)]
    candidates = [[th.randint(4, vocab, (k,), generator=g).tolist() for k in ks]
                  for ks in ((2, 1, 4), (3,), (1, 1), (5, 2, 2, 3), (2,))]
    return prompts, candidates


def test_packed_scoring_head_at_the_predicting_positions_equals_all_logits(lora_model, monkeypatch):
    """The packed scoring applies the head only where a candidate token is predicted (gathered hidden states);
    its log-probs and their gradients equal those of the logits at every position."""
    prompts, candidates = rows(lora_model.config.vocab_size)
    lora_model.train()
    gathered, mask = scoring.packed_candidate_logprobs(lora_model, prompts, candidates, pad_id=1)
    grads = th.autograd.grad(gathered[mask].sum(), [p for p in lora_model.parameters() if p.requires_grad])
    monkeypatch.setattr(scoring, "supports_right_padded_rows", lambda model: False)
    full, full_mask = scoring.packed_candidate_logprobs(lora_model, prompts, candidates, pad_id=1)
    full_grads = th.autograd.grad(full[full_mask].sum(), [p for p in lora_model.parameters() if p.requires_grad])
    lora_model.eval()
    assert th.equal(mask, full_mask)
    th.testing.assert_close(gathered, full, atol=1e-5, rtol=0)
    for a, b in zip(grads, full_grads):
        th.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_packed_scoring_equals_each_candidate_alone(lora_model):
    prompts, candidates = rows(lora_model.config.vocab_size, seed=1)
    with th.no_grad(), merged_forwards(lora_model):
        logp, mask = scoring.packed_candidate_logprobs(scoring.forward_model(lora_model), prompts, candidates, 1)
    k = 0
    with th.no_grad():
        for prompt, cands in zip(prompts, candidates):
            for cand in cands:
                ids = th.tensor([prompt + cand])
                alone = th.log_softmax(lora_model(input_ids=ids).logits[0, len(prompt) - 1:-1], -1)
                expected = alone.gather(-1, th.tensor(cand)[:, None])[:, 0]
                th.testing.assert_close(logp[k, : len(cand)], expected, atol=1e-5, rtol=0)
                assert mask[k].sum() == len(cand)
                k += 1


def test_acting_keeps_scores_while_the_weights_stay(lora_model, monkeypatch):
    prompts, candidates = rows(lora_model.config.vocab_size, seed=2)
    calls = []
    packed = scoring.packed_candidate_logprobs
    monkeypatch.setattr(scoring, "packed_candidate_logprobs", lambda m, p, c, pad: calls.append(len(p)) or
                        packed(m, p, c, pad))
    with th.no_grad(), merged_forwards(lora_model):
        first = scoring.candidate_scores(lora_model, prompts, candidates, 1, 4096)
        again = scoring.candidate_scores(lora_model, prompts[1:] + prompts[:1], candidates[1:] + candidates[:1], 1,
                                         4096)
        means = scoring.candidate_scores(lora_model, prompts, candidates, 1, 4096, "mean")  # another key
    assert calls == [5, 5]
    assert all(th.equal(a, b) for a, b in zip(first[1:] + first[:1], again))
    assert not all(th.equal(a, b) for a, b in zip(first, means))
    with th.no_grad():
        for p in lora_model.parameters():  # new weights: scored again
            if p.requires_grad:
                p.add_(th.randn(p.shape, generator=th.Generator().manual_seed(9)) * 0.1)
        with merged_forwards(lora_model):
            changed = scoring.candidate_scores(lora_model, prompts, candidates, 1, 4096)
    assert calls == [5, 5, 5]
    assert not all(th.allclose(a, b) for a, b in zip(first, changed))
    with th.no_grad():  # outside acting: never kept
        scoring.candidate_scores(lora_model, prompts, candidates, 1, 4096)
    assert calls == [5, 5, 5, 5]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return AutoTokenizer.from_pretrained(tiny_model(TEXTS, tmp_path_factory.mktemp("tok")))


CONTENTS = ["put the apple in the fridge", "", " spaces around ", "two\nlines\n\n", "{braces} and 'quotes'",
            "<|im_end|> inside", "ünï ✓"]


def test_chat_wrapping_rendered_once_equals_the_template(tokenizer):
    wrapped = RenderedChatTemplate(tokenizer)
    assert wrapped.split is not None
    for content in CONTENTS:
        message = [{"role": "user", "content": content}]
        assert wrapped.apply_chat_template(message, add_generation_prompt=True, tokenize=False) == \
            tokenizer.apply_chat_template(message, add_generation_prompt=True, tokenize=False)
    two = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]  # not a lone message
    assert wrapped.apply_chat_template(two, tokenize=False) == tokenizer.apply_chat_template(two, tokenize=False)


def test_a_template_that_changes_the_content_is_rendered_every_time(tmp_path):
    tok = AutoTokenizer.from_pretrained(tiny_model(TEXTS, tmp_path))
    tok.chat_template = "{% for m in messages %}<{{ m['content'] | trim }}>{% endfor %}"
    assert split_chat_template(tok) is None
    message = [{"role": "user", "content": "  x  "}]
    assert RenderedChatTemplate(tok).apply_chat_template(message, add_generation_prompt=True, tokenize=False) == "<x>"


def test_prompt_ids_from_the_backend_equal_the_tokenizer(tokenizer):
    wrapped = RenderedChatTemplate(tokenizer)
    assert wrapped.backend is fast_backend(tokenizer) is not None
    texts = [wrapped.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True,
                                         tokenize=False) for c in CONTENTS] + TEXTS
    for text in texts:
        assert wrapped(text, add_special_tokens=False)["input_ids"] == \
            tokenizer(text, add_special_tokens=False)["input_ids"]
    tokenizer._tokenizer.enable_truncation(3)  # a backend set otherwise: the tokenizer's own call answers
    try:
        assert wrapped(TEXTS[0], add_special_tokens=False)["input_ids"] == \
            tokenizer(TEXTS[0], add_special_tokens=False)["input_ids"]
    finally:
        tokenizer._tokenizer.no_truncation()


def test_kept_prompts_equal_the_prompt_builder(tokenizer):
    for history_length in (0, 2):
        template = "{task} {history} Step {step}: {observation} [{admissible_commands}] {instructions}"
        plain = PromptBuilder(tokenizer, template, INSTRUCTIONS["choose"], history_length, 512)
        kept = KeptPromptBuilder(tokenizer, template, INSTRUCTIONS["choose"], history_length, 512)
        rng = np.random.default_rng(history_length)
        history: list[tuple[str, str]] = []
        for step in range(40):
            obs = TEXTS[int(rng.integers(len(TEXTS)))]
            commands = None if step % 7 == 0 else ["go to kitchen", "open red box"][: 1 + step % 2]
            if step % 10 == 0:
                history = []  # a new episode: the same states at other step numbers
            assert kept.build("put the apple in the fridge", obs, history, commands) == \
                plain.build("put the apple in the fridge", obs, history, commands)
            history.append((obs, "go to kitchen" if step % 3 else "open red box"))


def test_candidate_ids_are_the_command_then_the_end_of_turn_token(tokenizer):
    ids = CandidateTokens(tokenizer)
    for command in ("go to kitchen", "open red box", "go to kitchen"):
        expected = tokenizer(command, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        got = ids(command)
        assert got == expected
        got.append(0)  # callers own their list
        assert ids(command) == expected
    commands = ["open red box", "go to kitchen", "look", "look"]  # kept and new, a repeat
    many = ids.many(commands)
    assert many == [tokenizer(c, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for c in commands]
    many[2].append(0)
    assert ids.many(commands)[3] == ids("look") and many[3] != many[2]  # a fresh list each


def test_a_tokenizer_without_end_of_turn_token(tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model(TEXTS, tmp_path))
    del model
    tok = AutoTokenizer.from_pretrained(tmp_path)
    tok.eos_token = None
    assert CandidateTokens(tok)("go to kitchen") == tok("go to kitchen", add_special_tokens=False)["input_ids"]
