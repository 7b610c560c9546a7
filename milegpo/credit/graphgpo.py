r"""GraphGPO (Cheng et al., 2026): distance-to-goal step returns on the task graph.

.. math::
    r^G_t = c\,\gamma_G^{\,d(s_{t+1}, g)}, \qquad
    A_t = w_\text{step}\,\text{Norm}_{q, s_t}(r^G_t) + w_\text{episode}\,\text{Norm}_q(Z_i)

:math:`d(\cdot, g)` is the BFS distance to the goal node of the task graph
(:mod:`milegpo.credit.graph`; nodes that cannot reach :math:`g` get the task's
max finite distance + 1). The last step of a successful trajectory enters :math:`g`
(:math:`d = 0`, :math:`r^G = c`). Invalid actions are ordinary rows: their
:math:`s_{t+1} = s_t`, so they score like staying put.

``upstream_exact=True`` (verl-agent's conventions, see :class:`~milegpo.credit.base.CreditConfig`)
also subtracts the invalid-action penalty from that step's :math:`r^G_t` and takes the
episode statistics over step rows. The GraphGPO authors' ALFWorld runs use
:math:`\gamma_G = 0.1`; our default is 0.2 (the MileGPO paper's): pass ``gamma_g=0.1``
to reproduce their baseline numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from milegpo.credit.base import CreditConfig, check_nonnegative, check_unit, common_diagnostics, step_group_diagnostics
from milegpo.credit.batch import CreditResult, StepBatch
from milegpo.credit.graph import build_task_graph
from milegpo.credit.norm import episode_scores, group_normalize, invalid_penalties
from milegpo.credit.task_graph import TaskGraph


@dataclass(frozen=True)
class GraphGPOConfig(CreditConfig):
    """GraphGPO hyperparameters.

    :param c: scale :math:`c` of the step return (10).
    :param gamma_g: distance discount :math:`\\gamma_G` (0.20).
    :param w_step: weight of the step-group term (1).
    :param w_episode: weight of the episode term (1).
    :param success_threshold: ``None`` (default): a trajectory succeeded iff
        ``StepBatch.success``; a number: iff its outcome ``Z_i >= success_threshold``
        (continuous scores, e.g. WebShop in [0, 1]). Only successes point to :math:`g`.
    """

    c: float = 10.0
    gamma_g: float = 0.20
    w_step: float = 1.0
    w_episode: float = 1.0
    success_threshold: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_unit(self, ("gamma_g",))
        check_nonnegative(self, ("c", "w_step", "w_episode"))


def graph_step_returns(batch: StepBatch, graph: TaskGraph, config: GraphGPOConfig) -> np.ndarray:
    """(N,) :math:`r^G_t = c\\,\\gamma_G^{d(s_{t+1}, g)}`, minus the invalid-action penalty
    of the step when ``config.upstream_exact``."""
    r_g = config.c * config.gamma_g ** graph.dist_to_goal[graph.row_dst]
    return r_g - invalid_penalties(batch)[1] if config.upstream_exact else r_g


def graphgpo(batch: StepBatch, config: GraphGPOConfig | None = None, graph: TaskGraph | None = None) -> CreditResult:
    """GraphGPO credit for every step row of ``batch``."""
    config = config or GraphGPOConfig()
    graph = graph or build_task_graph(batch, batch.success_mask(config.success_threshold))
    episode = episode_scores(batch, graph, config.norm, config.epsilon, config.upstream_exact)
    r_g = graph_step_returns(batch, graph, config)
    a_g = group_normalize(r_g, graph.row_src, graph.num_nodes, config.norm, config.epsilon)
    adv = config.w_step * a_g + config.w_episode * episode
    diagnostics = {"method": "graphgpo", **common_diagnostics(graph, adv, episode), **step_group_diagnostics(graph),
                   **graph_diagnostics(graph)}
    return CreditResult(advantages=adv, diagnostics=diagnostics,
                        components={"r_G": r_g, "d_next": graph.dist_to_goal[graph.row_dst], "A_G": a_g,
                                    "episode": episode})


def graph_diagnostics(graph: TaskGraph) -> dict[str, float | int]:
    """Size of the task graphs and how much of them reaches the goal."""
    real = ~graph.is_goal
    return {
        "num_nodes": int(real.sum()),
        "num_edges": int(graph.num_edges),
        "tasks_with_goal": int((graph.task_n_succ > 0).sum()),
        "frac_nodes_reaching_goal": float(graph.reaches_goal[real].mean()) if real.any() else 0.0,
    }
