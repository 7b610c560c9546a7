"""Evaluation's per-step work, kept or vectorised, against what it replaced: prompts kept per what they show,
House's texts kept per state, a vec step's infos."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import AutoTokenizer

from milegpo.envs import house, make_vec_env
from milegpo.envs.house import HouseEnv, Layout, State, admissible, describe, generate_layout, transition
from milegpo.policies import PromptBuilder, tiny_model
from milegpo.policies.prompt_tokens import KeptPromptBuilder
from milegpo.policies.prompts import INSTRUCTIONS

TEXTS = ["you are in the hall . you see a red box and a door to the kitchen", "go to kitchen", "open red box",
         "Your task : put the apple in the fridge", "Step observation action"]
TASKS = ["put the apple in the fridge", "open red box"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return AutoTokenizer.from_pretrained(tiny_model(TEXTS, tmp_path_factory.mktemp("tok")))


@pytest.mark.parametrize("template", [
    "{task} {observation}",
    "{observation}",
    "Step {step}: {observation}",
    "{task} {history} {observation} [{admissible_commands}]",
    "{task} {history} Step {step}: {observation} [{admissible_commands}] {instructions}",
])
@pytest.mark.parametrize("history_length", [0, 2])
def test_kept_prompts_keyed_on_what_the_template_shows_equal_the_prompt_builder(tokenizer, template, history_length):
    plain = PromptBuilder(tokenizer, template, INSTRUCTIONS["choose"], history_length, 512)
    kept = KeptPromptBuilder(tokenizer, template, INSTRUCTIONS["choose"], history_length, 512)
    rng = np.random.default_rng(history_length)
    history: list[tuple[str, str]] = []
    for step in range(60):
        task = TASKS[step // 20 % 2]
        obs = TEXTS[int(rng.integers(len(TEXTS)))]
        commands = None if step % 7 == 0 else ["go to kitchen", "open red box"][: 1 + step % 2]
        if step % 10 == 0:
            history = []  # a new episode: the same states at other step numbers
        assert kept.build(task, obs, history, commands) == plain.build(task, obs, history, commands)
        history.append((obs, "go to kitchen" if step % 3 else "open red box"))


def test_a_state_shown_without_its_step_number_is_built_once(tokenizer):
    """The CPU demo's template shows the task and the observation only: a state met at ten step numbers is one
    kept prompt (it was ten)."""
    kept = KeptPromptBuilder(tokenizer, "{task} {observation}", INSTRUCTIONS["choose"], 0, 512)
    history: list[tuple[str, str]] = []
    for step in range(10):
        kept.build(TASKS[0], TEXTS[0], history, ["go to kitchen", "open red box"][: 1 + step % 2])
        history.append((TEXTS[0], "go to kitchen"))
    assert len(kept._kept) == 1
    numbered = KeptPromptBuilder(tokenizer, "Step {step}: {observation}", INSTRUCTIONS["choose"], 0, 512)
    for step in range(10):
        numbered.build(TASKS[0], TEXTS[0], history[:step], None)
    assert len(numbered._kept) == 10  # a template that shows the step number: one prompt per step


@pytest.mark.parametrize("split", ["train", "eval_id", "eval_ood"])
def test_house_texts_kept_per_state_equal_fresh_ones_at_every_state(split, monkeypatch):
    """The description, commands and key an env shows equal ``describe`` / ``admissible`` / ``key()`` computed
    afresh, at every state of random walks, with a cache that fills and is emptied along the way; a second env
    walking the same states computes none of them again."""
    monkeypatch.setattr(house, "STATE_TEXTS_MAX", 50)
    house._STATE_TEXTS.clear()
    env = HouseEnv(split=split)
    rng = np.random.default_rng(7)
    for seed in range(12):
        obs, info = env.reset(seed=seed)
        assert obs == f"{env.layout.task} {describe(env.layout, env.state)}"
        for _ in range(40):
            assert info["admissible_commands"] == admissible(env.layout, env.state)
            assert info["state_key"] == env.state.key() and len(house._STATE_TEXTS) <= 50
            command = str(rng.choice(info["admissible_commands"]))
            state, feedback = transition(env.layout, env.state, command)
            obs, _, terminated, truncated, info = env.step(command)
            assert obs == (feedback if state.won else f"{feedback} {describe(env.layout, state)}".lstrip())
            if terminated or truncated:
                break

    monkeypatch.setattr(house, "STATE_TEXTS_MAX", 32768)

    def walk(env: HouseEnv) -> list[str]:
        rng = np.random.default_rng(3)
        _, info = env.reset(seed=1)
        keys = [info["state_key"]]
        for _ in range(20):
            *_, info = env.step(str(rng.choice(info["admissible_commands"])))
            keys.append(info["state_key"])
        return keys

    first = walk(HouseEnv(split=split))
    calls: list[State] = []

    def counted(layout: Layout, state: State) -> list[str]:
        calls.append(state)
        return admissible(layout, state)

    monkeypatch.setattr(house, "admissible", counted)
    assert walk(HouseEnv(split=split)) == first and calls == []  # the same states: all kept from the first walk


def test_a_vec_step_copies_only_the_finished_envs_last_infos():
    """Each step's infos are the stepped envs' new infos and, for the envs already finished, a copy of their last
    info marked inactive (what copying every env's last info and overwriting the stepped ones gave)."""
    env = make_vec_env("milegpo/House-v0", n_tasks=3, group_size=2, env_kwargs={"max_episode_steps": 30})
    rng = np.random.default_rng(0)
    env.reset_groups([0, 1, 2])
    infos = [dict(info) for info in env.reset_infos]
    plans = {0: house.solve(generate_layout("train", 0)), 3: house.solve(generate_layout("train", 1))}
    finished_seen, step = False, 0
    while env.active.any():
        was_active, last = env.active.copy(), [dict(info) for info in env._last_infos]
        actions = np.full(env.num_envs, "", dtype=object)
        for i in np.flatnonzero(was_active):  # envs 0 and 3 win on their plans, the others walk until the horizon
            plan = plans.get(int(i))
            actions[i] = plan[step] if plan else str(rng.choice(infos[i]["admissible_commands"]))
        _, _, dones, new_infos = env.step(actions)
        for i in range(env.num_envs):
            if was_active[i]:
                assert "inactive" not in new_infos[i] and new_infos[i] is env._last_infos[i]
            else:
                finished_seen = True
                assert new_infos[i] == {**last[i], "inactive": True} and new_infos[i] is not env._last_infos[i]
                assert dones[i]
        infos, step = new_infos, step + 1
    env.close()
    assert finished_seen
