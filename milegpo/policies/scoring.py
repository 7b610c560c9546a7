"""Scoring token sequences with a causal LM: padded batches and the log-probs of completions after
their prompts (the candidates of ``choose`` mode are scored in :mod:`~milegpo.policies.candidate_scoring`).

The conventions every forward pass of milegpo follows (and the tests check against each
sample scored alone): prompts are **left**-padded and completions **right**-padded, so
all prompts end at the same column; ``position_ids = cumsum(attention_mask) - 1`` counts
real tokens only (an absolute-position model is otherwise wrong by ~0.4 nats); only the
logits that predict completion tokens are computed (``logits_to_keep``).
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch as th
from peft import PeftModel
from transformers import PreTrainedModel

from milegpo.policies.lean_forward import LeanCausalLM
from milegpo.policies.model import forward_model


def _unwrapped(model: th.nn.Module) -> PreTrainedModel:
    """The transformers model under a peft wrapper or a lean forward (or ``model`` itself)."""
    base = model.get_base_model() if isinstance(model, PeftModel) else model
    base = base.hf if isinstance(base, LeanCausalLM) else base
    assert isinstance(base, PreTrainedModel)
    return base


#: per model class, the forward keyword of its KV cache (reading a signature costs ~0.1 ms, at every policy call)
_CACHE_KEYWORDS: dict[type, str] = {}


def cache_argument(model: th.nn.Module) -> str:
    """The forward keyword of the KV cache (``cache`` since transformers 5.2x, ``past_key_values`` before)."""
    if isinstance(model, LeanCausalLM):
        return "past_key_values"
    base = _unwrapped(model)
    if type(base) not in _CACHE_KEYWORDS:
        _CACHE_KEYWORDS[type(base)] = "cache" if "cache" in inspect.signature(base.forward).parameters \
            else "past_key_values"
    return _CACHE_KEYWORDS[type(base)]


def output_cache(out: Any) -> Any:
    """The KV cache of a model output (``cache`` since transformers 5.2x, ``past_key_values`` before)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def pad_rows(rows: Sequence[Sequence[int]], pad_id: int, left: bool = False,
             device: th.device | str | None = None) -> tuple[th.Tensor, th.Tensor]:
    """``(ids [B, L], attention_mask [B, L])`` of token rows padded with ``pad_id`` to the longest,
    on the left (prompts) or on the right (completions).

    Rows may be lists or int arrays; all tokens are gathered into one flat array and written
    through one boolean mask (row-major, so in row order), with no per-row tensor conversion."""
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    width = int(lengths.max(initial=0))
    columns = np.arange(width)
    filled = columns >= (width - lengths)[:, None] if left else columns < lengths[:, None]
    ids = np.full((len(rows), width), int(pad_id), dtype=np.int64)
    if width:
        arrays = all(isinstance(row, np.ndarray) for row in rows)
        ids[filled] = (np.concatenate(rows) if arrays
                       else np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(lengths.sum())))
    out_ids, mask = th.from_numpy(ids), th.from_numpy(filled.astype(np.int64))
    return (out_ids.to(device), mask.to(device)) if device is not None else (out_ids, mask)


def _check_rows(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]) -> None:
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    if any(len(c) == 0 for c in completions) or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts and completions must be non-empty")


def _token_logprobs(logits: th.Tensor, targets: th.Tensor, mask: th.Tensor,
                    with_entropy: bool) -> tuple[th.Tensor, th.Tensor, th.Tensor | None]:
    """``(log-prob of each target [B, C], mask, entropy [B, C] | None)`` from logits [B, C, V];
    0 where ``mask`` is False."""
    logz = logits.logsumexp(-1)
    logp = (logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logz).masked_fill(~mask, 0.0)
    entropy = None
    if with_entropy:
        log_probs = logits - logz.unsqueeze(-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1).masked_fill(~mask, 0.0)
    return logp, mask, entropy


def completion_logprobs(
    model: th.nn.Module,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_id: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[th.Tensor, th.Tensor, th.Tensor | None]:
    """Per-token log-probs of each completion given its prompt, in one padded forward pass.

    Rows are ``[pad … prompt | completion … pad]`` and the positions count real tokens
    only (``position_ids = cumsum(mask) - 1``: without them a left-padded row of an
    absolute-position model is scored at shifted positions). Returns ``(logp [B, C],
    mask [B, C], entropy [B, C] | None)`` in float32 with ``C`` the longest completion;
    logits are divided by ``temperature``.
    """
    _check_rows(prompts, completions)
    device = next(model.parameters()).device
    p_len = max(map(len, prompts))
    prompt_ids, prompt_mask = pad_rows(prompts, pad_id, left=True, device=device)
    comp_ids, comp_mask = pad_rows(completions, pad_id, device=device)
    ids, mask = th.cat([prompt_ids, comp_ids], dim=1), th.cat([prompt_mask, comp_mask], dim=1)
    c_len = comp_ids.shape[1]
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    # logits at positions p_len-1 … p_len+c_len-2 predict the completion tokens
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids, logits_to_keep=c_len + 1,
                use_cache=False)
    comp_mask = mask[:, p_len:].bool()
    return _token_logprobs(out.logits[:, :-1].float() / temperature, ids[:, p_len:], comp_mask, with_entropy)


