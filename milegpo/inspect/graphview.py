"""What a report draws of one kept batch: per task group its state graph, milestones, traps, branching
points, trajectories and the observations behind each state key.

The graph is :func:`milegpo.credit.build_task_graph` of the batch with the success the run's credit
used, and the milestone and trap evidence is :func:`milegpo.credit.milestone_evidence` under the run's
MileGPO settings (the defaults for a run of another method): what MileGPO's credit saw in that batch.
Nodes and edges are the graph's, one for one, so what is drawn can be counted against it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from milegpo.credit import MileGPOConfig, StepBatch, TaskGraph, build_task_graph, milestone_evidence
from milegpo.credit.milegpo import MilestoneEvidence


def node_id(node: int) -> str:
    """The id of graph node ``node`` in the report (``n<index>``; unique across the batch's groups)."""
    return f"n{node}"


def edge_id(edge: int) -> str:
    """The id of graph edge ``edge`` in the report (``e<index>``)."""
    return f"e{edge}"


def evidence_config(method: str, config: Any) -> MileGPOConfig:
    """The MileGPO settings whose milestones and traps the report shows: the run's own for a MileGPO
    run, else the defaults with the run's success threshold (what decides which trajectories won)."""
    if isinstance(config, MileGPOConfig):
        return config
    threshold = getattr(config, "success_threshold", None)
    return MileGPOConfig(success_threshold=threshold)


def batch_graph(batch: StepBatch, config: MileGPOConfig) -> tuple[TaskGraph, MilestoneEvidence]:
    """The task graph of ``batch`` (success as MileGPO's credit decides it) and its milestone evidence."""
    graph = build_task_graph(batch, batch.success_mask(config.success_threshold))
    return graph, milestone_evidence(graph, config)


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _sibling_lift(graph: TaskGraph) -> tuple[np.ndarray, np.ndarray]:
    """Per edge, its success rate minus the mean success rate of its source's other out-edges
    (PCC's branch-counterfactual credit before normalisation; NaN without siblings), and per node
    whether it is a branching point: two or more out-edges whose success rates differ, in a task
    with a success."""
    p_e = graph.edge_p_plus
    n_out = np.bincount(graph.edge_src, minlength=graph.num_nodes)
    out_sum = np.bincount(graph.edge_src, weights=p_e, minlength=graph.num_nodes)
    siblings = n_out[graph.edge_src] - 1
    lift = np.full(graph.num_edges, np.nan)
    has = siblings > 0
    lift[has] = p_e[has] - (out_sum[graph.edge_src][has] - p_e[has]) / siblings[has]
    high = np.full(graph.num_nodes, -np.inf)
    low = np.full(graph.num_nodes, np.inf)
    np.maximum.at(high, graph.edge_src, p_e)
    np.minimum.at(low, graph.edge_src, p_e)
    branching = (n_out >= 2) & (high > low) & (graph.task_n_succ[graph.node_task] > 0)
    return lift, branching


def trajectory_rows(batch: StepBatch) -> list[np.ndarray]:
    """The rows of each trajectory of ``batch``, in step order (trajectories by id)."""
    order = np.lexsort((batch.step_idx, batch.traj_ids))
    if not len(order):
        return []
    traj = batch.traj_ids[order]
    return np.split(order, np.flatnonzero(traj[1:] != traj[:-1]) + 1)


def _node_observations(batch: StepBatch, graph: TaskGraph,
                       observations: Mapping[str, Any] | None) -> dict[int, list[list[int]]]:
    """Per node the observation texts seen in it, as ``[text index, times seen]`` pairs (most seen first)."""
    if not observations:
        return {}
    state = np.asarray(observations["state"], dtype=np.int64)
    after = np.asarray(observations["next_state"], dtype=np.int64)
    n_text = max(len(observations["texts"]), 1)
    # every step shows its state's text; the last step of a trajectory also shows where it ended
    last = np.array([rows[-1] for rows in trajectory_rows(batch)], dtype=np.int64)
    nodes = np.concatenate([graph.row_src, graph.row_dst[last]])
    texts = np.concatenate([state, after[last]])
    codes, counts = np.unique(nodes * n_text + texts, return_counts=True)
    found: dict[int, list[list[int]]] = {}
    for code, count in sorted(zip(codes.tolist(), counts.tolist()), key=lambda pair: -pair[1]):
        found.setdefault(code // n_text, []).append([code % n_text, count])
    return found


def group_views(batch: StepBatch, graph: TaskGraph, evidence: MilestoneEvidence, methods: Sequence[str],
                advantages: Mapping[str, np.ndarray], observations: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """One entry per task group of ``batch``: its nodes, edges and trajectories as plain values.

    :param advantages: per credit method the advantage of every row of ``batch``.
    :param observations: the batch's observation table (:func:`milegpo.algos.run_outputs.observation_table`)
        or None when the run did not keep them.
    """
    lift, branching = _sibling_lift(graph)
    best = np.zeros(graph.num_edges, dtype=bool)
    for branch in np.flatnonzero(branching):
        out = np.flatnonzero(graph.edge_src == branch)
        best[out[np.argmax(graph.edge_p_plus[out])]] = True
    node_texts = _node_observations(batch, graph, observations)
    keys = graph.node_key
    n_fail = graph.node_n_traj - graph.node_n_succ
    dist = graph.dist_to_goal
    nodes_of: list[list[dict[str, Any]]] = [[] for _ in range(graph.num_tasks)]
    for v in range(graph.num_nodes):
        node: dict[str, Any] = {
            "id": node_id(v), "key": str(keys[v]), "visits": int(graph.node_n_traj[v]),
            "successes": int(graph.node_n_succ[v]), "revisits": int(graph.node_n_revisit[v]),
            "distance": float(dist[v]), "reaches_goal": bool(graph.reaches_goal[v]),
            "goal": bool(graph.is_goal[v]), "start": bool(graph.is_start[v]), "branching": bool(branching[v]),
            "observations": node_texts.get(v, []),
        }
        if evidence.milestone[v]:
            node["milestone"] = {
                "score": float(evidence.score0[v]), "score_pcc": float(evidence.score_pcc[v]),
                "reliability": float(evidence.weight_plus[v]), "kept": bool(evidence.keep[v]),
                "lift": float(evidence.lift[v]), "coverage": float(evidence.coverage[v]),
                "centrality": float(evidence.centrality[v]), "evidence": float(evidence.evidence[v]),
                "bcc": float(evidence.bcc[v]), "progress": _finite(evidence.psi_tilde[v])}
        if evidence.trap[v]:
            node["trap"] = {"score": float(evidence.score_trap[v]), "reliability": float(evidence.weight_minus[v]),
                            "failures": int(n_fail[v]), "revisits": int(graph.node_n_revisit[v])}
        nodes_of[int(graph.node_task[v])].append(node)

    edge_actions = _edge_actions(batch, graph)
    edges_of: list[list[dict[str, Any]]] = [[] for _ in range(graph.num_tasks)]
    for e in range(graph.num_edges):
        edges_of[int(graph.edge_task[e])].append({
            "id": edge_id(e), "source": node_id(int(graph.edge_src[e])), "target": node_id(int(graph.edge_dst[e])),
            "trajectories": int(graph.edge_n_traj[e]), "successes": int(graph.edge_n_succ[e]),
            "success_rate": float(graph.edge_p_plus[e]), "lift": _finite(lift[e]), "best": bool(best[e]),
            "actions": edge_actions.get(e, [])})

    groups: list[dict[str, Any]] = [{"task": int(graph.task_values[q]), "trajectories_total": int(graph.task_n_traj[q]),
               "successes_total": int(graph.task_n_succ[q]), "nodes": nodes_of[q], "edges": edges_of[q],
               "trajectories": []} for q in range(graph.num_tasks)]
    success = graph.traj_success
    for rows in trajectory_rows(batch):
        traj = int(batch.traj_ids[rows[0]])
        groups[int(graph.row_task[rows[0]])]["trajectories"].append({
            "id": traj, "success": bool(success[traj]), "outcome": float(batch.outcomes[traj]),
            "nodes": [node_id(int(v)) for v in graph.row_src[rows]] + [node_id(int(graph.row_dst[rows[-1]]))],
            "edges": [edge_id(int(e)) for e in graph.row_edge[rows]],
            "actions": [str(a) for a in batch.actions[rows]], "rewards": batch.rewards[rows].tolist(),
            "valid": batch.valid[rows].tolist(),
            "advantages": {m: np.asarray(advantages[m])[rows].tolist() for m in methods}})
    return groups


def _edge_actions(batch: StepBatch, graph: TaskGraph) -> dict[int, list[list[Any]]]:
    """Per edge the action texts that took it, as ``[text, steps]`` pairs (most taken first)."""
    found: dict[int, dict[str, int]] = {}
    for edge, action in zip(graph.row_edge.tolist(), batch.actions.tolist()):
        counts = found.setdefault(edge, {})
        counts[str(action)] = counts.get(str(action), 0) + 1
    return {e: sorted(([a, n] for a, n in counts.items()), key=lambda pair: -pair[1]) for e, counts in found.items()}
