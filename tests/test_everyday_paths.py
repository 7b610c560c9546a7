"""What a new user meets first: named models keep their own settings, SB3 habits get pointers, the
console and the logs say what happened, evaluation plays held-out tasks."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from milegpo.cli import main
from milegpo.envs import TextEnv

QWEN = "Qwen/Qwen2.5-1.5B-Instruct"


class NoSplitEnv(TextEnv):
    """An env without task splits: reach the end of a line of 3 cells."""

    def _reset(self, seed, options):
        self.position = 0
        return "cell 0", {"task": "reach cell 2"}

    def _step(self, action):
        self.position += 1
        return f"cell {self.position}", float(self.position == 2), self.position == 2, {"won": self.position == 2}

    def admissible_commands(self):
        return ["right"]


# ------------------------------------------------------------------ a named model on the command line
def test_a_named_model_gets_the_same_settings_as_in_python(capsys: pytest.CaptureFixture) -> None:
    from milegpo.config import AlgoConfig, PolicyConfig

    assert main(["train", f"policy.model={QWEN}", "--print-config"]) == 0
    captured = capsys.readouterr()
    config = yaml.safe_load(captured.out)
    # what MileGPO("LLMPolicy", env, policy_kwargs={"model": QWEN}) trains with: the defaults, the paper's
    assert config["algo"] == dataclasses.asdict(AlgoConfig())
    assert config["policy"] == dataclasses.asdict(PolicyConfig(model=QWEN))
    assert config["algo"]["learning_rate"] == 1e-6 and config["policy"]["mode"] == "generate"
    assert f"policy.model={QWEN}: using the defaults, the paper's settings" in captured.err
    assert "tiny model" not in captured.err + captured.out

    assert main(["train", "--preset", "cpu-demo", f"policy.model={QWEN}", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["algo"]["learning_rate"] == 3e-3  # asked for: the demo's


def test_the_demo_presets_line_says_the_settings_it_trains_with(capsys: pytest.CaptureFixture) -> None:
    assert main(["train", "policy.mode=generate", "algo.method=grpo", "--print-config"]) == 0
    assert "Using the cpu-demo preset (algo.method=grpo, policy.mode=generate, an offline tiny model)" in \
        capsys.readouterr().err


def test_the_hubs_page_gem_command_reaches_the_model_load(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("gem")
    run = tmp_path / "run"
    code = main(["train", "env.id=gem:game:Sudoku-v0-easy", f"policy.model={QWEN}", "policy.prompt_format=chat",
                 "--run-dir", str(run)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: model {QWEN!r} is not in the local Hugging Face cache"), err
    assert not run.exists()


@pytest.mark.parametrize("flag, pointer", [("--output_dir", "--run-dir DIR"),
                                           ("--model_name_or_path", "--policy.model NAME"),
                                           ("--num_generations", "--env.group_size K"),
                                           ("--per_device_train_batch_size", "--algo.batch_size N")])
def test_trl_flags_point_to_their_setting(flag: str, pointer: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", flag, "x", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"unknown flag {flag} (a TRL flag): here it is {pointer}" in err, err


# --------------------------------------------------------------------------------- the Python API
def test_sb3_policies_are_refused_before_a_model_is_built(capsys: pytest.CaptureFixture) -> None:
    from milegpo import MileGPO, make_vec_env

    env = make_vec_env("milegpo/House-v0", n_tasks=1, group_size=2)
    with pytest.raises(ValueError, match="unknown policy 'MlpPolicy': MileGPO trains a language model"):
        MileGPO("MlpPolicy", env)
    assert "No model given" not in capsys.readouterr().err


def test_an_env_class_is_named_by_its_class(capsys: pytest.CaptureFixture) -> None:
    from milegpo import MileGPO, make_vec_env
    from milegpo.envs.house import HouseEnv

    env = make_vec_env(HouseEnv, n_tasks=1, group_size=2, env_kwargs={"max_episode_steps": 4})
    assert env.env_name == "HouseEnv"
    MileGPO("LLMPolicy", env, seed=0)
    err = capsys.readouterr().err
    assert "on HouseEnv" in err and "KwargsFactory" not in err


def test_the_readme_line_shows_progress_and_what_was_learned(capsys: pytest.CaptureFixture) -> None:
    from milegpo import MileGPO, make_vec_env

    env = make_vec_env("milegpo/House-v0", n_tasks=1, group_size=2, env_kwargs={"max_episode_steps": 4})
    model = MileGPO("LLMPolicy", env, seed=0).learn(24)
    out = capsys.readouterr().out
    assert model.verbose == 1 and out.count("train success") >= model.iterations
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"Learned {model.num_timesteps:,} env steps in ") and "model.save(DIR)" in last
    assert MileGPO("LLMPolicy", env, seed=0, verbose=0).verbose == 0  # asked for silence: silent


def test_save_to_a_zip_name_and_sb3_callbacks_are_refused(tmp_path: Path) -> None:
    from stable_baselines3.common.callbacks import CheckpointCallback, EvalCallback

    from milegpo import MileGPO, make_vec_env

    env = make_vec_env("milegpo/House-v0", n_tasks=1, group_size=2, env_kwargs={"max_episode_steps": 4})
    model = MileGPO("LLMPolicy", env, seed=0, verbose=0)
    with pytest.raises(ValueError, match="not SB3 zip files: save to '.*model' instead of '.*model.zip'"):
        model.save(tmp_path / "model.zip")
    assert not (tmp_path / "model.zip").exists()
    with pytest.raises(ValueError, match=r"use milegpo.algos.EvalCallback\(eval_env"):
        model.learn(24, callback=EvalCallback(env))
    with pytest.raises(ValueError, match=r"use milegpo.algos.CheckpointCallback\(save_freq"):
        model.learn(24, callback=[CheckpointCallback(10, str(tmp_path))])
    assert model.num_timesteps == 0  # refused before any training


def test_evaluate_plays_held_out_seeds_of_an_env_without_splits() -> None:
    from milegpo import MileGPO, evaluate_policy, make_vec_env
    from milegpo.options import HELD_OUT_SEEDS_START
    model = MileGPO("LLMPolicy", make_vec_env("milegpo/House-v0", n_tasks=1, group_size=1), seed=0, verbose=0)
    split_env = make_vec_env("milegpo/House-v0", n_tasks=2, group_size=1, env_kwargs={"split": "eval_id"})
    assert split_env.has_task_splits
    assert [t["task_seed"] for t in model.evaluate(split_env, n_episodes=2)["per_task"]] == [0, 1]

    plain = make_vec_env(NoSplitEnv, n_tasks=2, group_size=1)
    assert not plain.has_task_splits
    seeds = [t["task_seed"] for t in model.evaluate(plain, n_episodes=3)["per_task"]]
    assert seeds == [HELD_OUT_SEEDS_START, HELD_OUT_SEEDS_START + 1, HELD_OUT_SEEDS_START + 2]
    rewards, lengths = evaluate_policy(model, plain, n_eval_episodes=2, return_episode_rewards=True)
    assert len(rewards) == 2


# ------------------------------------------------------------------------------------ the console
def test_small_losses_are_shown_not_rounded_to_zero() -> None:
    from milegpo.algos.console import loss_text

    assert loss_text(-3.725e-09) == "-3.725e-09" and loss_text(0.25) == "+0.2500" and loss_text(0.0) == "+0.0000"


def test_logs_to_a_file_keep_bars_apart_and_count_every_step(tmp_path: Path) -> None:
    run = tmp_path / "run"
    log = subprocess.run([sys.executable, "-m", "milegpo", "train", "--preset", "cpu-demo", "--run-dir", str(run),
                          "run.total_timesteps=170", "env.n_tasks=1", "env.group_size=2", "eval.n_tasks=2",
                          "env.kwargs={max_episode_steps: 8}"], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert log.returncode == 0, log.stderr
    text = log.stdout + log.stderr
    assert "\r" not in text and "eval:" not in text  # no bar redraws in a file, nor on the result's line
    steps = int(next(line for line in reversed(log.stdout.splitlines()) if line.startswith("iter")).split()[4])
    assert steps > 170 and f"{steps}/{steps}" in text  # the bar ends on the steps played, not the budget


def test_torch_threads_follow_the_model() -> None:
    import torch

    from milegpo.config.run import resolve_config
    from milegpo.run.plan import set_torch_threads

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert set_torch_threads(resolve_config("cpu-demo")) == 1  # the tiny model: one thread
        assert set_torch_threads(resolve_config("cpu-demo", overrides=["run.torch_threads=2"])) == 2
        torch.set_num_threads(2)
        assert set_torch_threads(resolve_config(overrides=["policy.model=some/model"])) == 2  # torch's, untouched
    finally:
        torch.set_num_threads(before)


SAFE_MODULE = '''
from milegpo.envs import TextEnv, register_env


class Dial(TextEnv):
    def _reset(self, seed, options):
        return "dial at 0", {"task": "turn the dial"}

    def _step(self, action):
        return "dial turned", 0.0, False, {"won": False}

    def admissible_commands(self):
        return ["turn"]


register_env("examples/Dial-v0", Dial, max_episode_steps=12)
'''


def test_a_class_named_by_module_plays_with_the_defaults_its_module_registers(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch,
                                                                              capsys: pytest.CaptureFixture) -> None:
    from milegpo.envs import make_env

    (tmp_path / "dial_module.py").write_text(SAFE_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert make_env("dial_module:Dial").max_episode_steps == 12  # as the registered id plays, not the class's 50
    assert make_env("dial_module:Dial", max_episode_steps=5).max_episode_steps == 5  # an explicit value wins

    (tmp_path / "dials_module.py").write_text(SAFE_MODULE + 'register_env("examples/LongDial-v0", Dial, '
                                                            'max_episode_steps=40)\n')
    assert make_env("dials_module:Dial").max_episode_steps == 50  # two registrations disagree: the constructor's
    assert "name one of them" in capsys.readouterr().err


@pytest.mark.slow
def test_a_run_of_a_users_env_module_evaluates_resumes_and_exports_from_another_folder(tmp_path: Path) -> None:
    from console_script import run_milegpo

    home, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    home.mkdir(), elsewhere.mkdir()
    (home / "dial_env.py").write_text(SAFE_MODULE)
    run = tmp_path / "runs" / "dial"
    trained = run_milegpo("train", "env.id=dial_env:Dial", "run.total_timesteps=32", "env.n_tasks=1",
                          "env.group_size=2", "eval.n_tasks=2", "--run-dir", str(run), "--no-progress-bar", cwd=home)
    assert trained.returncode == 0, trained.stderr
    assert json.loads((run / "config.json").read_text())["env"]["module_dir"] == str(home)
    evaluated = run_milegpo("eval", str(run), "--n-tasks", "2", cwd=elsewhere)
    assert evaluated.returncode == 0 and "held_out: success" in evaluated.stdout, evaluated.stderr
    resumed = run_milegpo("train", "--resume", str(run), "run.total_timesteps=64", "--no-progress-bar", cwd=elsewhere)
    assert resumed.returncode == 0, resumed.stderr
    exported = run_milegpo("export", str(run), str(elsewhere / "out"), cwd=elsewhere)
    assert exported.returncode == 0, exported.stderr
