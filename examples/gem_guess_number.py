"""A GEM env as a milegpo env: Guess the Number through ``gem:game:GuessTheNumber-v0-easy``.

GEM's games answer ``\\boxed{...}`` moves; the adapter passes the whole reply, so a chat model plays
them in generate mode (``--model`` a local chat model, ``prompt_format="chat"``: the conversation is
GEM's instructions, then the model's replies and GEM's answers), and the offline tiny model plays
them in choose mode among a fixed list of moves (the default here: no download).

Run: ``python examples/gem_guess_number.py`` (GEM: ``pip install --no-deps gem-llm==0.1.0
reasoning-gym==0.1.23 && pip install "milegpo[gem]"``). GEM rewards a lost game by how close the last
guess was (1 - distance / range), nearly a win's reward: the return rises before the success does.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from milegpo.config.run import eval_task_seeds
from milegpo.envs import make_vec_env
from milegpo.envs.hubs import register_hub_env
from milegpo.envs.vocabulary import env_vocabulary
from milegpo.options import HELD_OUT_SPLIT

ENV_ID = "gem:game:GuessTheNumber-v0-easy"
ANSWERS = [f"\\boxed{{{n}}}" for n in range(1, 11)]


def main(argv: list[str] | None = None) -> dict[str, float]:
    from milegpo import MileGPO
    from milegpo.policies import tiny_model

    parser = argparse.ArgumentParser(description="MileGPO on GEM's Guess the Number.")
    parser.add_argument("--steps", type=int, default=8_000, help="env-step budget of training")
    parser.add_argument("--model", default=None, help="a local chat model (generate mode); default: tiny, choose")
    parser.add_argument("--n-eval-tasks", type=int, default=25)
    parser.add_argument("--out", default="runs/gem_guess_number")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    if args.model is None:  # the offline tiny model scores the ten answers
        register_hub_env(ENV_ID, commands=ANSWERS, max_episode_steps=4)
        policy = {"model": tiny_model(env_vocabulary(ENV_ID, {}), Path(args.out) / "base_model", hidden_size=32,
                                      num_layers=1, num_heads=2, seed=args.seed),
                  "mode": "choose", "candidate_score": "sum", "prompt_template": "{observation}", "history_length": 0}
    else:  # a chat model writes its replies; GEM reads the \boxed{} answer in them
        register_hub_env(ENV_ID, max_episode_steps=4)
        policy = {"model": args.model, "mode": "generate", "prompt_format": "chat", "history_length": 4,
                  "max_new_tokens": 64}
    env = make_vec_env(ENV_ID, n_tasks=4, group_size=8, seed=args.seed)
    eval_env = make_vec_env(ENV_ID, n_tasks=args.n_eval_tasks, group_size=4, seed=args.seed)
    model = MileGPO("LLMPolicy", env, learning_rate=3e-3, batch_size=256, kl_coef=0.0, seed=args.seed, verbose=0,
                    policy_kwargs=policy)

    def evaluate() -> dict:
        seeds = eval_task_seeds(HELD_OUT_SPLIT, args.n_eval_tasks)  # numbers training never draws
        return model.evaluate(eval_env, task_seeds=seeds, deterministic=False, seed=0)

    before = evaluate()
    model.learn(total_timesteps=args.steps)
    after = evaluate()
    model.save(Path(args.out) / "final")
    env.close()
    eval_env.close()
    print(f"held-out success {before['success_rate']:.2f} -> {after['success_rate']:.2f}, mean return "
          f"{before['mean_return']:.2f} -> {after['mean_return']:.2f} after {model.num_timesteps} env steps")
    return {"success_before": before["success_rate"], "success_after": after["success_rate"],
            "num_timesteps": float(model.num_timesteps)}


if __name__ == "__main__":
    main()
