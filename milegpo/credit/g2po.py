r"""G2PO (Group-Graph Policy Optimization, arXiv 2606.22995): steps scored by the group's state graph.

Read from the authors' code (the public repository ``Nala-YN/G2PO``, ``g2po/core_g2po.py``, built on
verl-agent); this module restates its arithmetic in vectorised numpy and shares no code with it.

The steps of task :math:`q` are grouped by the state they were taken from (GiGPO's anchor-state
groups, GraphGPO's nodes). Each group :math:`g` gets the mean discounted outcome of its steps,

.. math::
    S(g) = \frac{1}{|g|} \sum_{t \in g} \gamma^{\,L_{i(t)} - t}\, Z_{i(t)}

(:math:`L_i` the number of steps of trajectory :math:`i`, :math:`t = 0 .. L_i - 1` the step's
position, so the last step is discounted once; :math:`\gamma = 0.95`). Each step points to the
group :math:`n_t` of its trajectory's next step; the last step of a trajectory points to a
terminal sentinel, *success* worth :math:`S(\oplus) = 10` or *failure* worth
:math:`S(\ominus) = 0`. With :math:`g_t` the step's own group,

.. math::
    A_t = w_\text{episode}\,\text{Norm}_q(Z_i)
        + w_\text{step}\Big[\text{Norm}_{q, s_t}\big(S(n_t) - p\,[a_t \text{ invalid}]\big)
        + \text{Norm}^\text{rows}_q\big(S(n_t) - S(g_t)\big)\Big]

The first bracketed term compares the steps taken from one state by where they led (a group of one
gets 0; :math:`p = 0.1` penalises an invalid action); the second, the score gain, compares every
step of the task by how much it raised the score, normalised over the task's step rows. The
authors' default normalisation is ``"mean_norm"`` (their trainer config; their ALFWorld and
WebShop scripts set ``"mean_std_norm"``); one ``norm`` applies to all three terms.

**Grouping is by exact match.** The repository also has an embedding worker
(``verl/workers/embedding/embedding_worker.py``: a sentence-transformers encoder, ``BAAI/bge-m3``,
enabled by ``env.use_embedding``), which its trainer spawns but never calls: nothing reads its
embeddings, and ``core_g2po.py`` groups steps by equality of the anchor observation. So there is
no similarity grouping to reproduce; here, as in every method, a group is one state key.

Where milegpo's step batch differs from verl-agent's, or the reference does something we
deliberately do not, decided **(ours)**; ``upstream_exact=True`` restores the reference's
arithmetic for the first three:

* **outcome**: :math:`Z_i` is ``StepBatch.outcomes``, the sum of the trajectory's rewards with the
  invalid-action penalty in it (milegpo's convention: the penalty is a reward). The reference
  scores groups with the env's episode reward, penalty-free, and subtracts the trainer's penalty
  from each invalid row's episode score only. ``upstream_exact``: the env reward sum (see
  :func:`g2po`'s ``invalid_action_penalty``) for the group scores, and each row's episode score
  minus that row's penalty.
* **success**: the sentinel a trajectory's last step points to follows ``StepBatch.success`` (the
  env's ``won``), or ``Z_i >= success_threshold`` when that is set. The reference tests
  ``episode reward == 10`` exactly: a Sokoban solve, which also pays -0.1 per step and +-1 per
  box, almost never sums to exactly 10 and so points to the failure sentinel, as does a win of
  verl-agent's multi-modal ALFWorld (10 plus the goal-condition success rate on every step).
  ``upstream_exact``: the env reward sum (in float32, as the reference's) equals ``success_reward``.
* **episode term**: statistics once per trajectory (long trajectories do not weigh more, as in
  every milegpo method); the reference takes them over step rows. ``upstream_exact``: over rows.
* **truncation**: a trajectory that ends without success points to the failure sentinel whether
  it terminated or was cut at the step limit, as in the reference: neither batch tells the two
  apart (``StepBatch.dones`` marks both), and the state a truncated trajectory stopped in is not
  scored.
* **next group**: read from the trajectory's next row (the reference's rule), so
  ``next_state_keys`` are not read; an invalid action that left the state unchanged (milegpo's
  envs never apply one) points to its own group and gains 0.
* **invalid actions**: the first term subtracts ``invalid_penalty`` (0.1, the reference's fixed
  value, independent of the trainer's penalty) for every row whose ``valid`` is False, in both
  modes.
* **a task with a single step row** gets 0 from the episode term and from the score gain; the
  reference gives its raw episode reward (its fallback of mean 0, std 1) and, under
  ``mean_std_norm``, a NaN score gain (the std of one value).
* **ties** give exactly 0 (:mod:`milegpo.credit.norm`). The reference sums the score gains and the
  episode scores in float32; equal values whose float32 mean is off by one rounding step then get
  that residue divided by ``std + epsilon`` under ``mean_std_norm``, a value of up to about 1
  that depends on the summation order. Everything here is float64.
* verl-agent's row copies (``adjust_batch``) count once (:mod:`milegpo.integrations.verl.steps`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from milegpo.credit.arrays import segment_starts
from milegpo.credit.base import CreditConfig, check_nonnegative, check_unit, common_diagnostics, step_group_diagnostics
from milegpo.credit.batch import CreditResult, StepBatch
from milegpo.credit.graph import build_task_graph, trajectory_order
from milegpo.credit.norm import episode_scores, group_normalize, invalid_penalties
from milegpo.credit.task_graph import TaskGraph


@dataclass(frozen=True)
class G2POConfig(CreditConfig):
    """G2PO hyperparameters, at the reference code's defaults.

    :param norm: ``"mean_norm"`` (the reference's default) or ``"mean_std_norm"``, for the
        episode term and both step terms.
    :param gamma: discount :math:`\\gamma` of the group scores (0.95).
    :param success_reward: the success sentinel's score :math:`S(\\oplus)` (10); with
        ``upstream_exact``, also the env reward sum that counts as a success.
    :param failure_reward: the failure sentinel's score :math:`S(\\ominus)` (0).
    :param invalid_penalty: :math:`p`, subtracted from an invalid step's next-group score in the
        same-state comparison (0.1).
    :param w_step: weight of the two step terms (the reference's ``step_advantage_w``, 1).
    :param w_episode: weight of the episode term (1).
    :param success_threshold: ``None`` (default): a trajectory succeeded iff ``StepBatch.success``;
        a number: iff its outcome ``Z_i >= success_threshold``. Not read with ``upstream_exact``.
    """

    norm: str = "mean_norm"
    gamma: float = 0.95
    success_reward: float = 10.0
    failure_reward: float = 0.0
    invalid_penalty: float = 0.1
    w_step: float = 1.0
    w_episode: float = 1.0
    success_threshold: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_unit(self, ("gamma",))
        check_nonnegative(self, ("invalid_penalty", "w_step", "w_episode"))
        for name in ("success_reward", "failure_reward"):
            if not np.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be finite, got {getattr(self, name)}")


def g2po(batch: StepBatch, config: G2POConfig | None = None, graph: TaskGraph | None = None, *,
         invalid_action_penalty: float | None = None) -> CreditResult:
    """G2PO credit for every step row of ``batch``.

    :param invalid_action_penalty: read with ``upstream_exact`` only: the trainer's penalty that
        ``batch.rewards`` hold on invalid rows, so that the env's own rewards are
        ``rewards + penalty`` there (the verl-agent adapter knows it: Sokoban pays for invalid
        steps too). None: an invalid row's whole reward is taken to be the penalty (milegpo's envs
        pay nothing for an invalid action).
    """
    config = config or G2POConfig()
    if config.upstream_exact:
        if invalid_action_penalty is None:
            env_rewards, penalties = invalid_penalties(batch)
        else:
            penalties = invalid_action_penalty * ~batch.valid
            env_rewards = batch.rewards + penalties
        outcomes = np.bincount(batch.traj_ids, weights=env_rewards, minlength=batch.num_trajectories)
        success = outcomes.astype(np.float32) == config.success_reward  # the reference's float32 episode reward
    else:
        outcomes = batch.outcomes
        success = batch.success_mask(config.success_threshold)
    graph = graph or build_task_graph(batch, success)

    own_score, next_score = _scores(batch, graph, outcomes, success, config)
    a_next = group_normalize(next_score - config.invalid_penalty * ~batch.valid, graph.row_src, graph.num_nodes,
                             config.norm, config.epsilon)
    a_gain = group_normalize(next_score - own_score, graph.row_task, graph.num_tasks, config.norm, config.epsilon)
    if config.upstream_exact:  # each row's env episode reward minus that row's penalty, over the task's rows
        episode = group_normalize(outcomes[batch.traj_ids] - penalties, graph.row_task, graph.num_tasks,
                                  config.norm, config.epsilon)
    else:
        episode = episode_scores(batch, graph, config.norm, config.epsilon, upstream_exact=False)
    advantages = config.w_episode * episode + config.w_step * (a_next + a_gain)
    diagnostics = {"method": "g2po", **common_diagnostics(graph, advantages, episode),
                   **step_group_diagnostics(graph)}
    return CreditResult(advantages=advantages, diagnostics=diagnostics,
                        components={"group_score": own_score, "next_score": next_score, "A_next": a_next,
                                    "A_gain": a_gain, "episode": episode})


def _scores(batch: StepBatch, graph: TaskGraph, outcomes: np.ndarray, success: np.ndarray,
            config: G2POConfig) -> tuple[np.ndarray, np.ndarray]:
    """Per row the score of its own group :math:`S(g_t)` and of its next one :math:`S(n_t)`."""
    n = batch.num_steps
    order = trajectory_order(batch)
    starts = segment_starts(batch.traj_ids[order])
    lengths = np.diff(np.r_[starts, n])
    to_end = np.empty(n)
    to_end[order] = np.repeat(starts + lengths, lengths) - np.arange(n)  # L_i - t: 1 on the last step
    weights, rewards = config.gamma ** to_end, outcomes[batch.traj_ids]
    if config.upstream_exact:  # the reference multiplies its float32 episode reward: NumPy keeps the product float32
        discounted = weights.astype(np.float32) * rewards.astype(np.float32)
    else:
        discounted = weights * rewards
    members = np.bincount(graph.row_src, minlength=graph.num_nodes)
    group_score = np.bincount(graph.row_src, weights=discounted, minlength=graph.num_nodes) / np.maximum(members, 1)
    # in trajectory order, a row's next group is the following row's; a trajectory's last row points to a sentinel
    last = np.zeros(n, dtype=bool)
    last[np.r_[starts[1:] - 1, n - 1]] = True
    following = np.r_[graph.row_src[order][1:], 0]
    sentinel = np.where(success[batch.traj_ids[order]], config.success_reward, config.failure_reward)
    next_score = np.empty(n)
    next_score[order] = np.where(last, sentinel, group_score[following])
    return group_score[graph.row_src], next_score
