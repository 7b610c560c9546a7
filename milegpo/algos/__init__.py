"""Group RL algorithms for text agents: MileGPO and the GraphGPO, HGPO, GiGPO, GAGPO, G2PO, RLOO, GRPO
baselines.

All of them share :class:`~milegpo.algos.base.GroupRLAlgorithm` (an SB3
``OnPolicyAlgorithm``) and differ only by their credit function
(:mod:`milegpo.credit`). Names are imported lazily, so that
``import milegpo.credit`` (pure numpy) does not pull in torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "ALGORITHMS": "milegpo.algos.algorithms",
    "MileGPO": "milegpo.algos.algorithms",
    "GraphGPO": "milegpo.algos.algorithms",
    "HGPO": "milegpo.algos.algorithms",
    "GiGPO": "milegpo.algos.algorithms",
    "RLOO": "milegpo.algos.algorithms",
    "GRPO": "milegpo.algos.algorithms",
    "GAGPO": "milegpo.algos.algorithms",
    "G2PO": "milegpo.algos.algorithms",
    "GroupRLAlgorithm": "milegpo.algos.base",
    "TextRolloutBuffer": "milegpo.algos.buffer",
    "IterationCallback": "milegpo.algos.callbacks",
    "CheckpointCallback": "milegpo.algos.callbacks",
    "TrainingError": "milegpo.algos.errors",
    "EvalCallback": "milegpo.algos.callbacks",
    "CheckpointError": "milegpo.algos.checkpoint",
    "latest_checkpoint": "milegpo.algos.checkpoint",
    "evaluate": "milegpo.algos.evaluation",
    "evaluate_policy": "milegpo.algos.evaluation",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'milegpo.algos' has no attribute {name!r}")
