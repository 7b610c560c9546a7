"""The graph searches (distance to goal, MileGPO's potentials) equal the edge-relaxation
implementation they replaced, bit for bit, on random graphs, chains and batches."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from milegpo.credit import StepBatch, build_task_graph
from milegpo.credit.graph import segment_starts
from milegpo.credit.task_graph import _distance_to_goal


def relaxed_distance(edge_src, edge_dst, is_goal, node_task, num_tasks):
    """The previous implementation: min-plus relaxation, one pass over every edge per unit of distance."""
    dist = np.where(is_goal, 0.0, np.inf)
    if len(edge_src) and is_goal.any():
        starts = segment_starts(edge_src)
        srcs = edge_src[starts]
        for _ in range(len(dist)):
            best = np.minimum.reduceat(dist[edge_dst], starts) + 1.0
            improved = best < dist[srcs]
            if not np.any(improved):
                break
            dist[srcs[improved]] = best[improved]
    reaches = np.isfinite(dist)
    task_max = np.zeros(num_tasks)
    np.maximum.at(task_max, node_task[reaches], dist[reaches])
    dist[~reaches] = task_max[node_task[~reaches]] + 1.0
    return dist, reaches


def relaxed_potential(graph, node_values, omega):
    """The previous max_potential: max-product relaxation over every edge until nothing improves."""
    phi = np.asarray(node_values, dtype=np.float64).copy()
    if graph.num_edges == 0 or not np.any(phi > 0) or omega == 0.0:
        return phi
    starts = segment_starts(graph.edge_src)
    srcs = graph.edge_src[starts]
    for _ in range(graph.num_nodes):
        best = omega * np.maximum.reduceat(phi[graph.edge_dst], starts)
        improved = best > phi[srcs]
        if not np.any(improved):
            break
        phi[srcs[improved]] = best[improved]
    return phi


@st.composite
def random_batches(draw):
    """Tasks of up to 6 trajectories over a few states (loops, dead ends, shared prefixes) or all-distinct chains."""
    n_tasks = draw(st.integers(1, 3))
    states, success, task_ids = [], [], []
    for q in range(n_tasks):
        chain = draw(st.booleans())
        for i in range(draw(st.integers(1, 6))):
            n = draw(st.integers(1, 30 if chain else 12))
            if chain:
                keys = ["start"] + [f"t{i} step {t}" for t in range(1, n + 1)]
            else:
                keys = ["start"] + draw(st.lists(st.sampled_from("abcdefgh"), min_size=n, max_size=n))
            states.append(keys)
            success.append(draw(st.booleans()))
            task_ids.append(q)
    return StepBatch.from_trajectories(states, success, task_ids=task_ids)


@settings(max_examples=150, deadline=None)
@given(random_batches(), st.sampled_from([0.0, 0.2, 0.5, 0.9, 1.0]), st.integers(0, 2 ** 31 - 1))
def test_searches_equal_the_relaxation(batch, omega, seed):
    graph = build_task_graph(batch)
    dist, reaches = relaxed_distance(graph.edge_src, graph.edge_dst, graph.is_goal, graph.node_task, graph.num_tasks)
    assert np.array_equal(graph.dist_to_goal, dist) and np.array_equal(graph.reaches_goal, reaches)
    rng = np.random.default_rng(seed)
    values = np.where(rng.random(graph.num_nodes) < 0.3, rng.random(graph.num_nodes), 0.0)
    assert np.array_equal(graph.max_potential(values, omega), relaxed_potential(graph, values, omega))


def test_a_long_chain():
    # 2,000 distinct states in a line to the goal: distance t from the end, potentials omega^d from the goal's parent
    n = 2000
    src = np.arange(n, dtype=np.int64)
    dst = np.arange(1, n + 1, dtype=np.int64)
    is_goal = np.zeros(n + 1, dtype=bool)
    is_goal[n] = True
    dist, reaches = _distance_to_goal(src, dst, is_goal, np.zeros(n + 1, dtype=np.int64), 1)
    assert np.array_equal(dist, np.arange(n, -1, -1, dtype=float)) and reaches.all()
    batch = StepBatch.from_trajectories([[f"s{t}" for t in range(n + 1)]], [True])
    graph = build_task_graph(batch)
    values = np.zeros(graph.num_nodes)
    values[graph.node_key == "s1500"] = 1.0
    assert np.array_equal(graph.max_potential(values, 0.5), relaxed_potential(graph, values, 0.5))


def looped_history_groups(batch, graph, levels):
    """The previous HGPO grouping: a Python loop building a tuple key per row and level."""
    from milegpo.credit.graph import index_strings, trajectory_order

    order = trajectory_order(batch)
    (keys,) = index_strings(batch.state_keys[order])
    starts = segment_starts(batch.traj_ids[order])
    pos = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    task = graph.row_task[order]
    result = []
    for k in levels:
        groups = np.full(len(order), -1, dtype=np.int64)
        ids = {}
        for j in np.flatnonzero(pos + 1 >= k):
            groups[j] = ids.setdefault((int(task[j]), *keys[j - k + 1: j + 1].tolist()), len(ids))
        out = np.empty_like(groups)
        out[order] = groups
        result.append(out)
    return result


@settings(max_examples=150, deadline=None)
@given(random_batches(), st.integers(0, 2 ** 31 - 1))
def test_hgpo_groups_equal_the_loop(batch, seed):
    from milegpo.credit.hgpo import history_groups_by_level

    rng = np.random.default_rng(seed)
    shuffled = rng.permutation(batch.num_steps)  # rows in any order
    batch = StepBatch(**{f: getattr(batch, f)[shuffled] if f not in ("outcomes", "success") else getattr(batch, f)
                         for f in batch.__dataclass_fields__})
    graph = build_task_graph(batch)
    levels = [1, 2, 3, 5]
    for got, want in zip(history_groups_by_level(batch, graph, levels), looped_history_groups(batch, graph, levels)):
        assert np.array_equal(got, want)
