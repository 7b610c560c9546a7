"""The benchmark scripts' own logic: paired CIs, curve areas, ground-truth trackers, one small run."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's root: the benchmarks package

from benchmarks.credit import credit_quality, ground_truth  # noqa: E402
from benchmarks.learning import learning_efficiency  # noqa: E402


def test_paired_difference_by_hand():
    # Differences 1, 2, 3: mean 2, sd 1, t(0.975, 2 df) = 4.303 -> half-width 4.303 / sqrt(3).
    d = learning_efficiency.paired_difference([2, 4, 6], [1, 2, 3])
    assert d["mean"] == pytest.approx(2.0)
    assert d["ci95"] == pytest.approx([2 - 4.303 / np.sqrt(3), 2 + 4.303 / np.sqrt(3)])
    assert (d["n"], d["wins"], d["losses"]) == (3, 3, 0)


def test_area_under_curve_holds_the_last_point_to_the_budget():
    curve = [{"num_timesteps": 0, "success_rate": 0.0}, {"num_timesteps": 50, "success_rate": 1.0}]
    # Trapezoid 0..50 (area 25) + flat 1.0 over 50..100 (area 50) = 75 / 100.
    assert learning_efficiency.area_under_curve(curve, 100) == pytest.approx(0.75)


def test_pairwise_metrics_by_hand():
    progress = np.array([1.0, -1.0, 0.0])
    pairs = (np.array([0, 0]), np.array([1, 2]))
    right = np.array([2.0, -1.0, 0.0])  # orders both pairs right
    assert credit_quality.pairwise_accuracy(right, progress, pairs) == 1.0
    assert credit_quality.weighted_agreement(right, progress, pairs) == pytest.approx(1.0)
    tied = np.zeros(3)
    assert credit_quality.pairwise_accuracy(tied, progress, pairs) == 0.5


@pytest.mark.parametrize("name,tasks", [("coin", 4), ("webshop", 15), ("house", 4)])
def test_ground_truth_distance_is_consistent_along_random_walks(name, tasks):
    """One step can gain at most one step of distance; a win is distance 0 and only a win is."""
    env, factory = ground_truth.make(name)
    rng = random.Random(0)
    for task in range(tasks):
        tracker = factory(env, task)
        for _ in range(3):
            _, info = env.reset(seed=task)
            tracker.observe(None, info)
            d, done = tracker.distance(info), False
            assert d is not None and d > 0
            while not done:
                action = rng.choice(info["admissible_commands"])
                _, _, terminated, truncated, info = env.step(action)
                tracker.observe(action, info)
                done = terminated or truncated
                d_next = tracker.distance(info)
                if d_next is not None and d is not None:
                    assert d_next >= d - 1, (action, d, d_next)
                assert (d_next == 0) == bool(info.get("won"))
                d = d_next


def test_a_coin_tracker_reused_across_episodes_gives_a_fresh_trackers_distances():
    """Doors opened in one episode of a task are closed again at the next reset: a tracker that followed
    earlier episodes must give every step of a new one the distance a fresh tracker gives."""
    env, factory = ground_truth.make("coin")
    rng = random.Random(1)
    for task in range(4):
        reused = factory(env, task)
        for episode in range(3):
            actions, done = [], False
            _, info = env.reset(seed=task)
            reused.observe(None, info)
            seen = [reused.distance(info)]
            while not done:
                doors = [a for a in info["admissible_commands"] if a.startswith("open door")]
                action = rng.choice(doors if doors and rng.random() < 0.5 else info["admissible_commands"])
                _, _, terminated, truncated, info = env.step(action)
                reused.observe(action, info)
                actions.append(action)
                seen.append(reused.distance(info))
                done = terminated or truncated
            fresh = factory(env, task)
            _, info = env.reset(seed=task)
            fresh.observe(None, info)
            want = [fresh.distance(info)]
            for action in actions:
                _, _, _, _, info = env.step(action)
                fresh.observe(action, info)
                want.append(fresh.distance(info))
            assert seen == want, (task, episode)


def test_coin_distance_at_the_start_is_at_most_the_gold_path():
    env, factory = ground_truth.make("coin")
    gold_env = ground_truth.make_env(ground_truth.ENVS["coin"][0], gold_path=True, **ground_truth.ENVS["coin"][1])
    for task in range(5):
        _, gold = gold_env.reset(seed=task)
        _, info = env.reset(seed=task)
        tracker = factory(env, task)
        _, info = env.reset(seed=task)
        tracker.observe(None, info)
        useful = [a for a in gold["gold_actions"] if a != "look around"]
        assert 1 <= tracker.distance(info) <= len(useful)


def test_the_scripted_experts_never_lose_ground():
    """Expert-only groups (epsilon 0) win every rollout. House's BFS expert gains one step of d*
    with every step; the coin expert (upstream's gold path, independent of the coin tracker's
    explored map) never loses any, but its way round is not always the shortest."""
    groups = credit_quality.play_groups("house", n_tasks=6, group_size=2, seed=0,
                                        actor=credit_quality.mixture_actor(0.0))
    assert all(groups.success)
    np.testing.assert_array_equal(groups.dist - groups.next_dist, np.ones_like(groups.dist))
    groups = credit_quality.play_groups("coin", n_tasks=6, group_size=2, seed=0,
                                        actor=credit_quality.mixture_actor(0.0))
    assert all(groups.success)
    assert set(groups.dist - groups.next_dist) <= {0.0, 1.0}


def test_a_small_learning_run_is_recorded_and_tabulated(tmp_path):
    """The learning benchmark's pipeline on WebShop: short GraphGPO, MileGPO and opt-in variant runs."""
    shared = json.loads((Path(learning_efficiency.ROOT) / "learning_efficiency.json").read_text())
    runs = []
    for name in ("graphgpo", "milegpo", "milegpo_success_only"):
        config = learning_efficiency.job_config(name, {
            **shared, **learning_efficiency.ENVS["webshop"], "run.seed": 0, "run.total_timesteps": 100,
            "env.n_tasks": 2, "env.group_size": 4, "eval.n_tasks": 3, "eval.copies": 1, "eval.freq": 1})
        runs.append(learning_efficiency.run_one({"env": "webshop", "name": name, "config": config,
                                                 "run_dir": str(tmp_path / name)}))
    graph_config = json.loads((tmp_path / "graphgpo" / "config.json").read_text())
    variant_config = json.loads((tmp_path / "milegpo_success_only" / "config.json").read_text())
    assert graph_config["algo"]["credit_preset"] is None
    variant = variant_config["algo"]
    assert variant["method"] == "milegpo" and variant["credit_preset"] == "webshop"
    assert variant["credit_kwargs"] == {"shape_failed_tasks": False}
    run = runs[1]
    assert [r["algo"] for r in runs] == ["graphgpo", "milegpo", "milegpo_success_only"]
    assert run["curve"][0]["num_timesteps"] == 0 and run["curve"][-1]["num_timesteps"] >= 100
    assert set(run["final"]) == {"eval"} and set(run["final_score"]) == {"eval"} and run["budget"] == 100
    runs += [{**r, "seed": 1} for r in runs]  # a second seed, so the paired differences have a CI
    table = learning_efficiency.summarize(runs)
    diff = table["webshop"]["milegpo_minus"]["graphgpo"]["final eval"]
    assert diff["n"] == 2 and diff["mean"] == pytest.approx(run["final"]["eval"] - runs[0]["final"]["eval"])
    assert table["webshop"]["milegpo_minus"]["milegpo_success_only"]["auc"]["n"] == 2
    learning_efficiency.write_table(table, tmp_path / "table.md")
    text = (tmp_path / "table.md").read_text()
    assert "MileGPO −" in text and "no shaping without a success (ours)" in text


