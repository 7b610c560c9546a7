"""Credit assignment for grouped rollouts: pure numpy, no torch, no env, no model.

``compute_credit(method, batch, config)`` turns a :class:`StepBatch` into one
advantage per step row, for ``method`` in :data:`CREDIT_METHODS`:

* ``"grpo"``     - :mod:`~milegpo.algos.credit.grpo`, outcome only;
* ``"gigpo"``    - :mod:`~milegpo.algos.credit.gigpo`, + anchor-state step groups;
* ``"graphgpo"`` - :mod:`~milegpo.algos.credit.graphgpo`, + distance to goal on the task graph;
* ``"milegpo"``  - :mod:`~milegpo.algos.credit.milegpo`, + milestone / trap shaping.

Example::

    from milegpo.algos.credit import StepBatch, compute_credit, make_credit_config
    batch = StepBatch.from_trajectories([["s0", "a", "b"], ["s0", "c", "c"]], success=[True, False])
    result = compute_credit("milegpo", batch, make_credit_config("milegpo", preset="alfworld"))
    result.advantages, result.diagnostics["milestones"], result.components["shaping"]
"""

from milegpo.algos.credit.api import CREDIT_METHODS, compute_credit, credit_of_trajectory, make_credit_config
from milegpo.algos.credit.base import CreditConfig
from milegpo.algos.credit.batch import CreditResult, StepBatch
from milegpo.algos.credit.gigpo import GiGPOConfig
from milegpo.algos.credit.graph import TaskGraph, build_task_graph
from milegpo.algos.credit.graphgpo import GraphGPOConfig
from milegpo.algos.credit.grpo import GRPOConfig
from milegpo.algos.credit.milegpo import MileGPOConfig, MilestoneEvidence, milestone_evidence

__all__ = [
    "CREDIT_METHODS", "compute_credit", "credit_of_trajectory", "make_credit_config",
    "StepBatch", "CreditResult", "CreditConfig", "GRPOConfig", "GiGPOConfig", "GraphGPOConfig", "MileGPOConfig",
    "TaskGraph", "build_task_graph", "MilestoneEvidence", "milestone_evidence",
]