#: Attention implementations that take a custom 4D mask as it is (bool for sdpa, additive for eager)
#: and that run unmasked right-padded rows with the causal kernel.
PACKED_ATTENTION = ("sdpa", "eager")
#: Architectures whose logits are exactly ``lm_head(decoder(ids))`` (no soft-capping or scaling after the
#: head), so :func:`right_padded_logprobs` may apply the head to the gathered hidden states itself.
PLAIN_HEAD_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral", "smollm3", "gpt2")


def supports_right_padded_rows(model: th.nn.Module) -> bool:
    """Whether :func:`right_padded_logprobs` can score ``model``: a causal attention that needs no
    mask for right padding (sdpa, eager) and a plain LM head."""
    base = _unwrapped(model)
    config = getattr(base, "config", None)
    return (getattr(config, "_attn_implementation", None) in PACKED_ATTENTION
            and getattr(config, "model_type", None) in PLAIN_HEAD_MODEL_TYPES
            and hasattr(base, "get_decoder") and base.get_output_embeddings() is not None)


def right_padded_logprobs(
    model: th.nn.Module,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_id: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[th.Tensor, th.Tensor, th.Tensor | None]:
    """:func:`completion_logprobs` with each row ``[prompt | completion | pad …]``.

    A row is padded only to the longest prompt + completion of the batch, not to the longest
    prompt plus the longest completion (at the paper's lengths that is 1.3-1.4x fewer tokens);
    right padding needs no attention mask under causal attention (no token sees a later one),
    so the fast causal kernel runs, and positions are the default ``0..L-1``. The LM head is
    applied only at the positions that predict a completion token (hidden states gathered
    per row). Same returns as :func:`completion_logprobs`; check
    :func:`supports_right_padded_rows` first.
    """
    _check_rows(prompts, completions)
    base = _unwrapped(model)
    device = next(model.parameters()).device
    ids, _ = pad_rows([list(p) + list(c) for p, c in zip(prompts, completions)], pad_id, device=device)
    targets, comp_mask = pad_rows(completions, pad_id, device=device)
    comp_mask = comp_mask.bool()
    hidden = base.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state
    # the hidden state at position len(prompt) - 1 + t predicts completion token t
    starts = th.tensor([len(p) - 1 for p in prompts], device=device)
    where = (starts[:, None] + th.arange(targets.shape[1], device=device)[None, :]).clamp(max=ids.shape[1] - 1)
    gathered = hidden.gather(1, where[..., None].expand(-1, -1, hidden.shape[-1]))
    logits = base.get_output_embeddings()(gathered).float() / temperature
    return _token_logprobs(logits, targets, comp_mask, with_entropy)


def score_rows(model: th.nn.Module, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
               pad_id: int, temperature: float, batch_tokens: int, with_entropy: bool = False,
               right_padded: bool | None = None) -> tuple[list[th.Tensor], list[th.Tensor | None]]:  # fmt: skip
    """Per-row token log-probs (and entropies) of ``completions`` after ``prompts``, in
    length-sorted chunks of about ``batch_tokens`` padded tokens: rows ``[prompt | completion]``
    right-padded (:func:`right_padded_logprobs`) where the model allows, else left-padded
    prompts and right-padded completions (:func:`completion_logprobs`); ``right_padded``
    forces one or the other (``True`` only where :func:`supports_right_padded_rows`)."""
    model = forward_model(model)  # the merged copy when acting (milegpo.policies.model.merged_forwards)
    if right_padded is None:
        right_padded = supports_right_padded_rows(model)
    score = right_padded_logprobs if right_padded else completion_logprobs
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]) + len(completions[i]))
    logps: list[th.Tensor] = [th.empty(0)] * len(prompts)
    ents: list[th.Tensor | None] = [None] * len(prompts)
    start = 0
    while start < len(order):
        end, p_max, c_max = start, 0, 0
        while end < len(order):
            i = order[end]
            p_new, c_new = max(p_max, len(prompts[i])), max(c_max, len(completions[i]))
            # rows come sorted by prompt + completion: the newest row is the longest one
            width = len(prompts[i]) + len(completions[i]) if right_padded else p_new + c_new
            if end > start and (end - start + 1) * width > batch_tokens:
                break
            end, p_max, c_max = end + 1, p_new, c_new
        rows = order[start:end]
        logp, _, ent = score(model, [prompts[i] for i in rows], [completions[i] for i in rows], pad_id, temperature,
                             with_entropy)  # fmt: skip
        for j, i in enumerate(rows):
            n = len(completions[i])
            logps[i] = logp[j, :n]
            ents[i] = ent[j, :n] if ent is not None else None
        start = end
    return logps, ents