def test_why_milegpo_reads_the_memorys_learning_runs_and_names_its_learning_groups(tmp_path, monkeypatch):
    """The memory's learning rows are the learning table's variant differences, as recorded; its credit rows
    over a learning policy's groups say so (not "random policy")."""
    from benchmarks.credit import memory_quality, why_milegpo

    diff = {"mean": 0.01, "ci95": [-0.02, 0.04], "n": 5, "wins": 3, "losses": 2}
    table = {"webshop": {"milegpo_minus": {}, "variant_minus": {"milegpo_memory": {"graphgpo": {"auc": diff}}}}}
    (tmp_path / "learning_efficiency_warm_start.json").write_text(json.dumps({"table": table}))
    monkeypatch.setattr(why_milegpo, "RESULTS", tmp_path)
    assert why_milegpo.memory_learning_comparisons("graphgpo") == [why_milegpo.Comparison(
        "webshop", "env keys", "warm start", "learning", "success AUC", 0.01, -0.02, 0.04, 5)]
    assert why_milegpo.memory_learning_comparisons("milegpo") == []

    def row(memory: float) -> dict:
        scores = {"pairwise_accuracy": 0.5, "weighted_agreement": 0.5, "accuracy_unsolved": 0.5}
        label = "memory h=2"
        return {"pairs": 10, "regimes": {"env": {
            "methods": {"GraphGPO": scores, "MileGPO": scores, label: {**scores, "pairwise_accuracy": memory}},
            "memory": {label: {"recurrence_rate": 0.3, "evidence_share_mean": 0.1, "bytes_per_task": 1.0}}}}}

    stage = {"setting": "", "envs": {"alfworld": {str(s): row(0.52 + 0.001 * s) for s in range(3)}}}
    data = {"stages": {"tuning": stage, "heldout-learning-warm-start": stage}}
    (tmp_path / "memory_quality.json").write_text(json.dumps(data))
    rows = why_milegpo.memory_comparisons("milegpo")
    assert {r.start for r in rows} == {"random policy, sequence (tuning)", "learning policy's groups, warm start"}
    accuracy = [r for r in rows if r.metric == "pairwise accuracy"]
    assert all(r.mean == pytest.approx(0.021) and r.verdict == "ahead" for r in accuracy)
    assert memory_quality.LEARNING_STAGES["heldout-learning-warm-start"] == "warm start"
    groups = why_milegpo.learning_group_comparisons()  # MileGPO − GraphGPO over the learning stage only
    assert {(r.start, r.metric, r.mean) for r in groups} == {
        ("learning policy's groups, warm start", "pairwise accuracy", 0.0),
        ("learning policy's groups, warm start", "weighted agreement", 0.0)}


def test_a_run_filed_twice_stops_the_table_naming_it(tmp_path):
    runs = tmp_path / "out.runs.jsonl"
    row = {"env": "house", "algo": "milegpo", "seed": 0}
    runs.write_text(json.dumps(row) + "\n" + json.dumps({**row, "seed": 1}) + "\n")
    assert len(learning_efficiency.read_runs(runs)) == 2
    runs.write_text(runs.read_text() + json.dumps(row) + "\n")
    with pytest.raises(SystemExit, match=r"filed more than once.*\('house', 'milegpo', 0\)"):
        learning_efficiency.read_runs(runs)
