"""TextEnv base class, TextSpace and the env registry."""

from __future__ import annotations

import gymnasium as gym
import pytest

import milegpo
from milegpo.envs import TextEnv, TextSpace, UnknownEnvError, make_env, normalize_text, register_env, registered_env_ids

INFO_KEYS = {"admissible_commands", "won", "task", "valid_action", "state_key", "score", "elapsed_steps"}


class DoorEnv(TextEnv):
    """Open the door: "open door" wins; "knock" does nothing (same text, different state)."""

    def __init__(self, max_episode_steps: int = 5, **kwargs):
        super().__init__(max_episode_steps=max_episode_steps, **kwargs)
        self.knocks = 0

    def _reset(self, seed, options):
        self.knocks = 0
        return "A closed door.", {"task": "open the door"}

    def _step(self, action):
        if action == "knock":
            self.knocks += 1
            return "A closed door.", 0.0, False, {}
        return "The door opens.", 10.0, True, {"won": True}

    def admissible_commands(self):
        return ["knock", "open door"]


def test_text_space_accepts_any_printable_text():
    space = TextSpace()
    for text in ["go to countertop 1", "", "click[Buy Now]", "café – 2×", "a\nb"]:
        assert space.contains(text)
    assert not space.contains(3) and isinstance(space.sample(), str)
    assert normalize_text("  Nothing\n happens. ") == "nothing happens."


def test_info_keys_valid_and_invalid_actions():
    env = DoorEnv(invalid_action_penalty=0.5)
    obs, info = env.reset(seed=0)
    assert INFO_KEYS <= info.keys() and info["task"] == "open the door" and info["valid_action"]
    assert info["state_key"] == "a closed door." and info["elapsed_steps"] == 0
    obs2, reward, terminated, truncated, info = env.step("  fly away ")
    assert (obs2, reward, terminated, truncated) == (obs, -0.5, False, False) and not info["valid_action"]
    obs3, reward, terminated, truncated, info = env.step(" open door ")  # surrounding blanks are stripped
    assert (obs3, reward, terminated, info["won"], info["score"]) == ("The door opens.", 10.0, True, True, 1.0)
    assert info["elapsed_steps"] == 2 and info["admissible_commands"] == ["knock", "open door"]
    with pytest.raises(RuntimeError, match="finished episode"):
        env.step("knock")


def test_horizon_truncates_and_reset_starts_over():
    env = DoorEnv(max_episode_steps=2)
    env.reset()
    assert env.step("knock")[3] is False
    _, _, terminated, truncated, info = env.step("knock")
    assert truncated and not terminated and not info["won"]
    _, info = env.reset()
    assert info["elapsed_steps"] == 0 and env.knocks == 0


@pytest.mark.parametrize("kwargs, match", [({"invalid_action_penalty": -1}, "invalid_action_penalty"),
                                           ({"max_episode_steps": 0}, "max_episode_steps"),
                                           ({"render_mode": "rgb_array"}, "render_mode")])
def test_constructor_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DoorEnv(**kwargs)


def test_register_and_make_a_custom_env():
    register_env("tests/Door-v0", DoorEnv, max_episode_steps=3)
    assert "tests/Door-v0" in registered_env_ids() and "milegpo/House-v0" in registered_env_ids()
    env = make_env("tests/Door-v0")
    assert isinstance(env, DoorEnv) and env.max_episode_steps == 3 and env.spec.id == "tests/Door-v0"
    assert make_env("tests/Door-v0", max_episode_steps=7).max_episode_steps == 7  # reaches the env, not a TimeLimit
    register_env("tests/Door-v0", DoorEnv, max_episode_steps=4)  # re-registering replaces
    assert make_env("tests/Door-v0").max_episode_steps == 4
    assert milegpo.make_env is make_env


def test_registry_errors_a_user_can_act_on():
    with pytest.raises(UnknownEnvError) as exc:
        make_env("milegpo/Hosue-v0")
    message = str(exc.value)
    assert "Unknown env id 'milegpo/Hosue-v0'" in message
    assert "milegpo/House-v0" in message and "register_env" in message
    with pytest.raises(TypeError, match="must subclass"):
        register_env("tests/NotText-v0", gym.Env)
    gym.register("tests/CartLike-v0", entry_point=lambda: gym.Env())
    with pytest.raises(TypeError, match="not a milegpo.envs.TextEnv"):
        make_env("tests/CartLike-v0")
