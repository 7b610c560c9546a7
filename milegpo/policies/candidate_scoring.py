"""Scoring the admissible commands of ``choose`` mode: each candidate's token log-probs after its
prompt, each distinct prompt run once and its candidates scored on its KV cache (packed into one row
where the attention takes a 4D mask, else one row per candidate on a repeated cache), and the scores
kept while acting for as long as the weights do not change.

The conventions of :mod:`~milegpo.policies.scoring` hold: prompts end at the same column or are
scored on their own positions, and every candidate is scored exactly as if it followed its prompt alone.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch as th

from milegpo.policies.lean_forward import LeanCausalLM
from milegpo.policies.model import forward_model
from milegpo.policies.scoring import (
    PACKED_ATTENTION,
    _unwrapped,
    cache_argument,
    output_cache,
    pad_rows,
    supports_right_padded_rows,
)


def _flat_candidates(prompts: Sequence[Sequence[int]], candidates: Sequence[Sequence[Sequence[int]]]) -> list:
    """The candidates of all prompts in one list, after checking that nothing is empty."""
    if len(prompts) != len(candidates):
        raise ValueError(f"{len(prompts)} prompts but {len(candidates)} candidate lists")
    flat = [c for cands in candidates for c in cands]
    empty = any(len(c) == 0 for c in flat) or any(len(p) == 0 for p in prompts) or any(not c for c in candidates)
    if not flat or empty:
        raise ValueError("prompts, candidate lists and candidates must be non-empty")
    return flat


def candidate_logprobs(
    model: th.nn.Module,
    prompts: Sequence[Sequence[int]],
    candidates: Sequence[Sequence[Sequence[int]]],
    pad_id: int,
) -> tuple[th.Tensor, th.Tensor]:
    """Per-token log-probs of every candidate of every prompt, each prompt run once.

    The prompts (left-padded) go through the model once; their KV cache is then
    repeated per candidate and all candidates (right-padded) are scored in one
    more pass. Equal to :func:`completion_logprobs` on the flattened rows, at a
    fraction of the cost when prompts are long and candidates many. Returns
    ``(logp [R, C], mask [R, C])`` with rows in the order of the flattened
    candidate lists.
    """
    flat = _flat_candidates(prompts, candidates)
    device = next(model.parameters()).device
    n = len(prompts)
    ids, mask = pad_rows(prompts, pad_id, left=True, device=device)
    out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0), use_cache=True,
                logits_to_keep=1)  # fmt: skip
    rows = th.repeat_interleave(th.arange(n), th.tensor([len(c) for c in candidates])).to(device)
    cache = output_cache(out)
    cache.batch_select_indices(rows)
    cand, cand_mask = pad_rows(flat, pad_id, device=device)
    c_len = cand.shape[1]
    positions = mask.sum(-1)[rows].unsqueeze(-1) + th.arange(c_len, device=device)
    out2 = model(input_ids=cand, attention_mask=th.cat([mask[rows], cand_mask], dim=-1), position_ids=positions,
                 use_cache=True, **{cache_argument(model): cache})  # fmt: skip
    # the prompt's last logits predict each candidate's first token, the candidate's own logits the rest
    logits = th.cat([out.logits[rows, -1:], out2.logits[:, :-1]], dim=1).float()
    logp = logits.gather(-1, cand.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)
    cand_mask = cand_mask.bool()
    return logp.masked_fill(~cand_mask, 0.0), cand_mask


def supports_packed_candidates(model: th.nn.Module) -> bool:
    """Whether :func:`packed_candidate_logprobs` can run on ``model`` (its attention takes a 4D mask)."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None) in PACKED_ATTENTION


