"""The examples run as written (each ``main`` with a tiny budget), the configs load, and the
per-trajectory credit plot draws what the credit functions give."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import json
from pathlib import Path

import gymnasium
import numpy as np
import pytest
from gymnasium.envs.registration import load_env_creator

from milegpo.config.run import PRESETS, TrainConfig, resolve_config
from milegpo.credit import CREDIT_METHODS, StepBatch, credit_of_trajectory
from milegpo.credit.batch import load_step_batch, save_step_batch
from milegpo.run import plots
from milegpo.run_folder import LAST_BATCH_FILE

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def one_torch_thread():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ------------------------------------------------------------------ examples
def test_custom_env_example_trains_and_saves(tmp_path):
    result = load_example("custom_env").main(["--steps", "40", "--n-eval-tasks", "2", "--out", str(tmp_path)])
    assert 0.0 <= result["success_before"] <= 1.0 and 0.0 <= result["success_after"] <= 1.0
    assert result["num_timesteps"] >= 40
    assert (tmp_path / "final").is_dir() and (tmp_path / "base_model" / "config.json").exists()


def test_alfworld_example_trains_and_evaluates_both_splits(tmp_path):
    pytest.importorskip("alfworld")
    results = load_example("alfworld_milegpo").main(
        ["--steps", "10", "--n-tasks", "1", "--group-size", "2", "--horizon", "5", "--n-eval-tasks", "1",
         "--out", str(tmp_path)])  # fmt: skip
    assert set(results) == {"eval_id", "eval_ood"}
    for result in results.values():
        assert result["n_episodes"] == 1 and 1 <= result["mean_length"] <= 5
        assert 0.0 <= result["success_rate"] <= 1.0
    assert json.loads((tmp_path / "eval_final.json").read_text()) == results
    for name in ("progress.csv", "credit_diagnostics.jsonl", "trajectory_credit.png", "final"):
        assert (tmp_path / name).exists(), name
    batch, _ = load_step_batch(tmp_path / LAST_BATCH_FILE)
    assert batch.num_trajectories == 2 and 2 <= batch.num_steps <= 10  # 1 game x 2 copies, horizon 5
    assert len(set(batch.task_ids.tolist())) == 1


def test_webshop_example_runs_the_papers_reward_and_preset(tmp_path):
    results = load_example("webshop_milegpo").main(
        ["--steps", "10", "--n-tasks", "1", "--group-size", "2", "--horizon", "4", "--n-eval-tasks", "1",
         "--out", str(tmp_path), "--no-progress-bar"])  # fmt: skip
    assert set(results) == {"eval"} and 0.0 <= results["eval"]["success_rate"] <= 1.0
    config = TrainConfig.from_file(tmp_path / "config.json")
    assert config.env.kwargs["success_reward"] == 10.0 and config.algo.credit_preset == "webshop"
    assert config.eval.splits == ["eval"]
    # the real batch of the run draws as a trajectory-credit plot
    assert plots.plot_run_trajectory_credit(tmp_path) == tmp_path / "trajectory_credit.png"


def test_compare_algorithms_uses_one_base_model_for_all_four(tmp_path):
    (tmp_path / "config.yaml").write_text("eval: {copies: 1, freq: 100}\n")
    results = load_example("compare_algorithms").main(
        ["--preset", "cpu-demo", "--config", str(tmp_path / "config.yaml"), "run.total_timesteps=10", "env.n_tasks=1",
         "env.group_size=2", "eval.n_tasks=1", "env.kwargs={max_episode_steps: 5}", "--out", str(tmp_path / "runs"),
         "--no-progress-bar"])  # fmt: skip
    assert list(results) == ["grpo", "gigpo", "graphgpo", "milegpo"]
    models = set()
    for algo, row in results.items():
        assert 0.0 <= row["eval_id"] <= 1.0 and 0.0 <= row["eval_ood"] <= 1.0 and 0.0 <= row["train_last"] <= 1.0
        run = TrainConfig.from_file(tmp_path / "runs" / algo / "config.json")
        assert run.algo.method == algo and run.run.total_timesteps == 10 and run.env.kwargs == {"max_episode_steps": 5}
        assert run.eval.copies == 1 and run.policy.mode == "choose"  # the file over the preset
        models.add(run.policy.model)
    assert models == {str(tmp_path / "runs" / "base_model")}


# ------------------------------------------------------------------- presets
@pytest.mark.parametrize("name", PRESETS)
def test_preset_loads_and_its_env_kwargs_exist(name):
    config = resolve_config(name)
    env_class = load_env_creator(gymnasium.spec(config.env.id).entry_point)
    parameters = inspect.signature(env_class).parameters
    assert set(config.env.kwargs) <= set(parameters), f"{name}: unknown env kwargs for {config.env.id}"


@pytest.mark.parametrize("name, env, horizon, prompt_tokens, preset", [
    ("paper-alfworld", "milegpo/ALFWorld-v0", 50, 2048, "alfworld"),
    ("paper-webshop", "milegpo/WebShop-v0", 15, 4096, "webshop"),
])  # fmt: skip
def test_paper_presets_hold_the_papers_setting(name, env, horizon, prompt_tokens, preset):
    config = resolve_config(name)
    policy, algo = config.policy, config.algo
    shape = (config.env.id, config.env.kwargs["max_episode_steps"], policy.max_prompt_tokens)
    assert shape == (env, horizon, prompt_tokens)
    assert algo.credit_preset == preset and config.env.kwargs["success_reward"] == 10.0
    assert (policy.model, policy.mode, config.env.n_tasks, config.env.group_size) == (
        "Qwen/Qwen2.5-1.5B-Instruct", "generate", 16, 8)
    assert (algo.learning_rate, algo.kl_coef, algo.ent_coef, algo.clip_range) == (1e-6, 0.01, 0.001, 0.2)
    assert (policy.temperature, config.eval.temperature, policy.history_length) == (1.0, 0.4, 2)
    assert policy.think and policy.dtype == "bf16" and config.run.device == "cuda"
    assert policy.max_new_tokens == 512 and policy.sampler.backend == "vllm"


def test_the_library_defaults_are_the_papers():
    """One set of defaults: TrainConfig's, the algorithm's and the policy's are the same objects' defaults."""
    from milegpo.config import AlgoConfig, PolicyConfig

    config = TrainConfig()
    assert config.algo == AlgoConfig() and config.policy == PolicyConfig()
    assert (config.algo.learning_rate, config.algo.kl_coef, config.algo.ent_coef, config.algo.clip_range) == (
        1e-6, 0.01, 0.001, 0.2)
    assert (config.policy.mode, config.policy.think, config.policy.history_length) == ("generate", True, 2)
    assert (config.env.n_tasks, config.env.group_size, config.eval.temperature) == (16, 8, 0.4)


# ------------------------------------------------- per-trajectory credit plot
def hand_batch() -> StepBatch:
    """Task 0: one success among three (the middle route), task 1: two failures."""
    return StepBatch.from_trajectories(
        [["s0", "a", "b", "goal"], ["s0", "a", "a", "a"], ["s0", "c", "c"], ["t0", "t1", "t1"], ["t0", "t1"]],
        success=[True, False, False, False, False],
        task_ids=[0, 0, 0, 1, 1],
        actions=[["go a", "go b", "open the goal door with the brass key"], ["go a", "wait", "wait"], ["go c", "wait"],
                 ["go t1", "jump"], ["go t1"]],
        valid=[[True, True, True], [True, False, False], [True, True], [True, False], [True]],
    )


def test_save_and_load_step_batch_round_trip(tmp_path):
    batch = hand_batch()
    batch.actions[0] = "öffne die Tür 🚪"  # non-ASCII text survives
    save_step_batch(batch, tmp_path / LAST_BATCH_FILE, {"iteration": 3})
    with np.load(tmp_path / LAST_BATCH_FILE, allow_pickle=False) as data:
        assert all(data[name].dtype != object for name in data.files)
    loaded, meta = load_step_batch(tmp_path / LAST_BATCH_FILE)
    assert meta == {"iteration": 3}
    for field in dataclasses.fields(StepBatch):
        assert np.array_equal(getattr(loaded, field.name), getattr(batch, field.name)), field.name
    assert not list(tmp_path.glob("*.tmp*"))
    (tmp_path / "bad.npz").write_bytes(b"not a zip file")
    with pytest.raises(ValueError, match="cannot read a StepBatch"):
        load_step_batch(tmp_path / "bad.npz")


def test_pick_trajectory_prefers_the_longest_success_of_a_mixed_group():
    assert plots.pick_trajectory(hand_batch()) == 0
    only_failures = StepBatch.from_trajectories([["x", "y"], ["x", "y", "z", "w"]], success=[False, False])
    assert plots.pick_trajectory(only_failures) == 1  # no success anywhere: the longest


def test_plot_trajectory_credit_draws_each_methods_credit_per_step(tmp_path, monkeypatch):
    figures = []
    save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, out: (figures.append(fig), save(fig, out))[1])
    batch = hand_batch()
    configs = {"milegpo": {"preset": "alfworld"}}
    out = plots.plot_trajectory_credit(batch, 1, tmp_path / "credit.png", configs=configs, title="hand-built")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    axes = figures[0].axes  # one panel per method, each on its own scale
    expected = credit_of_trajectory(batch, 1, configs=configs)
    assert [ax.get_ylabel() for ax in axes] == [plots.METHOD_LABELS.get(m, m) for m in CREDIT_METHODS]
    for ax, method in zip(axes, CREDIT_METHODS):
        assert np.allclose([patch.get_height() for patch in ax.patches], expected[method]), method
    labels = axes[-1].get_xticklabels()
    assert [label.get_text() for label in labels] == ["0: go a", "1: wait", "2: wait"]
    assert [label.get_color() for label in labels][1:] == ["red", "red"]  # the invalid steps
    assert "failure" in axes[0].get_title() and "task 0" in axes[0].get_title()
    assert any(expected[m].any() for m in expected)  # a mixed group: the credit is not all zero


def test_plot_trajectory_credit_shortens_long_actions_and_rejects_unknown_trajectories(tmp_path, monkeypatch):
    figures = []
    save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, out: (figures.append(fig), save(fig, out))[1])
    plots.plot_trajectory_credit(hand_batch(), None, tmp_path / "credit.png", methods=["grpo", "milegpo"])
    axes = figures[0].axes
    assert len(axes) == 2 and all(len(ax.patches) == 3 for ax in axes) and "success" in axes[0].get_title()
    assert all(len(label.get_text()) <= plots.ACTION_CHARS + 3 for label in axes[-1].get_xticklabels())
    with pytest.raises(ValueError, match="no steps"):
        plots.plot_trajectory_credit(hand_batch(), 42, tmp_path / "none.png")


def test_plot_run_trajectory_credit_uses_the_runs_credit_settings(tmp_path, monkeypatch):
    assert plots.plot_run_trajectory_credit(tmp_path) is None  # no last_batch.npz: nothing to draw
    save_step_batch(hand_batch(), tmp_path / LAST_BATCH_FILE, {"iteration": 7})
    config = TrainConfig().replace(**{"algo.method": "gigpo", "algo.credit_preset": "webshop",
                                      "algo.credit_kwargs": {"gamma": 0.9}})
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))  # as a run folder holds it
    calls = []
    draw = plots.plot_trajectory_credit
    monkeypatch.setattr(plots, "plot_trajectory_credit", lambda *a, **kw: (calls.append(kw), draw(*a, **kw))[1])
    assert plots.plot_run_trajectory_credit(tmp_path) == tmp_path / "trajectory_credit.png"
    assert (tmp_path / "trajectory_credit.png").stat().st_size > 0
    assert calls[0]["configs"] == {"milegpo": {"preset": "webshop"}, "gigpo": {"gamma": 0.9}}
    assert calls[0]["title"] == f"{tmp_path.name}, iteration 7"
