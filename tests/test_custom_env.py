"""examples/custom_env.py: a user's TextEnv registers, vectorizes and steps like a built-in env."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from milegpo.envs import make_env, make_vec_env, registered_env_ids

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "custom_env.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("custom_env_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_env_is_registered_and_winnable(example):
    assert "examples/Safe-v0" in registered_env_ids()
    env = make_env("examples/Safe-v0")
    assert isinstance(env, example.SafeEnv) and env.max_episode_steps == 12
    _, info = env.reset(seed=7)
    for digit in env.code[:-1]:
        _, reward, terminated, _, info = env.step(f"turn dial to {digit}")
        assert reward == 0.0 and not terminated and info["valid_action"]
    _, reward, terminated, _, info = env.step(f"turn dial to {env.code[-1]}")
    assert reward == 10.0 and terminated and info["won"]


def test_example_env_in_a_grouped_vec_env(example):
    venv = make_vec_env("examples/Safe-v0", n_tasks=3, group_size=2, seed=0)
    try:
        obs = venv.reset()
        assert venv.num_envs == 6 and set(obs) == {"a locked safe. the dial is at zero."}
        codes = venv.get_attr("code")
        assert all(codes[i] == codes[i + 1] for i in (0, 2, 4))  # the copies of a group share the task
        _, rewards, dones, infos = venv.step(["turn dial to 9"] * 6)  # not admissible
        assert rewards.tolist() == [-0.1] * 6 and not dones.any() and not infos[0]["valid_action"]
    finally:
        venv.close()
    assert 0.0 <= example.random_rollout(seed=1) <= 1.0
