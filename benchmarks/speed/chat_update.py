"""The real update (``model.train()``) in chat format: one-pass against per-turn scoring on the same buffer.

:mod:`benchmarks.chat_scoring` times one conversation scored alone. Here the whole update runs as
training runs it: a GRPO algorithm over ``E`` House envs in generate mode with ``prompt_format="chat"``,
its rollout buffer filled with ``E`` trajectories of ``T`` turns (observations of ~40 tokens, replies
of ~25, the policy's own chat prompts), credit computed, then ``model.train()``: the buffer's
minibatches (``batch_size`` rows), the update's micro-batches (``micro_batch_tokens``), forward,
backward and optimizer steps. The two ways differ only in how ``LLMPolicy`` scores a micro-batch's
replies (its ``_logprobs`` switch):

* ``one_pass``: as LLMPolicy does in a chat prompt with a right-padded-capable model: each
  conversation piece read from one pass over its last turn;
* ``per_turn``: every turn scored on its own prompt (``score_rows``, the same right-padded kernel),
  what the update cost before conversations were kept whole in it (a conversation's turns were then
  spread over micro-batches, so one-pass found nothing to share).

The model is an offline tiny LM on the House vocabulary (``--hidden``/``--layers``; a word-level
tokenizer, so one word is one token): on the CPU SmolLM2-135M updates about 100 tokens/s, hours
for the per-turn runs at 128 envs. The ratio follows the tokens and attention each way processes,
which the tiny model has in the same proportion; its absolute times are not a real model's.

``--buffer rollout`` fills the buffer with a real rollout instead: ``model.learn`` plays one iteration of
the House envs (``max_episode_steps = T``, replies of up to 24 sampled tokens), and ``train()`` is then
timed on that buffer. Its prompts are built by appending the sampled ids (what ``LLMPolicy`` does); with
``--prompts text`` each turn's prompt is re-rendered from the conversation's text instead (the way before
token-in/token-out chat prompts): the tiny model's word-level tokenizer does not round-trip its own replies,
so no turn then continues the one before and the one-pass scoring has nothing to share.

The two ways alternate (one-pass, per-turn, one-pass, ...) on the same buffer, so a load change
hits both; medians of wall and process CPU time; the 1-min load is recorded at each size. Results
go to ``benchmarks/results/chat_update.{json,md}`` after every size.

    OMP_NUM_THREADS=1 python -m benchmarks.speed.chat_update
    # on real rollouts, prompts grown from ids and re-rendered from text:
    OMP_NUM_THREADS=1 python -m benchmarks.speed.chat_update --buffer rollout --envs 8 --turns 10 \
        --out benchmarks/results/chat_update_rollout
    OMP_NUM_THREADS=1 python -m benchmarks.speed.chat_update --buffer rollout --prompts text --envs 8 --turns 10 \
        --out benchmarks/results/chat_update_rollout_text
    # the update of an earlier commit (its milegpo from its worktree, here /tmp/base), then both in one table:
    REPO=$PWD; (cd /tmp/base && OMP_NUM_THREADS=1 PYTHONPATH=$REPO python -m benchmarks.speed.chat_update \
        --ways one_pass --out $REPO/benchmarks/results/chat_update_before)
    python -m benchmarks.speed.chat_update --before benchmarks/results/chat_update_before.json --before-code 3217551
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from stable_baselines3.common.logger import configure

from benchmarks import harness
from milegpo import GRPO
from milegpo.algos.buffer import TextRolloutBuffer, continues
from milegpo.envs import make_vec_env
from milegpo.envs.house import HouseEnv
from milegpo.policies import LLMPolicy, tiny_model
from milegpo.policies.conversation import prefix_groups
from milegpo.policies.sample import ActionSample
from milegpo.policies.scoring import score_rows

OBSERVATION_WORDS, REPLY_WORDS = 40, 23  # + the action tags and the end-of-turn token: ~25


class SwitchedPolicy(LLMPolicy):
    """LLMPolicy whose update scores replies in one pass per conversation (its own choice in a chat
    prompt) or, with ``one_pass = False``, one turn at a time."""

    one_pass = True

    def _logprobs(self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                  with_entropy: bool = False) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        if self.one_pass:
            return super()._logprobs(prompts, completions, with_entropy)
        return score_rows(self.model, prompts, completions, self.pad_id, self.temperature, self.batch_tokens,
                          with_entropy)


def words(rng: np.random.Generator, vocabulary: list[str], n: int) -> str:
    return " ".join(rng.choice(vocabulary, n))


def trajectory(policy: LLMPolicy, rng: np.random.Generator, vocabulary: list[str], turns: int) -> list[ActionSample]:
    """One ``turns``-turn episode in the policy's chat prompts (replies end with the end-of-turn token)."""
    info = {"task": "find the key and open the door", "action_format": "tags"}
    history: list[tuple[str, str]] = []
    samples = []
    for _ in range(turns):
        observation = words(rng, vocabulary, OBSERVATION_WORDS)
        reply = f"{words(rng, vocabulary, REPLY_WORDS)} <action>go north</action>"
        action = policy.tokenizer.encode(reply, add_special_tokens=False) + [policy.tokenizer.eos_token_id]
        samples.append(ActionSample(text="go north", prompt_ids=policy.build_prompt(observation, info, history),
                                    action_ids=action, candidate_ids=None, chosen=None,
                                    old_logprobs=np.full(len(action), -5.0, np.float32), parsed=True,
                                    raw_text=reply))
        history.append((observation, reply))
    return samples


