"""The texts an env can print: what a tiny offline model's word tokenizer is built from."""

from __future__ import annotations

from typing import Any

from milegpo.envs.core import TextEnv
from milegpo.envs.registration import make_env

#: episodes of random commands played to collect an env's texts when it has no ``vocabulary()``
VOCABULARY_EPISODES = 20


def env_vocabulary(env_id: str, env_kwargs: dict[str, Any], episodes: int = VOCABULARY_EPISODES,
                   seed: int = 0) -> list[str]:
    """Texts covering what ``env_id`` can print, for building a tiny model's tokenizer (:func:`env_texts`)."""
    env = make_env(env_id, **env_kwargs)
    try:
        return env_texts(env, env_id, episodes, seed)
    finally:
        env.close()


def env_texts(env: TextEnv, name: str, episodes: int = VOCABULARY_EPISODES, seed: int = 0) -> list[str]:
    """Texts covering what ``env`` can print: its own ``vocabulary()`` when it has one; otherwise the
    observations, tasks and commands of a few episodes of random admissible commands (words never
    seen map to the tokenizer's unknown token). ``ValueError`` naming ``name`` when the env raises."""
    try:
        return list(env.vocabulary()) if hasattr(env, "vocabulary") else _play_for_texts(env, episodes, seed)
    except Exception as exc:  # a broken env: one message, as when it breaks during training
        raise ValueError(f"building the tiny model's vocabulary from {name}: the env raised "
                         f"{type(exc).__name__}: {exc}. Fix the env, give it a vocabulary() method, or train a "
                         "real model (policy.model=NAME_OR_PATH)") from exc


def _play_for_texts(env: TextEnv, episodes: int, seed: int) -> list[str]:
    """Observations, tasks and commands of ``episodes`` episodes of random admissible commands."""
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
    return texts
