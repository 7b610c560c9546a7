"""Credit diagnostics shared by the graph methods (the paper's Figures 4 and 9).

* **tie share** - among the pairs of same-source, distinct-action transitions of a
  task with a success, the share whose GraphGPO step returns are equal (the paper:
  54.4% on ALFWorld, 72.7% on WebShop);
* **ties broken** - the share of those tied pairs whose MileGPO step returns differ
  (the paper: 26.5% with RCS, 17.0% with uniform milestone detection);
* **shared-state share** - transitions leaving a state that two or more trajectories
  of the group visit (the paper: about 74%).
* the per-method sign-flip share and the advantage statistics live in
  :mod:`milegpo.credit.base`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from milegpo.credit.arrays import sorted_unique
from milegpo.credit.batch import StepBatch
from milegpo.credit.graph import index_strings_by_task
from milegpo.credit.task_graph import TaskGraph

STATE_CHARS = 200
"""State keys are cut to this many characters in diagnostics."""

RELATIVE_TOLERANCE = 1e-9
"""Two MileGPO step returns closer than this times their scale (at least 1) are equal."""


def describe_state(key: object) -> str:
    text = str(key)
    return text if len(text) <= STATE_CHARS else text[: STATE_CHARS - 3] + "..."


def distinct_action_rows(batch: StepBatch, graph: TaskGraph, rows: np.ndarray | None = None) -> np.ndarray:
    """One row per distinct (source state, action) of the tasks with a success (its first
    occurrence), sorted by source state (then by the action's id: :func:`~milegpo.credit.graph.index_strings_by_task`).

    Tasks without a success are left out: without a goal every method gives their transitions
    the same step return, so they would count as ties of no interest. ``rows`` (default all)
    restricts the search to some states' rows (every row of each of those states)."""
    rows = np.arange(batch.num_steps) if rows is None else rows
    action = index_strings_by_task(batch.actions[rows], graph.row_task[rows])
    n_actions = int(action.max(initial=0)) + 1
    first = rows[first_rows(graph.row_src[rows] * n_actions + action)]
    first = first[graph.task_n_succ[graph.row_task[first]] > 0]
    return first[np.argsort(graph.row_src[first], kind="stable")]


def first_rows(codes: np.ndarray) -> np.ndarray:
    """The first index of each distinct value of ``codes``, in increasing order of the value
    (``numpy.unique(codes, return_index=True)[1]``, by numpy's default sort and a minimum per run
    instead of a stable sort)."""
    if len(codes) == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(codes)
    ordered = codes[order]
    return np.minimum.reduceat(order, np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]))


def same_source_pairs(batch: StepBatch, graph: TaskGraph) -> tuple[np.ndarray, np.ndarray]:
    """Row pairs ``(i, j)`` with the same source state and distinct actions, in tasks with a success
    (rows of :func:`distinct_action_rows`). Their number grows with the square of the distinct
    actions per state: :func:`tie_statistics` counts them without listing them."""
    first = distinct_action_rows(batch, graph)
    src = graph.row_src[first]
    starts = np.flatnonzero(np.r_[True, src[1:] != src[:-1]])
    sizes = np.diff(np.r_[starts, len(src)])
    left, right = [], []
    for start, size in zip(starts[sizes > 1], sizes[sizes > 1]):
        i, j = np.triu_indices(size, k=1)
        left.append(first[start + i])
        right.append(first[start + j])
    if not left:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(left), np.concatenate(right)


def shared_state_share(batch: StepBatch, graph: TaskGraph) -> float:
    """Share of transitions (in tasks with a success) that leave a state two or more trajectories visit."""
    rows = graph.task_n_succ[graph.row_task] > 0
    return float(np.mean(graph.node_n_traj[graph.row_src[rows]] >= 2)) if rows.any() else 0.0


def tied_pairs(batch: StepBatch, graph: TaskGraph, r_m: np.ndarray) -> tuple[np.ndarray, ...]:
    """The :func:`same_source_pairs` ``(i, j)``, which of them GraphGPO ties, and which ``r_m`` separates.

    GraphGPO's step return ``c * gamma_G ** d(s_{t+1})`` is a function of the next
    state's graph distance only, so a pair is tied exactly when both distances are
    equal (compared as integers: the returns themselves underflow towards 0 for far
    states). ``r_m`` separates a tied pair when its two values differ by more than
    :data:`RELATIVE_TOLERANCE` of their scale.
    """
    i, j = same_source_pairs(batch, graph)
    d_next = graph.dist_to_goal[graph.row_dst]
    tied = d_next[i] == d_next[j]
    return i, j, tied, tied & _separated(r_m[i], r_m[j])


