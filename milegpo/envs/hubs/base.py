"""What the hub adapters share: :class:`HubEnv`, a :class:`~milegpo.envs.TextEnv` over another library's env.

A hub env parses its own replies (``\\boxed{5}``, ``[A C]``, a tool call), so the whole reply reaches it
(:attr:`HubEnv.action_format` ``"message"``; ``"tools"`` for envs that offer functions). Free text by
default (generate mode); a fixed list of ``commands`` makes a finite game playable in choose mode.
The episode is won when the hub ends it with a final reward of at least ``success_reward``, unless
the hub says so itself. ``state_key_fn(env) -> str`` overrides each adapter's default state key.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from milegpo.envs.core import TextEnv, normalize_text

NO_OBSERVATION = "(no new observation)"


def import_hub(module: str, install: str) -> Any:
    """Import a hub's package, or raise an ImportError naming the install command."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"this env needs the {module!r} package, which is not installed: {install}") from error


def hashed_key(value: Any) -> str:
    """A short, stable key for a JSON-able state (sorted keys; anything else by its ``str``)."""
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


class HubEnv(TextEnv):
    """Base of the hub adapters (see the module docstring).

    :param success_reward: the final reward from which an episode counts as won (when the hub has no
        success flag of its own).
    :param commands: admissible replies for choose mode (e.g. ``["\\\\boxed{1}", ...]``); None: free text.
    :param state_key_fn: ``(env) -> str``, the state key instead of the adapter's default.
    """

    action_format = "message"

    def __init__(self, success_reward: float = 1.0, commands: Sequence[str] | None = None,
                 state_key_fn: Callable[[Any], str] | None = None, invalid_action_penalty: float = 0.0,
                 max_episode_steps: int = 50, render_mode: str | None = None):
        super().__init__(invalid_action_penalty=invalid_action_penalty, max_episode_steps=max_episode_steps,
                         render_mode=render_mode)
        self.success_reward = float(success_reward)
        self.commands = list(commands) if commands is not None else None
        self.state_key_fn = state_key_fn

    def admissible_commands(self) -> list[str] | None:
        return list(self.commands) if self.commands is not None else None

    def seed_of(self, seed: int | None) -> int:
        """The hub's seed: ``seed`` itself (a group shares it), else one drawn from the env's generator."""
        return int(seed) if seed is not None else int(self.np_random.integers(2**31 - 1))

    def hub_state_key(self) -> str:
        """The adapter's default key (the normalised observation; adapters with a hub state override it)."""
        return normalize_text(self._observation)

    def state_key(self) -> str:
        if self.state_key_fn is not None:
            return str(self.state_key_fn(self))
        return self.hub_state_key()
