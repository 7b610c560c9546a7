"""Chat conversations kept whole in the update.

The O(n log n) carrier grouping equals the previous :func:`~milegpo.policies.conversation.prefix_groups`
(every row compared with the carriers of its 16-token bucket), kept here as the reference; rows that
continue nothing (template prompts, choose mode) are shuffled and packed exactly as by the previous
row shuffle and length sort (kept too); chat conversations are shuffled whole, in turn order, and
packed whole into micro-batches.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
import torch

from milegpo.algos.buffer import (
    RolloutMinibatch,
    TextRolloutBuffer,
    global_conversations,
    minibatch_rows,
    split_by_tokens,
)
from milegpo.algos.update import micro_batches
from milegpo.envs.core import TextSpace
from milegpo.policies import LLMPolicy
from milegpo.policies.conversation import prefix_groups
from milegpo.policies.sample import ActionSample
from milegpo.policies.scoring import score_rows


def previous_prefix_groups(sequences: Sequence[Sequence[int]]) -> dict[int, list[int]]:
    """The grouping before: longest first, each row compared with the carriers of its bucket."""
    arrays = [np.asarray(s, dtype=np.int64) for s in sequences]
    order = sorted(range(len(arrays)), key=lambda i: -len(arrays[i]))
    buckets: dict[tuple[int, ...], list[int]] = {}
    groups: dict[int, list[int]] = {}
    for i in order:
        seq = arrays[i]
        key = tuple(seq[:16].tolist())
        for carrier in buckets.get(key, []):
            if np.array_equal(arrays[carrier][: len(seq)], seq):
                groups[carrier].append(i)
                break
        else:
            buckets.setdefault(key, []).append(i)
            groups[i] = [i]
    return groups


def random_conversations(rng: np.random.Generator) -> list[list[int]]:
    """Rows of a chat minibatch: turns of branching conversations sharing an opening, some cut short,
    some copies, some tiny vocabularies (many accidental prefixes), shuffled."""
    vocab = int(rng.choice([2, 3, 50]))
    opening = list(rng.integers(0, vocab, int(rng.choice([0, 4, 16, 20]))))
    rows: list[list[int]] = []
    for _ in range(int(rng.integers(1, 7))):
        seq = list(opening)
        for _ in range(int(rng.integers(1, 6))):
            seq = seq + list(rng.integers(0, vocab, int(rng.integers(1, 9))))
            rows.append(seq)
        if rng.random() < 0.3:
            rows.append(list(seq))  # a copy (the group's copies at their first step)
        if rng.random() < 0.3 and len(seq) > 2:
            rows.append(seq[: int(rng.integers(1, len(seq)))])  # a prefix that is no turn
    return [rows[i] for i in rng.permutation(len(rows))]


@pytest.mark.parametrize("seed", range(300))
def test_prefix_groups_equal_the_previous_grouping(seed):
    rows = random_conversations(np.random.default_rng(seed))
    got, want = prefix_groups(rows), previous_prefix_groups(rows)
    assert got == want
    assert list(got) == list(want)  # carriers in the same order too


def test_prefix_groups_of_nothing():
    assert prefix_groups([]) == {}


def previous_minibatch_rows(rng: np.random.Generator, row_tokens: np.ndarray, batch_size: int | None,
                            mini_batch_tokens: int | None) -> list[np.ndarray]:
    """The row shuffle before conversations were kept whole."""
    order = rng.permutation(len(row_tokens))
    if mini_batch_tokens is not None:
        return split_by_tokens(order, row_tokens, mini_batch_tokens)
    size = batch_size or max(len(order), 1)
    return [order[start: start + size] for start in range(0, len(order), size)]


#: (batch_size, mini_batch_tokens)
CUTS: list[tuple[int | None, int | None]] = [(None, None), (3, None), (7, None), (None, 40), (None, 200)]


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("cut", CUTS)
def test_rows_of_their_own_are_shuffled_and_cut_exactly_as_before(seed: int, cut: tuple[int | None, int | None]):
    tokens = np.random.default_rng(seed).integers(1, 60, int(np.random.default_rng(seed).integers(0, 30)))
    got = minibatch_rows(np.random.default_rng(seed), tokens, cut[0], cut[1], conversations=None)
    want = previous_minibatch_rows(np.random.default_rng(seed), tokens, *cut)
    assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))


def random_conversation_ids(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.cumsum(np.r_[0, rng.random(n - 1) < 0.3]).astype(np.int64) if n else np.zeros(0, np.int64)


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("cut", CUTS)
def test_conversations_are_shuffled_whole_in_turn_order(seed: int, cut: tuple[int | None, int | None]):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    conversations = random_conversation_ids(rng, n)
    tokens = np.cumsum(rng.integers(5, 20, n))  # each turn longer than the one before
    batches = minibatch_rows(np.random.default_rng(seed), tokens, cut[0], cut[1], conversations=conversations)
    order = np.concatenate(batches)
    assert sorted(order.tolist()) == list(range(n))  # every row once
    laid_out = conversations[order]
    assert len(set(laid_out.tolist())) == int(np.sum(np.r_[True, laid_out[1:] != laid_out[:-1]]))  # contiguous
    assert all(np.all(np.diff(order[laid_out == c]) == 1) for c in np.unique(conversations))  # turn order
    if cut[0] is not None:
        assert [len(b) for b in batches[:-1]] == [cut[0]] * (len(batches) - 1)


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("budget", [1, 30, 100, 10_000])
def test_micro_batches_pack_whole_conversation_pieces(seed, budget):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 30))
    tokens = rng.integers(1, 60, n)
    alone = RolloutMinibatch(rows=np.arange(n), samples=[], advantages=np.zeros(n), tokens=tokens, n_units=n, n_seqs=n)
    want = split_by_tokens(np.argsort(tokens, kind="stable"), tokens, budget)  # the row packing before
    got = micro_batches(alone, budget)
    assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))
    conversations = random_conversation_ids(rng, n)
    chats = micro_batches(RolloutMinibatch(rows=np.arange(n), samples=[], advantages=np.zeros(n), tokens=tokens,
                                           n_units=n, n_seqs=n, conversations=conversations), budget)
    assert sorted(np.concatenate(chats).tolist()) == list(range(n))
    for micro in chats:
        pieces = [conversations == c for c in np.unique(conversations[micro])]
        assert all(set(np.flatnonzero(p)) <= set(micro.tolist()) for p in pieces)  # pieces never split
        assert len(pieces) == 1 or sum(int(tokens[p].max()) for p in pieces) <= budget


def chat_samples(policy: LLMPolicy, turns: int, room: int) -> list[ActionSample]:
    """One episode's samples in ``policy``'s prompt format (replies as the model's assistant turns)."""
    info = {"task": "find the key", "action_format": "tags"}
    history: list[tuple[str, str]] = []
    samples = []
    for t in range(turns):
        observation = f"you are in room {room + t} . you see a door"
        reply = "<action>go north</action>"
        action = policy.tokenizer.encode(reply, add_special_tokens=False) + [policy.tokenizer.eos_token_id]
        samples.append(ActionSample(text="go north", prompt_ids=policy.build_prompt(observation, info, history),
                                    action_ids=action, candidate_ids=None, chosen=None,
                                    old_logprobs=np.zeros(len(action), np.float32), parsed=True, raw_text=reply))
        history.append((observation, reply))
    return samples


def filled_buffer(policy: LLMPolicy, turns: tuple[int, ...]) -> TextRolloutBuffer:
    buffer = TextRolloutBuffer(len(turns), [0] * len(turns))
    for env, n in enumerate(turns):
        for t, sample in enumerate(chat_samples(policy, n, room=env)):
            buffer.add(env, sample, f"s{env}.{t}", float(env), t == n - 1, {"state_key": f"s{env}.{t + 1}"})
    buffer.compute_credit("grpo")
    return buffer


@pytest.mark.parametrize("prompt_format", ["chat", "template"])
def test_the_update_keeps_chat_conversations_together(model_path: str, prompt_format: str) -> None:
    policy = LLMPolicy(TextSpace(), TextSpace(), lambda _: 1e-3, model=model_path, mode="generate",
                       prompt_format=prompt_format, history_length=10, device="cpu")
    buffer = filled_buffer(policy, (4, 3, 5))
    (minibatch,) = buffer.get(np.random.default_rng(0))
    assert minibatch.conversations is not None
    if prompt_format == "template":  # nothing continues: the row shuffle of before
        assert len(set(minibatch.conversations.tolist())) == 12
        np.testing.assert_array_equal(minibatch.rows, np.random.default_rng(0).permutation(12))
        return
    assert sorted(np.bincount(minibatch.conversations).tolist()) == [3, 4, 5]
    for micro in micro_batches(minibatch, 10_000):  # whole conversations, each one carrier for the one pass
        sequences = [minibatch.samples[k].prompt_ids + minibatch.samples[k].action_ids for k in micro]
        assert len(prefix_groups(sequences)) == len(set(minibatch.conversations[micro].tolist()))
    # split by a cut, the later part is scored over its own last turn with the earlier turns as context
    parts = list(buffer.get(np.random.default_rng(0), batch_size=5))
    logp, mask, _ = policy.evaluate_actions(parts[0].samples)
    reference, _ = score_rows(policy.model, [s.prompt_ids for s in parts[0].samples],
                              [s.action_ids for s in parts[0].samples], policy.pad_id, policy.temperature, 4096)
    assert float((logp[mask] - torch.cat(reference)).detach().abs().max()) <= 1e-5


def test_ranks_conversations_are_numbered_over_the_global_batch():
    per_rank = [np.array([0, 0, 1]), np.zeros(0, np.int64), np.array([0, 1, 1])]
    np.testing.assert_array_equal(global_conversations(per_rank), [0, 0, 1, 2, 3, 3])
