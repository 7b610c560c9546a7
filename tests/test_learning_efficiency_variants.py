"""The learning benchmark's opt-in variants: paired against MileGPO and GraphGPO, counted ahead/level/behind,
with the milestone memory's diagnostics read from each run's progress.csv."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's root: the benchmarks package

from benchmarks.learning import learning_efficiency  # noqa: E402


def fake_run(algo: str, seed: int, final: float, memory: dict | None = None) -> dict:
    """A finished run as OUT.runs.jsonl holds it (ALFWorld's splits), its curve flat at ``final``."""
    run = {"env": "alfworld", "algo": algo, "seed": seed, "budget": 100,
           "curve": [{"num_timesteps": 0, "success_rate": final}, {"num_timesteps": 100, "success_rate": final}],
           "final": {"eval_id": final, "eval_ood": final}}
    return {**run, "memory": memory} if memory else run


def test_the_memory_variant_runs_milegpo_with_the_chosen_half_life() -> None:
    config = learning_efficiency.job_config("milegpo_memory", {"algo.credit_preset": "alfworld"})
    assert config["algo.method"] == "milegpo" and config["algo.credit_preset"] == "alfworld"
    assert config["algo.credit_kwargs"] == {"memory_half_life": 2}


def test_a_variant_is_paired_with_milegpo_and_graphgpo_and_counted(tmp_path: Path) -> None:
    memory = {"memory_recurrence_rate": 0.25, "memory_recurring_frac": 0.2, "memory_evidence_share": 0.1,
              "memory_tasks": 12.0, "memory_bytes": 2e6}
    runs = [fake_run("milegpo", s, 0.2 + 0.01 * s) for s in range(3)]
    runs += [fake_run("graphgpo", s, 0.4 + 0.02 * s) for s in range(3)]
    runs += [fake_run("milegpo_memory", s, 0.2 + 0.01 * s + [0.0, 0.01, -0.01][s], memory) for s in range(3)]
    entry = learning_efficiency.summarize(runs)["alfworld"]
    against = entry["variant_minus"]["milegpo_memory"]
    assert set(against) == {"milegpo", "graphgpo"}
    assert against["milegpo"]["auc"]["mean"] == pytest.approx(0.0) and against["milegpo"]["auc"]["n"] == 3
    assert learning_efficiency.verdict(against["milegpo"]["auc"]) == "level"
    assert learning_efficiency.verdict(against["graphgpo"]["final eval_id"]) == "behind"  # -0.2 +- 0.0x
    assert entry["memory"]["milegpo_memory"]["memory_recurrence_rate"] == {"mean": 0.25, "min": 0.25, "max": 0.25,
                                                                           "n": 3}
    assert "milegpo" not in entry["memory"]  # MileGPO's runs have no memory
    learning_efficiency.write_table(learning_efficiency.summarize(runs), tmp_path / "table.md")
    text = (tmp_path / "table.md").read_text()
    assert "against MileGPO and GraphGPO: ahead in 0, level in 3, behind in 3 of 6" in text
    assert "the share the memory held) 0.250 [0.250, 0.250]" in text and "(MB) 2.00 [2.00, 2.00]" in text
    assert learning_efficiency.write_variant_table(learning_efficiency.summarize(runs), tmp_path / "variants.md")
    alone = (tmp_path / "variants.md").read_text()
    assert alone.startswith("**alfworld**") and "ahead in 0, level in 3, behind in 3 of 6" in alone
    assert "| MileGPO − |" not in alone and "| algorithm | seeds |" not in alone
    without = [r for r in runs if r["algo"] != "milegpo_memory"]
    assert not learning_efficiency.write_variant_table(learning_efficiency.summarize(without), tmp_path / "none.md")
    assert not (tmp_path / "none.md").exists()


def test_the_memory_diagnostics_are_read_from_progress_csv(tmp_path: Path) -> None:
    progress = tmp_path / "progress.csv"
    progress.write_text("time/iterations,credit/memory_recurrence_rate,credit/memory_recurring_frac,"
                        "credit/memory_evidence_share,credit/memory_tasks,credit/memory_bytes\n"
                        "1,0.0,0.0,0.0,4,1000\n2,0.125,0.25,0.5,7,3000\n3,,,,,\n4,0.25,0.5,0.25,6,2000\n")
    assert learning_efficiency._memory_stats(progress) == {
        "memory_recurrence_rate": 0.25, "memory_recurring_frac": pytest.approx(0.25),
        "memory_evidence_share": pytest.approx(0.25), "memory_tasks": 7.0, "memory_bytes": 3000.0}
    (tmp_path / "plain.csv").write_text("time/iterations,credit/adv_mean\n1,0.0\n")
    assert learning_efficiency._memory_stats(tmp_path / "plain.csv") == {}
