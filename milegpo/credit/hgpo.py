r"""HGPO (arXiv 2602.22817): step groups by shared *history*, several history lengths at once.

GiGPO groups the steps of a task taken from the same state. HGPO groups them by the
last :math:`k` states instead (the context a policy with a history window sees), for
every :math:`k = 1 \dots H + 1` (:math:`H` = ``history_length``, the number of past
steps in the prompt):

.. math::
    G_k(t) = \{\, t' \text{ of task } q :\ (s_{t'-k+1}, \dots, s_{t'}) = (s_{t-k+1}, \dots, s_t) \,\},
    \qquad a_k(t) = \text{Norm}_{G_k(t)}(R_t),

with :math:`R_t = \sum_j \gamma^j r_{t+j}` (as GiGPO) and population-std normalisation
(``ddof = 0``). A step at position :math:`t` has levels :math:`k \le t + 1` only; a
level whose group is a single step, or whose :math:`a_k(t)` is exactly 0, is left out.
The advantage is the length-weighted mean over the levels that remain:

.. math::
    A_t = \sum_{k \in \mathcal K_t} w_k\, a_k(t), \qquad
    w_k = \frac{(k+1)^\alpha}{\sum_{k' \in \mathcal K_t} (k'+1)^\alpha + \varepsilon}

(0 when :math:`\mathcal K_t` is empty). Longer shared histories are more alike states,
so they weigh more. There is no separate episode term; ``base_group=True`` adds the
episode advantage :math:`\text{Norm}_q(Z_i)` as one more level with :math:`k = 0`.

Defaults are those of the authors' verl-agent recipe: :math:`H = 2`,
:math:`\alpha = 1`, :math:`\gamma = 0.95`, ``mean_std_norm``, no base group. The
invalid-action penalty follows :mod:`~milegpo.credit.gigpo` (``upstream_exact=True``:
subtracted from its own step's return, and the base group's statistics over rows).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from milegpo.credit import graph as graph_module
from milegpo.credit.arrays import segment_starts
from milegpo.credit.base import CreditConfig, check_nonnegative, check_unit, common_diagnostics
from milegpo.credit.batch import CreditResult, StepBatch
from milegpo.credit.gigpo import discounted_returns
from milegpo.credit.graph import build_task_graph, trajectory_order
from milegpo.credit.norm import episode_scores, group_normalize, invalid_penalties
from milegpo.credit.task_graph import TaskGraph


@dataclass(frozen=True)
class HGPOConfig(CreditConfig):
    """HGPO hyperparameters.

    :param gamma: discount :math:`\\gamma` of the step return :math:`R_t` (0.95).
    :param history_length: :math:`H`, past steps a group's members must share; levels
        :math:`k = 1..H+1` (2: the prompt history of the paper's setting).
    :param length_weight_alpha: :math:`\\alpha` of the level weights :math:`(k+1)^\\alpha`
        (1; 0 weighs every level the same).
    :param base_group: add the episode advantage as a level :math:`k = 0` (False).
    """

    gamma: float = 0.95
    history_length: int = 2
    length_weight_alpha: float = 1.0
    base_group: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_unit(self, ("gamma",))
        check_nonnegative(self, ("length_weight_alpha",))
        if int(self.history_length) != self.history_length or self.history_length < 0:
            raise ValueError(f"history_length must be an integer >= 0, got {self.history_length}")


def history_groups(batch: StepBatch, graph: TaskGraph, k: int) -> np.ndarray:
    """(N,) dense id of each row's level-``k`` group: same task and same last ``k`` state keys
    :math:`s_{t-k+1..t}`; -1 for a row with fewer than ``k`` states so far (:math:`t + 1 < k`)."""
    return history_groups_by_level(batch, graph, [k])[0]


def history_groups_by_level(batch: StepBatch, graph: TaskGraph, levels: list[int]) -> list[np.ndarray]:
    """:func:`history_groups` of every level in ``levels``; the rows are put in trajectory order once.

    Groups never join across tasks: the levels are numbered run by run (:func:`_run_starts`), every
    level of a run before the next run, so each run's arrays stay in the CPU's caches; a level's ids
    continue from the previous run's."""
    order = trajectory_order(batch)
    n = len(order)
    nodes = graph.row_src[order]  # the node of s_t: its task and state key in one id
    starts = segment_starts(batch.traj_ids[order])
    pos = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))
    run_starts = _run_starts(graph.row_task[order]).tolist()
    top = max(levels, default=0)
    in_order = [np.empty(n, dtype=np.int64) for _ in range(top)]  # level k - 1, rows in trajectory order
    offsets = [0] * top
    for low, high in zip(run_starts[:-1], run_starts[1:]):
        run_nodes, run_pos = nodes[low:high], pos[low:high]
        groups = np.full(high - low, -1, dtype=np.int64)
        for k in range(1, top + 1):
            # the level-k suffix ending at j is the level-(k-1) suffix ending at j-1, plus s_j
            rows = np.flatnonzero(run_pos + 1 >= k)
            codes = run_nodes[rows] if k == 1 else groups[rows - 1] * graph.num_nodes + run_nodes[rows]
            ids = _first_seen_ids(codes)
            groups = np.full(high - low, -1, dtype=np.int64)
            groups[rows] = ids
            in_order[k - 1][low:high] = np.where(groups >= 0, groups + offsets[k - 1], -1)
            offsets[k - 1] += int(ids.max(initial=-1)) + 1
    result = []
    for k in levels:
        out = np.empty(n, dtype=np.int64)
        out[order] = in_order[k - 1]
        result.append(out)
    return result


