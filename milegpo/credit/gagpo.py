r"""GAGPO (Zhu et al., arXiv 2605.13217): GAE over a value read off the group's own rollouts.

A reconstruction: the paper's equations were not readable where this module was written. The
stored copies of its full text (the arXiv HTML mirrored by fast.hugflare.com and
bittide.aicompass.dev) are searchable only through their opening (title, abstract); no public
code exists. What is below follows the abstract and two secondary readings of the full text (a
question-by-question paper note and a survey table, both stored in public GitHub repositories),
which between them state every design point listed under "paper points we follow"; the formulas
themselves are ours.

No critic is trained. The value of a state is the mean discounted return of the steps the
group took from it, and the advantage is the generalised advantage estimate (GAE) of the
temporal-difference errors against that value:

.. math::
    R_t = \sum_{k \ge 0} \gamma^k r_{t+k}, \qquad
    \hat V(s) = \frac{1}{|G_q(s)|} \sum_{t' \in G_q(s)} R_{t'}, \qquad
    \delta_t = r_t + \gamma\,\hat V(s_{t+1})\,[\lnot \text{done}_t] - \hat V(s_t),

.. math::
    \hat A^\text{GAE}_t = \sum_{l \ge 0} (\gamma\lambda)^l\, \delta_{t+l}, \qquad
    A_t = \text{Norm}_q(\hat A^\text{GAE}_t) + w_\text{episode}\,\text{Norm}_q(Z_i).

:math:`G_q(s)` is the set of steps of task :math:`q` taken from the state key :math:`s`: the
same step groups as GiGPO's anchor states and GraphGPO's nodes (exact match of the env's
state key within one task, across all of the group's trajectories). The sums over :math:`l`
stop at the end of the trajectory. Its limits follow from the telescoping sum:

* :math:`\lambda = 1`: :math:`\hat A^\text{GAE}_t = R_t - \hat V(s_t)`, the Monte-Carlo
  advantage against the state's group mean (GiGPO's step term before its std division);
* :math:`\lambda = 0`: the one-step TD error :math:`\delta_t`;
* a step whose state and next state are both visited once has
  :math:`\hat V(s_t) = R_t`, :math:`\hat V(s_{t+1}) = R_{t+1}` and so :math:`\delta_t = 0`:
  without shared states only the shared start state carries credit
  (:math:`\hat A_0 = R_0 - \operatorname{mean}_q R_0`), every later step gets 0.

Paper points we follow (as the secondary readings state them): the environment step is the unit
of credit; the value of a state is the mean discounted return of the steps the group's
trajectories took from it (states matched exactly); the TD residual against that value is summed
GAE-style backwards along each trajectory; this step-level temporal advantage is the only signal
(the ablation that adds a broadcast trajectory reward lowers the paper's results; here
``w_episode``); advantages are normalised within the group (ablations: batch-wide and none, here
``norm_scope``; and :math:`\lambda = 0`, no temporal recursion, here ``gae_lambda``).

Choices the available text leaves open, decided **(ours)**:

* :math:`\gamma = \lambda = 0.95` by default (GiGPO's :math:`\gamma`, the usual GAE
  :math:`\lambda`): the paper's values were not in what we could read (a survey reports that
  its appendix pushes "the temporal hyperparameter" to 1 and loses ALFWorld success, so its
  default is below 1).
* Every visit of a state counts in :math:`\hat V` (a state revisited within one trajectory
  adds one return per visit), as GiGPO's step groups count rows.
* The value after the last step of a trajectory is 0, whether it ended by success, failure or
  truncation: :math:`R_t` also stops there, so :math:`\lambda = 1` stays the Monte-Carlo form.
  A non-final step's next state takes the mean return of the steps taken from it (a state
  reached but never acted from has value 0).
* "Group-wise normalisation" is ``Norm_q`` over the task's step rows (each step once), with
  the library's ``mean_std_norm`` (unbiased std + ``epsilon``) by default.
* The invalid-action penalty is one more reward :math:`r_t`. ``upstream_exact=True`` (there is
  no GAGPO upstream code; verl-agent's convention for GiGPO) leaves it out of
  :math:`R`, :math:`\hat V` and :math:`\delta` and subtracts it from its own step's
  :math:`\hat A^\text{GAE}_t` before the normalisation, and takes the episode term over rows.

The paper's action-level importance ratio (one length-normalised ratio per action, shared by
its tokens; its ablation without it loses) belongs to the policy update, not to the credit:
``AlgoConfig.ratio_level="action"`` (:mod:`milegpo.algos.loss`). The trainer's default stays the
per-token ratio for every method, GAGPO included (ours: one default for all methods, so that a
comparison changes the credit alone); set it for the paper's setting.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from milegpo.credit.base import CreditConfig, check_nonnegative, check_unit, common_diagnostics, step_group_diagnostics
from milegpo.credit.batch import CreditResult, StepBatch
from milegpo.credit.gigpo import discounted_returns
from milegpo.credit.graph import build_task_graph
from milegpo.credit.norm import episode_scores, group_normalize, invalid_penalties
from milegpo.credit.task_graph import TaskGraph

NORM_SCOPES = ("task", "batch", "none")
"""Where :func:`gagpo` normalises the GAE advantages: per task (the paper's), over the whole
batch, or not at all (the paper's two ablations)."""


@dataclass(frozen=True)
class GAGPOConfig(CreditConfig):
    """GAGPO hyperparameters.

    :param gamma: discount :math:`\\gamma` of the returns, the TD errors and the GAE sum (0.95, ours).
    :param gae_lambda: :math:`\\lambda` of the GAE sum (0.95, ours); 0 is one-step TD, 1 Monte-Carlo.
    :param norm_scope: ``"task"`` (default): ``norm`` within each task's step rows; ``"batch"``:
        over all rows of the batch; ``"none"``: the raw GAE advantages.
    :param w_episode: weight of a broadcast episode term :math:`\\text{Norm}_q(Z_i)` (0: the
        paper's GAGPO; > 0: its "trajectory reward broadcast" ablation).
    """

    gamma: float = 0.95
    gae_lambda: float = 0.95
    norm_scope: str = "task"
    w_episode: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_unit(self, ("gamma", "gae_lambda"))
        check_nonnegative(self, ("w_episode",))
        if self.norm_scope not in NORM_SCOPES:
            raise ValueError(f"norm_scope must be one of {NORM_SCOPES}, got {self.norm_scope!r}")


def state_values(returns: np.ndarray, graph: TaskGraph) -> np.ndarray:
    """(V,) the value proxy :math:`\\hat V` of every node: the mean return of the rows taken from it
    (0 for a node no row is taken from: a final state, or the goal)."""
    counts = np.bincount(graph.row_src, minlength=graph.num_nodes)
    sums = np.bincount(graph.row_src, weights=returns, minlength=graph.num_nodes)
    return sums / np.maximum(counts, 1)


def td_errors(batch: StepBatch, rewards: np.ndarray, values: np.ndarray, graph: TaskGraph,
              gamma: float) -> np.ndarray:
    """(N,) :math:`\\delta_t = r_t + \\gamma \\hat V(s_{t+1}) - \\hat V(s_t)`, with no bootstrap after
    a trajectory's last step."""
    next_values = np.where(batch.dones, 0.0, values[graph.row_dst])
    return rewards + gamma * next_values - values[graph.row_src]


def gae_advantages(batch: StepBatch, deltas: np.ndarray, gamma: float, gae_lambda: float) -> np.ndarray:
    """(N,) :math:`\\sum_l (\\gamma\\lambda)^l \\delta_{t+l}` within each trajectory: the discounted
    sum of the TD errors, with :math:`\\gamma\\lambda` as the discount."""
    return discounted_returns(dataclasses.replace(batch, rewards=deltas), gamma * gae_lambda)


def normalize_scope(x: np.ndarray, graph: TaskGraph, config: GAGPOConfig) -> np.ndarray:
    """``x`` normalised per task, over the batch, or left as it is (``config.norm_scope``)."""
    if config.norm_scope == "none":
        return x.copy()
    if config.norm_scope == "batch":
        return group_normalize(x, np.zeros(len(x), dtype=np.int64), 1, config.norm, config.epsilon)
    return group_normalize(x, graph.row_task, graph.num_tasks, config.norm, config.epsilon)


def gagpo(batch: StepBatch, config: GAGPOConfig | None = None, graph: TaskGraph | None = None) -> CreditResult:
    """GAGPO credit for every step row of ``batch``."""
    config = config or GAGPOConfig()
    graph = graph or build_task_graph(batch)
    if config.upstream_exact:  # the penalty hits its own step only, outside the discounting
        rewards, penalties = invalid_penalties(batch)
    else:
        rewards, penalties = batch.rewards, np.zeros(batch.num_steps)
    returns = discounted_returns(dataclasses.replace(batch, rewards=rewards), config.gamma)
    values = state_values(returns, graph)
    deltas = td_errors(batch, rewards, values, graph, config.gamma)
    raw = gae_advantages(batch, deltas, config.gamma, config.gae_lambda) - penalties
    step = normalize_scope(raw, graph, config)
    episode = episode_scores(batch, graph, config.norm, config.epsilon, config.upstream_exact)
    adv = step + config.w_episode * episode
    diagnostics = {"method": "gagpo", **common_diagnostics(graph, adv, episode), **step_group_diagnostics(graph),
                   **spread_diagnostics(adv)}
    return CreditResult(advantages=adv, diagnostics=diagnostics,
                        components={"step_return": returns, "value": values[graph.row_src], "td_error": deltas,
                                    "gae": raw, "A_step": step, "episode": episode})


def spread_diagnostics(advantages: np.ndarray) -> dict[str, float]:
    """How concentrated the advantages are (the paper compares methods by these two numbers):
    their interquartile range and the share of steps with :math:`|A_t| > 1`."""
    if len(advantages) == 0:
        return {"adv_iqr": 0.0, "frac_abs_adv_gt1": 0.0}
    q1, q3 = np.percentile(advantages, [25, 75])
    return {"adv_iqr": float(q3 - q1), "frac_abs_adv_gt1": float(np.mean(np.abs(advantages) > 1.0))}
