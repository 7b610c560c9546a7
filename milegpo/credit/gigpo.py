r"""GiGPO (arXiv 2505.10978): episode advantage + anchor-state step advantage.

.. math::
    R_t = \sum_{k \ge 0} \gamma^k r_{t+k}, \qquad
    A_t = w_\text{episode}\,\text{Norm}_q(Z_i) + w_\text{step}\,\text{Norm}_{q, s_t}(R_t)

:math:`\text{Norm}_{q,s_t}` normalises among all steps of task ``q`` taken from the same
state key :math:`s_t` (the "anchor state" step group; a singleton group gets 0).

Upstream quirks, decided **(ours)** (``upstream_exact=True`` restores verl-agent's):

* the episode statistics are computed once per trajectory, not over step rows;
* the invalid-action penalty is part of :math:`r_t` and is discounted into the
  returns of the earlier steps like any reward (upstream subtracts it from that
  step's return only);
* no batch padding by duplicated steps before the advantages (it biases the group
  statistics).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from milegpo.credit.arrays import segment_starts
from milegpo.credit.base import CreditConfig, check_nonnegative, check_unit, common_diagnostics, step_group_diagnostics
from milegpo.credit.batch import CreditResult, StepBatch
from milegpo.credit.graph import build_task_graph, trajectory_order
from milegpo.credit.norm import episode_scores, group_normalize, invalid_penalties
from milegpo.credit.task_graph import TaskGraph


@dataclass(frozen=True)
class GiGPOConfig(CreditConfig):
    """GiGPO hyperparameters.

    :param gamma: discount :math:`\\gamma` of the step return :math:`R_t` (0.95).
    :param w_step: weight of the step-group term (1).
    :param w_episode: weight of the episode term (1).
    """

    gamma: float = 0.95
    w_step: float = 1.0
    w_episode: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_unit(self, ("gamma",))
        check_nonnegative(self, ("w_step", "w_episode"))


def discounted_returns(batch: StepBatch, gamma: float) -> np.ndarray:
    """(N,) :math:`R_t = \\sum_k \\gamma^k r_{t+k}` within each trajectory (rows in batch order)."""
    order = trajectory_order(batch)
    starts = segment_starts(batch.traj_ids[order])
    lengths = np.diff(np.r_[starts, len(order)])
    pos = np.arange(len(order)) - np.repeat(starts, lengths)
    traj = np.repeat(np.arange(len(starts)), lengths)
    # (step, trajectory): each backward step reads and writes contiguous rows, which stays fast when the
    # trajectories no longer fit the CPU's caches (a column of the transposed layout touched one cache line per value)
    padded = np.zeros((int(lengths.max(initial=0)), len(starts)))
    padded[pos, traj] = batch.rewards[order]
    for j in range(padded.shape[0] - 2, -1, -1):
        padded[j] += gamma * padded[j + 1]
    returns = np.empty(len(order))
    returns[order] = padded[pos, traj]
    return returns


def gigpo(batch: StepBatch, config: GiGPOConfig | None = None, graph: TaskGraph | None = None) -> CreditResult:
    """GiGPO credit for every step row of ``batch``."""
    config = config or GiGPOConfig()
    graph = graph or build_task_graph(batch)
    episode = episode_scores(batch, graph, config.norm, config.epsilon, config.upstream_exact)
    if config.upstream_exact:  # verl-agent: penalties are not discounted, each hits its own step
        env_rewards, penalties = invalid_penalties(batch)
        returns = discounted_returns(dataclasses.replace(batch, rewards=env_rewards), config.gamma) - penalties
    else:
        returns = discounted_returns(batch, config.gamma)
    step = group_normalize(returns, graph.row_src, graph.num_nodes, config.norm, config.epsilon)
    adv = config.w_step * step + config.w_episode * episode
    diagnostics = {"method": "gigpo", **common_diagnostics(graph, adv, episode), **step_group_diagnostics(graph)}
    return CreditResult(advantages=adv, diagnostics=diagnostics,
                        components={"step_return": returns, "A_step": step, "episode": episode})