def _run_starts(row_task: np.ndarray) -> np.ndarray:
    """The first row of each run of whole tasks (rows in trajectory order), and the number of rows: runs
    of about :data:`~milegpo.credit.graph.INTERN_CHUNK_ENTRIES` rows when the rows are grouped by task,
    else one run of all rows. Groups never join across tasks, so each run is numbered on its own: sorts
    of a few thousand codes stay in the CPU cache, where one sort of a million did not."""
    if len(row_task) <= graph_module.INTERN_CHUNK_ENTRIES or np.any(row_task[1:] < row_task[:-1]):
        return np.array([0, len(row_task)])
    return np.r_[graph_module.task_runs(row_task), len(row_task)]


def _first_seen_ids(codes: np.ndarray) -> np.ndarray:
    """Dense ids of ``codes``, numbered in order of first appearance.

    Codes within a span of a few times their number (level 1: node ids) find their first row in a
    table of the span, with no sort; wider ones (pairs of a group and a node) are sorted once with
    numpy's default sort (vectorised where the CPU has it: on 1M int64 codes the numbering takes about
    half the time of a stable ``unique`` with first indices)."""
    n = len(codes)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if int(codes.max()) - int(codes.min()) < 4 * n + 1024:
        offset = codes - codes.min()
        first = np.full(int(offset.max()) + 1, n, dtype=np.int64)
        np.minimum.at(first, offset, np.arange(n))
        first_row = first[offset]
        id_at_row = np.cumsum(first_row == np.arange(n)) - 1
        return id_at_row[first_row]
    order = np.argsort(codes)  # numpy's default sort; a group's first row is its smallest index
    ordered = codes[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    first = np.minimum.reduceat(order, starts)
    rank = np.empty(len(starts), dtype=np.int64)
    rank[np.argsort(first)] = np.arange(len(starts))
    group = np.empty(n, dtype=np.int64)
    group[order] = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, n]))
    return rank[group]


def hgpo(batch: StepBatch, config: HGPOConfig | None = None, graph: TaskGraph | None = None) -> CreditResult:
    """HGPO credit for every step row of ``batch``."""
    config = config or HGPOConfig()
    graph = graph or build_task_graph(batch)
    if config.upstream_exact:  # verl-agent: penalties are not discounted, each hits its own step
        env_rewards, penalties = invalid_penalties(batch)
        returns = discounted_returns(dataclasses.replace(batch, rewards=env_rewards), config.gamma) - penalties
    else:
        returns = discounted_returns(batch, config.gamma)
    n = batch.num_steps
    levels = list(range(1, int(config.history_length) + 2))
    # The advantage is the weighted mean of the levels' normalised returns, level k (and the base
    # group, k = 0) weighing (k + 1) ** alpha where its group is shared and its value non-zero;
    # summed level by level, so no (levels x steps) array is built.
    weighted_sum, weight_sum, levels_used = np.zeros(n), np.zeros(n), np.zeros(n, dtype=np.int64)

    def add_level(k: int, value: np.ndarray, present: np.ndarray) -> None:
        used = present & (value != 0.0)
        weight = (k + 1.0) ** config.length_weight_alpha
        weighted_sum[:] += np.where(used, weight * value, 0.0)
        weight_sum[:] += np.where(used, weight, 0.0)
        levels_used[:] += used

    if config.base_group:
        add_level(0, episode_scores(batch, graph, config.norm, config.epsilon, config.upstream_exact),
                  np.ones(n, dtype=bool))
    shared = {}
    components = {"step_return": returns}
    for k, groups in zip(levels, history_groups_by_level(batch, graph, levels)):
        has = groups >= 0
        num = int(groups.max(initial=-1)) + 1
        value, present = np.zeros(n), np.zeros(n, dtype=bool)
        value[has] = group_normalize(returns[has], groups[has], num, config.norm, config.epsilon, ddof=0)
        sizes = np.bincount(groups[has], minlength=num)
        present[has] = sizes[groups[has]] > 1
        shared[f"frac_steps_in_shared_groups_k{k}"] = float(present.mean()) if n else 0.0
        add_level(k, value, present)
        components[f"A_k{k}"] = value
    adv = weighted_sum / (weight_sum + config.epsilon)
    episode = episode_scores(batch, graph, config.norm, config.epsilon, config.upstream_exact)
    diagnostics = {"method": "hgpo", **common_diagnostics(graph, adv, episode), **shared,
                   "mean_levels_used": float(levels_used.mean()) if n else 0.0}
    return CreditResult(advantages=adv, diagnostics=diagnostics, components=components)
