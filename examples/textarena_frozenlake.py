"""A TextArena game as a milegpo env: FrozenLake through ``textarena:FrozenLake-v0``.

``register_hub_env`` registers the prefixed id (the TextArena adapter with the game's id); from then
on it is an env like any other: grouped copies of one lake, MileGPO's credit, evaluation on held-out
lakes. Here the offline tiny model (no download) chooses among the four moves from the board alone
(``commands`` makes the game playable in choose mode); a chat model plays the same env in generate
mode with ``prompt_format="chat"`` (TextArena reads the ``[down]`` in its whole reply).

Run: ``python examples/textarena_frozenlake.py`` (``pip install "milegpo[textarena]"``; about 2 min
on one CPU core; ``--steps`` sets the budget). A random policy reaches the goal in about 2 % of the
episodes; benchmarks/learning/hub_learning.py measures the learning curve, MileGPO against GRPO.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from milegpo.config.run import eval_task_seeds
from milegpo.envs import make_vec_env
from milegpo.envs.hubs import register_hub_env
from milegpo.envs.vocabulary import env_vocabulary
from milegpo.options import HELD_OUT_SPLIT

ENV_ID = "textarena:FrozenLake-v0"
MOVES = ["[up]", "[down]", "[left]", "[right]"]
HELD_OUT = eval_task_seeds(HELD_OUT_SPLIT, 1000)  # lakes training never draws


def main(argv: list[str] | None = None) -> dict[str, float]:
    from milegpo import MileGPO
    from milegpo.policies import tiny_model

    parser = argparse.ArgumentParser(description="MileGPO on TextArena's FrozenLake (tiny offline LM, CPU).")
    parser.add_argument("--steps", type=int, default=16_000, help="env-step budget of training")
    parser.add_argument("--n-eval-tasks", type=int, default=25, help="held-out lakes evaluated before and after")
    parser.add_argument("--out", default="runs/textarena_frozenlake", help="folder of the tiny model and checkpoint")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    register_hub_env(ENV_ID, commands=MOVES, max_episode_steps=12)
    env = make_vec_env(ENV_ID, n_tasks=4, group_size=8, seed=args.seed)
    eval_env = make_vec_env(ENV_ID, n_tasks=args.n_eval_tasks, group_size=4, seed=args.seed)
    model_dir = tiny_model(env_vocabulary(ENV_ID, {}), Path(args.out) / "base_model", hidden_size=32, num_layers=1,
                           num_heads=2, seed=args.seed)
    model = MileGPO("LLMPolicy", env, learning_rate=1e-2, batch_size=256, kl_coef=0.0, seed=args.seed, verbose=0,
                    policy_kwargs={"model": model_dir, "mode": "choose", "candidate_score": "sum",
                                   "prompt_template": "{observation}", "history_length": 0})

    def success() -> float:
        seeds = HELD_OUT[: args.n_eval_tasks]
        return model.evaluate(eval_env, task_seeds=seeds, deterministic=False, seed=0)["success_rate"]

    before = success()
    model.learn(total_timesteps=args.steps)
    after = success()
    model.save(Path(args.out) / "final")
    env.close()
    eval_env.close()
    print(f"reached the goal on held-out lakes (sampled): {before:.2f} before, {after:.2f} after "
          f"{model.num_timesteps} env steps")
    return {"success_before": before, "success_after": after, "num_timesteps": float(model.num_timesteps)}


if __name__ == "__main__":
    main()
