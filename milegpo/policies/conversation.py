"""Scoring a conversation's turns in one forward pass (chat prompts).

In a chat prompt each step's prompt is the conversation so far, so step ``t``'s prompt and
reply are the first tokens of step ``t + 1``'s prompt: scoring every step on its own
re-encodes the whole history each time, ``O(T²)`` tokens for a ``T``-turn trajectory.
Causal attention makes the log-prob of a token depend only on the tokens before it, so the
log-probs of every turn's reply can be read from one pass over the longest sequence that
contains them (``O(T)``), equal to per-turn scoring up to floating-point summation order.

:func:`prefix_groups` finds, among a minibatch's samples, each one's *carrier*: the longest
sample whose prompt + reply starts with its own prompt + reply. Samples whose conversation
was cut by a history window (or re-tokenised differently) are their own carriers and are
scored as before. :func:`single_pass_logprobs` scores the carriers, reading each member's
reply tokens at its positions.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch as th

from milegpo.policies.scoring import _token_logprobs, _unwrapped, pad_rows

#: tokens compared first to bucket the candidate carriers (conversations of a task share their opening)
_BUCKET_TOKENS = 16


def prefix_groups(sequences: Sequence[Sequence[int]]) -> dict[int, list[int]]:
    """``{carrier: members}``: every sequence is assigned to the longest sequence it is a prefix of
    (itself when there is none); the members of a carrier include the carrier."""
    arrays = [np.asarray(s, dtype=np.int64) for s in sequences]
    order = sorted(range(len(arrays)), key=lambda i: -len(arrays[i]))
    buckets: dict[tuple[int, ...], list[int]] = {}
    groups: dict[int, list[int]] = {}
    for i in order:
        seq = arrays[i]
        key = tuple(seq[:_BUCKET_TOKENS].tolist())
        for carrier in buckets.get(key, []):
            if np.array_equal(arrays[carrier][: len(seq)], seq):
                groups[carrier].append(i)
                break
        else:
            buckets.setdefault(key, []).append(i)
            groups[i] = [i]
    return groups


def span_logprobs(model: th.nn.Module, sequences: Sequence[Sequence[int]], spans: Sequence[Sequence[tuple[int, int]]],
                  pad_id: int, temperature: float = 1.0, with_entropy: bool = False,
                  ) -> tuple[list[th.Tensor], list[th.Tensor | None]]:
    """Per sequence, the log-probs (and entropies) of the tokens of its ``(start, length)`` spans, in
    span order, from one forward pass per sequence (rows right-padded: the model must support it,
    :func:`~milegpo.policies.scoring.supports_right_padded_rows`). The LM head runs only at the
    positions that predict a span token."""
    base = _unwrapped(model)
    device = next(model.parameters()).device
    ids, _ = pad_rows(sequences, pad_id, device=device)
    positions = [np.concatenate([np.arange(start, start + length) for start, length in row]) for row in spans]
    if any(int(p.min()) < 1 or int(p.max()) >= len(s) for p, s in zip(positions, sequences)):
        raise ValueError("a span starts at position 0 (nothing predicts it) or ends past its sequence")
    where, mask = pad_rows(positions, 1, device=device)
    targets = ids.gather(1, where)
    hidden = base.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state
    gathered = hidden.gather(1, (where - 1)[..., None].expand(-1, -1, hidden.shape[-1]))
    logits = base.get_output_embeddings()(gathered).float() / temperature
    logp, _, entropy = _token_logprobs(logits, targets, mask.bool(), with_entropy)
    counts = [len(p) for p in positions]
    return ([logp[r, :n] for r, n in enumerate(counts)],
            [entropy[r, :n] if entropy is not None else None for r, n in enumerate(counts)])


def single_pass_logprobs(model: th.nn.Module, prompts: Sequence[Sequence[int]], replies: Sequence[Sequence[int]],
                         pad_id: int, temperature: float, batch_tokens: int, with_entropy: bool = False,
                         ) -> tuple[list[th.Tensor], list[th.Tensor | None]]:
    """Each reply's token log-probs (and entropies), as :func:`~milegpo.policies.scoring.score_rows`
    gives them, with the replies of one conversation read from one pass over its longest sample;
    carriers are scored in chunks of about ``batch_tokens`` (rows x longest row)."""
    sequences = [list(p) + list(r) for p, r in zip(prompts, replies)]
    groups = prefix_groups(sequences)
    carriers = sorted(groups, key=lambda c: len(sequences[c]))
    logps: list[th.Tensor] = [th.empty(0)] * len(prompts)
    ents: list[th.Tensor | None] = [None] * len(prompts)
    start = 0
    while start < len(carriers):
        end = start + 1
        while end < len(carriers) and (end - start + 1) * len(sequences[carriers[end]]) <= batch_tokens:
            end += 1
        chunk = carriers[start:end]
        members = [sorted(groups[c], key=lambda i: len(prompts[i])) for c in chunk]
        spans = [[(len(prompts[i]), len(replies[i])) for i in group] for group in members]
        row_logps, row_ents = span_logprobs(model, [sequences[c] for c in chunk], spans, pad_id, temperature,
                                            with_entropy)
        for group, lp, ent in zip(members, row_logps, row_ents):
            offset = 0
            for i in group:
                n = len(replies[i])
                logps[i] = lp[offset: offset + n]
                ents[i] = ent[offset: offset + n] if ent is not None else None
                offset += n
        start = end
    return logps, ents
