"""TextWorld adapter on a real game made by ``tw-make`` (one game per test session)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("textworld")

from milegpo.envs import make_env  # noqa: E402
from milegpo.envs.textworld import TextWorldEnv  # noqa: E402


def tw_make() -> list[str]:
    """The ``tw-make`` command of this Python environment."""
    script = Path(sys.executable).parent / "tw-make"
    if script.is_file():
        return [sys.executable, str(script)]
    if shutil.which("tw-make"):
        return ["tw-make"]
    pytest.skip("tw-make (ships with textworld) not found")


@pytest.fixture(scope="session")
def game_file(tmp_path_factory) -> Path:
    """A small seeded TextWorld game: 3 rooms, 5 objects, a 3-step quest."""
    path = tmp_path_factory.mktemp("textworld") / "game.z8"
    subprocess.run([*tw_make(), "custom", "--world-size", "3", "--nb-objects", "5", "--quest-length", "3",
                    "--seed", "7", "--output", str(path), "--silent", "-f"], check=True, timeout=120)
    return path


@pytest.fixture(scope="session")
def game_json(game_file) -> dict:
    return json.loads(game_file.with_suffix(".json").read_text())


@pytest.fixture()
def env(game_file):
    env = make_env("milegpo/TextWorld-v0", game_files=[game_file])
    yield env
    env.close()


def test_walkthrough_wins_with_score_delta_rewards(env, game_json):
    walkthrough = game_json["metadata"]["walkthrough"]
    _, info = env.reset(seed=0)
    assert info["task"] == game_json["objective"] and not info["won"]
    results = [env.step(command) for command in walkthrough]
    assert all(step_info["valid_action"] for *_, step_info in results)
    assert [terminated for _, _, terminated, _, _ in results] == [False] * (len(walkthrough) - 1) + [True]
    assert results[-1][-1]["won"] and not results[-1][3]
    max_score = sum(quest.get("reward", 1) for quest in game_json["quests"])
    assert sum(reward for _, reward, *_ in results) == pytest.approx(max_score)
    assert results[-1][-1]["score"] == pytest.approx(max_score)


def test_admissible_commands_sorted_and_from_the_engine(env, game_json):
    _, info = env.reset(seed=0)
    commands = info["admissible_commands"]
    assert commands == sorted(commands) and "look" in commands and "inventory" in commands
    assert game_json["metadata"]["walkthrough"][0] in commands


def test_invalid_action_penalised_and_state_unchanged(env):
    observation, info = env.reset(seed=0)
    new_observation, reward, terminated, truncated, step_info = env.step("dance with the grue")
    assert (new_observation, reward, terminated, truncated) == (observation, -0.1, False, False)
    assert not step_info["valid_action"] and step_info["state_key"] == info["state_key"]


def test_state_key_is_the_world_facts_not_the_text(env, game_json):
    _, info = env.reset(seed=0)
    *_, look_info = env.step("look")
    assert look_info["state_key"] == info["state_key"]  # new text, same world
    assert "at(P, " in info["state_key"]
    *_, acted = env.step(game_json["metadata"]["walkthrough"][0])
    assert acted["state_key"] != info["state_key"]


def test_same_seed_same_game_and_seed_modulo_game_count(game_file):
    env = TextWorldEnv(game_files=[game_file, game_file], max_episode_steps=2)
    assert env.num_tasks == 2
    first, info = env.reset(seed=0)
    env.step("look")
    again, info_again = env.reset(seed=2)
    assert (first, info["state_key"]) == (again, info_again["state_key"])
    env.step("inventory")
    *_, truncated, _ = env.step("inventory")
    assert truncated
    env.close()


def test_bad_game_files_are_clear_errors(tmp_path, game_file):
    with pytest.raises(ValueError, match="non-empty list"):
        TextWorldEnv(game_files=[])
    with pytest.raises(ValueError, match="non-empty list"):
        TextWorldEnv(game_files=str(game_file))
    with pytest.raises(FileNotFoundError, match="not found"):
        TextWorldEnv(game_files=[tmp_path / "missing.z8"])
    lonely = tmp_path / "lonely.z8"
    shutil.copy(game_file, lonely)
    with pytest.raises(FileNotFoundError, match="lonely.json"):
        TextWorldEnv(game_files=[lonely])
