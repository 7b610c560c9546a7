"""The paper's tie statistics (credit/diagnostics.py) on hand-built groups.

The hand task of test_credit_milegpo (S1 s0->h->m->g, S2 s0->a->m->g, F1 s0->b->b->b,
F2 s0->h->b->c; d: m 1, h 2, a 2, s0 3, b/c 4) has these same-source, distinct-action pairs:
    s0: (h, a) d 2 = 2 tied, (h, b) 2 vs 4, (a, b) 2 vs 4;  h: (m, b) 1 vs 4;
    m: (G1, G2) both enter g, tied;  b: (b, c) 4 = 4 tied          -> 6 pairs, 3 tied.
Of its 12 transitions, 11 leave a state two trajectories visit (all but a -> m).
"""

from __future__ import annotations

import pytest

from milegpo.credit import StepBatch, build_task_graph, compute_credit
from milegpo.credit.diagnostics import same_source_pairs, tie_statistics

TRAJ = [["s0", "h", "m", "G1"], ["s0", "a", "m", "G2"], ["s0", "b", "b", "b"], ["s0", "h", "b", "c"]]
SUCCESS = [True, True, False, False]


def test_hand_task_pairs_ties_and_shared_states():
    d = compute_credit("milegpo", StepBatch.from_trajectories(TRAJ, SUCCESS)).diagnostics
    assert (d["same_source_pairs"], d["tie_pairs"], d["ties_broken_pairs"]) == (6, 3, 1)
    assert d["tie_share"] == pytest.approx(0.5)
    assert d["ties_broken"] == pytest.approx(1 / 3)
    assert d["shared_state_share"] == pytest.approx(11 / 12)


def test_tasks_without_success_are_not_counted():
    # The same task again with no success: every pair there would tie; none may count.
    batch = StepBatch.from_trajectories(TRAJ + TRAJ, SUCCESS + [False] * 4, task_ids=[0] * 4 + [1] * 4)
    d = compute_credit("milegpo", batch).diagnostics
    assert (d["same_source_pairs"], d["tie_pairs"], d["ties_broken_pairs"]) == (6, 3, 1)
    assert d["shared_state_share"] == pytest.approx(11 / 12)


def test_far_distances_are_compared_exactly():
    # From s0 one action leads to x1 (21 steps from the goal), another to x2 (20 steps):
    # c * 0.2**21 and c * 0.2**20 differ by ~1e-13, below any absolute rounding, yet GraphGPO
    # orders them. Not a tie.
    chain = [f"x{k}" for k in range(1, 22)]
    batch = StepBatch.from_trajectories([["s0", *chain, "G"], ["s0", *chain[1:], "G"]], [True, True])
    graph = build_task_graph(batch)
    i, j = same_source_pairs(batch, graph)
    assert len(i) == 1
    stats = tie_statistics(batch, graph, compute_credit("milegpo", batch).components["r_M"])
    assert (stats["same_source_pairs"], stats["tie_pairs"]) == (1, 0)
