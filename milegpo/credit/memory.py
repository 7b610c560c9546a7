r"""Milestone memory **(ours, opt-in)**: MileGPO's milestone and trap evidence carried across iterations.

MileGPO (:mod:`milegpo.credit.milegpo`) estimates every milestone and trap from one group of
:math:`K` rollouts: with :math:`K = 8` and success rates of 5-40 %, each reliability rests on one
to three successes, and a state that only this group's failures visited is a trap even where the
successes of earlier groups passed through it. With a finite training split the same task comes
back; its earlier groups have already shown which states successes pass and which only failures
visit. The memory keeps those counts.

**What it keys on.** A task's stable identity (the trainer passes the task each group played: its
task seed modulo the env's ``num_tasks`` where the env has a finite task list, since seed ``s``
plays task ``s % num_tasks`` and a draw larger than the list draws any seeds; else the seed; the
batch's task ids are group indices, renumbered every iteration) and, within the task, the state
key the graph's nodes are built from; an edge by the pair (state key, next state key, or the
goal).

**What it holds.** Per task, the visit counts :func:`~milegpo.credit.milegpo.milestone_evidence`
reads: trajectories and successful trajectories per task, per state (with the revisits) and per
edge, each weighed by its age.

**What reads it.** MD, RCS and PCC read the group's own counts plus the remembered ones
(:meth:`~milegpo.credit.task_graph.TaskGraph.with_counts`): candidates, lifts, coverages, trap scores
and branch success rates come from the sum. The structure stays the group's own: its nodes and
edges (degree, siblings), distances, start and goal states; so do the GraphGPO term, the
normalisation and the episode term. A remembered state this group did not visit is no node of
this group's graph: nothing steps to it, its evidence waits in the memory.

**When the policy has moved on (decay).** A count observed ``a`` iterations ago weighs
:math:`2^{-a / h}` (``memory_half_life`` :math:`h` in iterations; ``inf``: never decays), and a
decayed count below :data:`FORGET_BELOW` is forgotten: candidacy needs a count above zero, so
without it a success seen long ago with weight :math:`10^{-9}` would still make its state a
milestone. One sighting thus lasts one half-life, :math:`k` sightings about
:math:`h \log_2 2k` iterations. A task seen again is decayed in steps (to each sighting, then on),
whose product can round a hair below the one-step value (:math:`2^{-3/5} 2^{-2/5}` is
:math:`0.5 - 5.6 \cdot 10^{-17}`): counts within :data:`FORGET_TOLERANCE` of the boundary count as
on it, so a sighting lasts one half-life whether or not the task came back in between.

**Bounds.** ``memory_max_states`` states and as many edges per task (the most visited kept);
``memory_max_tasks`` tasks (the least recently seen dropped; among tasks last seen in the same
iteration, the smaller keys are kept).

**What it was built under.** The memory records its half-life, caps and the env it was filled on
(:attr:`MilestoneMemory.scope`); the trainer starts a fresh memory, saying so in one line, when a
resumed or re-targeted run differs in any of them, and drops it when the memory is turned off.

**Limits.** :math:`h \to 0`: nothing is remembered and the credit is MileGPO's exactly; so is
the first iteration (empty memory). Where tasks never recur (an env of unbounded seeds) the
memory never holds a task the batch has: the credit is MileGPO's and the memory only costs.

**Purity.** Nothing is hidden state: :func:`remembered_credit` reads a :class:`MilestoneMemory`
and returns the credit and the batch's own counts; :meth:`MilestoneMemory.advance` returns the
next memory. The split serves data parallelism: every rank credits its own groups reading the same
memory, the ranks' counts are gathered (rank order), and every rank advances the same memory by
them, so memory and advantages are those of one process with every group.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from milegpo.credit.api import check_finite_batch, checked_advantages, empty_credit
from milegpo.credit.base import CreditConfig
from milegpo.credit.batch import CreditResult, StepBatch
from milegpo.credit.graph import build_task_graph
from milegpo.credit.milegpo import MileGPOConfig, milegpo
from milegpo.credit.task_graph import TaskGraph

FORGET_BELOW = 0.5
"""A decayed count below this (half a trajectory) is forgotten."""

FORGET_TOLERANCE = 1e-9
"""A count this close below :data:`FORGET_BELOW` is on the boundary, not below it (stepwise decay rounds)."""

EdgeKey = tuple[str, str | None]
"""An edge of the memory: (state key, next state key), ``None`` for the goal."""


def forgotten(values: np.ndarray | float) -> np.ndarray:
    """Which decayed counts are forgotten: below :data:`FORGET_BELOW` by more than :data:`FORGET_TOLERANCE`."""
    return np.asarray(values) < FORGET_BELOW - FORGET_TOLERANCE


def decay_factor(age: int, half_life: float) -> float:
    """:math:`2^{-\\text{age} / h}`: 0 for ``half_life`` 0, 1 for ``inf``."""
    if half_life == 0:
        return 0.0
    return 1.0 if math.isinf(half_life) else 0.5 ** (age / half_life)


@dataclass(frozen=True)
class TaskCounts:
    """One task's visit counts (floats: decayed counts are fractional).

    :param node_keys: the states.
    :param node_counts: (n, 3) trajectories visiting each state, successful ones, revisits.
    :param edge_keys: the transitions.
    :param edge_counts: (m, 2) trajectories taking each transition, successful ones.
    :param n_traj: the task's trajectories.
    :param n_succ: its successful trajectories.
    """

    node_keys: tuple[str, ...]
    node_counts: np.ndarray
    edge_keys: tuple[EdgeKey, ...]
    edge_counts: np.ndarray
    n_traj: float
    n_succ: float

    def decayed(self, factor: float) -> TaskCounts:
        """The counts times ``factor``, those below :data:`FORGET_BELOW` forgotten (and the states and
        edges left without a trajectory dropped)."""

        def scaled(values: np.ndarray) -> np.ndarray:
            out = values * factor
            out[forgotten(out)] = 0.0
            return out

        nodes, edges = scaled(self.node_counts), scaled(self.edge_counts)
        totals = scaled(np.array([self.n_traj, self.n_succ]))
        kept_nodes, kept_edges = nodes[:, 0] > 0, edges[:, 0] > 0
        return TaskCounts(tuple(k for k, kept in zip(self.node_keys, kept_nodes) if kept), nodes[kept_nodes],
                          tuple(k for k, kept in zip(self.edge_keys, kept_edges) if kept), edges[kept_edges],
                          float(totals[0]), float(totals[1]))

    def capped(self, max_states: int) -> TaskCounts:
        """At most ``max_states`` states and as many edges, the most visited (ties: the earlier)."""
        def top(counts: np.ndarray) -> np.ndarray:
            if len(counts) <= max_states:
                return np.arange(len(counts))
            return np.sort(np.argsort(-counts[:, 0], kind="stable")[:max_states])

        nodes, edges = top(self.node_counts), top(self.edge_counts)
        return TaskCounts(tuple(self.node_keys[i] for i in nodes), self.node_counts[nodes],
                          tuple(self.edge_keys[i] for i in edges), self.edge_counts[edges], self.n_traj, self.n_succ)

    @functools.cached_property
    def nbytes(self) -> int:
        """Bytes held (measured once: the counts never change): the count arrays, the key strings and
        the tuples that list them (CPython sizes)."""
        keys = sum(sys.getsizeof(k) for k in self.node_keys)
        edges = sum(sys.getsizeof(e) + sys.getsizeof(e[0]) + (sys.getsizeof(e[1]) if e[1] is not None else 0)
                    for e in self.edge_keys)
        return (self.node_counts.nbytes + self.edge_counts.nbytes + keys + edges
                + sys.getsizeof(self.node_keys) + sys.getsizeof(self.edge_keys))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values (floats are written exactly by ``json``)."""
        return {"n_traj": self.n_traj, "n_succ": self.n_succ,
                "nodes": [[k, *map(float, c)] for k, c in zip(self.node_keys, self.node_counts)],
                "edges": [[s, d, *map(float, c)] for (s, d), c in zip(self.edge_keys, self.edge_counts)]}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TaskCounts:
        """What :meth:`to_dict` wrote."""
        nodes, edges = values["nodes"], values["edges"]
        return cls(tuple(str(n[0]) for n in nodes), np.array([n[1:] for n in nodes], dtype=np.float64).reshape(-1, 3),
                   tuple((str(e[0]), None if e[1] is None else str(e[1])) for e in edges),
                   np.array([e[2:] for e in edges], dtype=np.float64).reshape(-1, 2),
                   float(values["n_traj"]), float(values["n_succ"]))


