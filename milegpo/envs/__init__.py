"""Text environments: the :class:`TextEnv` base class, registration and grouped vector envs.

:class:`GroupedTextVecEnv` and :func:`make_vec_env` are imported lazily: they
subclass stable-baselines3's ``VecEnv`` (which imports torch), while making a
single env stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

from milegpo.envs.core import EnvContractError, TextEnv, normalize_text
from milegpo.envs.env_check import Finding, check_text_env
from milegpo.envs.registration import check_env_id, make_env, registered_env_ids
from milegpo.envs.registry import UnknownEnvError, register_env
from milegpo.envs.vocabulary import env_vocabulary
from milegpo.spaces import TextSpace

_LAZY = {"GroupedTextVecEnv": "milegpo.envs.vec_env", "make_vec_env": "milegpo.envs.vec_env"}

__all__ = [
    "EnvContractError",
    "TextEnv",
    "TextSpace",
    "normalize_text",
    "UnknownEnvError",
    "check_env_id",
    "check_text_env",
    "Finding",
    "make_env",
    "register_env",
    "registered_env_ids",
    "env_vocabulary",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'milegpo.envs' has no attribute {name!r}")
