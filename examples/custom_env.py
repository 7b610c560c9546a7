"""Drop in your own text env: subclass TextEnv, register it, vectorize it, train on it.

A :class:`~milegpo.envs.TextEnv` subclass implements ``_reset``, ``_step`` and
``admissible_commands``; the base class does the rest (invalid actions, the horizon,
the info keys). Registered, it works everywhere a built-in env does:
``make_vec_env``, ``MileGPO("LLMPolicy", env)``, ``milegpo train env.id=examples/Safe-v0``
(after importing this file), ``milegpo play``.

Run: ``python examples/custom_env.py`` (a random rollout, then an 8,000-step MileGPO
run with a tiny offline model in "choose" mode: about 40 s on 2 idle CPU cores; ``--steps``
sets the budget). The safes' codes are hidden, so the untrained policy opens about one
safe in ten; measured with the defaults, sampled success on 20 safes x 4 tries went
0.11 -> 0.45, 0.17 -> 0.29 and 0.11 -> 0.33 for seeds 0, 1, 2 (at 4,000 steps the gain
is within noise).
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from milegpo.envs import TextEnv, make_vec_env, register_env


class SafeEnv(TextEnv):
    """Crack a safe: turn its dial to the three digits of the code, in order.

    Safes come in four colours and every safe of a colour has its maker's code,
    which the agent is not told: it has to find the codes by trying and remember
    them (in its weights: that is what training does). The safe clicks at each
    right digit and resets at a wrong one. Seed ``s`` selects task ``s % num_tasks``
    (same seed, same task).
    """

    num_tasks = 100
    colors = ("red", "green", "blue", "black")

    def _reset(self, seed, options):
        self.color = self.colors[(seed or 0) % self.num_tasks % len(self.colors)]
        rng = random.Random(self.color)
        self.code, self.progress = [rng.randrange(4) for _ in range(3)], 0
        return "a locked safe. the dial is at zero.", {"task": f"open the {self.color} safe."}

    def _step(self, action):
        right = int(action.split()[-1]) == self.code[self.progress]
        self.progress = self.progress + 1 if right else 0
        won = self.progress == len(self.code)
        sound = "click" if right else "the dial spins back"
        text = "the safe opens!" if won else f"{sound}. {self.progress} of 3 digits set."
        return text, 10.0 if won else 0.0, won, {"won": won}

    def admissible_commands(self):
        return [f"turn dial to {digit}" for digit in range(4)]


register_env("examples/Safe-v0", SafeEnv, max_episode_steps=12)


def random_rollout(seed: int = 0) -> float:
    """One grouped rollout with random admissible commands; returns the success rate."""
    env = make_vec_env("examples/Safe-v0", n_tasks=2, group_size=4, seed=seed)
    rng = random.Random(seed)
    env.reset()
    infos = env.reset_infos
    while env.active.any():
        _, _, _, infos = env.step([rng.choice(info["admissible_commands"] or [""]) for info in infos])
    env.close()
    return sum(info["won"] for info in infos) / env.num_envs


# --------------------------------------------------------------------- training
#: Every word the safe prints or is told, for the tiny model's word-level tokenizer.
VOCABULARY = ["a locked safe. the dial is at zero. open the safe. the safe opens! click. the dial spins back.",
              "0 1 2 3 of 3 digits set. turn dial to", " ".join(SafeEnv.colors)]


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Train MileGPO on the safe with a tiny offline model; return success before and after."""
    from milegpo import MileGPO
    from milegpo.policies import tiny_model

    parser = argparse.ArgumentParser(description="MileGPO on the custom Safe env (tiny offline LM, CPU).")
    parser.add_argument("--steps", type=int, default=8_000, help="env-step budget of training")
    parser.add_argument("--n-eval-tasks", type=int, default=20, help="tasks evaluated before and after training")
    parser.add_argument("--out", default="runs/custom_env", help="folder of the tiny model and the checkpoint")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    env = make_vec_env("examples/Safe-v0", n_tasks=2, group_size=8, seed=args.seed)
    eval_env = make_vec_env("examples/Safe-v0", n_tasks=args.n_eval_tasks, group_size=4, seed=args.seed)
    out = Path(args.out)
    model_dir = tiny_model(VOCABULARY, out / "base_model", hidden_size=32, num_layers=1, num_heads=2, seed=args.seed)
    model = MileGPO("LLMPolicy", env, learning_rate=3e-3, batch_size=64, kl_coef=0.0, seed=args.seed, verbose=1,
                    policy_kwargs={"model": model_dir, "mode": "choose", "candidate_score": "mean",
                                   "lora": {"r": 8, "alpha": 16}})

    def success() -> float:  # sampled actions: a greedy policy without memory repeats one digit
        return model.evaluate(eval_env, n_episodes=args.n_eval_tasks, deterministic=False)["success_rate"]

    before = success()
    model.learn(total_timesteps=args.steps)
    after = success()
    model.save(out / "final")  # the LoRA adapter + optimizer state; MileGPO.load(out / "final", env) resumes
    env.close()
    eval_env.close()
    print(f"success on {args.n_eval_tasks} safes (sampled): {before:.2f} before, {after:.2f} after "
          f"{model.num_timesteps} env steps")
    return {"success_before": before, "success_after": after, "num_timesteps": float(model.num_timesteps)}


if __name__ == "__main__":
    print(f"random policy success: {random_rollout():.2f}")
    main()
