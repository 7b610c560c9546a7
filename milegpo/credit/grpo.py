r"""GRPO: one outcome advantage per trajectory, on every step.

.. math::
    A_{i,t} = \text{Norm}_q(Z_i) =
    \frac{Z_i - \operatorname{mean}_{j \in q} Z_j}{\operatorname{std}_{j \in q} Z_j + \varepsilon}

``norm="mean_norm"`` drops the std division: :math:`A_i = Z_i - \bar Z_q`, which is
the leave-one-out (RLOO) advantage up to the factor :math:`K/(K-1)`.
The statistics are taken once per trajectory; a group of size 1 gets 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from milegpo.credit.base import CreditConfig, common_diagnostics
from milegpo.credit.batch import CreditResult, StepBatch
from milegpo.credit.graph import build_task_groups
from milegpo.credit.norm import episode_scores
from milegpo.credit.task_graph import TaskGroups


@dataclass(frozen=True)
class GRPOConfig(CreditConfig):
    """GRPO hyperparameters: only the normalisation (see :class:`CreditConfig`)."""


def grpo(batch: StepBatch, config: GRPOConfig | None = None, graph: TaskGroups | None = None) -> CreditResult:
    """GRPO credit: the task-normalised outcome of each step's trajectory."""
    config = config or GRPOConfig()
    graph = graph or build_task_groups(batch)  # tasks and trajectories only: no state graph
    episode = episode_scores(batch, graph, config.norm, config.epsilon, config.upstream_exact)
    diagnostics = {"method": "grpo", **common_diagnostics(graph, episode, episode)}
    return CreditResult(advantages=episode.copy(), diagnostics=diagnostics, components={"episode": episode})
