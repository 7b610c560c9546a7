r"""RLOO (REINFORCE leave-one-out): each trajectory's outcome against the mean of the *other* ones.

.. math::
    A_{i,t} = Z_i - \frac{1}{K - 1} \sum_{j \in q,\ j \ne i} Z_j
            = \frac{K}{K - 1}\,\bigl(Z_i - \bar Z_q\bigr)

on every step of trajectory :math:`i` (Ahmadian et al., 2024, "Back to Basics"; the
``rloo`` estimator of verl and SkyRL). No std division; a group of one trajectory
gets 0. The statistics are taken once per trajectory (ours); ``upstream_exact=True``
takes them over step rows as verl-agent does (:math:`K` is then the task's number of
rows, and the invalid-action penalty is subtracted from its row's score).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from milegpo.credit.base import CreditConfig, common_diagnostics
from milegpo.credit.batch import CreditResult, StepBatch
from milegpo.credit.graph import build_task_groups
from milegpo.credit.norm import episode_scores
from milegpo.credit.task_graph import TaskGroups


@dataclass(frozen=True)
class RLOOConfig(CreditConfig):
    """RLOO has no hyperparameter of its own; ``norm`` is fixed to ``"mean_norm"``."""

    norm: str = "mean_norm"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.norm != "mean_norm":
            raise ValueError("RLOO subtracts the leave-one-out mean only: norm must be 'mean_norm' "
                             "(use method 'grpo' for a std-normalised outcome advantage)")


def rloo(batch: StepBatch, config: RLOOConfig | None = None, graph: TaskGroups | None = None) -> CreditResult:
    """RLOO credit: the leave-one-out outcome advantage of each step's trajectory."""
    config = config or RLOOConfig()
    graph = graph or build_task_groups(batch)  # tasks and trajectories only: no state graph
    centred = episode_scores(batch, graph, "mean_norm", config.epsilon, config.upstream_exact)
    if config.upstream_exact:  # statistics over the task's rows
        n = np.bincount(graph.row_task, minlength=graph.num_tasks)[graph.row_task]
    else:
        n = graph.task_n_traj[graph.row_task]
    advantages = centred * n / np.maximum(n - 1, 1)
    diagnostics = {"method": "rloo", **common_diagnostics(graph, advantages, advantages)}
    return CreditResult(advantages=advantages, diagnostics=diagnostics, components={"episode": advantages})
