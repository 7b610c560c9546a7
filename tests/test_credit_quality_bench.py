"""The credit-quality benchmark's two regimes (``--state-key``) and its per-component breakdown."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's root: the benchmarks package

from benchmarks.credit import credit_quality  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


@pytest.fixture(scope="module")
def house_groups() -> credit_quality.Groups:
    return credit_quality.play_groups("house", n_tasks=6, group_size=4, seed=0)


def test_observation_keys_merge_true_states_the_truth_keeps_apart(house_groups):
    """House prints the same text in different world states: the paper's key merges them, while the
    truth (the env's own key) keeps them apart (and the text after a move differs from the text after
    a look in the same room: the paper's key splits states too); the rollouts, and so the rows, are
    the same."""
    truth, paper = house_groups.batch("env"), house_groups.batch("observation")
    np.testing.assert_array_equal(truth.actions, paper.actions)
    np.testing.assert_array_equal(truth.traj_ids, paper.traj_ids)
    true_states_per_text: dict[tuple[int, str], set[str]] = {}
    for task, text, state in zip(truth.task_ids, paper.state_keys, truth.state_keys):
        true_states_per_text.setdefault((int(task), text), set()).add(state)
    assert any(len(states) > 1 for states in true_states_per_text.values())
    scored = np.ones(truth.num_steps, dtype=bool)
    merged = credit_quality.key_statistics(truth.task_ids, truth.state_keys, paper.state_keys, scored)
    same = credit_quality.key_statistics(truth.task_ids, truth.state_keys, truth.state_keys, scored)
    assert merged["merged_steps"] > 0 and merged["split_steps"] > 0
    assert same["merged_steps"] == same["split_steps"] == 0 and same["states"] == same["true_states"]


def test_both_regimes_are_scored_against_the_same_truth():
    """One seed, both regimes: the pairs and their types are the true state's (one set for both),
    the env regime is the one-regime benchmark's result, and the keys change the credit."""
    row = credit_quality.score_env("house", n_tasks=12, group_size=8, seed=0, state_keys=("env", "observation"))
    alone = credit_quality.score_env("house", n_tasks=12, group_size=8, seed=0)
    assert row["pairs"] > 0 and sum(row["pair_types"].values()) == row["pairs"]
    assert row["regimes"]["env"]["methods"] == alone["regimes"]["env"]["methods"]
    env, observation = row["regimes"]["env"], row["regimes"]["observation"]
    assert env["breakdown"]["all (MileGPO vs GraphGPO)"]["all"]["pairs"] == row["pairs"]
    assert observation["breakdown"]["all (MileGPO vs GraphGPO)"]["all"]["pairs"] == row["pairs"]
    assert env["keys"]["merged_steps"] == 0 and observation["keys"]["merged_steps"] > 0
    assert env["methods"]["GraphGPO"] != observation["methods"]["GraphGPO"]
    # GRPO sees no states: its scores cannot depend on the key
    assert env["methods"]["GRPO"] == observation["methods"]["GRPO"]


def test_pair_types_by_hand():
    # steps 0-5 from one state; step 2 is a trap step, steps 0 and 3 of successful rollouts
    trap_steps = np.array([False, False, True, False, False, False])
    step_success = np.array([True, False, False, True, False, False])
    on_path = np.array([True, True, True, True, False, False])
    pairs = (np.array([0, 0, 1, 0, 4]), np.array([2, 1, 2, 3, 5]))
    types = credit_quality.pair_types(pairs, trap_steps, step_success, on_path)
    assert [credit_quality.STATE_TYPES[t] for t in types] == [
        "trap", "branching point", "trap", "successful path", "off path"]


def test_departures_count_and_add_up_by_hand():
    progress = np.array([1.0, 0.0, -1.0, 1.0, 0.0])
    pairs = (np.array([0, 0, 1, 3]), np.array([1, 2, 2, 4]))  # the truth: first step better in every pair
    types = np.array([0, 0, 1, 3])
    without = np.array([0.0, 1.0, 0.0, 0.0, 0.0])  # pair scores 0, 0.5, 1, 0.5
    with_it = np.array([2.0, 1.0, 3.0, 1.0, 0.0])  # pair scores 1, 0, 0, 1
    out = credit_quality.departures(with_it, without, progress, pairs, types)
    assert out["all"] == {"pairs": 4, "changed": 4, "toward": 2, "away": 2, "net": 0.0}
    assert out["successful path"] == {"pairs": 2, "changed": 2, "toward": 1, "away": 1, "net": 0.5}
    assert out["branching point"] == {"pairs": 1, "changed": 1, "toward": 0, "away": 1, "net": -1.0}
    assert out["trap"] == {"pairs": 0, "changed": 0, "toward": 0, "away": 0, "net": 0.0}
    assert out["off path"] == {"pairs": 1, "changed": 1, "toward": 1, "away": 0, "net": 0.5}
    for count in ("pairs", "changed", "toward", "net"):
        assert sum(out[kind][count] for kind in credit_quality.STATE_TYPES) == out["all"][count]
    # net / pairs is the difference of pairwise accuracy
    difference = (credit_quality.pairwise_accuracy(with_it, progress, pairs)
                  - credit_quality.pairwise_accuracy(without, progress, pairs))
    assert out["all"]["net"] / out["all"]["pairs"] == pytest.approx(difference)


def test_runs_of_both_groups_and_their_seeds_share_one_results_file(tmp_path):
    """Seeds filed one at a time, by runs of random and warm-start groups, end up in one OUT.json
    (a seed filed again replaces its row); the Markdown has the MileGPO − GraphGPO table of both
    regimes and the breakdown for each run."""
    out = tmp_path / "regimes"
    rows = [{**credit_quality.score_env("house", n_tasks=20, group_size=8, seed=s, state_keys=("env", "observation")),
             "group_size": 8, "wall_s": 1.0} for s in (1, 0)]
    for label, groups in (("random", "random-policy groups"), ("warm_start", "warm groups")):
        run = {"groups": groups, "policy": "p", "epsilon": 1.0, "warm_start": label == "warm_start",
               "group_size": 8, "state_keys": ["env", "observation"]}
        for row in (*rows, rows[0]):
            credit_quality.save_seed(out, label, run, "house", row)
    data = json.loads(out.with_suffix(".json").read_text())
    assert set(data["runs"]) == {"random", "warm_start"}
    entry = data["runs"]["random"]["envs"]["house"]
    assert entry["seeds"] == [0, 1] and entry["wall_s"] == 2.0
    text = out.with_suffix(".md").read_text()
    assert text.count("### MileGPO − GraphGPO") == 2
    assert "| house | observation |" in text and "| trap penalty | observation |" in text
    summary = entry["regimes"]["observation"]
    low, high = summary["methods"]["MileGPO"]["pairwise_accuracy"]["vs_graphgpo_ci95"]
    assert low <= summary["methods"]["MileGPO"]["pairwise_accuracy"]["vs_graphgpo_mean"] <= high
    total = summary["breakdown"]["PCC"]["all"]
    assert total["pairs"] == sum(r["pairs"] for r in rows)
    assert total["changed"] == total["toward"] + total["away"]


def test_the_one_regime_results_files_still_tabulate(tmp_path):
    """``--tables-only`` on a results file of the layout before ``--state-key``."""
    data = json.loads((RESULTS / "credit_quality_warm_start.json").read_text())
    credit_quality.write_tables(data, tmp_path / "t.md")
    text = (tmp_path / "t.md").read_text()
    assert "groups sampled from the warm-started policy" in text and "| MileGPO |" in text
    assert "### MileGPO − GraphGPO" not in text  # one regime: no regime table
