"""Credit assignment for grouped rollouts: pure numpy, no torch, no env, no model.

``compute_credit(method, batch, config)`` turns a :class:`StepBatch` into one
advantage per step row, for ``method`` in :data:`CREDIT_METHODS`:

* ``"grpo"``     - :mod:`~milegpo.credit.grpo`, outcome only;
* ``"rloo"``     - :mod:`~milegpo.credit.rloo`, outcome against the leave-one-out mean;
* ``"gigpo"``    - :mod:`~milegpo.credit.gigpo`, + anchor-state step groups;
* ``"hgpo"``     - :mod:`~milegpo.credit.hgpo`, step groups by shared history of 1..H+1 states;
* ``"graphgpo"`` - :mod:`~milegpo.credit.graphgpo`, + distance to goal on the task graph;
* ``"milegpo"``  - :mod:`~milegpo.credit.milegpo`, + milestone / trap shaping;
* ``"gagpo"``    - :mod:`~milegpo.credit.gagpo`, GAE over the mean return of same-state steps;
* ``"g2po"``     - :mod:`~milegpo.credit.g2po`, scores of the group's state graph: where a step led
  among same-state steps, plus its score gain.

Example::

    from milegpo.credit import StepBatch, compute_credit, make_credit_config
    batch = StepBatch.from_trajectories([["s0", "a", "b"], ["s0", "c", "c"]], success=[True, False])
    result = compute_credit("milegpo", batch, make_credit_config("milegpo", preset="alfworld"))
    result.advantages, result.diagnostics["milestones"], result.components["shaping"]
"""

from milegpo.credit.api import CREDIT_METHODS, compute_credit, credit_of_trajectory, make_credit_config
from milegpo.credit.base import CreditConfig
from milegpo.credit.batch import CreditResult, StepBatch
from milegpo.credit.g2po import G2POConfig
from milegpo.credit.gagpo import GAGPOConfig
from milegpo.credit.gigpo import GiGPOConfig
from milegpo.credit.graph import build_task_graph
from milegpo.credit.graphgpo import GraphGPOConfig
from milegpo.credit.grpo import GRPOConfig
from milegpo.credit.hgpo import HGPOConfig
from milegpo.credit.memory import MilestoneMemory, milegpo_with_memory, remembered_credit
from milegpo.credit.milegpo import MileGPOConfig, MilestoneEvidence, milestone_evidence
from milegpo.credit.rloo import RLOOConfig
from milegpo.credit.task_graph import TaskGraph

__all__ = [
    "CREDIT_METHODS", "compute_credit", "credit_of_trajectory", "make_credit_config",
    "StepBatch", "CreditResult", "CreditConfig", "GRPOConfig", "RLOOConfig", "GiGPOConfig", "HGPOConfig",
    "GraphGPOConfig", "MileGPOConfig", "GAGPOConfig", "G2POConfig",
    "TaskGraph", "build_task_graph", "MilestoneEvidence", "milestone_evidence",
    "MilestoneMemory", "remembered_credit", "milegpo_with_memory",
]
