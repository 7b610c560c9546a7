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

from milegpo.credit.batch import StepBatch
from milegpo.credit.graph import TaskGraph, index_strings

STATE_CHARS = 200
"""State keys are cut to this many characters in diagnostics."""

RELATIVE_TOLERANCE = 1e-9
"""Two MileGPO step returns closer than this times their scale (at least 1) are equal."""


def describe_state(key: object) -> str:
    text = str(key)
    return text if len(text) <= STATE_CHARS else text[: STATE_CHARS - 3] + "..."


def same_source_pairs(batch: StepBatch, graph: TaskGraph) -> tuple[np.ndarray, np.ndarray]:
    """Row pairs ``(i, j)`` with the same source state and distinct actions, in tasks with a success.

    One row stands for each distinct (task, state, action) (its first occurrence);
    tasks without a success are left out: without a goal every method gives their
    transitions the same step return, so they would count as ties of no interest.
    """
    (action,) = index_strings(batch.actions)
    n_actions = int(action.max(initial=0)) + 1
    _, first = np.unique(graph.row_src * n_actions + action, return_index=True)
    first = first[graph.task_n_succ[graph.row_task[first]] > 0]
    first = first[np.argsort(graph.row_src[first], kind="stable")]
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
    scale = np.maximum(np.maximum(np.abs(r_m[i]), np.abs(r_m[j])), 1.0)
    separated = tied & (np.abs(r_m[i] - r_m[j]) > RELATIVE_TOLERANCE * scale)
    return i, j, tied, separated


def tie_statistics(batch: StepBatch, graph: TaskGraph, r_m: np.ndarray) -> dict[str, Any]:
    """Same-source, distinct-action pairs GraphGPO ties and the share of them ``r_m`` separates."""
    i, _, tied, separated = tied_pairs(batch, graph, r_m)
    n_pairs, n_tied, n_broken = len(i), int(tied.sum()), int(separated.sum())
    return {"same_source_pairs": n_pairs, "tie_pairs": n_tied, "tie_share": n_tied / n_pairs if n_pairs else 0.0,
            "ties_broken_pairs": n_broken, "ties_broken": n_broken / n_tied if n_tied else 0.0,
            "shared_state_share": shared_state_share(batch, graph)}
