r"""What a task graph is and how it is searched: the task-local state graphs shared by GraphGPO and MileGPO.

For every task ``q`` of a :class:`~milegpo.credit.batch.StepBatch`, the graph
:math:`G_q = (V_q, E_q)` has

* **nodes** - the state keys seen in the task's trajectories, plus one goal node
  :math:`g` when the task has a success. Nodes of different tasks are distinct even
  when their keys are equal, so tasks never share evidence.
* **edges** - the distinct observed transitions :math:`u \to v` (``state_key`` to
  ``next_state_key``); an edge remembers which trajectories traversed it. The *last*
  transition of a successful trajectory points to :math:`g` instead of its final
  state. **(ours)** Edges are keyed by the pair of states, not by the action text:
  two actions that lead to the same state are the same edge, because the credit of
  GraphGPO / MileGPO depends on the transition only.
* **visits** - trajectory :math:`i` visits :math:`v` if :math:`v` is one of
  :math:`s_0, \dots, s_T` (the ``state_key`` of its steps and the target of its last
  step). :math:`T(v)`, :math:`T^+(v)` are the trajectories / successful trajectories
  visiting :math:`v`; ``n_revisit(v)`` counts every visit beyond a trajectory's
  first.

Distances

.. math::
    d(v, g) = \text{BFS length from } v \text{ to } g \text{ (unit weights, reversed graph)},
    \qquad d(v, g) = \max_{u \in V_q,\ d(u,g) < \infty} d(u, g) + 1 \text{ if } v \text{ cannot reach } g.

**(ours)** A task without success has no :math:`g`; its nodes all get
:math:`d = 0 + 1 = 1` (any constant: it is normalised away within the task).

Distances are one breadth-first search per batch over the reversed edges, started from
all goal nodes at once (each edge is looked at once: O(V + E)).

Potentials of MileGPO (:meth:`TaskGraph.max_potential`) are the fixed point of the
max-product relaxation :math:`\Phi(u) \leftarrow \max(\Phi(u), \omega \max_{u \to w} \Phi(w))`
started from :math:`\Phi = \text{value}` on the candidate nodes. For
:math:`0 \le \omega \le 1` it is exactly
:math:`\Phi(s) = \max_v \text{value}(v)\, \omega^{d(s, v)}` (the best walk is a
shortest path). It is computed by frontier relaxation: each round looks only at the edges
into the nodes whose value rose in the previous round, so a node is revisited only when a
better candidate reaches it (once per node on a chain, instead of one pass over every
edge per unit of distance).

Everything is vectorised over all tasks at once: the union of the task graphs is one
graph whose components never connect. A batch becomes a graph in :mod:`milegpo.credit.graph`
(:func:`~milegpo.credit.graph.build_task_graph`).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np

from milegpo.credit.arrays import sorted_unique, unique_inverse

GOAL_KEY = "<goal>"
"""The state key shown for goal nodes in diagnostics."""


@dataclass
class TaskGroups:
    """The tasks and trajectories of one batch, without any state: all that the outcome-only
    methods (GRPO, RLOO) read. Build it with :func:`~milegpo.credit.graph.build_task_groups`. Tasks are
    renumbered ``0..Q-1`` in increasing order of ``batch.task_ids`` (``task_values`` maps back)."""

    num_tasks: int
    task_values: np.ndarray  # (Q,) original task id
    row_task: np.ndarray  # (N,) dense task of each row
    traj_task: np.ndarray  # (T,) dense task of each trajectory, -1 if it has no rows
    traj_success: np.ndarray  # (T,) bool
    task_n_traj: np.ndarray  # (Q,) K_q
    task_n_succ: np.ndarray  # (Q,) |T_q^+|

    @property
    def task_p_plus(self) -> np.ndarray:
        """(Q,) :math:`p_q^+ = |T_q^+| / K_q`."""
        return self.task_n_succ / np.maximum(self.task_n_traj, 1)


@dataclass
class TaskGraph(TaskGroups):
    """The task-local graphs of one batch, as flat arrays (nodes sorted by task), with its
    :class:`TaskGroups`. Build it with :func:`~milegpo.credit.graph.build_task_graph`.
    """

    row_src: np.ndarray  # (N,) node of s_t
    row_dst: np.ndarray  # (N,) node of s_{t+1} (g for the last step of a success)
    row_edge: np.ndarray  # (N,) edge of the row's transition
    node_task: np.ndarray  # (V,) dense task, non-decreasing
    node_row: np.ndarray  # (V,) where the node's key is: row r < N of state_keys, N + r of next_state_keys, -1 goal
    state_keys: np.ndarray  # (N,) object, the batch's state keys (the batch's own array, not a copy)
    next_state_keys: np.ndarray  # (N,) object, the batch's next-state keys
    is_goal: np.ndarray  # (V,) bool
    is_start: np.ndarray  # (V,) bool - s_0 of some trajectory
    edge_src: np.ndarray  # (E,) sorted by (src, dst)
    edge_dst: np.ndarray  # (E,)
    node_n_traj: np.ndarray  # (V,) |T(v)|
    node_n_succ: np.ndarray  # (V,) |T^+(v)|
    node_n_revisit: np.ndarray  # (V,) visits beyond the first, summed over trajectories
    edge_n_traj: np.ndarray  # (E,) |T(e)|
    edge_n_succ: np.ndarray  # (E,) |T^+(e)|

    @functools.cached_property
    def node_key(self) -> np.ndarray:
        """(V,) object, the state key of every node (:data:`GOAL_KEY` for goals), gathered on
        first use: the credit methods never read it, their diagnostics read a few (:meth:`keys_of`)."""
        return self.keys_of(np.arange(self.num_nodes))

    def keys_of(self, nodes: np.ndarray) -> np.ndarray:
        """(len(nodes),) object, the state keys of ``nodes`` (:data:`GOAL_KEY` for goals)."""
        rows = self.node_row[nodes]
        n = len(self.state_keys)
        keys = np.full(len(rows), GOAL_KEY, dtype=object)
        of_state, of_next = (rows >= 0) & (rows < n), rows >= n
        keys[of_state] = self.state_keys[rows[of_state]]
        keys[of_next] = self.next_state_keys[rows[of_next] - n]
        return keys

    @functools.cached_property
    def _distances(self) -> tuple[np.ndarray, np.ndarray]:
        return _distance_to_goal(self.edge_src, self.edge_dst, self.is_goal, self.node_task, self.num_tasks,
                                 self._reversed_edges)

    @functools.cached_property
    def _reversed_edges(self) -> _ReversedEdges:
        """The edges grouped by target, built once for the distance search and every potential."""
        return _ReversedEdges(self.edge_src, self.edge_dst, self.num_nodes)

    @property
    def dist_to_goal(self) -> np.ndarray:
        """(V,) float :math:`d(v, g)`, unreachable = the task's max finite + 1 (searched on first use:
        the methods without distances never pay for the search)."""
        return self._distances[0]

    @property
    def reaches_goal(self) -> np.ndarray:
        """(V,) bool :math:`d(v, g) < \\infty` before the replacement."""
        return self._distances[1]

    @property
    def num_nodes(self) -> int:
        return len(self.node_task)

    @property
    def num_edges(self) -> int:
        return len(self.edge_src)

    @property
    def node_p_plus(self) -> np.ndarray:
        """(V,) :math:`p^+(v) = |T^+(v)| / |T(v)|` (0 for a node nobody visits)."""
        return self.node_n_succ / np.maximum(self.node_n_traj, 1)

    @property
    def edge_p_plus(self) -> np.ndarray:
        """(E,) :math:`p^+(e) = |T^+(e)| / |T(e)|`."""
        return self.edge_n_succ / np.maximum(self.edge_n_traj, 1)

    @property
    def edge_task(self) -> np.ndarray:
        return self.node_task[self.edge_src]

    def with_counts(self, task_n_traj: np.ndarray, task_n_succ: np.ndarray, node_n_traj: np.ndarray,
                    node_n_succ: np.ndarray, node_n_revisit: np.ndarray, edge_n_traj: np.ndarray,
                    edge_n_succ: np.ndarray) -> TaskGraph:
        """The same graph (nodes, edges, distances, start and goal nodes) with other visit counts, e.g.
        the group's own plus those remembered from earlier iterations (:mod:`milegpo.credit.memory`);
        counts may be fractional (decayed). The distances and the reversed edges already computed are
        shared, not searched again: they depend on the structure only."""
        counted = dataclasses.replace(self, task_n_traj=task_n_traj, task_n_succ=task_n_succ,
                                      node_n_traj=node_n_traj, node_n_succ=node_n_succ,
                                      node_n_revisit=node_n_revisit, edge_n_traj=edge_n_traj,
                                      edge_n_succ=edge_n_succ)
        for structural in ("_distances", "_reversed_edges", "node_key"):  # cached_property values
            if structural in self.__dict__:
                counted.__dict__[structural] = self.__dict__[structural]
        return counted

    def task_max(self, node_values: np.ndarray, initial: float = 0.0) -> np.ndarray:
        """(Q,) per-task maximum of a per-node array (``initial`` for an empty max)."""
        out = np.full(self.num_tasks, initial, dtype=np.float64)
        np.maximum.at(out, self.node_task, node_values)
        return out

    def max_potential(self, node_values: np.ndarray, omega: float) -> np.ndarray:
        r"""(V,) :math:`\Phi(s) = \max_v \text{value}(v)\,\omega^{d(s,v)}`, values >= 0, :math:`0 \le \omega \le 1`.

        ``d(s, v)`` is the forward graph distance (s reaches v); unreachable pairs
        contribute 0.
        """
        phi = np.asarray(node_values, dtype=np.float64).copy()
        if self.num_edges == 0 or not np.any(phi > 0) or omega == 0.0:
            return phi
        into = self._reversed_edges
        changed = np.flatnonzero(phi > 0)
        while len(changed):
            srcs, dsts = into.edges_into(changed)
            sources, slot, _ = unique_inverse(srcs)  # work on this round's edges only, not all V
            best = np.zeros(len(sources))
            np.maximum.at(best, slot, omega * phi[dsts])
            improved = best > phi[sources]
            changed = sources[improved]
            phi[changed] = best[improved]
        return phi


class _ReversedEdges:
    """The edges grouped by target node (CSR), to walk the graph backwards."""

    def __init__(self, edge_src: np.ndarray, edge_dst: np.ndarray, num_nodes: int) -> None:
        order = np.argsort(edge_dst, kind="stable")
        self.src = edge_src[order]
        self.dst = edge_dst[order]
        self.ptr = np.zeros(num_nodes + 1, dtype=np.int64)
        np.cumsum(np.bincount(edge_dst, minlength=num_nodes), out=self.ptr[1:])

    def edges_into(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(sources, targets) of every edge ending in one of ``nodes``."""
        counts = self.ptr[nodes + 1] - self.ptr[nodes]
        total = int(counts.sum())
        if total == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        offsets = np.repeat(self.ptr[nodes] - np.cumsum(counts) + counts, counts) + np.arange(total)
        return self.src[offsets], self.dst[offsets]


def _distance_to_goal(edge_src: np.ndarray, edge_dst: np.ndarray, is_goal: np.ndarray,
                      node_task: np.ndarray, num_tasks: int,
                      into: _ReversedEdges | None = None) -> tuple[np.ndarray, np.ndarray]:
    """BFS distance of every node to its task's goal (one search from all goals, reversed edges;
    ``into``: those edges grouped by target when the caller has them)."""
    dist = np.where(is_goal, 0.0, np.inf)
    if len(edge_src) and is_goal.any():
        into = into if into is not None else _ReversedEdges(edge_src, edge_dst, len(dist))
        frontier, level = np.flatnonzero(is_goal), 0.0
        while len(frontier):
            level += 1.0
            srcs, _ = into.edges_into(frontier)
            frontier = sorted_unique(srcs[np.isinf(dist[srcs])])
            dist[frontier] = level
    reaches = np.isfinite(dist)
    task_max = np.zeros(num_tasks)
    np.maximum.at(task_max, node_task[reaches], dist[reaches])
    dist[~reaches] = task_max[node_task[~reaches]] + 1.0
    return dist, reaches