def fill(model: GRPO, turns: int, seed: int) -> None:
    """The model's rollout buffer: every env one ``turns``-turn trajectory, outcomes mixed, credit computed."""
    rng = np.random.default_rng(seed)
    policy = model.policy
    vocabulary = sorted({w for text in HouseEnv.vocabulary() for w in text.split()})
    buffer = model.rollout_buffer
    buffer.reset()
    for env in range(buffer.num_envs):
        reward = float(rng.integers(0, 2))
        for t, sample in enumerate(trajectory(policy, rng, vocabulary, turns)):
            done = t == turns - 1
            buffer.add(env, sample, f"s{env}.{t}", reward if done else 0.0, done,
                       {"state_key": f"s{env}.{t + 1}", "won": bool(reward)})
    buffer.compute_credit("grpo")


def play(model: GRPO, prompts: str) -> None:
    """The model's rollout buffer from one real iteration (``model.learn``: its rollout, credit and update),
    the prompts appended from ids (``"ids"``) or re-rendered from text (``"text"``)."""
    chat = model.policy.chat
    assert chat is not None
    if prompts == "text":
        chat.turn_ids = None  # every prompt rendered from the conversation's text
    model.learn(total_timesteps=1)


def continued_turns(buffer: TextRolloutBuffer) -> dict[str, int]:
    """Of the buffer's turns after a trajectory's first, how many continue the turn before (prompt + reply)."""
    assert buffer.batch is not None
    samples, traj = buffer.samples, buffer.batch.traj_ids
    pairs = [(a, b) for r, (a, b) in enumerate(zip(samples, samples[1:])) if traj[r] == traj[r + 1]]
    return {"turns": len(pairs), "continued": sum(continues(a, b) for a, b in pairs)}


def forward_tokens(buffer: TextRolloutBuffer) -> dict[str, int]:
    """Tokens each way runs through the model (over the whole buffer): every turn on its own, or one pass over
    each conversation's longest sample (:func:`~milegpo.policies.conversation.prefix_groups`)."""
    sequences = [list(s.prompt_ids) + list(s.action_ids) for s in buffer.samples]
    return {"per_turn": sum(map(len, sequences)), "one_pass": sum(len(sequences[c]) for c in prefix_groups(sequences))}


def timed_train(model: GRPO, one_pass: bool) -> dict[str, float]:
    model.policy.one_pass = one_pass
    with harness.Stopwatch() as clock:
        model.train()
    return {"wall_s": clock.wall_s, "cpu_s": clock.cpu_s}


