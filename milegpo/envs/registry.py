"""Registering a :class:`~milegpo.envs.core.TextEnv` under an env id, and the error for an id that names
none: what the id resolution (:mod:`~milegpo.envs.registration`) and the hubs' adapters
(:mod:`~milegpo.envs.hubs`) share.
"""

from __future__ import annotations

from typing import Any, cast

import gymnasium as gym
from gymnasium.envs.registration import EnvCreator

from milegpo.envs.core import TextEnv


class UnknownEnvError(KeyError):
    """Raised for an env id that is not registered; the message lists the known ids."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def register_env(env_id: str, entry_point: str | type[TextEnv], **kwargs: Any) -> None:
    """Register a :class:`TextEnv` under ``env_id`` (e.g. ``"myorg/Maze-v0"``).

    ``entry_point`` is a class or a ``"module:Class"`` string; ``kwargs`` become
    the env's default constructor arguments. Registering an id twice replaces it.
    """
    if isinstance(entry_point, type) and not issubclass(entry_point, TextEnv):
        raise TypeError(f"{entry_point.__name__} must subclass milegpo.envs.TextEnv")
    if env_id in gym.registry:
        del gym.registry[env_id]
    # a TextEnv class is an EnvCreator (called with its keyword arguments); its typed signature is narrower
    creator = entry_point if isinstance(entry_point, str) else cast(EnvCreator, entry_point)
    gym.register(id=env_id, entry_point=creator, kwargs=kwargs, disable_env_checker=True, order_enforce=False)
