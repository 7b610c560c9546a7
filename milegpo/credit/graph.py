"""A :class:`~milegpo.credit.batch.StepBatch` made into its task graphs
(:class:`~milegpo.credit.task_graph.TaskGraph`, defined with its distances and potentials in
:mod:`milegpo.credit.task_graph`): the rows put in trajectory order, the state keys interned to
integer ids, the nodes, edges and visit counts gathered, and a large batch built in runs of whole
tasks whose graphs are then joined.

Nodes never join across tasks, so the keys are interned, and a batch grouped by task is built, in
runs of whole tasks of about :data:`INTERN_CHUNK_ENTRIES` rows: the work of each run fits the CPU's
caches.
"""

from __future__ import annotations

import numpy as np

from milegpo.credit.arrays import dense_ids, index_strings, segment_starts, sorted_unique, unique_inverse
from milegpo.credit.batch import StepBatch
from milegpo.credit.task_graph import TaskGraph, TaskGroups


def trajectory_order(batch: StepBatch) -> np.ndarray:
    """Row indices sorted by (trajectory, step); raises on a repeated (trajectory, step).

    Rows already in that order (the trainer's batches are) are recognised in one pass, without the sort."""
    t, s = batch.traj_ids, batch.step_idx
    if len(t) < 2 or np.all((t[1:] > t[:-1]) | ((t[1:] == t[:-1]) & (s[1:] > s[:-1]))):
        return np.arange(len(t), dtype=np.int64)
    order = np.lexsort((batch.step_idx, batch.traj_ids))
    t, s = batch.traj_ids[order], batch.step_idx[order]
    if len(order) > 1 and np.any((t[1:] == t[:-1]) & (s[1:] == s[:-1])):
        i = int(np.flatnonzero((t[1:] == t[:-1]) & (s[1:] == s[:-1]))[0])
        raise ValueError(f"StepBatch has two rows for trajectory {int(t[i])} step {int(s[i])}")
    return order


def node_index(row_task: np.ndarray, keys: np.ndarray, n_keys: int, goal_id: int) -> tuple[np.ndarray, np.ndarray]:
    """``numpy.unique(row_task * n_keys + keys, return_inverse=True)``: the sorted (task, key) codes
    of the nodes, and the node of every entry (inverse as int64), sorting the nodes instead of the rows.

    A key seen in one task only is one node: it is found by a table over the key ids. Only the
    entries whose key is in several tasks, and the goal key (one node per task), are sorted by code.
    """
    if len(keys) == 0:
        unique, inverse = np.unique(row_task * n_keys + keys, return_inverse=True)
        return unique, inverse.astype(np.int64).reshape(-1)
    key_task = np.full(n_keys, -1, dtype=np.int64)
    key_task[keys] = row_task  # one of the key's tasks
    shared = np.zeros(n_keys, dtype=bool)
    shared[keys[key_task[keys] != row_task]] = True
    shared[goal_id] = True
    own = ~shared[keys]
    own_keys = np.zeros(n_keys, dtype=bool)
    own_keys[keys[own]] = True
    own_keys = np.flatnonzero(own_keys)
    other = np.flatnonzero(~own)
    other_codes = sorted_unique(row_task[other] * n_keys + keys[other])
    codes = np.concatenate([key_task[own_keys] * n_keys + own_keys, other_codes])
    order = np.argsort(codes)  # the codes are distinct: any sort gives this order
    rank = np.empty(len(codes), dtype=np.int64)
    rank[order] = np.arange(len(codes))
    node_of_key = np.zeros(n_keys, dtype=np.int64)
    node_of_key[own_keys] = rank[: len(own_keys)]
    nodes = node_of_key[keys]
    position = np.searchsorted(other_codes, row_task[other] * n_keys + keys[other])
    nodes[other] = rank[len(own_keys) + position]
    return codes[order], nodes


INTERN_CHUNK_ENTRIES = 1 << 15
"""Keys are interned in runs of whole tasks of about this many rows, one dictionary per run
(:func:`state_key_ids`)."""


