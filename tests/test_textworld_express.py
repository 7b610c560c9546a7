"""TextWorld-Express adapter: real engine, upstream's gold paths, seeds and splits."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

pytest.importorskip("textworld_express")
if shutil.which("java") is None:
    pytest.skip("TextWorld-Express needs a Java runtime on PATH", allow_module_level=True)

from milegpo.envs import make_env  # noqa: E402
from milegpo.envs import textworld_express as twx  # noqa: E402
from milegpo.envs.registration import TWX_GAMES  # noqa: E402
from milegpo.envs.textworld_express import TextWorldExpressEnv, game_param_string  # noqa: E402

SMALL_COIN = {"numLocations": 3, "numDistractorItems": 0, "includeDoors": False}


@pytest.fixture(scope="module")
def upstream():
    """Upstream's own Python env (its own JVM): the reference for seeds and gold paths."""
    from textworld_express import TextWorldExpressEnv as UpstreamEnv

    env = UpstreamEnv()
    yield env
    env.close()


def play(env: TextWorldExpressEnv, actions: list[str]) -> list[tuple]:
    """Step ``actions`` until the episode ends (upstream's twc gold paths can run one move past the win)."""
    results = []
    for action in actions:
        results.append(env.step(action))
        if results[-1][2] or results[-1][3]:
            break
    return results


@pytest.mark.parametrize("game", TWX_GAMES)
def test_upstream_gold_action_sequence_wins_through_the_adapter(game, upstream):
    env = make_env(f"milegpo/TWX-{game}-v0")
    assert isinstance(env, TextWorldExpressEnv) and env.game == game
    for seed in (0, 1, 2):
        observation, _ = env.reset(seed=seed)
        expected, _ = upstream.reset(seed=env.engine_seed(seed), gameFold="train", gameName=game, gameParams="",
                                     generateGoldPath=True)
        assert observation == expected
        gold = upstream.getGoldActionSequence()
        results = play(env, gold)
        assert len(results) >= len(gold) - 1 and all(step_info["valid_action"] for *_, step_info in results)
        assert results[-1][2] and not results[-1][3]  # terminated, not truncated
        assert results[-1][-1]["won"] and not any(step_info["won"] for *_, step_info in results[:-1])
        assert sum(reward for _, reward, *_ in results) == pytest.approx(1.0)  # score delta: sums to the final score


@pytest.mark.parametrize("game", ["cookingworld", "twc"])
def test_gold_path_in_reset_info_wins(game):
    env = TextWorldExpressEnv(game, split="eval_ood", gold_path=True)
    _, info = env.reset(seed=11)
    results = play(env, info["gold_actions"])
    assert results[-1][2] and results[-1][-1]["won"] and all(step_info["valid_action"] for *_, step_info in results)


@pytest.mark.parametrize(("split", "fold"), [("train", "train"), ("dev", "dev"), ("test", "test"),
                                             ("eval_id", "dev"), ("eval_ood", "test")])
def test_seed_s_plays_the_s_th_upstream_seed_of_the_split(split, fold, upstream):
    env = TextWorldExpressEnv("coin", split=split, **SMALL_COIN)
    upstream_seeds = {"train": upstream.getValidSeedsTrain, "dev": upstream.getValidSeedsDev,
                      "test": upstream.getValidSeedsTest}[fold]()
    assert env.num_tasks == len(upstream_seeds) == 1000
    for seed in (0, 7):
        observation, _ = env.reset(seed=seed)
        expected, _ = upstream.reset(seed=upstream_seeds[seed], gameFold=fold, gameName="coin",
                                     gameParams=game_param_string(SMALL_COIN))
        assert observation == expected
    assert env.engine_seed(env.num_tasks + 7) == upstream_seeds[7]


