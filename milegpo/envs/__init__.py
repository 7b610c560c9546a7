"""Text environments: the :class:`TextEnv` base class, registration and grouped vector envs."""

from milegpo.envs.core import TextEnv, TextSpace, normalize_text
from milegpo.envs.registration import UnknownEnvError, make_env, register_env, registered_env_ids

__all__ = [
    "TextEnv",
    "TextSpace",
    "normalize_text",
    "UnknownEnvError",
    "make_env",
    "register_env",
    "registered_env_ids",
]