def state_key_ids(batch: StepBatch, order: np.ndarray, row_task: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Integer ids of ``(batch.state_keys, batch.next_state_keys)``: equal ids for equal keys of one task.

    A step's next state is nearly always the state of the trajectory's next step (``order`` is
    :func:`trajectory_order`): those next-state keys are checked equal to it in one vectorised
    comparison and take its id, so only the state column and the other next states (last steps,
    anything else) are interned.

    Nodes never join across tasks, so the keys are interned in runs of whole tasks of about
    :data:`INTERN_CHUNK_ENTRIES` rows, each run with its own dictionary: a batch of a million
    distinct keys then costs per key what a batch of thousands does, where one dictionary of them
    all missed the CPU cache on nearly every lookup. Ids of different runs never meet; equal keys of
    two tasks in one run share an id, which :func:`node_index` splits by task. Within a run the
    state column is numbered first, then the other next states, each in row order: a batch of one run
    is numbered exactly as :func:`~milegpo.credit.arrays.index_strings` of the two columns would number it.

    Rows already in trajectory order and grouped by task (the trainer's batches are) are read as
    slices: every key object is touched as few times as possible, which is what a batch of a million
    keys scattered in memory pays for."""
    n = batch.num_steps
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if np.array_equal(order, np.arange(n)):
        follows = (batch.traj_ids[:-1] == batch.traj_ids[1:]) & (batch.next_state_keys[:-1] == batch.state_keys[1:])
        linked = np.flatnonzero(follows)
        successors = linked + 1
    else:
        rows, successors = order[:-1], order[1:]
        follows = batch.traj_ids[rows] == batch.traj_ids[successors]
        rows, successors = rows[follows], successors[follows]
        same = batch.next_state_keys[rows] == batch.state_keys[successors]
        linked, successors = rows[same], successors[same]
    rest = np.ones(n, dtype=bool)
    rest[linked] = False
    rest_rows = np.flatnonzero(rest)
    src_key = np.empty(n, dtype=np.int64)
    dst_key = np.empty(n, dtype=np.int64)
    if n <= INTERN_CHUNK_ENTRIES:
        src_key[:], dst_key[rest_rows] = index_strings(batch.state_keys, batch.next_state_keys[rest_rows])
    elif np.all(row_task[1:] >= row_task[:-1]):
        _intern_row_runs(batch, row_task, rest_rows, src_key, dst_key)
    else:
        ids = index_strings_by_task(np.concatenate([batch.state_keys, batch.next_state_keys[rest_rows]]),
                                    np.concatenate([row_task, row_task[rest_rows]]))
        src_key[:], dst_key[rest_rows] = ids[:n], ids[n:]
    dst_key[linked] = src_key[successors]
    return src_key, dst_key


def task_runs(sorted_task: np.ndarray) -> np.ndarray:
    """Start index of each run of whole tasks of about :data:`INTERN_CHUNK_ENTRIES` entries
    (``sorted_task`` non-decreasing)."""
    task_starts = segment_starts(sorted_task)
    return task_starts[np.r_[True, np.diff(task_starts // INTERN_CHUNK_ENTRIES) > 0]]


def _intern_row_runs(batch: StepBatch, row_task: np.ndarray, rest_rows: np.ndarray, src_key: np.ndarray,
                     dst_key: np.ndarray) -> None:
    """Fill ``src_key`` and ``dst_key[rest_rows]`` run by run, for rows grouped by task (slices, no copies)."""
    cuts = task_runs(row_task)
    offset = 0
    for low, high in zip(cuts, np.r_[cuts[1:], len(row_task)]):
        rest_in_run = rest_rows[np.searchsorted(rest_rows, low):np.searchsorted(rest_rows, high)]
        run_src, run_rest = index_strings(batch.state_keys[low:high], batch.next_state_keys[rest_in_run])
        src_key[low:high] = run_src + offset
        dst_key[rest_in_run] = run_rest + offset
        offset += int(max(run_src.max(initial=-1), run_rest.max(initial=-1))) + 1


def index_strings_by_task(keys: np.ndarray, task: np.ndarray) -> np.ndarray:
    """Integer ids of ``keys``, equal for equal keys of one task (``task``: each key's task).

    :func:`~milegpo.credit.arrays.index_strings` of ``keys`` when there are at most
    :data:`INTERN_CHUNK_ENTRIES`; beyond, one dictionary per run of whole tasks (:func:`state_key_ids`
    says why), read as slices when ``task`` is non-decreasing. Within a run, ids are numbered in order of
    first appearance."""
    if len(keys) <= INTERN_CHUNK_ENTRIES:
        return index_strings(keys)[0]
    in_order = bool(np.all(task[1:] >= task[:-1]))
    by_task = np.arange(len(keys)) if in_order else np.argsort(task, kind="stable")
    ordered_keys = keys if in_order else keys[by_task]
    cuts = task_runs(task[by_task])
    ids = np.empty(len(keys), dtype=np.int64)
    offset = 0
    for low, high in zip(cuts, np.r_[cuts[1:], len(keys)]):
        (run_ids,) = index_strings(ordered_keys[low:high])
        ids[by_task[low:high]] = run_ids + offset
        offset += int(run_ids.max()) + 1
    return ids


def build_task_groups(batch: StepBatch, success: np.ndarray | None = None) -> TaskGroups:
    """The tasks and trajectories of ``batch`` (no state is read).

    :param batch: the steps.
    :param success: (T,) bool success per trajectory (default ``batch.success``).
    """
    success = batch.success if success is None else np.asarray(success, dtype=bool)
    if len(success) != batch.num_trajectories:
        raise ValueError(f"success has {len(success)} entries, the batch has {batch.num_trajectories} trajectories")
    task_values, row_task = dense_ids(batch.task_ids)
    num_tasks = len(task_values)
    traj_task = np.full(batch.num_trajectories, -1, dtype=np.int64)
    traj_task[batch.traj_ids] = row_task
    if np.any(traj_task[batch.traj_ids] != row_task):
        bad = int(batch.traj_ids[np.flatnonzero(traj_task[batch.traj_ids] != row_task)[0]])
        raise ValueError(f"trajectory {bad} has rows in more than one task")
    traj_success = success & (traj_task >= 0)
    return TaskGroups(num_tasks=num_tasks, task_values=task_values, row_task=row_task, traj_task=traj_task,
                      traj_success=traj_success,
                      task_n_traj=np.bincount(traj_task[traj_task >= 0], minlength=num_tasks),
                      task_n_succ=np.bincount(traj_task[traj_success], minlength=num_tasks))


def build_task_graph(batch: StepBatch, success: np.ndarray | None = None) -> TaskGraph:
    """Build the task-local graphs of ``batch``.

    :param batch: the steps.
    :param success: (T,) bool success per trajectory (default ``batch.success``);
        decides which trajectories point to the goal node.

    Graphs never join across tasks, so a batch whose rows are in trajectory order and grouped
    by task (the trainer's are) is built in runs of whole tasks of about
    :data:`INTERN_CHUNK_ENTRIES` rows, the runs' graphs then joined: every sort and scatter
    of a run works on arrays that fit the CPU's caches (a million distinct-state steps: 0.35
    CPU µs per step, against 0.41 in one piece; ``benchmarks/credit/credit_scaling.py``). The joined graph
    equals the one-piece build array for array (the runs are the ones :func:`state_key_ids`
    interns keys in, and nodes and edges are sorted by task first).
    """
    groups = build_task_groups(batch, success)
    success = batch.success if success is None else np.asarray(success, dtype=bool)
    order = trajectory_order(batch)
    in_runs = batch.num_steps > INTERN_CHUNK_ENTRIES and np.array_equal(order, np.arange(batch.num_steps)) \
        and bool(np.all(groups.row_task[1:] >= groups.row_task[:-1]))
    if in_runs:
        cuts = task_runs(groups.row_task)
        if len(cuts) > 1:
            return _joined_graph(batch, success, groups, cuts)
    return _whole_graph(batch, success, groups, order)


def _run_batch(batch: StepBatch, success: np.ndarray, low: int, high: int) -> StepBatch:
    """Rows ``low:high`` of ``batch`` (whole trajectories) as a batch of their own, with its
    trajectories renumbered ``0..t-1`` in the order of their ids and ``success`` as its success."""
    traj_values, local_traj = dense_ids(batch.traj_ids[low:high])
    return StepBatch(task_ids=batch.task_ids[low:high], traj_ids=local_traj, step_idx=batch.step_idx[low:high],
                     state_keys=batch.state_keys[low:high], next_state_keys=batch.next_state_keys[low:high],
                     actions=batch.actions[low:high], rewards=batch.rewards[low:high], valid=batch.valid[low:high],
                     dones=batch.dones[low:high], outcomes=batch.outcomes[traj_values], success=success[traj_values])


def _joined_graph(batch: StepBatch, success: np.ndarray, groups: TaskGroups, cuts: np.ndarray) -> TaskGraph:
    """:func:`build_task_graph` of a batch in trajectory order and grouped by task, built run by
    run (``cuts``: each run's first row) and joined: node, edge, task and row ids shifted by the
    runs before."""
    parts: list[TaskGraph] = []
    nodes_before, edges_before = 0, 0
    for low, high in zip(cuts.tolist(), np.r_[cuts[1:], batch.num_steps].tolist()):
        run = _run_batch(batch, success, low, high)
        part = _whole_graph(run, run.success, build_task_groups(run), np.arange(run.num_steps))
        # the run's ids as ids of the whole batch, shifted in place while its arrays are in the caches
        for ids in (part.row_src, part.row_dst, part.edge_src, part.edge_dst):
            ids += nodes_before
        part.row_edge += edges_before
        part.node_task += groups.row_task[low]
        keyed, of_next = part.node_row >= 0, part.node_row >= run.num_steps
        part.node_row[keyed] += low
        part.node_row[of_next] += batch.num_steps - run.num_steps
        nodes_before, edges_before = nodes_before + part.num_nodes, edges_before + part.num_edges
        parts.append(part)

    def joined(name: str) -> np.ndarray:
        return np.concatenate([getattr(part, name) for part in parts])

    return TaskGraph(
        **vars(groups), row_src=joined("row_src"), row_dst=joined("row_dst"), row_edge=joined("row_edge"),
        node_task=joined("node_task"), node_row=joined("node_row"), state_keys=batch.state_keys,
        next_state_keys=batch.next_state_keys, is_goal=joined("is_goal"), is_start=joined("is_start"),
        edge_src=joined("edge_src"), edge_dst=joined("edge_dst"),
        node_n_traj=joined("node_n_traj"), node_n_succ=joined("node_n_succ"),
        node_n_revisit=joined("node_n_revisit"), edge_n_traj=joined("edge_n_traj"),
        edge_n_succ=joined("edge_n_succ"),
    )


def _whole_graph(batch: StepBatch, success: np.ndarray, groups: TaskGroups, order: np.ndarray) -> TaskGraph:
    """:func:`build_task_graph` in one piece (``order``: :func:`trajectory_order` of ``batch``)."""
    row_task, traj_success = groups.row_task, groups.traj_success

    # Trajectories: their first and last rows.
    starts = segment_starts(batch.traj_ids[order])
    first_rows = order[starts]
    last_rows = order[np.r_[starts[1:] - 1, len(order) - 1]] if len(order) else order

    # Nodes: (task, key) pairs; the goal gets its own key id per task.
    src_key, dst_key = state_key_ids(batch, order, row_task)
    n_keys = int(max(src_key.max(initial=-1), dst_key.max(initial=-1))) + 2
    goal_id = n_keys - 1
    to_goal = last_rows[success[batch.traj_ids[last_rows]]]
    dst_key[to_goal] = goal_id
    node_codes, inverse = node_index(np.concatenate([row_task, row_task]), np.concatenate([src_key, dst_key]),
                                     n_keys, goal_id)
    n = batch.num_steps
    row_src, row_dst = inverse[:n], inverse[n:]
    num_nodes = len(node_codes)
    node_task = node_codes // n_keys
    is_goal = node_codes % n_keys == goal_id
    node_row = np.empty(num_nodes, dtype=np.int64)  # every node is some row's source or target
    node_row[row_dst] = np.arange(n, 2 * n)
    node_row[row_src] = np.arange(n)
    node_row[is_goal] = -1
    is_start = np.zeros(num_nodes, dtype=bool)
    is_start[row_src[first_rows]] = True

    # Edges: distinct (src, dst) pairs, sorted by src.
    edge_codes, row_edge, _ = unique_inverse(row_src * num_nodes + row_dst)
    edge_src, edge_dst = edge_codes // num_nodes, edge_codes % num_nodes

    # Visits: s_0..s_T of every trajectory = the source of each row + the target of its last row.
    visit_traj = np.concatenate([batch.traj_ids, batch.traj_ids[last_rows]])
    visit_node = np.concatenate([row_src, row_dst[last_rows]])
    pair_codes, _, pair_counts = unique_inverse(visit_traj * num_nodes + visit_node)
    pair_traj, pair_node = pair_codes // num_nodes, pair_codes % num_nodes
    node_n_traj = np.bincount(pair_node, minlength=num_nodes)
    node_n_succ = np.bincount(pair_node, weights=traj_success[pair_traj], minlength=num_nodes).astype(np.int64)
    node_n_revisit = np.bincount(pair_node, weights=pair_counts - 1, minlength=num_nodes).astype(np.int64)
    num_edges = len(edge_codes)
    epair = sorted_unique(batch.traj_ids * num_edges + row_edge)
    epair_traj, epair_edge = epair // max(num_edges, 1), epair % max(num_edges, 1)
    edge_n_traj = np.bincount(epair_edge, minlength=num_edges)
    edge_n_succ = np.bincount(epair_edge, weights=traj_success[epair_traj], minlength=num_edges).astype(np.int64)

    return TaskGraph(
        **vars(groups), row_src=row_src, row_dst=row_dst, row_edge=row_edge, node_task=node_task,
        node_row=node_row, state_keys=batch.state_keys, next_state_keys=batch.next_state_keys, is_goal=is_goal,
        is_start=is_start, edge_src=edge_src, edge_dst=edge_dst,
        node_n_traj=node_n_traj, node_n_succ=node_n_succ, node_n_revisit=node_n_revisit,
        edge_n_traj=edge_n_traj, edge_n_succ=edge_n_succ,
    )