def packed_candidate_logprobs(
    model: th.nn.Module,
    prompts: Sequence[Sequence[int]],
    candidates: Sequence[Sequence[Sequence[int]]],
    pad_id: int,
) -> tuple[th.Tensor, th.Tensor]:
    """:func:`candidate_logprobs` with each prompt's candidates packed into one row after its KV cache.

    The prompts go through the model once (right-padded, without a mask); then row ``i`` of
    the second pass is ``[cand_i1 cand_i2 … cand_iK pad …]`` on top of prompt ``i``'s
    own cache. A 4D attention mask lets every candidate token see the prompt and the
    earlier tokens of its own candidate only, and each candidate's positions start
    where the prompt ends, so every candidate is scored exactly as if it followed the
    prompt alone. Against :func:`candidate_logprobs` nothing is repeated per candidate
    (no copy of the prompt's keys and values per candidate, no padding of every
    candidate to the longest, logits at the packed tokens only): WebShop's steps have
    ~600-token prompts and ~10 candidates. Needs an attention implementation that
    takes a custom mask (:func:`supports_packed_candidates`). Same return values, same
    row order.
    """
    flat = _flat_candidates(prompts, candidates)
    device = next(model.parameters()).device
    n = len(prompts)
    layout = _PackedLayout(prompts, candidates, flat)
    # prompts right-padded and no mask: causal attention never reaches the padding after a prompt, and
    # attention without a mask takes the fast causal kernel (~1.8x faster on CPU at 32 x 600 tokens)
    ids, mask = pad_rows(prompts, pad_id)
    allowed = layout.attention_mask(mask.bool()).to(device)
    if _unwrapped(model).config._attn_implementation == "eager":
        dtype = next(model.parameters()).dtype
        allowed = th.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, th.finfo(dtype).min)
    tail_ids, positions = layout.tail_ids(pad_id).to(device), layout.positions().to(device)
    targets = th.from_numpy(layout.tokens).to(device)
    rows, first = th.from_numpy(layout.token_row).to(device), th.from_numpy(layout.token_index == 0).to(device)
    if supports_right_padded_rows(model):
        # the head only where a candidate token is predicted: each prompt's last position and the tail
        # positions followed by a token of the same candidate (not the padding, not a candidate's last token)
        hidden, cache = _decoder_states(model, ids.to(device), None, None, None)
        last = hidden[th.arange(n, device=device), th.from_numpy(layout.prompt_lengths - 1).to(device)]
        hidden2, _ = _decoder_states(model, tail_ids, allowed, positions, cache)
        head = _unwrapped(model).get_output_embeddings()
        prompt_logits = head(last).float()
        rest = ~first
        rest_logits = head(hidden2[rows[rest], th.from_numpy(layout.token_slot - 1).to(device)[rest]]).float()
        token_logp = th.empty(len(layout.tokens), dtype=prompt_logits.dtype, device=device)
        prompt_logz = prompt_logits.logsumexp(-1)
        token_logp[first] = prompt_logits[rows[first], targets[first]] - prompt_logz[rows[first]]
        token_logp[rest] = rest_logits.gather(-1, targets[rest].unsqueeze(-1)).squeeze(-1) - rest_logits.logsumexp(-1)
    else:
        last_columns, column = th.unique(th.from_numpy(layout.prompt_lengths - 1), return_inverse=True)
        out = model(input_ids=ids.to(device), use_cache=True, logits_to_keep=last_columns.to(device))
        first_logits = out.logits[th.arange(n, device=device), column.to(device)].unsqueeze(1)
        out2 = model(input_ids=tail_ids, attention_mask=allowed, position_ids=positions, use_cache=True,
                     **{cache_argument(model): output_cache(out)})  # fmt: skip
        logits = th.cat([first_logits, out2.logits], dim=1)
        # logit columns: 0 = the prompt's last token (predicts every first candidate token), 1 + j = tail token j
        predictor = th.from_numpy(np.where(layout.token_index == 0, 0, layout.token_slot)).to(device)
        picked = logits[rows, predictor].float()
        token_logp = picked.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - picked.logsumexp(-1)
    cand_mask = th.from_numpy(np.arange(int(layout.lengths.max()))[None, :] < layout.lengths[:, None]).to(device)
    logp = th.zeros(cand_mask.shape, dtype=token_logp.dtype, device=device).masked_scatter(cand_mask, token_logp)
    return logp, cand_mask


