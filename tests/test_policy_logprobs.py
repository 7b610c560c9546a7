"""Batched, masked completion log-probs equal each sample scored alone."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from milegpo.policies import completion_logprobs, tiny_model
from milegpo.policies.candidate_scoring import candidate_logprobs, packed_candidate_logprobs, supports_packed_candidates
from milegpo.policies.scoring import right_padded_logprobs, score_rows, supports_right_padded_rows

TEXTS = ["you are in the hall . you see a red box and a door to the kitchen", "go to kitchen", "open red box"]


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def model(request, tmp_path_factory):
    path = tiny_model(TEXTS, tmp_path_factory.mktemp(request.param), arch=request.param, seed=7)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def rows(vocab_size, seed=0):
    """Prompts and completions of very different lengths (heavy left and right padding)."""
    g = torch.Generator().manual_seed(seed)
    lengths = [(3, 5), (17, 1), (9, 8), (1, 2), (12, 3)]
    prompts = [torch.randint(4, vocab_size, (p,), generator=g).tolist() for p, _ in lengths]
    completions = [torch.randint(4, vocab_size, (c,), generator=g).tolist() for _, c in lengths]
    return prompts, completions


def alone(model, prompt, completion):
    """The reference: one unpadded sequence, log_softmax over the full logits."""
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


@torch.no_grad()
def test_batched_equals_alone(model):
    prompts, completions = rows(model.config.vocab_size)
    logp, mask, entropy = completion_logprobs(model, prompts, completions, pad_id=1, with_entropy=True)
    assert logp.shape == mask.shape == entropy.shape == (5, 8)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        assert mask[i].tolist() == [True] * len(c) + [False] * (8 - len(c))
        torch.testing.assert_close(logp[i, : len(c)], alone(model, p, c), atol=1e-5, rtol=0)
        assert (logp[i, len(c) :] == 0).all() and (entropy[i, len(c) :] == 0).all()
    assert (entropy[mask] > 0).all()


@torch.no_grad()
def test_temperature_scales_logits(model):
    prompts, completions = rows(model.config.vocab_size, seed=1)
    hot, _, _ = completion_logprobs(model, prompts[:1], completions[:1], pad_id=1, temperature=2.0)
    ids = torch.tensor([prompts[0] + completions[0]])
    logits = model(input_ids=ids).logits[0, len(prompts[0]) - 1 : -1] / 2.0
    ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(completions[0])[:, None])[:, 0]
    torch.testing.assert_close(hot[0], ref, atol=1e-5, rtol=0)


@torch.no_grad()
def test_position_ids_matter_with_left_padding(model):
    """Without position_ids a left-padded row of an absolute-position model is scored wrongly."""
    from milegpo.policies.scoring import _token_logprobs, pad_rows

    prompts, completions = rows(model.config.vocab_size, seed=2)
    # the same forward pass as completion_logprobs, but with the model's default positions (0, 1, ... per row)
    prompt_ids, prompt_mask = pad_rows(prompts, 1, left=True)
    comp_ids, comp_mask = pad_rows(completions, 1)
    ids, full_mask = torch.cat([prompt_ids, comp_ids], 1), torch.cat([prompt_mask, comp_mask], 1)
    p_len = prompt_ids.shape[1]
    logits = model(input_ids=ids, attention_mask=full_mask).logits[:, p_len - 1: -1]
    wrong, mask, _ = _token_logprobs(logits.float(), ids[:, p_len:], full_mask[:, p_len:].bool(), False)
    right, _, _ = completion_logprobs(model, prompts, completions, pad_id=1)
    error = (wrong - right).abs()[mask].max().item()
    if model.config.model_type == "gpt2":
        assert error > 1e-3  # learned absolute positions: shifted positions change the scores
    else:
        assert error < 1e-4  # rotary positions are relative: a constant shift cancels out


def test_gradients_flow_only_where_expected(model):
    prompts, completions = rows(model.config.vocab_size, seed=3)
    logp, mask, _ = completion_logprobs(model, prompts, completions, pad_id=1)
    logp[mask].sum().backward()
    grad = model.get_input_embeddings().weight.grad
    assert grad is not None and grad.abs().sum() > 0
    model.zero_grad(set_to_none=True)


def test_rejects_empty_rows(model):
    with pytest.raises(ValueError, match="non-empty"):
        completion_logprobs(model, [[5, 6]], [[]], pad_id=1)


@torch.no_grad()
def test_shared_prompt_candidates_equal_flat_rows(model):
    """candidate_logprobs (prompt run once, KV cache shared) == every (prompt, candidate) row scored flat."""
    g = torch.Generator().manual_seed(4)
    v = model.config.vocab_size
    prompts = [torch.randint(4, v, (k,), generator=g).tolist() for k in (3, 11, 6)]
    candidates = [[torch.randint(4, v, (k,), generator=g).tolist() for k in ks] for ks in ((2, 5), (1,), (4, 3, 6))]
    shared, mask = candidate_logprobs(model, prompts, candidates, pad_id=1)
    flat_p = [p for p, cands in zip(prompts, candidates) for _ in cands]
    flat_c = [c for cands in candidates for c in cands]
    flat, flat_mask, _ = completion_logprobs(model, flat_p, flat_c, pad_id=1)
    assert torch.equal(mask, flat_mask)
    torch.testing.assert_close(shared, flat, atol=1e-5, rtol=0)
    for r, (p, c) in enumerate(zip(flat_p, flat_c)):
        torch.testing.assert_close(shared[r, : len(c)], alone(model, p, c), atol=1e-5, rtol=0)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_candidates_equal_each_candidate_alone(model, attention, tmp_path):
    """packed_candidate_logprobs (all candidates of a prompt in one row on its cache, a 4D mask) scores every
    candidate as if it followed its prompt alone, with and without gradients, for both mask formats."""
    model.save_pretrained(tmp_path)
    packed_model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32, attn_implementation=attention)
    assert supports_packed_candidates(packed_model)
    g = torch.Generator().manual_seed(5)
    v = model.config.vocab_size
    prompts = [torch.randint(4, v, (k,), generator=g).tolist() for k in (3, 14, 1, 7)]
    candidates = [[torch.randint(4, v, (k,), generator=g).tolist() for k in ks]
                  for ks in ((2, 5), (1,), (4, 3, 6), (1, 1, 2, 1))]
    packed, mask = packed_candidate_logprobs(packed_model, prompts, candidates, pad_id=1)
    with torch.no_grad():
        shared, shared_mask = candidate_logprobs(model, prompts, candidates, pad_id=1)
    assert torch.equal(mask, shared_mask) and packed.requires_grad
    torch.testing.assert_close(packed.detach(), shared, atol=1e-5, rtol=0)
    flat = [(p, c) for p, cands in zip(prompts, candidates) for c in cands]
    for r, (p, c) in enumerate(flat):
        torch.testing.assert_close(packed[r, : len(c)].detach(), alone(model, p, c), atol=1e-5, rtol=0)
    packed.sum().backward()  # a graph through both passes
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in packed_model.parameters())


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_right_padded_rows_equal_each_sample_alone(model, attention, tmp_path):
    """right_padded_logprobs ([prompt | completion | pad], no mask, the head on gathered states) gives the
    left/right-padded path's log-probs and entropies, each sample's alone, and gradients."""
    model.save_pretrained(tmp_path)
    right_model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32, attn_implementation=attention)
    assert supports_right_padded_rows(right_model)
    prompts, completions = rows(model.config.vocab_size, seed=3)
    logp, mask, entropy = right_padded_logprobs(right_model, prompts, completions, pad_id=1, temperature=0.7,
                                                with_entropy=True)
    with torch.no_grad():
        ref, ref_mask, ref_entropy = completion_logprobs(model, prompts, completions, pad_id=1, temperature=0.7,
                                                         with_entropy=True)
    assert torch.equal(mask, ref_mask) and logp.requires_grad
    torch.testing.assert_close(logp.detach(), ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy.detach(), ref_entropy, atol=1e-5, rtol=0)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        ids = torch.tensor([p + c])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(p) - 1 : -1] / 0.7
        alone_logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c)[:, None])[:, 0]
        torch.testing.assert_close(logp[i, : len(c)].detach(), alone_logp, atol=1e-5, rtol=0)
    logp.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in right_model.parameters())


def test_score_rows_takes_the_right_padded_path_only_where_the_model_allows(model, tmp_path):
    """score_rows chunks by padded tokens and gives the same log-probs on both paths; an architecture
    outside the plain-head list (its logits may be post-processed) keeps the left-padded path."""
    prompts, completions = rows(model.config.vocab_size, seed=4)
    assert supports_right_padded_rows(model)
    with torch.no_grad():
        fast, _ = score_rows(model, prompts, completions, pad_id=1, temperature=1.0, batch_tokens=24)
        ref, _, _ = completion_logprobs(model, prompts, completions, pad_id=1)
    for i, c in enumerate(completions):
        torch.testing.assert_close(fast[i], ref[i, : len(c)], atol=1e-5, rtol=0)
    model.config.model_type, original = "gemma2", model.config.model_type  # soft-caps its logits after the head
    try:
        assert not supports_right_padded_rows(model)
    finally:
        model.config.model_type = original


def _pad_rows_one_by_one(rows, pad_id, left):
    """The previous pad_rows: one tensor conversion per row."""
    width = max(map(len, rows), default=0)
    ids = torch.full((len(rows), width), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if len(row):
            span = slice(width - len(row), width) if left else slice(0, len(row))
            ids[i, span] = torch.as_tensor(list(row), dtype=torch.long)
            mask[i, span] = 1
    return ids, mask


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("as_arrays", [True, False])
def test_pad_rows_equals_padding_row_by_row(left: bool, as_arrays: bool) -> None:
    import numpy as np

    from milegpo.policies.scoring import pad_rows

    rng = np.random.default_rng(0)
    for _ in range(50):
        rows = [rng.integers(0, 1000, size=int(n)) for n in rng.integers(0, 12, size=int(rng.integers(0, 6)))]
        rows = rows if as_arrays else [r.tolist() for r in rows]
        got, want = pad_rows(rows, 7, left=left), _pad_rows_one_by_one(rows, 7, left)
        assert torch_equal(got, want)


def torch_equal(a, b) -> bool:
    return all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b))
