"""``state_key="observation"``: the paper's (and verl-agent's) state key on every bundled env.

In that regime a step's key is the observation text exactly; states that print the same text share a
key. Each env here gets a collision case worked out from its own engine: two different world states
that print the same text get one key in the paper's regime and two with the env's own key.
"""

from __future__ import annotations

import gymnasium as gym
import pytest

import milegpo.envs  # noqa: F401  (registers the envs)
from milegpo.envs.core import TextEnv


def _step(env: gym.Env, action: str) -> dict:
    _, _, _, _, info = env.step(action)
    assert info["valid_action"], action
    return info


def _paper_and_env_keys(env: gym.Env, info: dict) -> tuple[str, str]:
    return info["state_key"], env.unwrapped.state_key()


@pytest.mark.parametrize("env_id, kwargs, move", [
    ("milegpo/ALFWorld-v0", {"size": "small", "task_types": [1, 2]}, "go to "),
    ("milegpo/TWX-coin-v0", {}, "move "),
])
def test_inventory_in_two_places_is_one_paper_key_and_two_env_keys(env_id, kwargs, move):
    """"inventory" prints the same sentence wherever the agent stands: one state for the paper's key."""
    env = gym.make(env_id, state_key="observation", **kwargs)
    _, info = env.reset(seed=0)
    first = _paper_and_env_keys(env, _step(env, "inventory"))
    for command in [c for c in info["admissible_commands"] if c.startswith(move)]:
        env.reset(seed=0)
        _step(env, command)
        second = _paper_and_env_keys(env, _step(env, "inventory"))
        if second[1] != first[1]:  # the move reached another world state
            break
    else:
        pytest.fail(f"no '{move}…' command of {env_id} changed the state")
    assert second[0] == first[0]  # same text: one key in the paper's regime
    assert second[1] != first[1]  # two world states: two keys with the env's own key


def test_webshop_choosing_an_option_is_one_paper_key_and_two_env_keys():
    """WebShop's text page does not show a chosen option: the item page before and after a click is
    one anchor observation (verl-agent's format: the parts after the instruction, quoted)."""
    env = gym.make("milegpo/WebShop-v0", state_key="observation")
    _, info = env.reset(seed=3)
    assert info["state_key"] == "'Search'"
    info = _step(env, "search[usb c cable braided]")
    product = next(c for c in info["admissible_commands"] if c.startswith("click[b0"))
    info = _step(env, product)
    before = _paper_and_env_keys(env, info)
    option = next(c for c in info["admissible_commands"] if c in ("click[black]", "click[white]"))
    after = _paper_and_env_keys(env, _step(env, option))
    assert after[0] == before[0]
    assert after[1] != before[1]
    assert env.unwrapped.goal.instruction_text not in after[0]
    assert after[0].startswith("'Back to Search' [SEP] '")


@pytest.mark.parametrize("env_id, kwargs", [
    ("milegpo/House-v0", {}),
    ("milegpo/TWX-coin-v0", {}),
    ("milegpo/ALFWorld-v0", {"size": "small", "task_types": [1, 2]}),
])
def test_paper_key_is_the_observation_text_exactly(env_id, kwargs):
    env = gym.make(env_id, state_key="observation", **kwargs)
    observation, info = env.reset(seed=1)
    assert info["state_key"] == observation
    observation, _, _, _, info = env.step(info["admissible_commands"][0])
    assert info["state_key"] == observation
    # an invalid action leaves the state, and its key, as they were
    _, _, _, _, invalid = env.step("not a command at all")
    assert not invalid["valid_action"] and invalid["state_key"] == observation


def test_default_is_the_env_key_and_a_bad_source_is_refused():
    env = gym.make("milegpo/House-v0")
    _, info = env.reset(seed=1)
    assert info["state_key"] == env.unwrapped.state_key()
    with pytest.raises(ValueError, match="state_key must be one of"):
        gym.make("milegpo/House-v0", state_key="raw")
    assert TextEnv(state_key="observation").state_key_source == "observation"


def test_a_group_in_worker_processes_carries_the_paper_keys():
    """``env.kwargs.state_key`` reaches every copy of a group, in worker processes too: the G copies of a
    task start from one key, the observation text."""
    from milegpo.envs.vec_env import make_vec_env

    vec = make_vec_env("milegpo/House-v0", n_tasks=2, group_size=3, seed=0,
                       env_kwargs={"state_key": "observation"}, subprocess=True, n_workers=2)
    try:
        observations = vec.reset()
        keys = [info["state_key"] for info in vec.reset_infos]
        assert keys == list(observations)
        assert len(set(keys[:3])) == 1 and len(set(keys[3:])) == 1
    finally:
        vec.close()