def tie_statistics(batch: StepBatch, graph: TaskGraph, r_m: np.ndarray) -> dict[str, Any]:
    """Same-source, distinct-action pairs GraphGPO ties and the share of them ``r_m`` separates.

    The counts of :func:`tied_pairs`, in O(steps log steps) whatever the number of distinct actions
    per state: pairs are counted per source state (``k (k - 1) / 2``), tied pairs per (source, next
    distance) group, and the tied pairs ``r_m`` leaves together (:func:`_unseparated_pairs`) are
    subtracted from the tied ones."""
    # a state left once has one distinct action and no pair: its actions need not be interned
    shared = np.bincount(graph.row_src, minlength=graph.num_nodes)[graph.row_src] > 1
    first = distinct_action_rows(batch, graph, np.flatnonzero(shared))
    per_state = np.bincount(graph.row_src[first], minlength=graph.num_nodes)
    n_pairs = int((per_state * (per_state - 1) // 2).sum())
    first = first[per_state[graph.row_src[first]] > 1]  # a state with one distinct action has no pair
    src = graph.row_src[first]
    d_next = graph.dist_to_goal[graph.row_dst[first]]
    order = np.lexsort((d_next, src))
    tie_group = _run_ids(src[order], d_next[order])
    n_tied = _pair_count(tie_group)
    n_broken = n_tied - _unseparated_pairs(tie_group, np.asarray(r_m, dtype=np.float64)[first[order]])
    return {"same_source_pairs": n_pairs, "tie_pairs": n_tied, "tie_share": n_tied / n_pairs if n_pairs else 0.0,
            "ties_broken_pairs": n_broken, "ties_broken": n_broken / n_tied if n_tied else 0.0,
            "shared_state_share": shared_state_share(batch, graph)}


def _run_ids(*sorted_columns: np.ndarray) -> np.ndarray:
    """Id ``0, 1, ...`` of each run of equal rows over ``sorted_columns`` (rows sorted by them)."""
    n = len(sorted_columns[0])
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    change = np.zeros(n, dtype=bool)
    for column in sorted_columns:
        change[1:] |= column[1:] != column[:-1]
    return np.cumsum(change)


def _pair_count(labels: np.ndarray) -> int:
    """Unordered pairs of entries with equal labels (non-negative ints)."""
    counts = np.bincount(labels).astype(np.int64) if len(labels) else np.zeros(0, dtype=np.int64)
    return int((counts * (counts - 1) // 2).sum())


def _separated(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Whether the step returns ``a`` and ``b`` differ by more than :data:`RELATIVE_TOLERANCE` of their scale."""
    scale = np.maximum(np.maximum(np.abs(a), np.abs(b)), 1.0)
    return np.abs(a - b) > RELATIVE_TOLERANCE * scale


def _unseparated_pairs(group: np.ndarray, values: np.ndarray) -> int:
    """Pairs of entries of one group (``group`` sorted) whose ``values`` are not :func:`_separated`.

    Equal values are counted by multiplicity; distinct values are compared only with the values
    above them closer than ``4 x`` the tolerance (a superset of the unseparated ones: a value more
    than twice as large in magnitude is always separated), so the work stays linear unless many
    values differ only by rounding."""
    if len(values) == 0:
        return 0
    order = np.lexsort((values, group))
    group, values = group[order], values[order]
    run = _run_ids(group, values)
    starts = np.flatnonzero(np.r_[True, run[1:] != run[:-1]])
    counts = np.diff(np.r_[starts, len(run)]).astype(np.int64)
    u_group, u_value = group[starts], values[starts]
    equal = int((counts * (counts - 1) // 2).sum())
    levels = sorted_unique(u_value)
    rank = np.searchsorted(levels, u_value)
    bound = u_value + 4.0 * RELATIVE_TOLERANCE * np.maximum(np.abs(u_value), 1.0)
    key = u_group * len(levels) + rank
    last = np.searchsorted(key, u_group * len(levels) + np.searchsorted(levels, bound, side="right") - 1,
                           side="right")
    n_close = last - np.arange(len(key)) - 1
    if not n_close.any():
        return equal
    lower = np.repeat(np.arange(len(key)), n_close)
    upper = lower + 1 + (np.arange(len(lower)) - np.repeat(np.cumsum(n_close) - n_close, n_close))
    together = ~_separated(u_value[lower], u_value[upper])
    return equal + int((counts[lower] * counts[upper])[together].sum())