def run_size(model_path: str, envs: int, turns: int, repeats: int, settings: dict[str, Any],
             ways: Sequence[str], buffer: str = "written", prompts: str = "ids") -> dict[str, Any]:
    venv = make_vec_env("milegpo/House-v0", n_tasks=envs // 4, group_size=4, seed=0,
                        env_kwargs={"max_episode_steps": turns} if buffer == "rollout" else None)
    model = GRPO(SwitchedPolicy, venv, seed=0, device="cpu", **settings, policy_kwargs={
        "model": model_path, "mode": "generate", "prompt_format": "chat", "think": False,
        "history_length": max(turns, 1), "max_prompt_tokens": 1 << 20, "dtype": "float32", "max_new_tokens": 24})
    model.set_logger(configure(None, []))  # train() records its statistics; nothing is written
    if buffer == "rollout":
        play(model, prompts)
    else:
        fill(model, turns, seed=envs * 1000 + turns)
    samples: dict[str, list[dict[str, float]]] = {way: [] for way in ways}
    load_start = harness.load_1min()
    for _ in range(repeats):
        for way in ways:
            samples[way].append(timed_train(model, way == "one_pass"))
    row = {"envs": envs, "turns": turns, "rows": model.rollout_buffer.num_steps, "repeats": repeats,
           "tokens": forward_tokens(model.rollout_buffer), "buffer": buffer, "prompts": prompts,
           "continued": continued_turns(model.rollout_buffer),
           "load_1min": [load_start, harness.load_1min()],
           "seconds": {way: {k: statistics.median(s[k] for s in runs) for k in ("wall_s", "cpu_s")}
                       for way, runs in samples.items()},
           "all_wall_s": {way: [s["wall_s"] for s in runs] for way, runs in samples.items()}}
    if set(ways) == {"one_pass", "per_turn"}:
        row["speedup_wall"] = row["seconds"]["per_turn"]["wall_s"] / row["seconds"]["one_pass"]["wall_s"]
        row["speedup_cpu"] = row["seconds"]["per_turn"]["cpu_s"] / row["seconds"]["one_pass"]["cpu_s"]
    venv.close()
    return row


