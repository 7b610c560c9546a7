"""Credit diagnostics shared by the graph methods (the paper's Figures 4 and 9).

* **ties broken** - among the pairs of distinct same-state transitions of a task
  (same :math:`s_t`, different action or next state) whose GraphGPO step returns are
  equal, the share whose MileGPO step returns differ.
* the per-method sign-flip share and the advantage statistics live in
  :mod:`milegpo.algos.credit.base`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from milegpo.algos.credit.batch import StepBatch
from milegpo.algos.credit.graph import TaskGraph, index_strings

STATE_CHARS = 200
"""State keys are cut to this many characters in diagnostics."""

TIE_TOLERANCE = 1e-9
"""Two step returns closer than this are tied."""


def describe_state(key: object) -> str:
    text = str(key)
    return text if len(text) <= STATE_CHARS else text[: STATE_CHARS - 3] + "..."


def _pairs(*columns: np.ndarray) -> int:
    """Number of unordered pairs of rows that agree on all ``columns`` (int arrays)."""
    if len(columns[0]) == 0:
        return 0
    order = np.lexsort(columns[::-1])
    new_run = np.zeros(len(order), dtype=bool)
    new_run[0] = True
    for col in columns:
        c = col[order]
        new_run[1:] |= c[1:] != c[:-1]
    counts = np.diff(np.r_[np.flatnonzero(new_run), len(order)])
    return int((counts * (counts - 1) // 2).sum())


def tie_statistics(batch: StepBatch, graph: TaskGraph, r_g: np.ndarray, r_m: np.ndarray) -> dict[str, Any]:
    """Pairs of same-state transitions tied by ``r_g`` and how many ``r_m`` separates."""
    (action,) = index_strings(batch.actions)
    n_actions, n_nodes = int(action.max(initial=0)) + 1, graph.num_nodes
    units = (graph.row_src * n_actions + action) * n_nodes + graph.row_dst
    _, first = np.unique(units, return_index=True)
    group = graph.row_src[first]
    g_q = np.round(r_g[first] / TIE_TOLERANCE).astype(np.int64)
    m_q = np.round(r_m[first] / TIE_TOLERANCE).astype(np.int64)
    tied = _pairs(group, g_q)
    broken = tied - _pairs(group, g_q, m_q)
    return {"tie_pairs": tied, "ties_broken_pairs": broken, "ties_broken": broken / tied if tied else 0.0}
