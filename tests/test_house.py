"""HouseEnv: solvable tasks, determinism, disjoint splits, invalid actions, true-state keys, vocabulary."""

from __future__ import annotations

import numpy as np
import pytest

from milegpo.envs import make_env
from milegpo.envs.house import (
    MAX_OPTIMAL_STEPS,
    OOD_TREASURES,
    PIT,
    SPLITS,
    HouseEnv,
    generate_layout,
    initial_state,
    plan,
    solve,
    words,
)


def _play(env: HouseEnv, commands: list[str]) -> list[tuple]:
    out = []
    for command in commands:
        out.append(env.step(command))
    return out


@pytest.mark.parametrize("split", sorted(SPLITS))
def test_every_task_is_solvable_and_the_solver_wins(split):
    env = HouseEnv(split=split)
    assert env.num_tasks == SPLITS[split].num_tasks
    assert env.max_episode_steps == 30 and MAX_OPTIMAL_STEPS <= env.max_episode_steps
    for index in range(env.num_tasks):
        env.reset(seed=index)
        path = env.solve()
        assert path is not None and len(path) <= MAX_OPTIMAL_STEPS
        results = _play(env, path)
        assert all(info["valid_action"] for *_, info in results)
        _, reward, terminated, truncated, info = results[-1]
        assert reward == 10.0 and terminated and not truncated and info["won"]
        assert all(r == 0.0 and not t for _, r, t, _, _ in results[:-1])


def test_reset_is_deterministic_by_seed():
    a, b = HouseEnv(), HouseEnv()
    obs_a, info_a = a.reset(seed=17)
    obs_b, info_b = b.reset(seed=17 + a.num_tasks)  # seed s -> task s % num_tasks
    assert obs_a == obs_b and info_a == info_b and a.layout == b.layout
    assert info_a["task_index"] == 17 and info_a["task"] in obs_a
    rng = np.random.default_rng(0)
    for _ in range(10):
        command = rng.choice(info_a["admissible_commands"])
        step_a, step_b = a.step(command), b.step(command)
        assert step_a == step_b
        info_a = step_a[-1]
        if step_a[2] or step_a[3]:
            break
    assert a.reset(seed=3)[0] != a.reset(seed=4)[0]


def test_splits_are_disjoint_and_ood_is_out_of_distribution():
    signatures = {split: {generate_layout(split,
                                          i).signature() for i in range(SPLITS[split].num_tasks)} for split in SPLITS}
    assert len(signatures["train"]) == 1000  # all train tasks are distinct
    assert not signatures["train"] & signatures["eval_id"]
    assert not (signatures["train"] | signatures["eval_id"]) & signatures["eval_ood"]
    treasures = {split: {tuple(generate_layout(split, i).treasure.split()) for i in range(50)} for split in SPLITS}
    assert treasures["eval_ood"] <= OOD_TREASURES and not (treasures["train"] | treasures["eval_id"]) & OOD_TREASURES
    rooms = {split: np.mean([len(generate_layout(split, i).rooms) for i in range(50)]) for split in SPLITS}
    assert rooms["eval_ood"] > rooms["eval_id"]


def test_invalid_action_penalty_and_unchanged_state():
    env = make_env("milegpo/House-v0", invalid_action_penalty=0.25)
    obs, info = env.reset(seed=5)
    key = info["state_key"]
    obs2, reward, terminated, truncated, info2 = env.step("dance on the table")
    assert obs2 == obs and reward == -0.25 and not terminated and not truncated
    assert not info2["valid_action"] and info2["state_key"] == key
    assert info2["admissible_commands"] == info["admissible_commands"]


def test_horizon_truncates():
    env = HouseEnv(max_episode_steps=3)
    env.reset(seed=0)
    results = _play(env, ["xyzzy"] * 3)
    assert [r[3] for r in results] == [False, False, True] and not results[-1][2]


def test_admissible_commands_are_sorted_and_executable():
    env = HouseEnv()
    rng = np.random.default_rng(1)
    for seed in range(20):
        _, info = env.reset(seed=seed)
        done = False
        while not done:
            commands = info["admissible_commands"]
            assert commands == sorted(commands) and commands
            _, _, terminated, truncated, info = env.step(str(rng.choice(commands)))
            assert info["valid_action"]
            done = terminated or truncated


def _find_layout(split, predicate):
    return next(i for i in range(SPLITS[split].num_tasks) if predicate(generate_layout(split, i)))


def test_the_pit_says_how_many_climbs_are_left():
    env = HouseEnv()
    env.reset(seed=_find_layout("train", lambda lay: any(e.kind == "rotten" for e in lay.edges)))
    fall = _play(env, plan(env.layout, env.state, lambda s: s.location == PIT))[-1]
    first = env.step("climb rope")
    second = env.step("climb rope")
    assert "three climbs up" in fall[0] and "two climbs up" in first[0] and "one climb up" in second[0]
    assert first[-1]["state_key"] != second[-1]["state_key"]
    assert set(words(fall[0] + first[0] + second[0])) <= set(HouseEnv.vocabulary())


def test_state_key_sees_a_door_unlocked_elsewhere():
    # Walking into a room away from the locked door prints the same text before and after unlocking it.
    env = HouseEnv()
    for seed in range(50):
        env.reset(seed=seed)
        layout = env.layout
        door = next(e for e in layout.edges if e.kind == "door")
        key = f"{door.color} key"
        far = [r for r in layout.rooms if r not in (door.a, door.b, dict(layout.places)[key])
               and not any(e.kind == "heavy" and e.b == r for e in layout.edges)]
        if far:
            break
    room = far[0]
    _play(env, plan(layout, env.state, lambda s: key in s.holding()))
    before = _play(env, plan(layout, env.state, lambda s: s.location == room))[-1]
    _play(env, plan(layout, env.state, lambda s: bool(s.unlocked)))
    after = _play(env, plan(layout, env.state, lambda s: s.location == room))[-1]
    assert before[0] == after[0] and f"you are in the {room}" in after[0]
    assert before[-1]["state_key"] != after[-1]["state_key"]


def test_vocabulary_covers_everything_printed():
    vocab = set(HouseEnv.vocabulary())
    assert len(vocab) < 200 and vocab == {w.lower() for w in vocab}
    rng = np.random.default_rng(2)
    for split in SPLITS:
        env = HouseEnv(split=split)
        for seed in range(15):
            obs, info = env.reset(seed=seed)
            texts = [obs, info["task"], *info["admissible_commands"]]
            for command in env.solve():
                obs, *_, info = env.step(command)
                texts += [obs, *info["admissible_commands"]]
            obs, info = env.reset(seed=seed)
            for _ in range(30):  # a random walk visits traps, pits and junk too
                obs, _, term, trunc, info = env.step(str(rng.choice(info["admissible_commands"])))
                texts += [obs, *info["admissible_commands"]]
                if term or trunc:
                    break
            missing = {w for text in texts for w in words(text)} - vocab
            assert not missing, f"{split} seed {seed}: words outside vocabulary(): {missing}"
            assert all(text == text.lower() for text in texts)


def test_solver_is_optimal_on_a_tiny_search():
    layout = generate_layout("train", 0)
    path = solve(layout)
    shorter = plan(layout, initial_state(layout), lambda s: s.won, useful_only=False, max_depth=len(path) - 1)
    assert shorter is None  # no path of fewer steps exists, even with every command allowed