def markdown(result: dict[str, Any], before: dict[str, Any] | None = None) -> str:
    """The table of ``result``; with ``before`` (a ``--ways one_pass`` run of the code before conversations
    were kept together in the update), that update's time beside it."""
    m = result["model"]
    source = {"written": "a buffer of E trajectories of T turns written by the benchmark",
              "rollout": "the buffer of a real rollout of E House envs (max_episode_steps T), its prompts "
                         + ("appended from the sampled ids" if result.get("prompts", "ids") == "ids"
                            else "re-rendered from the conversation's text")}[result.get("buffer", "written")]
    title = {"written": "", "rollout": ", on a real rollout"}[result.get("buffer", "written")]
    if title:
        title += " (prompts from the sampled ids)" if result.get("prompts", "ids") == "ids" else \
            " (prompts re-rendered from text)"
    lines = [f"### The real update in chat format{title}: one-pass against per-turn scoring", "",
             f"`model.train()` of GRPO on {source} (chat prompts, generate mode), "
             f"tiny LM (hidden {m['hidden']}, {m['layers']} layers), batch_size {result['settings']['batch_size']}, "
             f"micro_batch_tokens {result['settings']['micro_batch_tokens']}, 1 epoch, {result['threads']} torch "
             f"thread(s) on {result['machine']['cpus']} shared cores. Medians of interleaved runs; speed-up = "
             "per-turn / one-pass.", "",
             "| E | T | rows | turns continuing the one before | tokens per-turn / one-pass | one-pass wall (CPU) s | "
             "per-turn wall (CPU) s | speed-up wall | speed-up CPU | repeats | 1-min load |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in result["runs"]:
        s = r["seconds"]
        continued = r.get("continued")
        linked = f"{continued['continued']} / {continued['turns']}" if continued else "-"
        lines.append(f"| {r['envs']} | {r['turns']} | {r['rows']:,} | {linked} | {r['tokens']['per_turn']:,} / "
                     f"{r['tokens']['one_pass']:,} | {s['one_pass']['wall_s']:.2f} ({s['one_pass']['cpu_s']:.2f}) | "
                     f"{s['per_turn']['wall_s']:.2f} ({s['per_turn']['cpu_s']:.2f}) | {r['speedup_wall']:.2f}x | "
                     f"{r['speedup_cpu']:.2f}x | {r['repeats']} | {r['load_1min'][0]:.1f} -> "
                     f"{r['load_1min'][1]:.1f} |")
    if before is not None:
        lines += ["", f"The same update before conversations were kept together ({before['code']}: rows shuffled "
                  "and sorted by length, so a conversation's turns rarely met in a micro-batch), its one-pass "
                  "scoring timed the same way in a separate run:", "",
                  "| E | T | before wall (CPU) s | now wall (CPU) s | now vs before, CPU | 1-min load before |",
                  "|---:|---:|---:|---:|---:|---|"]
        now = {(r["envs"], r["turns"]): r["seconds"]["one_pass"] for r in result["runs"]}
        for r in before["runs"]:
            b, a = r["seconds"]["one_pass"], now.get((r["envs"], r["turns"]))
            if a is not None:
                lines.append(f"| {r['envs']} | {r['turns']} | {b['wall_s']:.2f} ({b['cpu_s']:.2f}) | "
                             f"{a['wall_s']:.2f} ({a['cpu_s']:.2f}) | {b['cpu_s'] / a['cpu_s']:.2f}x faster | "
                             f"{r['load_1min'][0]:.1f} -> {r['load_1min'][1]:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = harness.parser(__doc__, harness.RESULTS / "chat_update",
                            "OUT: the results' path without its suffix (OUT.json, OUT.md)")
    parser.add_argument("--envs", type=int, nargs="+", default=[8, 128])
    parser.add_argument("--turns", type=int, nargs="+", default=[5, 10, 20])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--micro-batch-tokens", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--ways", nargs="+", default=["one_pass", "per_turn"], choices=["one_pass", "per_turn"])
    parser.add_argument("--buffer", choices=["written", "rollout"], default="written",
                        help="the buffer: trajectories written here, or a real rollout of the policy")
    parser.add_argument("--prompts", choices=["ids", "text"], default="ids",
                        help="--buffer rollout: prompts appended from the sampled ids, or re-rendered from text")
    parser.add_argument("--before", type=Path, default=None,
                        help="a --ways one_pass result of the previous code: only rewrite --out's table with it")
    parser.add_argument("--before-code", default="the code before", help="how the table names that code")
    args = parser.parse_args()
    out = args.out
    if args.before is not None:
        before = {**json.loads(args.before.read_text()), "code": args.before_code}
        harness.write_text(out.with_suffix(".md"), markdown(json.loads(out.with_suffix(".json").read_text()), before))
        return
    torch.set_num_threads(args.threads)
    model_path = tiny_model(HouseEnv.vocabulary(), Path(tempfile.mkdtemp()) / "tiny", hidden_size=args.hidden,
                            num_layers=args.layers, num_heads=4)
    settings = {"learning_rate": 1e-4, "n_epochs": 1, "batch_size": args.batch_size, "kl_coef": 0.0,
                "micro_batch_tokens": args.micro_batch_tokens}
    result: dict[str, Any] = {
        "benchmark": "chat_update", "model": {"kind": "tiny_model (House vocabulary)", "hidden": args.hidden,
                                              "layers": args.layers},
        "settings": settings, "threads": args.threads,
        "statistic": "median wall and process CPU seconds of model.train(), one-pass and per-turn interleaved",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__},
        "buffer": args.buffer, "prompts": args.prompts, "runs": []}
    for envs in args.envs:
        for turns in args.turns:
            row = run_size(model_path, envs, turns, args.repeats, settings, args.ways, args.buffer, args.prompts)
            result["runs"].append(row)
            print(json.dumps(row), flush=True)
            harness.write_results(out, result, markdown(result) if len(args.ways) == 2 else None)


if __name__ == "__main__":
    main()
