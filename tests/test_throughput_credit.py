"""Credit rewrites for speed give exactly what the previous implementations gave.

The previous implementations are kept here as references: the two-column dict interning of
``build_task_graph``, the pair-listing tie statistics of MileGPO's diagnostics, and GRPO / RLOO
on the full task graph. Random batches cover shuffled rows, next states that do not follow
(env errors, truncation), repeated and free-text actions, tasks without a success.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from milegpo.credit import StepBatch, build_task_graph, compute_credit
from milegpo.credit.diagnostics import RELATIVE_TOLERANCE, shared_state_share, tie_statistics
from milegpo.credit.graph import TaskGraph, index_strings, sorted_unique, state_key_ids, trajectory_order
from milegpo.credit.grpo import GRPOConfig, grpo
from milegpo.credit.rloo import RLOOConfig, rloo


def previous_index_strings(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """The dict interning ``build_task_graph`` used before (ids in order of first appearance)."""
    ids: dict[object, int] = {}
    return tuple(np.fromiter((ids.setdefault(k, len(ids)) for k in a), dtype=np.int64, count=len(a))
                 for a in arrays)


def previous_tie_statistics(batch: StepBatch, graph: TaskGraph, r_m: np.ndarray) -> dict[str, Any]:
    """The tie statistics before: every same-source, distinct-action pair listed."""
    (action,) = previous_index_strings(batch.actions)
    n_actions = int(action.max(initial=0)) + 1
    _, first = np.unique(graph.row_src * n_actions + action, return_index=True)
    first = first[graph.task_n_succ[graph.row_task[first]] > 0]
    first = first[np.argsort(graph.row_src[first], kind="stable")]
    src = graph.row_src[first]
    starts = np.flatnonzero(np.r_[True, src[1:] != src[:-1]])
    sizes = np.diff(np.r_[starts, len(src)])
    left, right = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)]
    for start, size in zip(starts[sizes > 1], sizes[sizes > 1]):
        i, j = np.triu_indices(size, k=1)
        left.append(first[start + i])
        right.append(first[start + j])
    i, j = np.concatenate(left), np.concatenate(right)
    d_next = graph.dist_to_goal[graph.row_dst]
    tied = d_next[i] == d_next[j]
    scale = np.maximum(np.maximum(np.abs(r_m[i]), np.abs(r_m[j])), 1.0)
    separated = tied & (np.abs(r_m[i] - r_m[j]) > RELATIVE_TOLERANCE * scale)
    n_pairs, n_tied, n_broken = len(i), int(tied.sum()), int(separated.sum())
    return {"same_source_pairs": n_pairs, "tie_pairs": n_tied, "tie_share": n_tied / n_pairs if n_pairs else 0.0,
            "ties_broken_pairs": n_broken, "ties_broken": n_broken / n_tied if n_tied else 0.0,
            "shared_state_share": shared_state_share(batch, graph)}


def random_batch(rng: np.random.Generator, tasks: int, group: int, horizon: int, n_states: int, n_actions: int,
                 broken: float = 0.1) -> StepBatch:
    """Random walks over ``n_states`` states per task, rows shuffled; a share ``broken`` of next states
    is not the next step's state (as after an env error or a truncation)."""
    rows: dict[str, list[Any]] = {k: [] for k in ("task", "traj", "step", "src", "dst", "action", "reward")}
    success = []
    for q in range(tasks):
        for k in range(group):
            length = int(rng.integers(1, horizon + 1))
            states = [f"task {q} room {s}" for s in rng.integers(0, n_states, length + 1)]
            for t in range(length):
                nxt = f"elsewhere {rng.integers(3)}" if rng.random() < broken else states[t + 1]
                for name, value in (("task", q), ("traj", q * group + k), ("step", t), ("src", states[t]),
                                    ("dst", nxt), ("action", f"do {rng.integers(n_actions)}"),
                                    ("reward", float(rng.choice([0.0, -0.1, 1.0])))):
                    rows[name].append(value)
            success.append(bool(rng.random() < 0.5))
    perm = rng.permutation(len(rows["task"]))
    col = {name: np.asarray(values, dtype=object if name in ("src", "dst", "action") else None)[perm]
           for name, values in rows.items()}
    outcomes = np.bincount(col["traj"].astype(np.int64), weights=col["reward"].astype(float),
                           minlength=tasks * group)
    return StepBatch(task_ids=col["task"], traj_ids=col["traj"], step_idx=col["step"], state_keys=col["src"],
                     next_state_keys=col["dst"], actions=col["action"], rewards=col["reward"],
                     valid=np.ones(len(perm), bool), dones=np.zeros(len(perm), bool), outcomes=outcomes,
                     success=np.asarray(success))


