"""The graph build's faster parts give exactly what they replaced, and so does every credit method.

References kept here: ``numpy.unique`` for the task ids and the (task, key) node codes, ``numpy.lexsort``
for the trajectory order, the Python ``setdefault`` loop for string interning. Random groups cover
rows in trajectory order and shuffled, keys shared by several tasks (an observation such as "Nothing
happens." in two games), sparse and huge task ids, next states that do not follow, revisits, tasks
with and without a success.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from milegpo.credit import CREDIT_METHODS, StepBatch, build_task_graph, compute_credit
from milegpo.credit import gigpo as gigpo_module
from milegpo.credit import graph as graph_module
from milegpo.credit import hgpo as hgpo_module
from milegpo.credit import norm as norm_module
from milegpo.credit.base import sign_flip_fraction
from milegpo.credit.graph import dense_ids, index_strings, node_index, trajectory_order
from milegpo.credit.task_graph import GOAL_KEY


def previous_index_strings(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    ids: dict[object, int] = {}
    return tuple(np.fromiter((ids.setdefault(k, len(ids)) for k in a), dtype=np.int64, count=len(a))
                 for a in arrays)


def previous_dense_ids(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    unique, inverse = np.unique(values, return_inverse=True)
    return unique, inverse.astype(np.int64).reshape(-1)


def previous_node_index(row_task: np.ndarray, keys: np.ndarray, n_keys: int, goal_id: int
                        ) -> tuple[np.ndarray, np.ndarray]:
    unique, inverse = np.unique(row_task * n_keys + keys, return_inverse=True)
    return unique, inverse.astype(np.int64).reshape(-1)


def previous_trajectory_order(batch: StepBatch) -> np.ndarray:
    order = np.lexsort((batch.step_idx, batch.traj_ids))
    t, s = batch.traj_ids[order], batch.step_idx[order]
    if len(order) > 1 and np.any((t[1:] == t[:-1]) & (s[1:] == s[:-1])):
        raise ValueError("StepBatch has two rows for one trajectory step")
    return order


def previous_unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    unique, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    return unique, inverse.astype(np.int64).reshape(-1), counts


def previous_first_seen_ids(codes: np.ndarray) -> np.ndarray:
    unique, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
    rank = np.empty(len(unique), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(unique))
    return rank[inverse.reshape(-1)]


def previous_sorted_unique(values: np.ndarray) -> np.ndarray:
    return np.unique(values)


def random_batch(rng: np.random.Generator, shuffled: bool) -> StepBatch:
    """Walks over a few states per task, some keys shared by every task, task ids sparse or huge."""
    tasks, group = int(rng.integers(1, 5)), int(rng.integers(1, 6))
    task_values = rng.choice([0, 3, 17, 10**12], size=tasks, replace=False) if rng.random() < 0.3 else \
        np.sort(rng.choice(50, size=tasks, replace=False))
    n_states = int(rng.integers(1, 6))
    rows: dict[str, list[Any]] = {k: [] for k in ("task", "traj", "step", "src", "dst", "action", "reward")}
    success = []
    for q in range(tasks):
        for k in range(group):
            length = int(rng.integers(1, 9))
            states = [("Nothing happens." if rng.random() < 0.2 else f"task {q} room {s}")
                      for s in rng.integers(0, n_states, length + 1)]
            for t in range(length):
                nxt = f"elsewhere {rng.integers(3)}" if rng.random() < 0.1 else states[t + 1]
                for name, value in (("task", int(task_values[q])), ("traj", q * group + k), ("step", t),
                                    ("src", states[t]), ("dst", nxt), ("action", f"do {rng.integers(3)}"),
                                    ("reward", float(rng.choice([0.0, -0.1, 1.0])))):
                    rows[name].append(value)
            success.append(bool(rng.random() < 0.5))
    n = len(rows["task"])
    perm = rng.permutation(n) if shuffled else np.arange(n)
    col = {name: np.asarray(values, dtype=object if name in ("src", "dst", "action") else None)[perm]
           for name, values in rows.items()}
    dones = np.r_[col["traj"][1:] != col["traj"][:-1], True] if not shuffled else np.zeros(n, bool)
    outcomes = np.bincount(col["traj"].astype(np.int64), weights=col["reward"].astype(float),
                           minlength=tasks * group)
    return StepBatch(task_ids=col["task"], traj_ids=col["traj"], step_idx=col["step"], state_keys=col["src"],
                     next_state_keys=col["dst"], actions=col["action"], rewards=col["reward"],
                     valid=rng.random(n) < 0.9, dones=dones, outcomes=outcomes, success=np.asarray(success))


@pytest.mark.parametrize("seed", range(10))
def test_the_parts_equal_their_references(seed):
    rng = np.random.default_rng(seed)
    words = np.array([f"w{i}" for i in rng.integers(0, 8, 40)] + ["Nothing happens."] * 3, dtype=object)
    arrays = (words[rng.permutation(len(words))], words[: int(rng.integers(0, 10))], np.zeros(0, dtype=object))
    for got, want in zip(index_strings(*arrays), previous_index_strings(*arrays)):
        np.testing.assert_array_equal(got, want)
    for values in (rng.integers(-5, 40, 30), rng.integers(0, 10**15, 20), np.zeros(0, np.int64),
                   np.full(7, 3, np.int64)):
        for got, want in zip(dense_ids(values), previous_dense_ids(values)):
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)
    n_keys = int(rng.integers(2, 12))
    keys = rng.integers(0, n_keys, 50)
    keys[rng.random(50) < 0.2] = n_keys - 1  # the goal key, one node per task
    row_task = rng.integers(0, 4, 50)
    for got, want in zip(node_index(row_task, keys, n_keys, n_keys - 1),
                         previous_node_index(row_task, keys, n_keys, n_keys - 1)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shuffled", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_trajectory_order_equals_the_sort(seed, shuffled):
    batch = random_batch(np.random.default_rng(seed), shuffled)
    np.testing.assert_array_equal(trajectory_order(batch), previous_trajectory_order(batch))


def test_a_repeated_step_is_refused_in_order_too():
    batch = StepBatch.from_trajectories([["a", "b", "c"]], success=[False])
    batch.step_idx[1] = 0
    with pytest.raises(ValueError, match="two rows"):
        trajectory_order(batch)


def results(batch: StepBatch) -> dict[str, Any]:
    graph = build_task_graph(batch)
    fields = {name: value for name, value in vars(graph).items() if not name.startswith("_")}
    return {"graph": fields, "graph_distances": (graph.dist_to_goal, graph.reaches_goal),
            **{method: compute_credit(method, batch) for method in CREDIT_METHODS}}


def assert_same(got: Any, want: Any) -> None:
    if isinstance(want, dict):
        assert got.keys() == want.keys()
        for key in want:
            assert_same(got[key], want[key])
    elif isinstance(want, tuple):
        for g, w in zip(got, want):
            assert_same(g, w)
    elif isinstance(want, np.ndarray):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    elif hasattr(want, "advantages"):
        assert_same((got.advantages, got.components, got.diagnostics), (want.advantages, want.components,
                                                                         want.diagnostics))
    else:
        assert got == want or (got != got and want != want)  # NaN equals NaN here


@pytest.mark.parametrize("shuffled", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_every_method_gives_what_the_previous_build_gave(seed, shuffled, monkeypatch):
    batch = random_batch(np.random.default_rng(100 + seed), shuffled)
    now = results(batch)
    for module in (graph_module, gigpo_module, hgpo_module):
        monkeypatch.setattr(module, "trajectory_order", previous_trajectory_order)
    monkeypatch.setattr(graph_module, "dense_ids", previous_dense_ids)
    monkeypatch.setattr(graph_module, "node_index", previous_node_index)
    monkeypatch.setattr(graph_module, "index_strings", previous_index_strings)
    monkeypatch.setattr(graph_module, "unique_inverse", previous_unique_inverse)
    monkeypatch.setattr(graph_module, "sorted_unique", previous_sorted_unique)
    monkeypatch.setattr(hgpo_module, "_first_seen_ids", previous_first_seen_ids)
    assert_same(now, results(batch))


def node_names(graph: Any) -> np.ndarray:
    """(V,) each node as its (task, key): what a node is, whatever its number."""
    return np.array([f"{task}|{key}" for task, key in zip(graph.node_task, graph.node_key)], dtype=object)


@pytest.mark.parametrize("shuffled", [False, True])
@pytest.mark.parametrize("seed", range(10))
def test_interning_in_runs_of_tasks_builds_the_same_graph_and_credit(seed, shuffled, monkeypatch):
    """Keys interned in runs of a few tasks (each with its own dictionary, as for batches of more than
    ``INTERN_CHUNK_ENTRIES`` rows) give the graph of one dictionary up to the numbering of nodes within
    a task, and every method the same credit."""
    rng = np.random.default_rng(300 + seed)
    batch = random_batch(rng, shuffled)
    one_run = results(batch)
    monkeypatch.setattr(graph_module, "INTERN_CHUNK_ENTRIES", int(rng.integers(1, 12)))
    in_runs = results(batch)
    for method in CREDIT_METHODS:
        assert_same(in_runs[method], one_run[method])
    got, want = in_runs["graph"], one_run["graph"]
    names_got = node_names(build_task_graph(batch))
    monkeypatch.setattr(graph_module, "INTERN_CHUNK_ENTRIES", 1 << 15)
    names_want = node_names(build_task_graph(batch))
    assert sorted(names_got) == sorted(names_want)
    for column in ("row_src", "row_dst"):
        np.testing.assert_array_equal(names_got[got[column]], names_want[want[column]])
    relabel = {name: i for i, name in enumerate(names_want)}
    node = np.array([relabel[name] for name in names_got])  # node of ``got`` -> node of ``want``
    for column in ("node_n_traj", "node_n_succ", "node_n_revisit", "is_goal", "is_start", "node_task"):
        np.testing.assert_array_equal(got[column], want[column][node])
    edges_got = sorted(zip(node[got["edge_src"]], node[got["edge_dst"]], got["edge_n_traj"], got["edge_n_succ"]))
    assert edges_got == sorted(zip(want["edge_src"], want["edge_dst"], want["edge_n_traj"], want["edge_n_succ"]))
    dist_got, dist_want = in_runs["graph_distances"], one_run["graph_distances"]
    np.testing.assert_array_equal(dist_got[0], dist_want[0][node])


@pytest.mark.parametrize("seed", range(10))
def test_a_graph_built_in_runs_of_tasks_equals_the_one_piece_build(seed, monkeypatch):
    """A batch in trajectory order and grouped by task, of more than ``INTERN_CHUNK_ENTRIES`` rows, is
    built run by run and joined: array for array the graph of the one-piece build, node keys included."""
    rng = np.random.default_rng(500 + seed)
    batch = StepBatch.concat([random_batch(rng, shuffled=False) for _ in range(4)], task_offsets=[0, 100, 200, 300])
    run_of_task = np.cumsum(np.r_[0, batch.task_ids[1:] != batch.task_ids[:-1]])  # tasks numbered in row order
    batch = dataclasses.replace(batch, task_ids=run_of_task)
    monkeypatch.setattr(graph_module, "INTERN_CHUNK_ENTRIES", 1 + seed % 2)  # 4 tasks or more: 2 runs or more
    joined = build_task_graph(batch)
    assert len(graph_module.task_runs(joined.row_task)) > 1  # the batch was built in runs
    whole = graph_module._whole_graph(batch, batch.success, graph_module.build_task_groups(batch),
                                      trajectory_order(batch))
    for field in dataclasses.fields(whole):
        got, want = getattr(joined, field.name), getattr(whole, field.name)
        assert np.asarray(got).dtype == np.asarray(want).dtype, field.name
        np.testing.assert_array_equal(got, want, err_msg=field.name)
    assert joined.node_key.tolist() == whole.node_key.tolist()
    assert set(joined.node_key[joined.is_goal]) == {GOAL_KEY}
    np.testing.assert_array_equal(joined.node_key[joined.row_src], batch.state_keys)
    nodes = rng.permutation(joined.num_nodes)[:5]
    assert joined.keys_of(nodes).tolist() == joined.node_key[nodes].tolist()


@pytest.mark.parametrize("seed", range(8))
def test_keys_interned_by_task_are_equal_exactly_when_key_and_task_are(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 60))
    keys = np.array([f"k{i}" for i in rng.integers(0, 6, n)], dtype=object)
    task = rng.integers(0, 5, n)
    if seed % 2:
        task = np.sort(task)  # grouped by task: read as slices
    np.testing.assert_array_equal(graph_module.index_strings_by_task(keys, task), index_strings(keys)[0])
    monkeypatch.setattr(graph_module, "INTERN_CHUNK_ENTRIES", int(rng.integers(1, 9)))
    ids = graph_module.index_strings_by_task(keys, task)
    same_key, same_task = keys[:, None] == keys[None, :], task[:, None] == task[None, :]
    same_id = ids[:, None] == ids[None, :]
    np.testing.assert_array_equal(same_id & same_task, same_key & same_task)


@pytest.mark.parametrize("seed", range(6))
def test_first_rows_are_numpy_unique_first_indices(seed):
    from milegpo.credit.diagnostics import first_rows

    rng = np.random.default_rng(seed)
    for codes in (rng.integers(0, 7, 50), rng.integers(0, 10**13, 20), np.zeros(0, np.int64), np.full(5, 2)):
        np.testing.assert_array_equal(first_rows(codes), np.unique(codes, return_index=True)[1])


@pytest.mark.parametrize("seed", range(6))
def test_first_seen_ids_by_table_equal_the_sort(seed):
    rng = np.random.default_rng(seed)
    for codes in (rng.integers(0, 20, 60), rng.integers(-3, 3, 9), rng.integers(0, 10**13, 40), np.arange(5),
                  rng.permutation(rng.integers(0, 10**13, 5).repeat(3)), np.zeros(0, np.int64)):
        np.testing.assert_array_equal(hgpo_module._first_seen_ids(codes), previous_first_seen_ids(codes))


@pytest.mark.parametrize("seed", range(6))
def test_unique_inverse_is_numpy_unique(seed):
    rng = np.random.default_rng(seed)
    for values in (rng.integers(-5, 5, 40), rng.integers(0, 10**13, 30), np.zeros(0, np.int64), np.arange(4)):
        got = graph_module.unique_inverse(values)
        want = np.unique(values, return_inverse=True, return_counts=True)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w.reshape(-1))
        assert got[1].dtype == np.int64


@pytest.mark.parametrize("seed", range(40))
def test_normalising_span_by_span_gives_the_whole_batch_result_to_the_bit(seed, monkeypatch):
    """Groups numbered task by task (mostly), sometimes shuffled or with a group spread over the batch:
    every span boundary ``group_spans`` returns separates the ids, and ``group_normalize`` over those
    spans equals one pass over all rows (``_normalize``, the previous function unchanged), bit for bit."""
    rng = np.random.default_rng(seed)
    blocks, base = [], 0
    for _ in range(int(rng.integers(1, 12))):
        blocks.append(rng.integers(0, 6, int(rng.integers(1, 40))) + base)
        base += 6 if rng.random() < 0.8 else 0  # else the next block shares this one's ids
    ids = np.concatenate(blocks)
    if seed % 5 == 0:
        ids = rng.permutation(ids)
    if seed % 7 == 0:
        ids[rng.integers(len(ids))] = ids.max() + 1  # one group's row far from the others
        ids[0] = ids.max()
    rows = int(rng.integers(1, 10))
    cuts = norm_module.group_spans(ids, rows)
    valid = [i for i in range(1, len(ids)) if ids[:i].max() < ids[i:].min()]  # where no group is cut
    want_cuts = sorted({min(i for i in valid if i // rows == block) for block in {i // rows for i in valid}
                        if block >= 1}) if len(ids) > 2 * rows else []  # the first of each block of rows
    assert cuts.tolist() == [0, *want_cuts, len(ids)]
    _, dense = np.unique(ids, return_inverse=True)
    x = rng.normal(size=len(ids)) * rng.choice([0.0, 1.0, 1e6], size=len(ids))
    monkeypatch.setattr(norm_module, "NORMALIZE_CHUNK_ROWS", rows)
    for norm, ddof in (("mean_std_norm", 1), ("mean_std_norm", 0), ("mean_norm", 1)):
        got = norm_module.group_normalize(x, dense, int(dense.max()) + 1, norm, 1e-6, ddof)
        want = norm_module._normalize(x, dense, int(dense.max()) + 1, norm, 1e-6, ddof)
        np.testing.assert_array_equal(got, want)


def previous_sign_flip_fraction(advantages: np.ndarray, episode: np.ndarray) -> float:
    mask = episode != 0
    if not mask.any():
        return 0.0
    return float(np.mean(np.sign(advantages[mask]) != np.sign(episode[mask])))


@pytest.mark.parametrize("seed", range(10))
def test_sign_flips_counted_without_gathering_equal_the_previous_share(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 2000))
    advantages = rng.normal(size=n) * (rng.random(n) < 0.7)  # zero advantages count as flipped
    episode = rng.normal(size=n) * (rng.random(n) < rng.random())
    if seed == 0:
        episode[:] = 0.0
    assert sign_flip_fraction(advantages, episode) == previous_sign_flip_fraction(advantages, episode)
