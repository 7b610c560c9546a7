"""GEM envs through the hub adapter, against the real ``gem-llm`` package (0.1.0)."""

from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path

import pytest

if importlib.util.find_spec("gem") is None:  # found, not imported: gem configures the root logger at import
    pytest.skip("pip install --no-deps gem-llm==0.1.0 reasoning-gym==0.1.23 && pip install \"milegpo[gem]\"",
                allow_module_level=True)

from example_modules import load_example  # noqa: E402

from milegpo.cli import build_parser, main, play  # noqa: E402
from milegpo.envs import make_env, make_vec_env  # noqa: E402
from milegpo.envs.hubs import GEMEnv, register_hub_env  # noqa: E402
from milegpo.envs.hubs.gem import import_gem  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


GUESS = "game:GuessTheNumber-v0-easy"
HANOI = "game:TowerofHanoi-v0-easy"
HANOI_WIN = [r"\boxed{A C}", r"\boxed{A B}", r"\boxed{C B}", r"\boxed{A C}", r"\boxed{B A}", r"\boxed{B C}",
             r"\boxed{A C}"]


def direct(game: str, seed: int, actions: list[str]) -> list[float]:
    """GEM driven by itself: the step rewards of ``actions`` until it ends the episode."""
    env = import_gem().make(game)
    env.reset(seed=seed)
    rewards = []
    for action in actions:
        _, reward, terminated, truncated, _ = env.step(action)
        rewards.append(float(reward))
        if terminated or truncated:
            break
    return rewards


def adapted(env: GEMEnv, seed: int, actions: list[str]) -> tuple[list[float], bool, bool]:
    env.reset(seed=seed)
    rewards = []
    for action in actions:
        _, reward, terminated, truncated, info = env.step(action)
        rewards.append(reward)
        if terminated or truncated:
            return rewards, info["won"], terminated
    return rewards, False, False


def binary_search(env: GEMEnv, seed: int) -> list[str]:
    observation, _ = env.reset(seed=seed)
    low, high, played = 1, 10, []
    while True:
        guess = (low + high) // 2
        played.append(rf"\boxed{{{guess}}}")
        observation, _, terminated, _, _ = env.step(played[-1])
        if terminated:
            return played
        low, high = (guess + 1, high) if "higher" in observation else (low, guess - 1)


@pytest.mark.parametrize("seed", [0, 3])
def test_rewards_and_won_equal_gem_on_winning_and_losing_scripts(seed: int) -> None:
    guess, hanoi = GEMEnv(GUESS), GEMEnv(HANOI)
    winning = binary_search(guess, seed)
    number = guess.hub.game_number
    losing = [rf"\boxed{{{n}}}" for n in range(1, 11) if n != number][:4]  # four wrong guesses: GEM's turn limit
    cases = [(guess, GUESS, winning, True), (guess, GUESS, losing, False), (guess, GUESS, ["no box here"], False),
             (hanoi, HANOI, HANOI_WIN, True), (hanoi, HANOI, [r"\boxed{A B}", r"\boxed{B A}"] * 60, False)]
    for env, game, script, wins in cases:
        expected = direct(game, seed, script)
        rewards, won, terminated = adapted(env, seed, script)
        assert terminated and rewards == pytest.approx(expected) and won is wins, (game, script[:3], rewards)


def test_a_group_starts_from_one_state_and_the_board_is_in_the_observation() -> None:
    venv = make_vec_env(GEMEnv, n_tasks=2, group_size=3, seed=0, env_kwargs={"game": GUESS})
    venv.reset()
    numbers = [hub.game_number for hub in venv.get_attr("hub")]
    keys = venv.env_method("state_key")
    assert numbers[0] == numbers[1] == numbers[2] and numbers[3] == numbers[4] == numbers[5] and keys[0] == keys[2]
    venv.close()
    env = GEMEnv(HANOI)
    observation, info = env.reset(seed=0)
    assert "A: [3, 2, 1]" in observation and "Tower of Hanoi" in info["task"]
    assert "A: [3, 2, 1]" in info["messages"][0]["content"] and info["action_format"] == "message"
    observation, *_ = env.step(r"\boxed{A C}")
    assert "C: [1]" in observation
    assert register_hub_env(f"gem:{HANOI}", max_episode_steps=9)
    made = make_env(f"gem:{HANOI}")
    assert isinstance(made, GEMEnv) and made.game == HANOI and made.max_episode_steps == 9
    with pytest.raises(KeyError, match="no env"):
        GEMEnv("game:Nothing-v0")



@pytest.mark.parametrize("command", ["play", "train", "check-env"])
def test_an_unknown_game_is_one_line_reported_first(command: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    """Before: play raised a KeyError (an 18-21 line traceback); train said "has no task splits" first."""
    argv = {"play": ["play", "gem:nope"], "check-env": ["check-env", "gem:nope"],
            "train": ["train", "env.id=gem:nope", "--run-dir", str(tmp_path / "run")]}[command]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert len(err.splitlines()) == 1 and err.startswith("error: GEM has no env 'nope'; its games: [")
    assert "no task splits" not in out and not (tmp_path / "run").exists()

def test_cli_trains_evaluates_plays_and_exports(tmp_path: Path) -> None:
    kwargs = {"commands": [rf"\boxed{{{n}}}" for n in range(1, 11)], "max_episode_steps": 4}
    run = tmp_path / "run"
    assert main(["train", f"env.id=gem:{GUESS}", f"env.kwargs={json.dumps(kwargs)}",
                 "env.n_tasks=1", "env.group_size=2", "eval.n_tasks=1", "run.total_timesteps=16",
                 "--run-dir", str(run), "--no-progress-bar"]) == 0
    assert main(["eval", str(run), "--n-tasks", "1"]) == 0
    assert main(["export", str(run), str(tmp_path / "exported")]) == 0
    out = io.StringIO()
    args = build_parser().parse_args(["play", f"gem:{GUESS}", "--env-kwargs", json.dumps(kwargs)])
    assert play(args, stdin=io.StringIO("\\boxed{5}\n:q\n"), stdout=out) == 0
    assert "you guessed 5" in out.getvalue()


def test_the_example_trains(tmp_path: Path) -> None:
    result = load_example("gem_guess_number").main(["--steps", "48", "--n-eval-tasks", "2", "--out", str(tmp_path)])
    assert result["num_timesteps"] >= 48 and 0.0 <= result["success_after"] <= 1.0
