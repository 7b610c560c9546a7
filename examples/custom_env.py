"""Drop in your own text env: subclass TextEnv, register it, vectorize it, train on it.

Run: ``python examples/custom_env.py`` (a random rollout, then a short MileGPO run
with a tiny offline model in "choose" mode).
"""

from __future__ import annotations

import random
import tempfile

from milegpo.envs import TextEnv, make_vec_env, register_env


class SafeEnv(TextEnv):
    """Crack a safe: turn its dial to the three digits of the code, in order.

    The safe clicks at each right digit and resets at a wrong one. Seed ``s``
    selects the code of task ``s % num_tasks`` (same seed, same task).
    """

    num_tasks = 100

    def _reset(self, seed, options):
        rng = random.Random((seed or 0) % self.num_tasks)
        self.code, self.progress = [rng.randrange(4) for _ in range(3)], 0
        return "a locked safe. the dial is at zero.", {"task": "open the safe."}

    def _step(self, action):
        right = int(action.split()[-1]) == self.code[self.progress]
        self.progress = self.progress + 1 if right else 0
        won = self.progress == len(self.code)
        text = "the safe opens!" if won else f"{'click' if right else 'the dial spins back'}. {self.progress} of 3 digits set."
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
def main() -> None:
    """Train MileGPO on the safe with a tiny offline model (a few updates on a CPU)."""
    from milegpo import MileGPO
    from milegpo.policies import tiny_model

    env = make_vec_env("examples/Safe-v0", n_tasks=2, group_size=8, seed=0)
    vocab = ["a locked safe. the dial is at zero. open the safe. the safe opens! click the dial spins back",
             "of digits set turn dial to 0 1 2 3"]
    model_dir = tiny_model(vocab, tempfile.mkdtemp(prefix="safe-model-"))
    model = MileGPO("LLMPolicy", env, learning_rate=1e-3, policy_kwargs={"model": model_dir, "mode": "choose"}, verbose=1)
    model.learn(total_timesteps=600)
    env.close()


if __name__ == "__main__":
    print(f"random policy success: {random_rollout():.2f}")
    main()
