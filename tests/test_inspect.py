"""``milegpo inspect``'s data, file handling and HTML, on hand-made run folders (no browser: the
browser tests are tests/test_inspect_browser.py, kill/resume tests/test_inspect_resume.py).

The report's numbers are checked against the credit functions themselves: its graph is
``build_task_graph`` of the kept batch, group by group, its milestones ``milestone_evidence`` and its
advantages ``compute_credit`` under the run's config, to the last bit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from milegpo.algos.run_outputs import keep_batch, observation_table
from milegpo.cli import main
from milegpo.config.run import TrainConfig
from milegpo.credit import (
    CREDIT_METHODS,
    MileGPOConfig,
    StepBatch,
    build_task_graph,
    compute_credit,
    make_credit_config,
    milestone_evidence,
)
from milegpo.credit.batch import load_step_batch, save_step_batch
from milegpo.envs import make_env
from milegpo.inspect import report_data, write_report
from milegpo.inspect.html import json_block, render_report
from milegpo.inspect.runfiles import kept_iterations, learning_curve
from milegpo.run.logs import rollback_logs

VENDOR = Path(__file__).resolve().parents[1] / "milegpo" / "inspect" / "vendor"
VENDOR_SHA256 = {
    "cytoscape.min.js": "71fa9ebec21a7ca2c40cff6aacc30d1f6464e363662ad4b2c197e1adc770cd94",
    "uPlot.iife.min.js": "19c8d4c6ad88929a79f4ae49d6f7161566dfd0ba3d15cc495e974f787eb78f1f",
    "uPlot.min.css": "df630c6a8d6f8eeaff264b50f73ce5b114f646ffd9a0bb74f049b0a00135fa04",
}

#: per state key the observation text a step sees there; "c" and "d" print the same text (one state,
#: two keys), and the second visit of "a" in trajectory 1 prints another text (two states, one key)
TEXTS = {"s0": "you stand at the gate.", "a": "a hall with a lamp.", "b": "a bright room.", "c": "a dark corridor.",
         "d": "a dark corridor.", "win": "you won.", "t0": "a cellar.", "t1": "a well."}
OTHER_A = "a hall, the lamp is out."


def hand_batch() -> StepBatch:
    """Task 0: two successes (through the milestone "b"; "d" beats "a" from the start) and two failures
    (both through the trap "c"); task 1: two failures."""
    return StepBatch.from_trajectories(
        [["s0", "a", "b", "win"], ["s0", "a", "c", "a", "c"], ["s0", "d", "b", "win"], ["s0", "a", "c"],
         ["t0", "t1", "t1"], ["t0", "t1"]],
        success=[True, False, True, False, False, False], task_ids=[0, 0, 0, 0, 7, 7],
        actions=[["go a", "go b", "open it"], ["go a", "go c", "go a", "go c"], ["go d", "go b", "open it"],
                 ["go a", "go c"], ["go t1", "jump"], ["go t1"]])


def hand_observations(batch: StepBatch) -> tuple[list[str], list[str]]:
    state = [TEXTS.get(k, k) for k in batch.state_keys]
    after = [TEXTS.get(k, k) for k in batch.next_state_keys]
    for row in np.flatnonzero((batch.traj_ids == 1) & (batch.step_idx == 3)):  # "a" seen again, the lamp out
        state[row] = after[row - 1] = OTHER_A
    return state, after


def write_run(folder: Path, config: TrainConfig, batches: dict[int, StepBatch], *, new_format: bool = True,
              kept: bool = True) -> Path:
    """A run folder as training leaves it: config.json, progress.csv, credit_diagnostics.jsonl, the last
    batch and (``kept``) every batch in batches/; ``new_format`` False: a batch meta of before kept batches."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config.to_dict()))
    credit_config = config.algo.credit_config()
    rows, lines = ["time/iterations,time/total_timesteps,rollout/success_rate,eval/eval_id/success_rate"], []
    rows.append("0,0,,0.1")
    for iteration, batch in sorted(batches.items()):
        result = compute_credit(config.algo.method, batch, credit_config)
        lines.append(json.dumps({"iteration": iteration, "diagnostics": result.diagnostics}))
        rows.append(f"{iteration},{10 * iteration},{batch.success.mean()},{'0.5' if iteration % 2 == 0 else ''}")
        meta = {"iteration": iteration, "num_timesteps": 10 * iteration, "method": config.algo.method}
        if new_format:
            meta |= {"credit_config": dataclasses.asdict(credit_config),
                     "observations": observation_table(*hand_observations(batch))}
        save_step_batch(batch, folder / "last_batch.npz", meta)
        if kept:
            assert keep_batch(folder, iteration) is not None
    (folder / "progress.csv").write_text("\n".join(rows) + "\n")
    (folder / "credit_diagnostics.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def group_rows(batch: StepBatch, task: int) -> list[np.ndarray]:
    """The rows of each trajectory of task ``task`` in step order."""
    rows = []
    for traj in sorted(set(batch.traj_ids[batch.task_ids == task].tolist())):
        mine = np.flatnonzero(batch.traj_ids == traj)
        rows.append(mine[np.argsort(batch.step_idx[mine])])
    return rows


def test_the_vendored_libraries_are_the_npm_files_named_in_their_readme():
    readme = (VENDOR / "README.md").read_text()
    for name, digest in VENDOR_SHA256.items():
        assert hashlib.sha256((VENDOR / name).read_bytes()).hexdigest() == digest, name
        assert f"{digest}  {name}" in readme
    assert {"LICENSE.cytoscape.txt", "LICENSE.uplot.txt"} <= {p.name for p in VENDOR.iterdir()}
    assert "cytoscape | 3.35.0" in readme.replace("](https://www.npmjs.com/package/cytoscape) (Cytoscape.js, the "
                                                  "state graphs)", "")


def test_the_report_data_is_the_credit_functions_output_group_by_group(tmp_path):
    config = TrainConfig().replace(**{"algo.credit_kwargs": {"eta": 0.5, "omega": 0.3}})
    batch = hand_batch()
    run = write_run(tmp_path / "run", config, {4: batch})
    data = report_data(run)
    view = data["iterations"][4]
    assert view["config_source"] == "the kept batch" and view["check"]["status"] == "match"
    credit_config = config.algo.credit_config()
    assert view["configs"]["milegpo"] == dataclasses.asdict(credit_config)
    graph = build_task_graph(batch)
    evidence = milestone_evidence(graph, credit_config)
    advantages = {m: compute_credit(m, batch, credit_config if m == "milegpo" else None).advantages
                  for m in CREDIT_METHODS}
    assert [g["task"] for g in view["groups"]] == [0, 7]
    for q, group in enumerate(view["groups"]):
        nodes = np.flatnonzero(graph.node_task == q)
        edges = np.flatnonzero(graph.edge_task == q)
        assert [n["id"] for n in group["nodes"]] == [f"n{v}" for v in nodes]
        assert [e["id"] for e in group["edges"]] == [f"e{e}" for e in edges]
        assert [(e["source"], e["target"]) for e in group["edges"]] == [
            (f"n{graph.edge_src[e]}", f"n{graph.edge_dst[e]}") for e in edges]
        assert [n["visits"] for n in group["nodes"]] == graph.node_n_traj[nodes].tolist()
        assert [n["id"] for n in group["nodes"] if "milestone" in n] == [f"n{v}" for v in nodes
                                                                          if evidence.milestone[v]]
        assert [n["id"] for n in group["nodes"] if "trap" in n] == [f"n{v}" for v in nodes if evidence.trap[v]]
        for n in group["nodes"]:
            if "milestone" in n:
                v = int(n["id"][1:])
                assert n["milestone"]["reliability"] == evidence.weight_plus[v]
                assert n["milestone"]["evidence"] == evidence.evidence[v]
        for trajectory, rows in zip(group["trajectories"], group_rows(batch, group["task"])):
            assert trajectory["nodes"] == [f"n{v}" for v in graph.row_src[rows]] + [f"n{graph.row_dst[rows[-1]]}"]
            assert trajectory["edges"] == [f"e{e}" for e in graph.row_edge[rows]]
            for method in CREDIT_METHODS:  # bit for bit
                assert trajectory["advantages"][method] == advantages[method][rows].tolist(), method
    milestones = [n["key"] for n in view["groups"][0]["nodes"] if "milestone" in n]
    assert "b" in milestones and any("trap" in n for n in view["groups"][0]["nodes"] if n["key"] == "c")
    assert any(n["branching"] for n in view["groups"][0]["nodes"] if n["key"] == "s0")  # d beats a
    assert not any(n["branching"] for n in view["groups"][1]["nodes"])  # no success: nothing to beat
    json.dumps(data, allow_nan=False)  # plain JSON: no NaN or infinity reaches the page


def test_the_state_panels_show_the_texts_behind_each_key(tmp_path):
    run = write_run(tmp_path / "run", TrainConfig(), {2: hand_batch()})
    view = report_data(run)["iterations"][2]
    texts = view["texts"]
    nodes = {n["key"]: n for n in view["groups"][0]["nodes"]}
    shown = {key: sorted(texts[t] for t, _ in n["observations"]) for key, n in nodes.items()}
    assert shown["a"] == sorted([TEXTS["a"], OTHER_A])  # one key, two observations
    assert shown["c"] == shown["d"] == [TEXTS["c"]]  # one observation, two keys
    assert shown["<goal>"] == [TEXTS["win"]]  # where the successes ended
    counts = {texts[t]: n for t, n in nodes["a"]["observations"]}
    assert counts == {TEXTS["a"]: 3, OTHER_A: 1}  # trajectories 0, 1 and 3, then 1 again


def test_a_run_from_before_kept_batches_inspects_its_last_batch_with_its_configs_settings(tmp_path):
    config = TrainConfig().replace(**{"algo.method": "gigpo", "algo.credit_kwargs": {"gamma": 0.8}})
    batch = hand_batch()
    run = write_run(tmp_path / "old", config, {5: batch}, new_format=False, kept=False)
    assert not (run / "batches").exists()
    data = report_data(run)
    assert data["kept"] == [5] and data["iterations"][5]["file"] == "last_batch.npz"
    view = data["iterations"][5]
    assert view["config_source"] == "config.json" and view["texts"] is None and view["check"]["status"] == "match"
    expected = compute_credit("gigpo", batch, make_credit_config("gigpo", gamma=0.8)).advantages
    rows = group_rows(batch, 0)[0]
    assert view["groups"][0]["trajectories"][0]["advantages"]["gigpo"] == expected[rows].tolist()
    # GiGPO runs: milestones and traps are MileGPO's defaults on the same graph
    assert [n["key"] for n in view["groups"][0]["nodes"] if "milestone" in n] == [
        n["key"] for n in report_data(write_run(tmp_path / "new", TrainConfig(), {5: batch}))["iterations"][5]
        ["groups"][0]["nodes"] if "milestone" in n]


def test_a_logged_statistic_that_differs_is_reported(tmp_path):
    run = write_run(tmp_path / "run", TrainConfig(), {3: hand_batch()})
    row = json.loads((run / "credit_diagnostics.jsonl").read_text())
    row["diagnostics"]["adv_std"] += 1e-3  # e.g. a batch that is not the one the run trained on
    (run / "credit_diagnostics.jsonl").write_text(json.dumps(row) + "\n")
    check = report_data(run)["iterations"][3]["check"]
    assert check["status"] == "differ" and check["compared"]["adv_std"]["logged"] != \
        check["compared"]["adv_std"]["recomputed"]


def test_kept_batches_are_listed_once_and_the_last_batch_joins_them(tmp_path):
    batch = hand_batch()
    run = write_run(tmp_path / "run", TrainConfig(), {2: batch, 4: batch})
    assert kept_iterations(run) == {2: run / "batches" / "iteration_000002.npz",
                                    4: run / "batches" / "iteration_000004.npz"}
    save_step_batch(batch, run / "last_batch.npz", {"iteration": 5})  # a last iteration that was not kept
    assert list(kept_iterations(run)) == [2, 4, 5] and kept_iterations(run)[5] == run / "last_batch.npz"
    assert report_data(run, iterations=[4])["included"] == [4]
    with pytest.raises(ValueError, match=r"iteration\(s\) \[3\] .* were not kept; kept: \[2, 4, 5\]"):
        report_data(run, iterations=[3])


def test_keep_batch_copies_the_last_batch_of_that_iteration_only(tmp_path):
    batch = hand_batch()
    save_step_batch(batch, tmp_path / "last_batch.npz", {"iteration": 6})
    assert keep_batch(tmp_path, 5) is None  # iteration 5 left no batch (no steps): nothing to keep
    kept = keep_batch(tmp_path, 6)
    assert kept == tmp_path / "batches" / "iteration_000006.npz"
    assert kept.read_bytes() == (tmp_path / "last_batch.npz").read_bytes()
    assert [p.name for p in (tmp_path / "batches").iterdir()] == ["iteration_000006.npz"]  # no temporary left


def test_a_resume_drops_the_kept_batches_after_its_checkpoint_and_a_half_copy(tmp_path):
    folder = tmp_path / "batches"
    folder.mkdir()
    for name in ("iteration_000002.npz", "iteration_000004.npz", "iteration_000006.npz",
                 ".iteration_000008.npz.tmp-123", "notes.txt"):
        (folder / name).write_bytes(b"x")
    dropped = rollback_logs(tmp_path, 4)
    assert dropped["batches"] == 2
    assert sorted(p.name for p in folder.iterdir()) == ["iteration_000002.npz", "iteration_000004.npz", "notes.txt"]


def test_observation_table_writes_each_text_once():
    table = observation_table(["x", "y", "x"], ["y", "x", "z"])
    assert table == {"texts": ["x", "y", "z"], "state": [0, 1, 0], "next_state": [1, 0, 2]}


def test_the_learning_curve_has_every_split_and_gaps_where_a_row_has_none(tmp_path):
    (tmp_path / "progress.csv").write_text(
        "time/iterations,time/total_timesteps,rollout/success_rate,eval/b/success_rate,eval/a/success_rate\n"
        "0,0,,0.1,0.2\n1,10,0.5,,\n2,20,0.75,0.3,nan\n")
    curve = learning_curve(tmp_path, ["a"])
    assert curve == {"iterations": [0, 1, 2], "steps": [0.0, 10.0, 20.0], "train": [None, 0.5, 0.75],
                     "eval": {"a": [0.2, None, None], "b": [0.1, None, 0.3]}}


def test_the_html_holds_everything_inline_and_escapes_its_data(tmp_path):
    batch = hand_batch()
    batch.state_keys[0] = "</script><script>alert(1)</script><!--"  # text never ends the data block
    run = write_run(tmp_path / "run", TrainConfig(), {1: batch, 2: hand_batch()})
    out = write_report(run)
    assert out == run / "report.html"
    html = out.read_text(encoding="utf-8")
    assert html.count("</script>") == 2 + 1 + 2 + 1  # the libraries, the summary, 2 iterations, the report's own
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", html) and "<link rel=\"stylesheet\"" not in html
    assert 'id="iteration-1"' in html and 'id="iteration-2"' in html
    summary = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S)
    assert summary is not None and json.loads(summary.group(1))["kept"] == [1, 2]
    block = re.search(r'<script type="application/json" id="iteration-1">(.*?)</script>', html, re.S)
    assert block is not None and "alert(1)</script><!--" in json.loads(block.group(1))["groups"][0]["nodes"][0]["key"]
    assert json.loads(json_block({"k": "</b><!--"})) == {"k": "</b><!--"}
    assert not list(run.glob(".report.html.tmp-*"))


