"""milegpo: train long-horizon LLM agents with milestone-graph credit assignment.

``MileGPO("LLMPolicy", env).learn(total_timesteps)`` - see the README.
Heavy modules (torch, transformers) are imported only when an algorithm or a
policy is first used, so ``import milegpo`` stays light; it registers the env ids,
so ``gymnasium.make("milegpo/House-v0")`` works after it.
"""

from __future__ import annotations

import importlib
from typing import Any

import milegpo.envs.registration  # noqa: F401  registers the env ids (string entry points: cheap)

__version__ = "0.1.0"

_LAZY = {
    "MileGPO": "milegpo.algos",
    "GraphGPO": "milegpo.algos",
    "HGPO": "milegpo.algos",
    "GiGPO": "milegpo.algos",
    "RLOO": "milegpo.algos",
    "GRPO": "milegpo.algos",
    "GAGPO": "milegpo.algos",
    "G2PO": "milegpo.algos",
    "LLMPolicy": "milegpo.policies",
    "TextEnv": "milegpo.envs",
    "register_env": "milegpo.envs",
    "make_env": "milegpo.envs",
    "make_vec_env": "milegpo.envs",
    "AlgoConfig": "milegpo.config",
    "PolicyConfig": "milegpo.config",
    "LoraConfig": "milegpo.config",
    "SamplerConfig": "milegpo.config",
    "TrainConfig": "milegpo.config.run",
    "train": "milegpo.run.train",
    "evaluate_policy": "milegpo.algos.evaluation",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'milegpo' has no attribute {name!r}")
