"""The texts an env can print: what a tiny offline model's word tokenizer is built from."""

from __future__ import annotations

from typing import Any

from milegpo.envs.registration import make_env


def env_vocabulary(env_id: str, env_kwargs: dict[str, Any], episodes: int = 20, seed: int = 0) -> list[str]:
    """Texts covering what ``env_id`` can print, for building a tiny model's tokenizer.

    Uses the env's own ``vocabulary()`` when it has one; otherwise plays random
    admissible commands for a few episodes and collects observations, tasks and
    commands (words never seen map to the tokenizer's unknown token).
    """
    env = make_env(env_id, **env_kwargs)
    if hasattr(env, "vocabulary"):
        return list(env.vocabulary())
    import random

    rng = random.Random(seed)
    texts: list[str] = []
    for episode in range(episodes):
        observation, info = env.reset(seed=seed + episode)
        texts += [observation, info["task"], *(info["admissible_commands"] or [])]
        done = False
        while not done:
            commands = info["admissible_commands"] or ["look"]
            observation, _, terminated, truncated, info = env.step(rng.choice(commands))
            texts += [observation, *(info["admissible_commands"] or [])]
            done = terminated or truncated
    env.close()
    return texts
