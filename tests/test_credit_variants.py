"""MileGPO's opt-in options beyond the paper (ours), on the hand task of test_credit_milegpo.

Rows: S1 0-2 (s0->h, h->m, m->g), S2 3-5 (s0->a, a->m, m->g), F1 6-8 (s0->b, b->b, b->b),
F2 9-11 (s0->h, h->b, b->c). Paper shaping (worked out there):
    [0.289683, 1.904762, 0, 1.222222, 0.972222, 0, -0.5, 0, 0, 0.289683, -0.5, 0]
Phi-: b 1, s0 0.2, h 0.2, others 0; w- = 0.25, c * lambda = 2.5.
"""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from milegpo.algos.credit import StepBatch, compute_credit

TRAJ = [["s0", "h", "m", "G1"], ["s0", "a", "m", "G2"], ["s0", "b", "b", "b"], ["s0", "h", "b", "c"]]
SUCCESS = [True, True, False, False]
PAPER_SHAPING = [0.289683, 1.904762, 0, 1.222222, 0.972222, 0, -0.5, 0, 0, 0.289683, -0.5, 0]


def credit(**options):
    return compute_credit("milegpo", StepBatch.from_trajectories(TRAJ, SUCCESS), options)


def approx(values):
    return pytest.approx(list(values), rel=1e-5, abs=1e-6)


def test_signed_traps_credit_leaving_a_trap():
    # Unclipped delta- = 0.25 Phi-(next) - 0.25 Phi-(here): s0->a and h->m leave Phi- 0.2 (-0.05 -> +0.125),
    # b->c leaves the trap (0 - 0.25 -> +0.625); entering b still costs -0.5.
    expected = np.add(PAPER_SHAPING, [0, 0.125, 0, 0.125, 0, 0, 0, 0, 0, 0, 0, 0.625])
    assert credit(signed_traps=True).components["shaping"] == approx(expected)


def test_dead_end_traps_keep_b_and_failed_task_shaping_goes():
    # b cannot reach the goal: still a trap, shaping unchanged.
    assert credit(traps_need_dead_end=True).components["shaping"] == approx(PAPER_SHAPING)
    # The same trajectories as a second task without any success: the paper shapes it (b is a trap there),
    # shape_failed_tasks=False does not; the successful task keeps its shaping.
    batch = StepBatch.from_trajectories(TRAJ + TRAJ, SUCCESS + [False] * 4, task_ids=[0] * 4 + [1] * 4)
    paper = compute_credit("milegpo", batch).components["shaping"]
    ours = compute_credit("milegpo", batch, {"shape_failed_tasks": False}).components["shaping"]
    assert np.any(paper[12:] != 0) and not np.any(ours[12:])
    assert list(ours[:12]) == approx(PAPER_SHAPING)


def test_relative_residual_by_hand():
    # The s0 group (rows 0, 3, 6, 9), d(s0) = 3: relative returns 10 * 0.2 ** (d(next) - 3) = 50, 50, 2, 50.
    rows = [0, 3, 6, 9]
    rel = [50.0, 50.0, 2.0, 50.0]

    def norm(values):
        mean, std = statistics.mean(values), statistics.stdev(values)
        return [(v - mean) / (std + 1e-6) for v in values]

    mix = norm([r + PAPER_SHAPING[i] for r, i in zip(rel, rows)])
    res = credit(relative_residual=True)
    assert res.components["A_res"][rows] == approx(np.subtract(mix, norm(rel)))
    assert res.advantages[rows] == approx(res.components["A_G"][rows] + 0.2 * res.components["A_res"][rows]
                                          + res.components["episode"][rows])


@pytest.mark.parametrize("option", ["relative_residual", "signed_traps", "traps_need_dead_end", "residual_on_ties_only"])
def test_eta_zero_is_still_graphgpo(option):
    batch = StepBatch.from_trajectories(TRAJ, SUCCESS)
    graph = compute_credit("graphgpo", batch).advantages
    assert compute_credit("milegpo", batch, {option: True, "eta": 0.0}).advantages == approx(graph)


def test_residual_on_ties_only_leaves_contrasted_groups_to_graphgpo():
    # s0's group reaches d 2, 2, 4, 2 (GraphGPO contrasts it): no residual. b's group (b->b twice,
    # b->c: all d 4) and m's group (both enter g) are GraphGPO ties: the residual stays. With signed
    # traps b->c is shaped +0.625 while b->b is not, so b's group has a residual to keep.
    paper, ours = credit(signed_traps=True), credit(signed_traps=True, residual_on_ties_only=True)
    contrasted, tied = [0, 3, 6, 9, 1, 10], [7, 8, 11, 2, 5]
    assert not np.any(ours.components["A_res"][contrasted])
    assert ours.components["A_res"][tied] == approx(paper.components["A_res"][tied])
    assert np.any(paper.components["A_res"][tied] != 0)
