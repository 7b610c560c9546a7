"""A verifiers environment as a milegpo env: Guess the Number through ``verifiers:verifiers_guess_number``.

This file is both a verifiers environment module and the training script. ``load_environment()`` builds
the environment with verifiers' own classes: a ``MultiTurnEnv`` whose ``env_response`` answers "higher" /
"lower", a ``@vf.stop`` condition that ends the game on the right number, and a ``Rubric`` that pays 1
for it; its dataset is offline (``datasets.Dataset.from_list``: one secret number per row). The env id
``verifiers:verifiers_guess_number`` makes verifiers' ``load_environment`` import this module (it must
be importable: the script puts its folder on ``sys.path``); an installed verifiers environment package
is named the same way (``verifiers:<its module>``).

The offline tiny model plays in choose mode among the ten answers (no download); ``--model`` a local
chat model plays in generate mode, the conversation being the dataset's prompt, then the model's
replies and the environment's answers.

Run: ``python examples/verifiers_guess_number.py`` (verifiers: ``pip install --no-deps verifiers==0.2.0
openai-agents==0.24.0 && pip install "milegpo[verifiers]"``).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

ENV_ID = "verifiers:verifiers_guess_number"
ANSWERS = [f"\\boxed{{{n}}}" for n in range(1, 11)]
SYSTEM_PROMPT = "Guess the secret number between 1 and 10. Answer with your guess as \\boxed{n}."


def guess_of(text: str | None) -> int | None:
    """The number in a reply's last ``\\boxed{...}``; None without one."""
    found = re.findall(r"\\boxed\{\s*(\d+)\s*\}", text or "")
    return int(found[-1]) if found else None


def load_environment(n_numbers: int = 10, max_turns: int = 4) -> Any:
    """The verifiers environment: one row per secret number ``1..n_numbers``, ``max_turns`` guesses."""
    import verifiers as vf
    from datasets import Dataset

    def last_guess(messages: Any) -> int | None:
        replies = [m for m in messages if getattr(m, "role", None) == "assistant"]
        return guess_of(replies[-1].content) if replies else None

    class GuessTheNumber(vf.MultiTurnEnv):
        async def env_response(self, messages: Any, state: Any, **kwargs: Any) -> Any:
            guess, secret = last_guess(messages), int(state["answer"])
            if guess is None:
                return [vf.UserMessage(content="Answer with your guess as \\boxed{n}.")]
            return [vf.UserMessage(content=f"{guess} is too {'low' if guess < secret else 'high'}.")]

        @vf.stop
        async def guessed(self, state: Any) -> bool:
            trajectory = state["trajectory"]
            return bool(trajectory) and last_guess(trajectory[-1]["completion"]) == int(state["answer"])

    def correct(completion: Any, answer: str, **kwargs: Any) -> float:
        return 1.0 if last_guess(completion) == int(answer) else 0.0

    rows = [{"question": "I picked a number. Your guess?", "answer": str(n)} for n in range(1, n_numbers + 1)]
    return GuessTheNumber(dataset=Dataset.from_list(rows), system_prompt=SYSTEM_PROMPT,
                          rubric=vf.Rubric(funcs=[correct], weights=[1.0]), max_turns=max_turns)


def main(argv: list[str] | None = None) -> dict[str, float]:
    from milegpo import MileGPO
    from milegpo.envs import make_vec_env
    from milegpo.envs.hubs import register_hub_env
    from milegpo.envs.vocabulary import env_vocabulary
    from milegpo.policies import tiny_model

    parser = argparse.ArgumentParser(description="MileGPO on a verifiers Guess the Number environment.")
    parser.add_argument("--steps", type=int, default=4_000, help="env-step budget of training")
    parser.add_argument("--model", default=None, help="a local chat model (generate mode); default: tiny, choose")
    parser.add_argument("--n-eval-tasks", type=int, default=10)
    parser.add_argument("--out", default="runs/verifiers_guess_number")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    sys.path.insert(0, str(Path(__file__).resolve().parent))  # verifiers' load_environment imports this module
    if args.model is None:  # the offline tiny model scores the ten answers
        register_hub_env(ENV_ID, commands=ANSWERS, max_episode_steps=4)
        policy = {"model": tiny_model(env_vocabulary(ENV_ID, {}), Path(args.out) / "base_model", hidden_size=32,
                                      num_layers=1, num_heads=2, seed=args.seed),
                  "mode": "choose", "candidate_score": "sum", "prompt_template": "{observation}", "history_length": 0}
    else:  # a chat model writes its replies; the environment reads the \boxed{} answer in them
        register_hub_env(ENV_ID, max_episode_steps=4)
        policy = {"model": args.model, "mode": "generate", "prompt_format": "chat", "history_length": 4,
                  "max_new_tokens": 64}
    env = make_vec_env(ENV_ID, n_tasks=4, group_size=8, seed=args.seed)
    eval_env = make_vec_env(ENV_ID, n_tasks=args.n_eval_tasks, group_size=2, seed=args.seed)
    model = MileGPO("LLMPolicy", env, learning_rate=3e-3, batch_size=256, kl_coef=0.0, seed=args.seed, verbose=0,
                    policy_kwargs=policy)

    def evaluate() -> dict:
        # the ten secret numbers, each once: the dataset has no held-out rows
        return model.evaluate(eval_env, task_seeds=list(range(args.n_eval_tasks)), deterministic=False, seed=0)

    before = evaluate()
    model.learn(total_timesteps=args.steps)
    after = evaluate()
    model.save(Path(args.out) / "final")
    env.close()
    eval_env.close()
    print(f"success {before['success_rate']:.2f} -> {after['success_rate']:.2f}, mean return "
          f"{before['mean_return']:.2f} -> {after['mean_return']:.2f} after {model.num_timesteps} env steps")
    return {"success_before": before["success_rate"], "success_after": after["success_rate"],
            "num_timesteps": float(model.num_timesteps)}


if __name__ == "__main__":
    main()