def _decoder_states(model: th.nn.Module, ids: th.Tensor, attention_mask: th.Tensor | None,
                    position_ids: th.Tensor | None, cache: Any) -> tuple[th.Tensor, Any]:
    """The final hidden states of ``ids`` and the KV cache (extended in place when given) from ``model``'s
    decoder, without its LM head (a model of :func:`supports_right_padded_rows`)."""
    if isinstance(model, LeanCausalLM):
        return model.hidden_states(ids, attention_mask, position_ids, cache, use_cache=True)
    extra = {cache_argument(model): cache} if cache is not None else {}
    out = _unwrapped(model).get_decoder()(input_ids=ids, attention_mask=attention_mask, position_ids=position_ids,
                                          use_cache=True, **extra)
    return out.last_hidden_state, output_cache(out)


class _PackedLayout:
    """Where each candidate token of :func:`packed_candidate_logprobs` goes, as flat arrays (one entry per
    candidate token, candidates in order): its row, its index in its candidate, its column in the row's tail."""

    def __init__(self, prompts: Sequence[Sequence[int]], candidates: Sequence[Sequence[Sequence[int]]],
                 flat: list) -> None:
        n = len(prompts)
        per_row = np.fromiter(map(len, candidates), dtype=np.int64, count=n)
        self.lengths = np.fromiter(map(len, flat), dtype=np.int64, count=len(flat))
        self.prompt_lengths = np.fromiter(map(len, prompts), dtype=np.int64, count=n)
        total = int(self.lengths.sum())
        self.tokens = np.fromiter(itertools.chain.from_iterable(flat), dtype=np.int64, count=total)
        cand_start = np.cumsum(self.lengths) - self.lengths  # each candidate's first token in ``tokens``
        cand_row = np.repeat(np.arange(n), per_row)
        row_start = cand_start[np.cumsum(per_row) - per_row]  # each row's first token in ``tokens``
        self.token_cand = np.repeat(np.arange(len(flat)), self.lengths)
        self.token_row = cand_row[self.token_cand]
        self.token_index = np.arange(total) - cand_start[self.token_cand]
        self.token_slot = np.arange(total) - row_start[self.token_row]
        self.width = int(np.bincount(self.token_row, minlength=n).max())

    def tail_ids(self, pad_id: int) -> th.Tensor:
        """``[n, width]``: each row's candidates one after another, then padding."""
        ids = np.full((len(self.prompt_lengths), self.width), int(pad_id), dtype=np.int64)
        ids[self.token_row, self.token_slot] = self.tokens
        return th.from_numpy(ids)

    def positions(self) -> th.Tensor:
        """``[n, width]``: each candidate's positions start where its prompt ends (0 at the padding)."""
        positions = np.zeros((len(self.prompt_lengths), self.width), dtype=np.int64)
        positions[self.token_row, self.token_slot] = self.prompt_lengths[self.token_row] + self.token_index
        return th.from_numpy(positions)

    def attention_mask(self, prompt_mask: th.Tensor) -> th.Tensor:
        """``[n, 1, width, prompt + width]`` bool: a candidate token sees its prompt (``prompt_mask``, the
        prompt's real tokens) and the earlier tokens of its own candidate; padding sees itself (no empty
        softmax; its outputs are unused)."""
        n, width = len(self.prompt_lengths), self.width
        segment = np.zeros((n, width), dtype=np.int64)  # 0 padding, c + 1 the tokens of flat candidate c
        segment[self.token_row, self.token_slot] = self.token_cand + 1
        seg = th.from_numpy(segment)
        tail = (seg.unsqueeze(2) == seg.unsqueeze(1)) & (seg.unsqueeze(1) > 0)
        tail &= th.ones(width, width, dtype=th.bool).tril()
        tail |= th.eye(width, dtype=th.bool)
        prompt = prompt_mask.unsqueeze(1).expand(n, width, prompt_mask.shape[1])
        return th.cat([prompt, tail], dim=-1).unsqueeze(1)


