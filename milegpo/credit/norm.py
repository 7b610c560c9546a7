r"""Group normalisation shared by every credit function.

For a group :math:`G` (a task's trajectories, or a task's steps taken from one state key):

.. math::
    \text{Norm}_G(x)_j = \frac{x_j - \bar x_G}{\sigma_G + \varepsilon} \quad (\texttt{"mean\_std\_norm"}),
    \qquad \text{Norm}_G(x)_j = x_j - \bar x_G \quad (\texttt{"mean\_norm"}),

with :math:`\sigma_G` the unbiased (``ddof = 1``) standard deviation, as ``torch.std`` in
verl-agent's GRPO / GiGPO. A group of size 1 gets 0. Equal values give exactly 0 (the
mean is taken relative to a value of the group, so no rounding residue is left
to be blown up by :math:`1/\varepsilon`).
"""

from __future__ import annotations

import numpy as np

from milegpo.credit.batch import StepBatch
from milegpo.credit.task_graph import TaskGroups

NORM_MODES = ("mean_std_norm", "mean_norm")


def check_norm(norm: str) -> None:
    if norm not in NORM_MODES:
        raise ValueError(f"norm must be one of {NORM_MODES}, got {norm!r}")


NORMALIZE_CHUNK_ROWS = 1 << 15
""":func:`group_normalize` works on spans of about this many rows where the groups allow it."""


def group_normalize(x: np.ndarray, groups: np.ndarray, num_groups: int, norm: str, epsilon: float,
                    ddof: int = 1) -> np.ndarray:
    """Normalise ``x`` within groups (``groups``: dense ids ``0..num_groups-1``).

    ``ddof``: the std's delta degrees of freedom (1: unbiased, as GRPO / GiGPO; 0: the
    population std, as HGPO).

    Where the rows split into spans no group crosses (state groups of a batch grouped by task, as
    the trainer's are), spans of about :data:`NORMALIZE_CHUNK_ROWS` rows are normalised one at a
    time, so each pass works on arrays that fit the CPU's caches; every group's values are summed
    in the same order either way, so the result is the same to the last bit."""
    x = np.asarray(x, dtype=np.float64)
    cuts = group_spans(groups, NORMALIZE_CHUNK_ROWS)
    if len(cuts) <= 2:
        return _normalize(x, groups, num_groups, norm, epsilon, ddof)
    out = np.empty(len(x))
    for low, high in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
        span = groups[low:high]
        first = int(span.min())
        out[low:high] = _normalize(x[low:high], span - first, int(span.max()) - first + 1, norm, epsilon, ddof)
    return out


def group_spans(groups: np.ndarray, rows: int) -> np.ndarray:
    """Boundaries ``0 = c_0 < c_1 < ... = N`` of spans of about ``rows`` rows such that no group has
    rows in two spans: a cut before row ``i`` only where every id before it is below every id from
    it on (the first such row of each block of ``rows`` rows); ``[0, N]`` when there are at most
    ``2 * rows`` rows. One pass over the rows for each block's minimum and maximum, then a search
    inside each block on its own rows."""
    n = len(groups)
    if n <= 2 * rows:
        return np.array([0, n])
    starts = np.arange(0, n, rows)
    max_through = np.maximum.accumulate(np.maximum.reduceat(groups, starts))  # max of blocks 0..b
    min_from = np.minimum.accumulate(np.minimum.reduceat(groups, starts)[::-1])[::-1]  # min of blocks b..
    cuts = [0]
    for block in range(1, len(starts)):
        block_ids = groups[starts[block]:starts[block] + rows]
        max_before = np.maximum.accumulate(np.r_[max_through[block - 1], block_ids[:-1]])
        min_after = np.minimum.accumulate(block_ids[::-1])[::-1]
        if block + 1 < len(starts):
            min_after = np.minimum(min_after, min_from[block + 1])
        valid = np.flatnonzero(max_before < min_after)
        if len(valid):
            cuts.append(int(starts[block] + valid[0]))
    return np.array([*cuts, n])


def _normalize(x: np.ndarray, groups: np.ndarray, num_groups: int, norm: str, epsilon: float,
               ddof: int) -> np.ndarray:
    """:func:`group_normalize` over all rows at once."""
    counts = np.bincount(groups, minlength=num_groups)
    ref = np.full(num_groups, -np.inf)
    np.maximum.at(ref, groups, x)  # any one value of the group would do
    y = x - ref[groups]
    dev = y - (np.bincount(groups, weights=y, minlength=num_groups) / np.maximum(counts, 1))[groups]
    if norm == "mean_std_norm":
        var = np.bincount(groups, weights=dev * dev, minlength=num_groups) / np.maximum(counts - ddof, 1)
        dev = dev / (np.sqrt(var)[groups] + epsilon)
    dev[counts[groups] < 2] = 0.0
    return dev


def episode_term(graph: TaskGroups, outcomes: np.ndarray, norm: str, epsilon: float) -> np.ndarray:
    r"""(N,) :math:`\text{Norm}_q(Z_i)` of each row's trajectory, normalised once per trajectory.

    GiGPO quirk decided **(ours)**: the episode statistics are taken over the task's
    *trajectories* (each counted once), not over step rows, so long trajectories do
    not weigh more.
    """
    present = graph.traj_task >= 0
    z = np.zeros(len(outcomes))
    z[present] = group_normalize(outcomes[present], graph.traj_task[present], graph.num_tasks, norm, epsilon)
    return z


def invalid_penalties(batch: StepBatch) -> tuple[np.ndarray, np.ndarray]:
    """Split each row's reward into (env reward, invalid-action penalty).

    An invalid action never reaches the engine, so its whole reward is the
    penalty: ``rewards = env_rewards - penalties``.
    """
    penalties = np.where(batch.valid, 0.0, -batch.rewards)
    return batch.rewards + penalties, penalties


def upstream_episode_term(batch: StepBatch, graph: TaskGroups, norm: str, epsilon: float) -> np.ndarray:
    r"""(N,) verl-agent's episode term: :math:`\text{Norm}_q` of each *row's* score, over the task's rows.

    A row's score is its trajectory's env reward sum (penalties left out) minus the
    invalid-action penalty of that row, as verl-agent applies the penalty to the
    row's reward before the episode normalisation (its statistics count every step
    row, so longer trajectories weigh more).
    """
    env_rewards, penalties = invalid_penalties(batch)
    traj_env_return = np.bincount(batch.traj_ids, weights=env_rewards, minlength=batch.num_trajectories)
    scores = traj_env_return[batch.traj_ids] - penalties
    return group_normalize(scores, graph.row_task, graph.num_tasks, norm, epsilon)


def episode_scores(batch: StepBatch, graph: TaskGroups, norm: str, epsilon: float, upstream_exact: bool) -> np.ndarray:
    """(N,) the episode term of every row: ours (:func:`episode_term` of ``batch.outcomes``) or
    verl-agent's (:func:`upstream_episode_term`)."""
    if upstream_exact:
        return upstream_episode_term(batch, graph, norm, epsilon)
    return episode_term(graph, batch.outcomes, norm, epsilon)[batch.traj_ids]
