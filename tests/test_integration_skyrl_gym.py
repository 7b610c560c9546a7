"""milegpo.integrations.skyrl_gym on the real skyrl-gym package (its gsm8k envs run on CPU).

The tasks are a few grade-school sums written here in the format SkyRL's gsm8k dataset
script writes (parquet rows with ``prompt``, ``env_class``, ``reward_spec``,
``extra_info``); the data set itself comes from a hub and cannot be had offline.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from milegpo.envs import make_env, make_vec_env

if not os.environ.get("MILEGPO_CI"):
    pytest.importorskip("skyrl_gym")

import skyrl_gym

from milegpo.integrations.skyrl_gym import (
    SkyRLGymEnv,
    load_skyrl_tasks,
    register_skyrl_env,
)

SUMS = [(2, 3), (4, 4), (1, 6), (3, 5)]
INSTRUCTION = "Let's think step by step and output the final answer after \"####\"."


def gsm8k_rows(env_class: str = "gsm8k_multi_turn") -> list[dict]:
    return [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"what is {a} plus {b}? {INSTRUCTION}"}],
            "env_class": env_class,
            "reward_spec": {"method": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": "train", "index": i, "max_turns": 3},
        }
        for i, (a, b) in enumerate(SUMS)
    ]


@pytest.fixture(scope="module")
def parquet_tasks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    import pandas as pd

    path = tmp_path_factory.mktemp("skyrl") / "train.parquet"
    pd.DataFrame(gsm8k_rows()).to_parquet(path)
    return load_skyrl_tasks(path)


def test_parquet_rows_load_back_as_plain_python(parquet_tasks: list[dict], tmp_path: Path) -> None:
    assert parquet_tasks == gsm8k_rows()
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text("\n".join(json.dumps(row) for row in gsm8k_rows()))
    assert load_skyrl_tasks(jsonl) == gsm8k_rows()
    with pytest.raises(ValueError, match="parquet, .jsonl or .json"):
        load_skyrl_tasks(tmp_path / "train.csv")


def test_episode_matches_the_skyrl_env_driven_directly(parquet_tasks: list[dict]) -> None:
    replies = ["I do not know", "the sum is #### 9", "#### 5"]  # no format, wrong answer, right answer
    row = parquet_tasks[0]
    direct = skyrl_gym.make("gsm8k_multi_turn", env_config={}, extras=row)
    direct.init(row["prompt"])
    expected = [direct.step(reply) for reply in replies]
    assert [out["reward"] for out in expected] == [0, pytest.approx(0.2 / 3), 1.0]

    env = SkyRLGymEnv("gsm8k_multi_turn", parquet_tasks)
    observation, info = env.reset(seed=4)  # 4 % 4 tasks -> row 0
    assert info["task"] == row["prompt"][0]["content"] == observation
    assert info["admissible_commands"] is None and info["task_index"] == 0
    keys = [info["state_key"]]
    for reply, out in zip(replies, expected):
        observation, reward, terminated, truncated, info = env.step(reply)
        assert reward == pytest.approx(out["reward"]) and terminated == out["done"] and not truncated
        keys.append(info["state_key"])
    assert info["won"] and info["skyrl_metrics"] == {"steps": 3}
    assert observation == "(no new observation)"
    assert len(set(keys)) == 4  # the same message every turn, still one state per turn


def test_a_wrong_final_answer_is_not_a_win_and_same_seed_same_task(parquet_tasks: list[dict]) -> None:
    env = SkyRLGymEnv("gsm8k_multi_turn", parquet_tasks, commands=["#### 1", "#### 8"])
    _, info = env.reset(seed=1)
    assert info["admissible_commands"] == ["#### 1", "#### 8"]
    for _ in range(3):
        _, reward, terminated, _, info = env.step("#### 1")
    assert terminated and not info["won"] and reward == pytest.approx(0.2 / 3)
    assert env.reset(seed=2)[1]["task"] != env.reset(seed=5)[1]["task"] == env.reset(seed=1)[1]["task"]
    _, _, terminated, _, info = env.step("#### 8")  # 4 + 4
    assert terminated and info["won"]
    env.close()


def test_errors_name_the_fix(parquet_tasks: list[dict], monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(KeyError, match="no env 'nope'.*gsm8k_multi_turn"):
        SkyRLGymEnv("nope", [{"prompt": []}])
    with pytest.raises(ValueError, match="no 'prompt'"):
        SkyRLGymEnv("gsm8k", [{"question": "1+1"}])
    monkeypatch.setitem(sys.modules, "skyrl_gym", None)
    with pytest.raises(ImportError, match=r"milegpo\[skyrl\]"):
        SkyRLGymEnv("gsm8k", parquet_tasks)


def test_registered_skyrl_env_groups_and_trains(parquet_tasks: list[dict], model_path: str) -> None:
    from milegpo import MileGPO

    register_skyrl_env("skyrl/GSM8kMultiTurn-v0", "gsm8k_multi_turn", parquet_tasks,
                       commands=[f"#### {n}" for n in range(4, 10)])
    assert isinstance(make_env("skyrl/GSM8kMultiTurn-v0"), SkyRLGymEnv)
    venv = make_vec_env("skyrl/GSM8kMultiTurn-v0", n_tasks=2, group_size=3, seed=0)
    venv.reset()
    tasks = venv.get_attr("task_index")
    assert tasks[0] == tasks[1] == tasks[2] and tasks[3] == tasks[4] == tasks[5]  # the copies of a group share a task
    model = MileGPO("LLMPolicy", venv, seed=0, learning_rate=1e-2, batch_size=8, policy_kwargs={
        "model": model_path, "mode": "choose", "history_length": 0, "prompt_template": "{task} {observation}"})
    model.learn(total_timesteps=1)  # one grouped rollout of 6 episodes, credit, one update
    batch = model.rollout_buffer.batch
    assert model.iterations == 1 and len(np.unique(batch.task_ids)) == 2 and len(np.unique(batch.traj_ids)) == 6
    assert set(np.round(batch.rewards, 4)) <= {0.0, round(0.2 / 3, 4), 1.0}
    venv.close()


def test_free_text_replies_in_generate_mode_reach_the_skyrl_env(parquet_tasks: list[dict], model_path: str) -> None:
    from milegpo import MileGPO

    venv = make_vec_env(SkyRLGymEnv, n_tasks=1, group_size=2, seed=0,
                        env_kwargs={"env_class": "gsm8k_multi_turn", "tasks": parquet_tasks})
    model = MileGPO("LLMPolicy", venv, seed=0, policy_kwargs={
        "model": model_path, "mode": "generate", "max_new_tokens": 6, "history_length": 0})
    model.learn(total_timesteps=1)
    batch = model.rollout_buffer.batch
    assert model.iterations == 1 and batch.step_idx.max() == 2  # max_turns=3 in the rows' extra_info
    assert all(isinstance(action, str) for action in batch.actions)
    venv.close()
