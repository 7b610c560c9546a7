"""MileGPO on a hand-built task whose milestone / trap scores are worked out on paper.

Task (K = 4, p_q^+ = 0.5), defaults (ALFWorld preset, omega = 0.2, c*lambda = 2.5):
    S1 success  s0 -> h -> m -> (g)        S2 success  s0 -> a -> m -> (g)
    F1 failure  s0 -> b -> b -> b          F2 failure  s0 -> h -> b -> c
Distances to g: m 1, h 2, a 2, s0 3; b, c cannot reach g -> 3 + 1 = 4.

Milestone candidates (visited by a success, not g, not the start): h, m, a.
    lift  l+ = max(p+(v) - 0.5, 0):  h 0,   m 0.5, a 0.5
    coverage m(v) = |T+(v)| / 2:      h 0.5, m 1,   a 0.5
    degree (distinct edges, no self-loops): h 3 (s0->h, h->m, h->b), m 3 (h->m, a->m, m->g), a 2
    centrality C = deg / 3:           h 1,   m 1,   a 2/3
    S0+ = l+ + m + 0.25 C:            h 0.75, m 1.75, a 1.166667   -> S0bar: m 1, a 0.666667, h 0.428571
Trap candidates (failures only, recurring): b (F1 thrice, F2 once: 2 failed trajectories, 2 revisits);
    c is visited once by one failure -> no trap.
    S-(b) = 1 * max(1 - 0.5, 0) + 0.25 * f-(=2/2) * L(=2/2) = 0.75 -> Sbar- = 1.
BCC (kappa_bc = 0): p+(e): s0->h 0.5, s0->a 1, s0->b 0, h->m 1, h->b 0, a->m 1 (lone), m->g 1 (lone),
    b->b 0, b->c 0.  c~ = p+(e) - mean p+ of siblings (lone edge: - p_q^+):
    s0->h 0.5 - 0.5 = 0, s0->a 1 - 0.25 = 0.75, s0->b -0.75, h->m 1, h->b -1, a->m 0.5, m->g 0.5, b->* 0.
    max |c~| = 1.   b(v) = max positive over incoming: h 0, a 0.75, m max(1, 0.5) = 1.
Local progress of incoming success edges, psi = dd + (p+(v) - 0.5) - l-(e) (all l-(e) = 0 here):
    s0->h 1 + 0 = 1,  s0->a 1 + 0.5 = 1.5,  h->m 1.5,  a->m 1.5
    psi~: h 1, a 1.5, m 1.5 -> psibar: h 2/3, a 1, m 1.  All kept (psi~ > 0).
E = b + psibar: h 0.666667, a 1.75, m 2.
S_pcc = S0 (1 + E): h 1.25, a 3.208333, m 5.25 -> Sbar_pcc: m 1, a 0.611111, h 0.238095.
Potentials: Phi+(m) 1, Phi+(a) 0.611111, Phi+(h) 0.238095, Phi+(s0) = max(0.2 * 0.611111, ...) = 0.122222,
    Phi+(b) = Phi+(c) = Phi+(g) = 0.   Phi-(b) 1, Phi-(s0) = Phi-(h) = 0.2, others 0.
Increments and shaping 2.5 (delta+ - delta-):
    s0->h: delta+ = 0.238095 - 0.122222 = 0.115873 -> 0.289683     h->m: 1 - 0.238095 -> 1.904762
    s0->a: 0.611111 - 0.122222 = 0.488889 -> 1.222222              a->m: 1 - 0.611111 -> 0.972222
    m->g: 0.   s0->b: delta- = 0.25 * 1 - 0.25 * 0.2 = 0.2 -> -0.5.  h->b: -0.5.  b->b, b->c: 0.
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from milegpo.credit import MileGPOConfig, StepBatch, build_task_graph, compute_credit, milestone_evidence

TRAJ = [["s0", "h", "m", "G1"], ["s0", "a", "m", "G2"], ["s0", "b", "b", "b"], ["s0", "h", "b", "c"]]
SUCCESS = [True, True, False, False]


def approx(values, rel=1e-5, abs=1e-6):
    return pytest.approx(list(values), rel=rel, abs=abs)


def hand_batch() -> StepBatch:
    return StepBatch.from_trajectories(TRAJ, SUCCESS)


def node_values(graph, values) -> dict[str, float]:
    return {k: float(values[i]) for i, k in enumerate(graph.node_key)}


def evidence(config: MileGPOConfig | None = None):
    graph = build_task_graph(hand_batch())
    return graph, milestone_evidence(graph, config or MileGPOConfig())


def test_milestone_and_trap_scores_by_hand():
    graph, ev = evidence()
    assert node_values(graph, ev.milestone) == {"s0": 0, "h": 1, "m": 1, "a": 1, "<goal>": 0, "b": 0, "c": 0}
    assert node_values(graph, ev.trap) == {"s0": 0, "h": 0, "m": 0, "a": 0, "<goal>": 0, "b": 1, "c": 0}
    s0 = node_values(graph, ev.score0)
    assert [s0["h"], s0["m"], s0["a"]] == approx([0.75, 1.75, 1.166667])
    assert node_values(graph, ev.score_trap)["b"] == pytest.approx(0.75)
    b = node_values(graph, ev.bcc)
    assert [b["h"], b["a"], b["m"]] == approx([0, 0.75, 1])
    psi = node_values(graph, ev.psi_tilde)
    assert [psi["h"], psi["a"], psi["m"]] == approx([1, 1.5, 1.5])
    w = node_values(graph, ev.weight_plus)
    assert [w["m"], w["a"], w["h"]] == approx([1, 0.611111, 0.238095])
    phi = node_values(graph, ev.phi_plus)
    assert [phi["m"], phi["a"], phi["h"], phi["s0"], phi["b"], phi["<goal>"]] == approx(
        [1, 0.611111, 0.238095, 0.122222, 0, 0])
    phi_m = node_values(graph, ev.phi_minus)
    assert [phi_m["b"], phi_m["s0"], phi_m["h"], phi_m["m"]] == approx([1, 0.2, 0.2, 0])


def test_shaping_and_step_returns_by_hand():
    res = compute_credit("milegpo", hand_batch())
    assert res.components["shaping"] == approx([0.289683, 1.904762, 0, 1.222222, 0.972222, 0,
                                                -0.5, 0, 0, 0.289683, -0.5, 0])
    # r^G = 10 * 0.2^d(next): h 0.4, m 2, g 10, a 0.4, b / c 0.016.
    r_g = [0.4, 2, 10, 0.4, 2, 10, 0.016, 0.016, 0.016, 0.4, 0.016, 0.016]
    assert res.components["r_G"] == approx(r_g)
    assert res.components["r_M"] == approx(np.add(r_g, res.components["shaping"]))
    # Same-state pairs: at s0 "to h" vs "to a" tie under GraphGPO (0.4 = 0.4), MileGPO separates them
    # (0.69 vs 1.62); at b "b->b" vs "b->c" tie (0.016) under both; at m "to G1" vs "to G2" (both enter g)
    # tie under both. 3 tied pairs, 1 broken.
    d = res.diagnostics
    assert (d["tie_pairs"], d["ties_broken_pairs"]) == (3, 1)
    assert d["ties_broken"] == pytest.approx(1 / 3)
    assert d["milestones"][0]["state"] == "m" and d["milestones"][0]["n_success"] == 2
    assert d["traps"][0]["state"] == "b" and d["traps"][0]["n_revisit"] == 2
    assert (d["num_milestone_candidates"], d["num_milestones_kept"], d["num_trap_candidates"]) == (3, 3, 1)


def test_advantage_is_graph_term_plus_eta_residual():
    # The s0 step group (rows 0, 3, 6, 9) worked with statistics.stdev (unbiased), independently of the code.
    res = compute_credit("milegpo", hand_batch())
    rows = [0, 3, 6, 9]
    r_g = [0.4, 0.4, 0.016, 0.4]
    r_m = [0.4 + 0.289683, 0.4 + 1.222222, 0.016 - 0.5, 0.4 + 0.289683]
    a_g = [(x - statistics.mean(r_g)) / statistics.stdev(r_g) for x in r_g]
    a_mix = [(x - statistics.mean(r_m)) / statistics.stdev(r_m) for x in r_m]
    episode = [1 / math.sqrt(3) * 1.5, 1.5 / math.sqrt(3), -1.5 / math.sqrt(3), -1.5 / math.sqrt(3)]  # +-0.866025
    expected = [g + 0.2 * (m - g) + e for g, m, e in zip(a_g, a_mix, episode)]
    assert res.advantages[rows] == approx(expected, rel=1e-4)


def test_state_on_both_outcomes_is_down_weighted_by_rcs():
    # h lies on one success and one failure (lift 0): RCS weighs it 0.43 of m (before PCC), uniform MD 1.
    graph, rcs = evidence(MileGPOConfig(pcc=False))
    _, uniform = evidence(MileGPOConfig(rcs=False))
    w_rcs, w_uni = node_values(graph, rcs.weight_plus), node_values(graph, uniform.weight_plus)
    assert [w_rcs["m"], w_rcs["a"], w_rcs["h"]] == approx([1, 0.666667, 0.428571])
    assert [w_uni["m"], w_uni["a"], w_uni["h"]] == [1, 1, 1]


def bcc_batch(edge_into_v_better: bool) -> StepBatch:
    """u branches to v (the milestone under test) and w.  Better: u->v p+ = 1, u->w p+ = 0;
    worse: u->v p+ = 0.5 (one success, one failure), u->w p+ = 1 (two successes)."""
    if edge_into_v_better:
        trajs = [["s0", "u", "v", "G"], ["s0", "u", "v", "G"], ["s0", "u", "w", "x"], ["s0", "u", "w", "y"]]
        return StepBatch.from_trajectories(trajs, [True, True, False, False])
    trajs = [["s0", "u", "v", "G"], ["s0", "u", "v", "x"], ["s0", "u", "w", "G"], ["s0", "u", "w", "G"]]
    return StepBatch.from_trajectories(trajs, [True, False, True, True])


@pytest.mark.parametrize("better", [True, False])
def test_bcc_boost_only_for_an_edge_that_beats_its_sibling(better):
    # Better: c~(u->v) = 1 - 0 = 1 = max |c~| -> b(v) = 1.
    # Worse: c~(u->v) = 0.5 - 1 = -0.5 -> b(v) = 0, so v scores as with BCC switched off.
    graph = build_task_graph(bcc_batch(better))
    v = list(graph.node_key).index("v")
    on = milestone_evidence(graph, MileGPOConfig())
    off = milestone_evidence(graph, MileGPOConfig(bcc=False))
    assert on.milestone[v]
    if better:
        assert on.bcc[v] == pytest.approx(1.0)
        assert on.score_pcc[v] > off.score_pcc[v]
    else:
        assert on.bcc[v] == 0.0
        assert on.score_pcc[v] == off.score_pcc[v]


def test_kappa_bc_requires_siblings():
    # kappa_bc = 1 (WebShop): the lone edge a->m no longer counts; m keeps its boost from h->m.
    # a's only incoming edge s0->a has 2 siblings, so b(a) = 0.75 either way.
    graph, ev = evidence(MileGPOConfig.preset("webshop"))
    b = node_values(graph, ev.bcc)
    assert [b["a"], b["m"]] == approx([0.75, 1.0])
    lone = StepBatch.from_trajectories([["s0", "u", "v", "G"], ["s0", "u", "v", "G"], ["s0", "x", "y", "z"]],
                                       [True, True, False])
    g = build_task_graph(lone)
    v = list(g.node_key).index("v")
    assert milestone_evidence(g, MileGPOConfig(kappa_bc=0)).bcc[v] > 0
    assert milestone_evidence(g, MileGPOConfig(kappa_bc=1)).bcc[v] == 0


def test_step_into_trap_is_punished():
    res = compute_credit("milegpo", hand_batch())
    # Row 6: F1 s0 -> b; row 10: F2 h -> b.
    assert res.components["delta_minus"][[6, 10]] == approx([0.2, 0.2])
    assert np.all(res.components["shaping"][[6, 10]] < 0)


def test_eta_zero_is_graphgpo_exactly():
    batch = hand_batch()
    mile = compute_credit("milegpo", batch, MileGPOConfig(eta=0.0))
    graph = compute_credit("graphgpo", batch)
    np.testing.assert_array_equal(mile.advantages, graph.advantages)


def test_each_ablation_switches_only_its_part():
    graph, full = evidence()
    # traps=False: no trap potential, milestone side untouched.
    _, no_traps = evidence(MileGPOConfig(traps=False))
    assert np.all(no_traps.phi_minus == 0) and np.array_equal(no_traps.phi_plus, full.phi_plus)
    # pcc=False: Phi+ built from S0bar; traps untouched.
    _, no_pcc = evidence(MileGPOConfig(pcc=False))
    w = node_values(graph, no_pcc.weight_plus)
    assert [w["m"], w["a"], w["h"]] == approx([1, 0.666667, 0.428571])
    assert np.array_equal(no_pcc.phi_minus, full.phi_minus)
    # bcc=False: E = psibar -> S_pcc h 1.25, a 2.333333, m 3.5 -> weights h 0.357143, a 0.666667, m 1.
    _, no_bcc = evidence(MileGPOConfig(bcc=False))
    w = node_values(graph, no_bcc.weight_plus)
    assert [w["m"], w["a"], w["h"]] == approx([1, 0.666667, 0.357143])
    assert np.all(no_bcc.bcc == 0) and np.array_equal(no_bcc.psi_bar, full.psi_bar)
    # local_progress=False: E = b; h has b = 0 and is dropped (rho = 0); a 1.166667 * 1.75, m 1.75 * 2.
    _, no_lp = evidence(MileGPOConfig(local_progress=False))
    w = node_values(graph, no_lp.weight_plus)
    assert [w["m"], w["a"], w["h"]] == approx([1, 0.583333, 0])
    assert np.all(no_lp.psi_bar == 0) and np.array_equal(no_lp.bcc, full.bcc)
    # rcs=False: uniform potentials over both candidate sets.
    _, uniform = evidence(MileGPOConfig(rcs=False))
    assert np.array_equal(uniform.weight_plus, full.milestone.astype(float))
    assert np.array_equal(uniform.weight_minus, full.trap.astype(float))
    # rho > 0 scales the dropped candidate instead of removing it: h 0.5 * 0.75 = 0.375 / 3.5.
    _, rho = evidence(MileGPOConfig(local_progress=False, rho=0.5))
    assert node_values(graph, rho.weight_plus)["h"] == pytest.approx(0.375 / 3.5)


def test_theta_m_keeps_well_covered_candidates():
    # With BCC and local progress off, only coverage can keep a candidate: theta_m = 1.1 keeps none,
    # theta_m = 0.5 keeps all three (coverage 0.5, 1, 0.5).
    graph, none = evidence(MileGPOConfig(bcc=False, local_progress=False))
    _, all_kept = evidence(MileGPOConfig(bcc=False, local_progress=False, theta_m=0.5))
    assert not none.keep.any() and np.all(none.phi_plus == 0)
    assert all_kept.keep.sum() == 3


# ---------------------------------------------------------------- random graphs

@st.composite
def random_batches(draw, max_tasks: int = 3):
    states, success, tasks = [], [], []
    for q in range(draw(st.integers(1, max_tasks))):
        for _ in range(draw(st.integers(1, 5))):
            length = draw(st.integers(1, 7))
            states.append(["start"] + [draw(st.sampled_from("abcdef")) for _ in range(length)])
            success.append(draw(st.booleans()))
            tasks.append(q)
    return StepBatch.from_trajectories(states, success, task_ids=tasks)


CONFIGS = [MileGPOConfig(), MileGPOConfig.preset("webshop"), MileGPOConfig(rcs=False), MileGPOConfig(pcc=False),
           MileGPOConfig(bcc=False, local_progress=False, rho=0.3)]


@settings(max_examples=60, deadline=None)
@given(random_batches(), st.sampled_from(CONFIGS))
def test_raw_correction_within_paper_bound(batch, config):
    res = compute_credit("milegpo", batch, config)
    shaping = res.components["shaping"]
    assert np.all(shaping >= -0.625 - 1e-12) and np.all(shaping <= 2.5 + 1e-12)
    graph = build_task_graph(batch)
    ev = milestone_evidence(graph, config)
    assert np.all((ev.phi_plus >= 0) & (ev.phi_plus <= 1)) and np.all((ev.phi_minus >= 0) & (ev.phi_minus <= 1))


@settings(max_examples=40, deadline=None)
@given(random_batches(), st.sampled_from(CONFIGS))
def test_eta_zero_equals_graphgpo_on_random_graphs(batch, config):
    mile = compute_credit("milegpo", batch, config.with_ablation(eta=0.0))
    np.testing.assert_array_equal(mile.advantages, compute_credit("graphgpo", batch).advantages)


@settings(max_examples=30, deadline=None)
@given(random_batches(max_tasks=1))
def test_potential_matches_bfs_definition(batch):
    # Phi(s) = max_v w(v) * omega^d(s, v), with d from a plain BFS per candidate.
    graph = build_task_graph(batch)
    ev = milestone_evidence(graph, MileGPOConfig())
    succ: dict[int, set[int]] = {}
    for u, v in zip(graph.edge_src, graph.edge_dst):
        succ.setdefault(int(u), set()).add(int(v))
    for s in range(graph.num_nodes):
        dist, frontier, seen = 0, {s}, {s}
        best = 0.0
        while frontier:
            best = max([best] + [ev.weight_plus[v] * 0.2 ** dist for v in frontier])
            frontier = {w for v in frontier for w in succ.get(v, ())} - seen
            seen |= frontier
            dist += 1
        assert ev.phi_plus[s] == pytest.approx(best, rel=1e-12, abs=1e-15)


def test_shape_failed_tasks_off_leaves_only_tasks_without_success_unshaped():
    # The hand task again as a second task in which nobody succeeded: the paper shapes it (b recurs
    # in failures only, so it is a trap: s0 -> b and h -> b get -0.5 as in the first task);
    # shape_failed_tasks=False zeroes that task's shaping and leaves the successful task's alone.
    batch = StepBatch.from_trajectories(TRAJ + TRAJ, SUCCESS + [False] * 4, task_ids=[0] * 4 + [1] * 4)
    paper = compute_credit("milegpo", batch).components["shaping"]
    ours = compute_credit("milegpo", batch, {"shape_failed_tasks": False}).components["shaping"]
    alone = compute_credit("milegpo", hand_batch()).components["shaping"]
    assert paper[12 + 6] == pytest.approx(-0.5) and paper[12 + 10] == pytest.approx(-0.5)
    assert not np.any(ours[12:])
    assert list(ours[:12]) == approx(alone) and list(paper[:12]) == approx(alone)
    # Without shaping and without a success, every step of the failed task gets zero step credit.
    no_shaping = compute_credit("milegpo", batch, {"shape_failed_tasks": False})
    np.testing.assert_allclose(no_shaping.components["A_res"][12:], 0.0)