def test_splits_differ_and_resets_are_reproducible():
    train = TextWorldExpressEnv("cookingworld", split="train")
    test = TextWorldExpressEnv("cookingworld", split="eval_ood")
    first, info = train.reset(seed=4)
    again, info_again = train.reset(seed=4)
    assert (first, info["state_key"], info["admissible_commands"]) == (
        again, info_again["state_key"], info_again["admissible_commands"])
    assert train.reset(seed=4 + train.num_tasks)[0] == first
    assert test.reset(seed=4)[0] != first


def test_info_keys_and_sorted_admissible_commands():
    env = TextWorldExpressEnv("cookingworld")
    _, info = env.reset(seed=0)
    assert info["task"].startswith("You are hungry!")
    commands = info["admissible_commands"]
    assert commands == sorted(commands) and "look around" in commands
    assert info["won"] is False and info["score"] == 0.0


def test_game_params_as_kwargs_dict_or_string_are_the_same_game():
    assert game_param_string(SMALL_COIN) == "numLocations=3,numDistractorItems=0,includeDoors=0"
    assert game_param_string("numLocations=5, includeDoors=1", includeDoors=False) == "numLocations=5,includeDoors=0"
    by_kwargs = TextWorldExpressEnv("coin", **SMALL_COIN)
    by_dict = make_env("milegpo/TWX-coin-v0", game_params=SMALL_COIN)
    by_string = TextWorldExpressEnv("coin", game_params="numLocations=3,numDistractorItems=0,includeDoors=0")
    observations = {env.reset(seed=3)[0] for env in (by_kwargs, by_dict, by_string)}
    assert len(observations) == 1


def test_game_params_change_the_game():
    one_room = TextWorldExpressEnv("cookingworld", numLocations=1, numIngredients=1, numDistractorItems=0)
    default = TextWorldExpressEnv("cookingworld")
    _, info = one_room.reset(seed=0)
    assert not any(command.startswith("move") for command in info["admissible_commands"])
    assert any(command.startswith("move") for command in default.reset(seed=0)[1]["admissible_commands"])


def test_unknown_game_param_or_split_is_a_clear_error():
    with pytest.raises(ValueError, match="numRooms.*Known properties: numLocations"):
        TextWorldExpressEnv("coin", numRooms=3)
    with pytest.raises(ValueError, match="split must be one of"):
        TextWorldExpressEnv("coin", split="validation")
    with pytest.raises(ValueError, match="Unknown game"):
        TextWorldExpressEnv("chess")


def test_invalid_action_penalised_state_unchanged_and_horizon_truncates():
    env = TextWorldExpressEnv("coin", max_episode_steps=2, invalid_action_penalty=0.5, **SMALL_COIN)
    observation, info = env.reset(seed=0)
    new_observation, reward, terminated, truncated, step_info = env.step("take the moon")
    assert (new_observation, reward, terminated, truncated) == (observation, -0.5, False, False)
    assert not step_info["valid_action"] and step_info["state_key"] == info["state_key"]
    assert step_info["admissible_commands"] == info["admissible_commands"]
    *_, truncated, step_info = env.step("look around")
    assert truncated and step_info["valid_action"] and step_info["elapsed_steps"] == 2


def test_state_key_separates_states_with_the_same_feedback_text():
    env = TextWorldExpressEnv("coin", **SMALL_COIN)
    _, start = env.reset(seed=0)
    here, _, _, _, here_info = env.step("inventory")
    env.step("move east")
    there, _, _, _, there_info = env.step("inventory")
    assert here == there and here_info["state_key"] != there_info["state_key"]
    env.step("move west")
    assert env.step("look around")[-1]["state_key"] == start["state_key"]  # back at the start: the same state


