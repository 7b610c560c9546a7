"""Time spent building prompts and tokenising admissible commands during House rollouts (choose mode), with
and without the token caches (same seeds, so every variant plays the same episodes; alternated, two repetitions).

``cached`` is the policy as it is: its prompt builder (``prompt_tokens.KeptPromptBuilder``) keeps each state's
prompt ids, and on a miss looks the prompt text up in its text token cache; the candidate ids of each command are
kept (``prompt_tokens.CandidateTokens``). The two variants without caches call the tokenizer every time, for every
prompt and every command of every step (a plain ``PromptBuilder`` and the command's tokens plus the end-of-turn
token): ``uncached`` calls the policy's tokenizer itself (the chat template rendered by jinja, transformers' call),
as before the caches; ``uncached_wrapped`` calls it through the wrapper the cached builder is built on
(``prompt_tokens.RenderedChatTemplate``: the chat template by concatenation, the Rust backend's encode), so
``uncached_wrapped`` against ``cached`` is what the caches alone save, and ``uncached`` against
``uncached_wrapped`` what the wrapper saves. The state cache and the text cache of the prompts are not timed apart.
Each run's actions are hashed (``actions_sha256``): the script stops if the variants of a seed played differently.

    python -m benchmarks.speed.prompt_cache        # writes benchmarks/results/prompt_cache.json
"""

from __future__ import annotations

import hashlib
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import harness
from milegpo.algos.rollout import play_episodes
from milegpo.envs.house import HouseEnv
from milegpo.envs.vec_env import make_vec_env
from milegpo.policies import LLMPolicy, PromptBuilder, tiny_model
from milegpo.policies.prompt_tokens import RenderedChatTemplate
from milegpo.spaces import TextSpace

SETTING = "House, 4 tasks x 8, horizon 30, history 2, 3 rollouts, tiny LM (hidden 32, 1 layer), 1 thread, choose mode"
VARIANTS = ("uncached", "uncached_wrapped", "cached")


class Timed:
    """``fn`` (and its ``many``, where it has one) with the seconds spent in its calls added to ``spent[key]``."""

    def __init__(self, fn: Any, spent: dict[str, float], key: str):
        self.fn, self.spent, self.key = fn, spent, key

    def _time(self, fn: Any, *args: Any) -> Any:
        start = time.perf_counter()
        out = fn(*args)
        self.spent[self.key] += time.perf_counter() - start
        return out

    def __call__(self, *args: Any) -> Any:
        return self._time(self.fn, *args)

    def many(self, commands: Any) -> Any:
        return self._time(self.fn.many, commands)


class UncachedCandidates:
    """A command's candidate ids as ``CandidateTokens`` gives them, from the tokenizer every time."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def __call__(self, command: str) -> list[int]:
        eos = self.tokenizer.eos_token_id
        ids = list(self.tokenizer(command, add_special_tokens=False)["input_ids"])
        return ids + ([] if eos is None else [int(eos)])

    def many(self, commands: Any) -> list[list[int]]:
        return [self(command) for command in commands]


def run(model: str, variant: str, seed: int) -> dict[str, Any]:
    policy = LLMPolicy(TextSpace(), TextSpace(), lambda _: 1e-3, model=model, mode="choose", history_length=2,
                       prompt_template="{task} {history} {observation}", device="cpu", seed=seed)
    if variant != "cached":  # the tokenizer called every time: no kept prompt ids, texts or candidate ids
        tok = policy.tokenizer if variant == "uncached" else RenderedChatTemplate(policy.tokenizer)
        kept = policy.prompts
        plain = PromptBuilder(tok, kept.template, kept.instructions, kept.history_length, kept.max_prompt_tokens)
        plain._encoded = lambda text: list(tok(text, add_special_tokens=False)["input_ids"])  # type: ignore
        policy.prompts = plain  # type: ignore[assignment]
        policy._command_tokens = UncachedCandidates(tok)  # type: ignore[assignment]
    spent = {"prompt_s": 0.0, "candidates_s": 0.0}
    policy.prompts.build = Timed(policy.prompts.build, spent, "prompt_s")  # type: ignore[method-assign]
    policy._command_tokens = Timed(policy._command_tokens, spent, "candidates_s")  # type: ignore[assignment]
    env = make_vec_env(HouseEnv, n_tasks=4, group_size=8, seed=seed, env_kwargs={"max_episode_steps": 30})
    steps, played = 0, hashlib.sha256()

    def count(step) -> None:
        nonlocal steps
        steps += len(step.active)
        played.update("\n".join(sample.text for sample in step.samples).encode())

    with harness.Stopwatch() as clock:
        for iteration in range(3):
            env.seed(seed * 10 + iteration)
            obs = env.reset()
            play_episodes(policy, env, obs, [dict(i) for i in env.reset_infos], deterministic=False, on_step=count)
        env.close()
    return {**spent, "rollout_s": clock.wall_s, "rollout_cpu_s": clock.cpu_s, "steps": steps,
            "actions_sha256": played.hexdigest()[:16]}


def main() -> None:
    args = harness.parser(__doc__, harness.RESULTS / "prompt_cache.json").parse_args()
    torch.set_num_threads(1)
    model = tiny_model(HouseEnv.vocabulary(), Path(tempfile.mkdtemp()) / "tiny", hidden_size=32, num_layers=1,
                       num_heads=2)
    runs = []
    for seed in range(2):
        for variant in VARIANTS if seed % 2 == 0 else VARIANTS[::-1]:
            runs.append({"variant": variant, "seed": seed, **run(model, variant, seed)})
            print(runs[-1], flush=True)
    if len({(row["seed"], row["steps"], row["actions_sha256"]) for row in runs}) != 2:
        raise RuntimeError("the variants played different episodes: their timings do not compare")
    harness.write_json(args.out, {"setting": SETTING, "load_1min": harness.load_1min(), "runs": runs})


if __name__ == "__main__":
    main()
