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

#: sequences shorter than this many tokens are grouped only with identical ones (the grouping has always
#: compared this many opening tokens first; a conversation turn is longer than that)
_SHORT_TOKENS = 16


def prefix_groups(sequences: Sequence[Sequence[int]]) -> dict[int, list[int]]:
    """``{carrier: members}``: every sequence is assigned to the longest sequence it is a prefix of
    (itself when there is none; among equally long ones the first); the members of a carrier include
    the carrier. Carriers and members are listed longest first (ties in index order). A sequence of
    fewer than ``_SHORT_TOKENS`` tokens is grouped only with the sequences identical to it.

    O(n log n) comparisons of byte strings (no pair of rows is compared otherwise): sorted
    lexicographically, the sequences that extend a sequence follow it, so one pass with a stack
    finds each one's longest proper prefix (:func:`_prefix_parents`), and each one's carrier is the
    best of its descendants in that forest."""
    keys = [np.asarray(s, dtype=np.int64).tobytes() for s in sequences]
    lengths = [len(s) for s in sequences]
    parents, order = _prefix_parents(keys)
    rank = {i: (-lengths[i], i) for i in range(len(keys))}
    best = list(range(len(keys)))
    for i in reversed(order):  # descendants come after their ancestors in the sorted order
        parent = parents[i]
        if parent >= 0 and rank[best[i]] < rank[best[parent]]:
            best[parent] = best[i]
    carrier = best
    for i in order:  # an identical copy's parent is the copy before it: they share the first copy's carrier
        parent = parents[i]
        if parent >= 0 and lengths[parent] == lengths[i]:
            carrier[i] = carrier[parent]
        elif lengths[i] < _SHORT_TOKENS:
            carrier[i] = i
    groups: dict[int, list[int]] = {}
    for i in sorted(range(len(keys)), key=rank.__getitem__):
        groups.setdefault(carrier[i], []).append(i)
    return groups


def _prefix_parents(keys: Sequence[bytes]) -> tuple[list[int], list[int]]:
    """Each key's closest earlier prefix (its longest proper prefix, or an identical key before it;
    -1 for none), and the keys' lexicographic order (stable)."""
    order = sorted(range(len(keys)), key=keys.__getitem__)
    parents = [-1] * len(keys)
    stack: list[int] = []  # the previous key and its prefixes, longest last
    for i in order:
        while stack and not keys[i].startswith(keys[stack[-1]]):
            stack.pop()
        parents[i] = stack[-1] if stack else -1
        stack.append(i)
    return parents, order


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