def test_one_jvm_per_process_shared_by_independent_envs():
    a, b = TextWorldExpressEnv("coin", **SMALL_COIN), TextWorldExpressEnv("coin", **SMALL_COIN)
    assert list(twx._GATEWAYS) == [twx.os.getpid()]
    assert twx._java_gateway() is twx._java_gateway()
    gold = TextWorldExpressEnv("coin", gold_path=True, **SMALL_COIN).reset(seed=5)[1]["gold_actions"]
    a.reset(seed=5)
    b.reset(seed=9)  # b plays another game on the same JVM between a's steps
    interleaved = []
    for action in gold:
        interleaved.append(a.step(action)[0])
        b.step("look around")
    a.reset(seed=5)
    assert interleaved == [a.step(action)[0] for action in gold]


def test_missing_java_says_what_to_install(monkeypatch):
    monkeypatch.setattr(twx, "_GATEWAYS", {})
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="no `java` executable is on PATH. Install a Java runtime"):
        TextWorldExpressEnv("coin")


def test_reset_without_seed_picks_a_task_of_the_split():
    env = TextWorldExpressEnv("coin", **SMALL_COIN)
    observation, info = env.reset()
    assert observation and info["admissible_commands"]


COIN_WITH_DOORS = {"numLocations": 5, "numDistractorItems": 0, "includeDoors": True}


def test_gold_walk_without_detours():
    gold = ["look around", "open door to south", "open door to west", "move south", "move north", "move west",
            "take coin"]
    assert twx._without_detours(gold) == ["west"]
    assert twx._without_detours(["move east", "move north", "move south", "move south"]) == ["east", "south"]
    assert twx._without_detours(["take coin"]) == []


def test_coin_expert_walks_back_to_the_route_and_reopens_doors():
    """Train task 1, worked out by hand: the coin is one room west of the kitchen, behind a closed
    door; the agent first wanders south into the pantry and shuts the door. (Upstream's gold path
    for a task varies from reset to reset, in its detours only.)"""
    env = make_env("milegpo/TWX-coin-v0", **COIN_WITH_DOORS, gold_path=True)
    _, info = env.reset(seed=1)
    assert twx._without_detours(info["gold_actions"]) == ["west"]
    assert env.expert_action() == "open door to west"
    env.step("open door to south")
    env.step("move south")  # off the route: in the pantry
    env.step("close door to north")
    assert env.expert_action() == "open door to north"
    env.step("open door to north")
    assert env.expert_action() == "move north"
    env.step("move north")  # back in the kitchen, on the route
    assert env.expert_action() == "open door to west"
    env.step("open door to west")
    assert env.expert_action() == "move west"
    env.step("move west")
    assert env.expert_action() == "take coin"
    *_, terminated, _, info = env.step("take coin")
    assert terminated and info["won"]
    env.close()


def test_coin_expert_wins_every_task_from_the_start_and_after_random_detours():
    env = make_env("milegpo/TWX-coin-v0", **COIN_WITH_DOORS, gold_path=True, max_episode_steps=40)
    rng = np.random.default_rng(0)
    for seed in range(20):
        _, info = env.reset(seed=seed)
        gold_length = len(info["gold_actions"])
        for steps in range(1, 41):  # noqa: B007  the number of steps taken is read after the loop
            action = env.expert_action()
            assert action in info["admissible_commands"]
            *_, terminated, _, info = env.step(action)
            if terminated:
                break
        assert info["won"] and steps <= gold_length  # the gold path's detours cut out
        _, info = env.reset(seed=seed)
        terminated, steps = False, 0
        while not terminated and steps < 30:
            commands = env.admissible_commands()
            action = commands[rng.integers(len(commands))] if steps < 6 else env.expert_action()  # wander first
            *_, terminated, _, info = env.step(action)
            steps += 1
        won = info["won"]
        assert won, f"task {seed}: the expert did not find its way back"
    env.close()


def test_coin_expert_needs_the_gold_path_and_other_games_have_none():
    with pytest.raises(ValueError, match="gold_path=True"):
        make_env("milegpo/TWX-coin-v0", **SMALL_COIN).expert_action()
    with pytest.raises(NotImplementedError, match="no scripted expert"):
        make_env("milegpo/TWX-arithmetic-v0").expert_action()