@pytest.mark.parametrize("seed", range(12))
def test_state_interning_equals_the_dict_interning(seed):
    rng = np.random.default_rng(seed)
    batch = random_batch(rng, tasks=int(rng.integers(1, 5)), group=int(rng.integers(1, 6)), horizon=12,
                         n_states=int(rng.integers(1, 9)), n_actions=3, broken=float(rng.choice([0.0, 0.2, 1.0])))
    expected = previous_index_strings(batch.state_keys, batch.next_state_keys)
    row_task = build_task_graph(batch).row_task
    for got, want in zip(state_key_ids(batch, trajectory_order(batch), row_task), expected):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(index_strings(batch.actions, batch.state_keys), previous_index_strings(batch.actions,
                                                                                                batch.state_keys)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("upstream_exact", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_outcome_methods_without_the_graph_equal_them_on_it(seed, upstream_exact):
    batch = random_batch(np.random.default_rng(seed), tasks=3, group=4, horizon=8, n_states=5, n_actions=3)
    graph = build_task_graph(batch)
    grpo_config, rloo_config = GRPOConfig(upstream_exact=upstream_exact), RLOOConfig(upstream_exact=upstream_exact)
    pairs = [(grpo(batch, grpo_config), grpo(batch, grpo_config, graph)),
             (rloo(batch, rloo_config), rloo(batch, rloo_config, graph))]
    for alone, on_graph in pairs:
        np.testing.assert_array_equal(alone.advantages, on_graph.advantages)
        assert alone.diagnostics == on_graph.diagnostics


@pytest.mark.parametrize("seed", range(16))
def test_tie_statistics_equal_the_pair_listing(seed):
    rng = np.random.default_rng(100 + seed)
    batch = random_batch(rng, tasks=int(rng.integers(1, 4)), group=int(rng.integers(2, 9)), horizon=10,
                         n_states=int(rng.integers(2, 7)), n_actions=int(rng.choice([2, 5, 1000])))
    graph = build_task_graph(batch)
    r_m = compute_credit("milegpo", batch).components["r_M"]
    assert tie_statistics(batch, graph, r_m) == previous_tie_statistics(batch, graph, r_m)
    # returns on a coarse grid, some a rounding apart: equal values, near values and separated ones mixed
    coarse = np.round(rng.integers(-3, 4, len(r_m)) * 0.5 + rng.choice([0.0, 1e-12, 1e-3], len(r_m)), 13)
    assert tie_statistics(batch, graph, coarse) == previous_tie_statistics(batch, graph, coarse)


@pytest.mark.parametrize("seed", range(5))
def test_sorted_unique_is_numpy_unique(seed):
    rng = np.random.default_rng(seed)
    for values in (rng.integers(-5, 5, int(rng.integers(0, 50))), rng.random(30), np.zeros(0, np.int64)):
        got, want = sorted_unique(values), np.unique(values)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def previous_hgpo(batch: StepBatch, config: Any) -> tuple[np.ndarray, float, dict[str, np.ndarray]]:
    """HGPO's advantages, mean levels used and level values as computed before: a (levels x steps)
    array of values, weights where used, and their sums over the levels axis."""
    from milegpo.credit.gigpo import discounted_returns
    from milegpo.credit.hgpo import history_groups_by_level
    from milegpo.credit.norm import episode_scores, group_normalize

    graph = build_task_graph(batch)
    returns = discounted_returns(batch, config.gamma)
    levels = list(range(1, int(config.history_length) + 2))
    values = np.zeros((len(levels) + 1, batch.num_steps))
    present = np.zeros((len(levels) + 1, batch.num_steps), dtype=bool)
    if config.base_group:
        values[0] = episode_scores(batch, graph, config.norm, config.epsilon, False)
        present[0] = True
    for row, groups in enumerate(history_groups_by_level(batch, graph, levels), start=1):
        has = groups >= 0
        num = int(groups.max(initial=-1)) + 1
        values[row, has] = group_normalize(returns[has], groups[has], num, config.norm, config.epsilon, ddof=0)
        present[row, has] = np.bincount(groups[has], minlength=num)[groups[has]] > 1
    used = present & (values != 0.0)
    lengths = np.arange(len(levels) + 1, dtype=np.float64)[:, None] + 1.0
    weights = np.where(used, lengths ** config.length_weight_alpha, 0.0)
    adv = (weights * values).sum(axis=0) / (weights.sum(axis=0) + config.epsilon)
    return adv, float(used.sum(axis=0).mean()), {f"A_k{k}": values[row] for row, k in enumerate(levels, start=1)}


@pytest.mark.parametrize("seed", range(10))
def test_hgpo_summed_level_by_level_equals_the_levels_array(seed):
    from milegpo.credit.hgpo import HGPOConfig, hgpo

    rng = np.random.default_rng(200 + seed)
    batch = random_batch(rng, tasks=int(rng.integers(1, 4)), group=int(rng.integers(2, 7)), horizon=10,
                         n_states=int(rng.integers(2, 7)), n_actions=3)
    config = HGPOConfig(history_length=int(rng.integers(0, 4)), base_group=bool(seed % 2),
                        length_weight_alpha=float(rng.choice([0.0, 1.0, 2.5])))
    got = hgpo(batch, config)
    adv, mean_levels_used, level_values = previous_hgpo(batch, config)
    np.testing.assert_array_equal(got.advantages, adv)
    assert got.diagnostics["mean_levels_used"] == mean_levels_used
    for name, value in level_values.items():
        np.testing.assert_array_equal(got.components[name], value)


def previous_milestone_listing(graph: TaskGraph, ev: Any, top_k: int) -> dict[str, list[dict[str, Any]]]:
    """The per-task milestones and traps of MileGPO's diagnostics, one node and one field at a time."""
    from milegpo.credit.diagnostics import describe_state

    out: dict[str, list[dict[str, Any]]] = {"milestones": [], "traps": []}
    n_fail = graph.node_n_traj - graph.node_n_succ
    for nodes, key, sink, describe in (
        (np.flatnonzero(ev.milestone), ev.weight_plus, out["milestones"], lambda v: {
            "score": float(ev.score0[v]), "score_pcc": float(ev.score_pcc[v]), "weight": float(ev.weight_plus[v]),
            "kept": bool(ev.keep[v]), "lift": float(ev.lift[v]), "coverage": float(ev.coverage[v]),
            "centrality": float(ev.centrality[v]), "bcc": float(ev.bcc[v]),
            "progress": float(ev.psi_tilde[v]) if np.isfinite(ev.psi_tilde[v]) else None,
            "n_success": int(graph.node_n_succ[v]), "n_visits": int(graph.node_n_traj[v]),
            "d_goal": float(graph.dist_to_goal[v])}),
        (np.flatnonzero(ev.trap), ev.score_trap, out["traps"], lambda v: {
            "score": float(ev.score_trap[v]), "weight": float(ev.weight_minus[v]),
            "n_fail": int(n_fail[v]), "n_revisit": int(graph.node_n_revisit[v])}),
    ):
        order = nodes[np.lexsort((-key[nodes], graph.node_task[nodes]))]
        tasks = graph.node_task[order]
        rank = np.arange(len(order)) - np.searchsorted(tasks, tasks)
        for v in order[rank < top_k]:
            sink.append({"task": int(graph.task_values[graph.node_task[v]]),
                         "state": describe_state(graph.node_key[v]), **describe(v)})
    return out


@pytest.mark.parametrize("seed", range(10))
def test_milestone_listing_read_by_column_equals_the_per_node_listing(seed):
    from milegpo.credit.milegpo import MileGPOConfig, milegpo, milestone_evidence

    rng = np.random.default_rng(300 + seed)
    config = MileGPOConfig(diagnostics_top_k=int(rng.integers(1, 5)))
    want: dict[str, list[dict[str, Any]]] = {"milestones": [], "traps": []}
    while not (want["milestones"] and want["traps"]):  # a batch with both to list
        batch = random_batch(rng, tasks=int(rng.integers(1, 5)), group=int(rng.integers(2, 7)), horizon=12,
                             n_states=int(rng.integers(2, 9)), n_actions=3)
        graph = build_task_graph(batch, batch.success_mask(config.success_threshold))
        want = previous_milestone_listing(graph, milestone_evidence(graph, config), config.diagnostics_top_k)
    got = milegpo(batch, config, graph).diagnostics
    for name in ("milestones", "traps"):
        assert got[name] == want[name]
        assert [list(entry) for entry in got[name]] == [list(entry) for entry in want[name]]  # same field order
        assert all(type(a) is type(b) for g, w in zip(got[name], want[name]) for a, b in zip(g.values(), w.values()))
