"""The progress line states what the iteration's held-out evaluations cost."""

from __future__ import annotations

import io

from milegpo.algos.console import IterationLineFormat


def line(values: dict) -> str:
    stream = io.StringIO()
    IterationLineFormat(stream).write(values, {})
    return stream.getvalue().strip()


def test_the_line_adds_the_evaluations_seconds():
    row = {"time/iterations": 5, "time/total_timesteps": 4800, "rollout/success_rate": 0.25, "train/loss": 0.01,
           "time/rollout_s": 1.0, "time/credit_s": 0.1, "time/update_s": 0.9,
           "eval/eval_id/success_rate": 0.1, "eval/eval_ood/success_rate": 0.0,
           "time/eval/eval_id_s": 0.7, "time/eval/eval_ood_s": 0.8}
    text = line(row)
    assert text.endswith("| 2.0 s | eval 1.5 s"), text
    del row["time/eval/eval_id_s"], row["time/eval/eval_ood_s"]
    assert "eval " not in line(row).split("| 2.0 s")[-1]  # no evaluation in this iteration


def test_the_untrained_policys_row_shows_its_evaluation():
    text = line({"time/iterations": 0, "time/total_timesteps": 0, "eval/success_rate": 0.03, "time/eval_s": 1.25})
    assert text.endswith("held-out 0.030 | eval 1.2 s") or text.endswith("held-out 0.030 | eval 1.3 s"), text