def merge_counts(parts: Sequence[TaskCounts]) -> TaskCounts:
    """The sum of ``parts`` key by key (keys in order of first appearance; summed in the order given)."""
    def summed(keys_of: Sequence[Sequence[Any]], counts_of: Sequence[np.ndarray],
               width: int) -> tuple[tuple[Any, ...], np.ndarray]:
        index: dict[Any, int] = {}
        ids = [index.setdefault(k, len(index)) for keys in keys_of for k in keys]
        total = np.zeros((len(index), width))
        np.add.at(total, np.array(ids, dtype=np.int64), np.concatenate(counts_of).reshape(-1, width))
        return tuple(index), total

    node_keys, nodes = summed([p.node_keys for p in parts], [p.node_counts for p in parts], 3)
    edge_keys, edges = summed([p.edge_keys for p in parts], [p.edge_counts for p in parts], 2)
    return TaskCounts(node_keys, nodes, edge_keys, edges, float(sum(p.n_traj for p in parts)),
                      float(sum(p.n_succ for p in parts)))


@dataclass(frozen=True)
class RememberedTask:
    """A task's counts as of ``seen``, the iteration that last observed it."""

    seen: int
    counts: TaskCounts


@dataclass(frozen=True)
class MilestoneMemory:
    """The evidence of every remembered task (immutable: :meth:`advance` returns the next memory).

    :param iteration: the iterations advanced so far (the age of an entry is this minus its ``seen``).
    :param tasks: the remembered tasks by task key.
    :param tasks_observed: tasks observed over the run (one per task key and iteration).
    :param tasks_recurred: of those, the ones the memory still remembered (counts not all forgotten)
        when they came.
    :param scope: what the memory was built under (:func:`memory_scope`: half-life, caps, the env as
        the trainer knows it), plain JSON values; a memory is read only under the same scope (empty: not
        recorded, e.g. a memory filled by hand).
    """

    iteration: int = 0
    tasks: Mapping[int, RememberedTask] = field(default_factory=dict)
    tasks_observed: int = 0
    tasks_recurred: int = 0
    scope: Mapping[str, Any] = field(default_factory=dict)

    def remembered(self, key: int, half_life: float) -> TaskCounts | None:
        """Task ``key``'s counts decayed to this iteration; None when not held or all forgotten."""
        entry = self.tasks.get(key)
        if entry is None:
            return None
        counts = entry.counts.decayed(decay_factor(self.iteration - entry.seen, half_life))
        return counts if counts.n_traj > 0 else None

    @property
    def recurrence_rate(self) -> float:
        """The share of the run's observed tasks that the memory remembered when they came."""
        return self.tasks_recurred / self.tasks_observed if self.tasks_observed else 0.0

    @property
    def nbytes(self) -> int:
        """Bytes the remembered counts hold (:attr:`TaskCounts.nbytes`, summed)."""
        return sum(entry.counts.nbytes for entry in self.tasks.values())

    def advance(self, observed: Iterable[tuple[int, TaskCounts]], config: MileGPOConfig) -> MilestoneMemory:
        """The memory after this iteration: each observed task's decayed counts plus its group's (several
        groups of one key, e.g. from several ranks: added in the order given), capped; then the tasks
        whose trajectories will all have decayed below :data:`FORGET_BELOW` dropped, and the least
        recently seen tasks beyond ``config.memory_max_tasks``.

        :param observed: (task key, the group's own counts) of this iteration, as :func:`remembered_credit`
            returns them (with several ranks: every rank's, in rank order).
        """
        by_key: dict[int, list[TaskCounts]] = {}
        for key, counts in observed:
            by_key.setdefault(int(key), []).append(counts)
        tasks = dict(self.tasks)
        recurred = 0
        for key, groups in by_key.items():
            old = self.remembered(key, config.memory_half_life)
            recurred += old is not None
            merged = merge_counts(([old] if old is not None else []) + groups)
            tasks[key] = RememberedTask(self.iteration, merged.capped(config.memory_max_states))
        # a task whose trajectories have all decayed below FORGET_BELOW by the next iteration is forgotten
        tasks = {k: entry for k, entry in tasks.items()
                 if not forgotten(entry.counts.n_traj
                                  * decay_factor(self.iteration + 1 - entry.seen, config.memory_half_life))}
        if len(tasks) > config.memory_max_tasks:
            kept = sorted(tasks, key=lambda k: (-tasks[k].seen, k))[:config.memory_max_tasks]
            tasks = {k: tasks[k] for k in sorted(kept)}
        return MilestoneMemory(self.iteration + 1, tasks, self.tasks_observed + len(by_key),
                               self.tasks_recurred + recurred, self.scope)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values (what a checkpoint keeps); :meth:`from_dict` reads them back exactly."""
        return {"iteration": self.iteration, "tasks_observed": self.tasks_observed,
                "tasks_recurred": self.tasks_recurred, "scope": dict(self.scope),
                "tasks": [{"task": key, "seen": entry.seen, **entry.counts.to_dict()}
                          for key, entry in self.tasks.items()]}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> MilestoneMemory:
        """What :meth:`to_dict` wrote; ``ValueError`` naming the fault when it is not that. A memory saved
        before the scope was recorded reads with an empty scope (which no run's scope equals)."""
        try:
            tasks = {int(t["task"]): RememberedTask(int(t["seen"]), TaskCounts.from_dict(t)) for t in values["tasks"]}
            return cls(int(values["iteration"]), tasks, int(values["tasks_observed"]), int(values["tasks_recurred"]),
                       dict(values.get("scope") or {}))
        except (KeyError, TypeError, ValueError, IndexError) as error:
            raise ValueError(f"the saved milestone memory is not readable ({type(error).__name__}: {error}); "
                             "the checkpoint is damaged") from None


def uses_memory(config: CreditConfig) -> bool:
    """Whether the credit is MileGPO's with the milestone memory (``memory_half_life > 0``)."""
    return isinstance(config, MileGPOConfig) and config.memory_half_life > 0


def memory_scope(config: MileGPOConfig, env: Mapping[str, Any]) -> dict[str, Any]:
    """What a memory is built under, as plain JSON values: the half-life (``"inf"`` for never: strict JSON
    has no infinity), the caps, and ``env`` (the trainer: the env's name, split and task count)."""
    half_life = config.memory_half_life
    return {"memory_half_life": "inf" if math.isinf(half_life) else half_life,
            "memory_max_states": config.memory_max_states, "memory_max_tasks": config.memory_max_tasks,
            **{f"env.{name}": value for name, value in env.items()}}


def scope_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """The settings in which a memory's ``saved`` scope differs from ``current``, as ``name saved -> current``
    (``not recorded`` where the saved memory has none)."""
    if not saved:
        return ["the memory's settings were not recorded"]
    return [f"{name} {saved.get(name, 'not recorded')} -> {value}" for name, value in current.items()
            if saved.get(name) != value]


def group_counts(graph: TaskGraph) -> list[tuple[TaskCounts, np.ndarray, np.ndarray]]:
    """Each task's own counts in ``graph`` (dense task order) with the graph's node and edge of each
    listed state and edge. Goal nodes are not states (their counts are the task's successes); edges
    into them have the goal ``None`` as next state.

    States and edges are listed sorted by key, not in the graph's node order (which depends on the
    other tasks of the batch): a task's counts, and so the memory, are the same whichever rank's batch
    it was in."""
    names: list[str | None] = graph.node_key.tolist()
    for goal in np.flatnonzero(graph.is_goal).tolist():
        names[goal] = None
    node_bounds = np.searchsorted(graph.node_task, np.arange(graph.num_tasks + 1))
    edge_bounds = np.searchsorted(graph.edge_task, np.arange(graph.num_tasks + 1))
    node_counts, edge_counts = count_arrays(graph)
    out = []
    for q in range(graph.num_tasks):
        nodes = np.arange(node_bounds[q], node_bounds[q + 1])
        nodes = nodes[~graph.is_goal[nodes]]
        node_keys = [names[v] for v in nodes.tolist()]
        nodes = nodes[sorted(range(len(nodes)), key=node_keys.__getitem__)]
        edges = np.arange(edge_bounds[q], edge_bounds[q + 1])
        edge_keys = [(names[s], names[d]) for s, d in zip(graph.edge_src[edges].tolist(),
                                                           graph.edge_dst[edges].tolist())]
        order = sorted(range(len(edges)), key=lambda i: (edge_keys[i][0], edge_keys[i][1] is None,
                                                         edge_keys[i][1] or ""))
        edges = edges[order]
        counts = TaskCounts(tuple(names[v] for v in nodes.tolist()), node_counts[nodes],
                            tuple(edge_keys[i] for i in order), edge_counts[edges],
                            float(graph.task_n_traj[q]), float(graph.task_n_succ[q]))
        out.append((counts, nodes, edges))
    return out


def count_arrays(graph: TaskGraph) -> tuple[np.ndarray, np.ndarray]:
    """The graph's (nodes, 3) trajectories, successes and revisits and (edges, 2) trajectories and successes,
    as fresh float arrays."""
    return (np.stack([graph.node_n_traj, graph.node_n_succ, graph.node_n_revisit], axis=1).astype(np.float64),
            np.stack([graph.edge_n_traj, graph.edge_n_succ], axis=1).astype(np.float64))


def _lookup(keys: Sequence[Any], remembered: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """(positions in ``keys``, positions in ``remembered``) of the keys both have."""
    index = {k: i for i, k in enumerate(remembered)}
    found = [(i, index[k]) for i, k in enumerate(keys) if k in index]
    if not found:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    mine, theirs = zip(*found)
    return np.array(mine, dtype=np.int64), np.array(theirs, dtype=np.int64)


def remembered_credit(batch: StepBatch, config: MileGPOConfig, memory: MilestoneMemory,
                      task_keys: Mapping[int, int] | None = None) -> tuple[CreditResult, list[tuple[int, TaskCounts]]]:
    """MileGPO credit of ``batch`` whose MD, RCS and PCC read the group's counts plus ``memory``'s,
    and the batch's own counts per task key (for :meth:`MilestoneMemory.advance`).

    :param config: MileGPO's config; its ``memory_half_life`` decays the remembered counts.
    :param memory: the memory before this iteration (not changed).
    :param task_keys: the stable key of each of ``batch``'s task ids (the trainer: group -> task
        seed); None: the task ids are themselves stable across iterations.

    The diagnostics add ``memory_evidence_share`` (of the trajectories the evidence counts, the share
    that came from memory), ``memory_recurring_frac`` (of the batch's tasks, the share the memory
    remembered), ``memory_recurrence_rate`` (the same over the run, this iteration included),
    ``memory_tasks`` and ``memory_bytes`` (the memory read).

    Refuses what :func:`~milegpo.credit.compute_credit` refuses (the same checks): a non-finite reward
    or outcome, and advantages that come out non-finite.
    """
    if batch.num_steps == 0:
        return empty_credit("milegpo"), []
    check_finite_batch(batch)
    graph = build_task_graph(batch, batch.success_mask(config.success_threshold))
    if task_keys is None:
        keys = [int(v) for v in graph.task_values.tolist()]
    else:
        missing = [int(v) for v in graph.task_values.tolist() if int(v) not in task_keys]
        if missing:
            raise ValueError(f"task_keys has no key for the batch's task ids {missing[:5]}: give every task its "
                             "stable key (the trainer: its task seed)")
        keys = [int(task_keys[int(v)]) for v in graph.task_values.tolist()]
    own = group_counts(graph)
    node_counts, edge_counts = count_arrays(graph)  # the group's, to which the remembered counts are added
    task_counts = np.stack([graph.task_n_traj, graph.task_n_succ], axis=1).astype(np.float64)
    from_memory, recurring = 0.0, set()
    for q, key in enumerate(keys):
        old = memory.remembered(key, config.memory_half_life)
        if old is None:
            continue
        recurring.add(key)
        counts, nodes, edges = own[q]
        mine, theirs = _lookup(counts.node_keys, old.node_keys)
        node_counts[nodes[mine]] += old.node_counts[theirs]
        mine, theirs = _lookup(counts.edge_keys, old.edge_keys)
        edge_counts[edges[mine]] += old.edge_counts[theirs]
        task_counts[q] += (old.n_traj, old.n_succ)
        from_memory += old.n_traj
    evidence = graph.with_counts(task_counts[:, 0], task_counts[:, 1], node_counts[:, 0], node_counts[:, 1],
                                 node_counts[:, 2], edge_counts[:, 0], edge_counts[:, 1])
    result = milegpo(batch, config, graph, evidence=evidence)
    unique = set(keys)
    result.diagnostics.update({
        "memory_evidence_share": from_memory / max(float(task_counts[:, 0].sum()), 1.0),
        "memory_recurring_frac": len(recurring) / len(unique) if unique else 0.0,
        "memory_recurrence_rate": ((memory.tasks_recurred + len(recurring)) / (memory.tasks_observed + len(unique))
                                   if unique else memory.recurrence_rate),
        "memory_tasks": len(memory.tasks),
        "memory_bytes": memory.nbytes,
    })
    return checked_advantages("milegpo", config, result), [(key, counts) for key, (counts, _, _) in zip(keys, own)]


def milegpo_with_memory(batch: StepBatch, config: MileGPOConfig, memory: MilestoneMemory,
                        task_keys: Mapping[int, int] | None = None) -> tuple[CreditResult, MilestoneMemory]:
    """One process's iteration: :func:`remembered_credit`, then the memory advanced by the batch."""
    result, observed = remembered_credit(batch, config, memory, task_keys)
    return result, memory.advance(observed, config)