def test_render_refuses_data_json_cannot_hold():
    with pytest.raises(ValueError, match="Out of range float"):
        render_report({"run": {"name": "x"}, "iterations": {1: {"value": float("nan")}}})


def test_the_cli_writes_the_report_and_refuses_what_it_cannot_read(tmp_path, capsys):
    run = write_run(tmp_path / "run", TrainConfig(), {2: hand_batch(), 4: hand_batch()})
    assert main(["inspect", str(run), "--out", str(tmp_path / "out" / "r.html"), "--iteration", "2"]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"Wrote {tmp_path / 'out' / 'r.html'} (") and 'id="iteration-4"' not in \
        (tmp_path / "out" / "r.html").read_text(encoding="utf-8")
    assert main(["inspect", str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err.strip() == (f"error: {str(tmp_path / 'nothing')!r} is not a run folder (no "
                                               "config.json, no last_batch.npz); pass the folder `milegpo train` wrote")
    assert main(["inspect", str(run), "--iteration", "3"]) == 2
    assert "iteration(s) [3]" in capsys.readouterr().err
    assert main(["inspect", str(run), "--out", str(tmp_path)]) == 2
    assert "is a folder: name the HTML file to write" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text(json.dumps(TrainConfig().to_dict()))
    assert main(["inspect", str(empty)]) == 2
    assert "has no kept batch yet" in capsys.readouterr().err


def test_a_group_without_success_has_no_goal_distance_or_branching(tmp_path):
    batch = StepBatch.from_trajectories([["x", "y", "z"], ["x", "z"]], success=[False, False])
    view = report_data(write_run(tmp_path / "run", TrainConfig(), {1: batch}))["iterations"][1]
    group = view["groups"][0]
    assert group["successes_total"] == 0 and not any(n["goal"] or n["branching"] for n in group["nodes"])
    assert {n["distance"] for n in group["nodes"]} == {1.0}  # every state equally far from a goal nobody reached
    assert load_step_batch(tmp_path / "run" / "last_batch.npz")[1]["credit_config"] == dataclasses.asdict(
        MileGPOConfig())


@pytest.mark.slow
@pytest.mark.parametrize("rollout", [
    [],  # lockstep, in this process
    ["env.subprocess=true", "env.n_workers=2", "algo.rollout=async"],  # envs answer out of order
    ["algo.max_staleness=1"],  # the next rollout plays in a thread during the update
])
def test_a_real_run_keeps_the_observation_of_every_state(rollout: list[str], tmp_path: Path):
    """House's state key names the room (``at=<room>|...``) and its observation says "you are in the <room>."
    (or "in a deep pit."): every kept step's observation is the one of the state it acted in, and its next
    observation the one of where it went, however the rollout was played."""
    run = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "milegpo", "train", "--preset", "cpu-demo", "--run-dir", str(run),
                    "--no-progress-bar", "run.total_timesteps=96", "env.n_tasks=2", "env.group_size=2",
                    "env.kwargs={max_episode_steps: 8}", "eval.splits=[]", "run.keep_batch_every=1", *rollout],
                   check=True, stdout=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    kept = kept_iterations(run)
    assert len(kept) >= 2
    for iteration, path in kept.items():
        batch, meta = load_step_batch(path)
        table = meta["observations"]
        for keys, column in ((batch.state_keys, "state"), (batch.next_state_keys, "next_state")):
            for key, text_id in zip(keys, table[column]):
                if str(key).endswith("|won=1"):  # the last observation says what was achieved, not where
                    continue
                room = str(key).split("|")[0].removeprefix("at=")
                said = "you are in a deep pit." if room == "pit" else f"you are in the {room}."
                assert said in table["texts"][text_id], (iteration, key)
        assert_replays_from_its_task_seeds(batch, meta["task_seeds"], run)


def assert_replays_from_its_task_seeds(batch: StepBatch, task_seeds: list[int], run: Path) -> None:
    """Each kept trajectory, replayed from the task seed its group played (the meta's ``task_seeds``) in an
    env made with the run's settings, passes the same states with the same rewards (what a benchmark
    needs to follow the run's episodes with its own ground truth)."""
    config = TrainConfig.from_file(run / "config.json")
    env = make_env(config.env.id, **config.env.kwargs_for(config.env.train_split))
    assert len(task_seeds) == len(np.unique(batch.task_ids)) == config.env.n_tasks
    for traj in np.unique(batch.traj_ids):
        rows = np.flatnonzero(batch.traj_ids == traj)
        _, info = env.reset(seed=task_seeds[int(batch.task_ids[rows[0]])])
        for row in rows:
            assert info["state_key"] == batch.state_keys[row]
            _, reward, _, _, info = env.step(str(batch.actions[row]))
            assert (info["state_key"], reward) == (batch.next_state_keys[row], batch.rewards[row])
    env.close()


def test_an_old_run_whose_config_cannot_give_its_credit_settings_is_one_clear_error(tmp_path, capsys):
    run = write_run(tmp_path / "old", TrainConfig(), {5: hand_batch()}, new_format=False, kept=False)
    config = json.loads((run / "config.json").read_text())
    config["algo"]["credit_kwargs"] = {"no_such_setting": 1}  # what another version may have written
    (run / "config.json").write_text(json.dumps(config))
    assert main(["inspect", str(run)]) == 2
    said = capsys.readouterr().err.strip()
    assert said.startswith("error: cannot rebuild iteration 5's credit config from the run's config.json (its algo "
                           "section: algo.credit_kwargs: MileGPOConfig has no field(s) ['no_such_setting']")
    assert "\n" not in said
