"""Time spent building prompts and tokenising admissible commands during House rollouts, with and
without the token cache (same seeds, so both play the same episodes; alternated, two repetitions).

    python -m benchmarks.speed.prompt_cache        # writes benchmarks/results/prompt_cache.json
"""

from __future__ import annotations

import functools
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import harness
from milegpo.algos.rollout import play_episodes
from milegpo.envs.core import TextSpace
from milegpo.envs.house import HouseEnv
from milegpo.envs.vec_env import make_vec_env
from milegpo.policies import LLMPolicy, PromptBuilder, tiny_model

SETTING = "House, 4 tasks x 8, horizon 30, history 2, 3 rollouts, tiny LM (hidden 32, 1 layer), 1 thread"


def run(model: str, cached: bool, seed: int) -> dict[str, float]:
    policy = LLMPolicy(TextSpace(), TextSpace(), lambda _: 1e-3, model=model, mode="choose", history_length=2,
                       prompt_template="{task} {history} {observation}", device="cpu", seed=seed)
    if not cached:  # the tokenizer called every time, as before the caches (no kept prompts or candidate ids)
        tok = policy.tokenizer
        policy.prompts.build = functools.partial(PromptBuilder.build, policy.prompts)
        policy.prompts._encoded = lambda text: list(tok(text, add_special_tokens=False)["input_ids"])
        policy._command_tokens = lambda text: list(tok(text, add_special_tokens=False)["input_ids"]) + [
            tok.eos_token_id]
    spent = {"prompt_s": 0.0, "candidates_s": 0.0}

    def timed(fn, key):
        def wrapper(*args):
            start = time.perf_counter()
            out = fn(*args)
            spent[key] += time.perf_counter() - start
            return out
        return wrapper

    policy.build_prompt = timed(policy.build_prompt, "prompt_s")
    policy._candidate_ids = timed(policy._candidate_ids, "candidates_s")
    env = make_vec_env(HouseEnv, n_tasks=4, group_size=8, seed=seed, env_kwargs={"max_episode_steps": 30})
    steps = 0

    def count(step) -> None:
        nonlocal steps
        steps += len(step.active)

    with harness.Stopwatch() as clock:
        for iteration in range(3):
            env.seed(seed * 10 + iteration)
            obs = env.reset()
            play_episodes(policy, env, obs, [dict(i) for i in env.reset_infos], deterministic=False, on_step=count)
        env.close()
    return {**spent, "rollout_s": clock.wall_s, "steps": steps}


def main() -> None:
    args = harness.parser(__doc__, harness.RESULTS / "prompt_cache.json").parse_args()
    torch.set_num_threads(1)
    model = tiny_model(HouseEnv.vocabulary(), Path(tempfile.mkdtemp()) / "tiny", hidden_size=32, num_layers=1,
                       num_heads=2)
    runs = [{"cached": cached, **run(model, cached, seed)} for seed in range(2) for cached in (False, True)]
    for row in runs:
        print(row)
    harness.write_json(args.out, {"setting": SETTING, "load_1min": harness.load_1min(), "runs": runs})


if __name__ == "__main__":
    main()
