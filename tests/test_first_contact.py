"""A new user's first minutes: the habits of stable-baselines3 and TRL users get a pointer, not a traceback
(the headline line and a user's own env through the CLI are tested in test_docs.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from milegpo import MileGPO, evaluate_policy, make_vec_env
from milegpo.cli import main
from milegpo.cli.train import OLD_FLAGS as _OLD_FLAGS
from milegpo.envs import TextEnv, register_env

ROOT = Path(__file__).resolve().parents[1]


def explicit(model_path: str, env) -> MileGPO:
    return MileGPO("LLMPolicy", env, learning_rate=3e-3, seed=0,
                   policy_kwargs={"model": model_path, "mode": "choose", "lora": {"r": 4, "alpha": 8}})


def test_a_policy_setting_given_to_the_algorithm_points_to_policy_kwargs() -> None:
    env = make_vec_env("milegpo/House-v0", n_tasks=1, group_size=2)
    with pytest.raises(ValueError, match=r"^model is a policy setting: pass policy_kwargs=\{'model': 'Qwen/x'\}$"):
        MileGPO("LLMPolicy", env, model="Qwen/x")
    with pytest.raises(ValueError, match=r"mode, model are policy settings: pass policy_kwargs="):
        MileGPO("LLMPolicy", env, model="Qwen/x", mode="choose")


def test_learn_without_a_budget_needs_one_when_a_model_is_given(model_path: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    model = explicit(model_path, make_vec_env("milegpo/House-v0", n_tasks=1, group_size=2,
                                              env_kwargs={"max_episode_steps": 4}))
    monkeypatch.delenv("MILEGPO_TOTAL_TIMESTEPS", raising=False)
    with pytest.raises(TypeError, match=r"learn\(\) needs total_timesteps"):
        model.learn()
    monkeypatch.setenv("MILEGPO_TOTAL_TIMESTEPS", "8")
    assert model.learn().num_timesteps >= 8


class FreeTextEnv(TextEnv):
    """Answers any text; lists no commands."""

    def _reset(self, seed, options):
        return "say something", {"task": "talk"}

    def _step(self, action):
        return "ok", 0.0, True, {"won": False}

    def admissible_commands(self):
        return None


register_env("tests/FreeText-v0", FreeTextEnv)


def test_no_model_and_no_commands_names_what_to_pass() -> None:
    env = make_vec_env("tests/FreeText-v0", n_tasks=1, group_size=2)
    with pytest.raises(ValueError, match=r"no model given and tests/FreeText-v0 lists no admissible commands.*"
                                         r"policy_kwargs=\{'model': 'Qwen/Qwen2.5-1.5B-Instruct'\}.*'generate'"):
        MileGPO("LLMPolicy", env)


def test_predict_finds_its_env_infos_or_says_what_to_pass(model_path: str) -> None:
    env = make_vec_env("milegpo/House-v0", n_tasks=1, group_size=2)
    model = explicit(model_path, env)
    observations = env.reset()
    actions, state = model.predict(observations, deterministic=True)  # SB3's habit: no infos
    commands = env.reset_infos[0]["admissible_commands"]
    assert state is None and len(actions) == 2 and all(action in commands for action in actions)
    with pytest.raises(ValueError, match=r"choose mode needs the env's infos .* milegpo.evaluate_policy"):
        model.predict(np.array(["some other text", "and more"], dtype=object))
    with pytest.raises(TypeError, match=r"stable_baselines3's evaluate_policy .* Use milegpo.evaluate_policy"):
        from stable_baselines3.common.evaluation import evaluate_policy as sb3_evaluate_policy

        sb3_evaluate_policy(model, env, n_eval_episodes=2)
    mean, std = evaluate_policy(model, env, n_eval_episodes=2)
    assert np.isfinite(mean) and np.isfinite(std)


def test_an_unknown_flag_names_its_setting(capsys: pytest.CaptureFixture) -> None:
    assert main(["train", "--learning_rate", "1e-5"]) == 2
    err = capsys.readouterr().err
    assert err == ("error: unknown flag --learning_rate: it is --algo.learning_rate VALUE (or "
                   "algo.learning_rate=VALUE); see milegpo train --help\n")
    assert main(["train", "--no_such_thing", "1"]) == 2
    assert "unknown flag --no_such_thing; settings are --section.field VALUE" in capsys.readouterr().err


def test_a_config_file_says_what_it_starts_from(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = tmp_path / "my.yaml"
    config.write_text("run:\n  total_timesteps: 300\nenv:\n  id: no/Such-v0\n")
    assert main(["train", "--config", str(config), "--run-dir", str(tmp_path / "run")]) == 2
    out = capsys.readouterr().out
    assert f"{config} on top of the defaults, the paper's GPU settings" in out and "--preset cpu-demo" in out
    assert main(["train", "--preset", "cpu-demo", "--config", str(config), "--run-dir", str(tmp_path / "run")]) == 2
    assert "on top of the defaults" not in capsys.readouterr().out


def test_a_hub_model_offline_is_one_line_without_retries(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    result = subprocess.run([sys.executable, "-m", "milegpo", "train", "policy.model=Qwen/Qwen2.5-1.5B-Instruct",
                             "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "'Qwen/Qwen2.5-1.5B-Instruct' is not in the local Hugging Face cache and HF_HUB_OFFLINE is set" in \
        result.stderr


def current_flags() -> set[str]:
    """Every flag of every ``milegpo`` subcommand today."""
    from milegpo.cli import build_parser

    subparsers = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    return {flag for parser in subparsers.choices.values() for action in parser._actions
            for flag in action.option_strings}


def test_no_retired_name_is_left_in_docs_hints_or_errors() -> None:
    """The flags ``milegpo train`` retired (and no subcommand has today) are named only where the refusal
    of old flags is explained; scripts' own flags (benchmarks, examples/, tw-make) are theirs."""
    retired = [flag for flag in _OLD_FLAGS if flag not in current_flags()]
    assert "--algo" in retired and "--model" in retired and "--seed" not in retired
    paths = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "milegpo").rglob("*.py")]
    found = []
    for path in paths:
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            named = [flag for flag in retired if re.search(rf"(?<![\w.-]){re.escape(flag)}(?![\w.-])", line)]
            if not named or re.search(r"benchmarks[/.]|examples/|gpu_check\.py|tw-make|OLD_FLAGS = ", line):
                continue
            if path.parts[-2:] == ("cli", "train.py") and line.strip().startswith('"--'):  # the rest of OLD_FLAGS
                continue
            if path.name == "cli.md" and "earlier versions" in line:  # the page explaining the refusal
                continue
            found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "retired flags still named:\n" + "\n".join(found)