#: an acting copy (:func:`milegpo.policies.model.acting_model`) -> the candidate scores it computed, by
#: (prompt, candidates, candidate_score); a copy is rebuilt whenever a weight changes, so its scores stay valid
_ACTING_SCORES: weakref.WeakKeyDictionary[th.nn.Module, dict[tuple, th.Tensor]] = weakref.WeakKeyDictionary()
#: the most scores kept per acting copy (the oldest half is dropped when it is full)
ACTING_SCORES_MAX = 200_000


def candidate_scores(model: th.nn.Module, prompts: Sequence[Sequence[int]],
                     candidates: Sequence[Sequence[Sequence[int]]], pad_id: int, batch_tokens: int,
                     candidate_score: str = "sum") -> list[th.Tensor]:
    """For each prompt, the score of each candidate: its summed (``candidate_score="sum"``) or
    mean (``"mean"``) token log-prob at temperature 1.

    Prompts with the same candidates (the copies of a group at their first step, copies
    that met again in a state) are scored once and share the result (the same tensor, so
    gradients add up). Each distinct prompt is run once and its candidates scored on its
    KV cache: packed into one row (:func:`packed_candidate_logprobs`, sdpa and eager
    attention) or one row per candidate on a repeated cache (:func:`candidate_logprobs`,
    any other attention), prompts grouped in length order into chunks of about
    ``batch_tokens`` (rows x padded width of prompt and candidates).

    When acting (inside :func:`~milegpo.policies.model.merged_forwards`, no gradients) the scores are
    also kept from one call to the next for as long as the weights do not change: a state met again
    (the copies of a task, an episode going back and forth, the next evaluation's same tasks) is not
    scored again. A kept score is the one computed the first time, in another batch: it may differ from
    a fresh one by the float rounding batching adds (about 1e-7), as scores of one prompt in two batches do.
    """
    acting = forward_model(model)  # the merged copy when acting (milegpo.policies.model.merged_forwards)
    kept = _ACTING_SCORES.setdefault(acting, {}) if acting is not model else None
    model = acting
    first: dict[tuple, int] = {}  # each distinct (prompt, candidates, candidate_score): its first row
    source = [first.setdefault((tuple(p), tuple(map(tuple, c)), candidate_score), i)
              for i, (p, c) in enumerate(zip(prompts, candidates))]
    scores: list[th.Tensor] = [th.empty(0)] * len(prompts)
    if kept is not None:
        for key, i in list(first.items()):
            found = kept.get(key)
            if found is not None:
                scores[i] = found
                del first[key]
    order = sorted(first.values(), key=lambda i: len(prompts[i]))
    packed = supports_packed_candidates(model)
    score = packed_candidate_logprobs if packed else candidate_logprobs
    start = 0
    while start < len(order):
        end, n_rows, width = start, 0, 0
        while end < len(order):
            i = order[end]
            tail = sum(map(len, candidates[i])) if packed else max(map(len, candidates[i]))
            w = max(width, len(prompts[i]) + tail)
            rows = n_rows + (1 if packed else len(candidates[i]))
            if end > start and rows * w > batch_tokens:
                break
            end, n_rows, width = end + 1, rows, w
        chunk = order[start:end]
        logp, mask = score(model, [prompts[i] for i in chunk], [candidates[i] for i in chunk], pad_id)
        row_scores = logp.sum(-1) if candidate_score == "sum" else logp.sum(-1) / mask.sum(-1)
        for i, sc in zip(chunk, row_scores.split([len(candidates[i]) for i in chunk])):
            scores[i] = sc
        start = end
    if kept is not None:
        if len(kept) + len(first) > ACTING_SCORES_MAX:
            for key in list(kept)[: len(kept) // 2]:
                del kept[key]
        for key, i in first.items():
            kept[key] = scores[i]
    return [scores[i] for i in source]
