"""`TextArena <https://pypi.org/project/textarena/>`_ single-player games as milegpo envs (``textarena:<id>``).

How TextArena's conventions map:

* **Task and seed.** ``reset(seed=s)`` plays ``env.reset(num_players=1, seed=s)``: TextArena seeds
  its game from ``s``, so a group of K copies starts from one board. The game's player prompt is the
  episode's ``task`` and its opening user message (chat prompts); the board and messages after it are
  the first observation. The game is built without TextArena's observation wrappers (its ``-raw``
  form): the messages of each step reach the model once, as a conversation turn.
* **Observation.** The game's messages since the last step, joined (the echo of the player's own
  action left out).
* **Reward and success.** TextArena rewards the player when the game ends (``state.rewards[0]``;
  0 on every earlier step); won is a final reward of at least ``success_reward`` (1: TextArena's
  win). An invalid move is TextArena's own: it answers with its message and, past its error
  allowance, ends the game with its reward.
* **Actions.** The whole reply (``action_format="message"``): TextArena reads the ``[...]`` move
  in it. ``commands=[...]`` makes a game with a finite move list playable in choose mode.
* **State key.** TextArena's own ``game_state`` (e.g. Tower of Hanoi's towers, Guess the Number's
  guesses), hashed; ``state_key_fn`` overrides it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from milegpo.envs.hubs.base import NO_OBSERVATION, HubEnv, hashed_key, import_hub
from milegpo.envs.registry import UnknownEnvError

INSTALL_HINT = 'pip install "milegpo[textarena]"  (or: pip install textarena==0.7.4)'


def textarena_game_ids() -> list[str]:
    """The ids TextArena registers (single- and multi-player; only single-player games play here)."""
    ta = import_hub("textarena", INSTALL_HINT)
    return sorted(ta.envs.registration.ENV_REGISTRY)


def check_textarena_game(game: str) -> None:
    """Raise :class:`~milegpo.envs.UnknownEnvError` (one line, with examples) when TextArena has no game
    ``game``; an ImportError naming the install command when TextArena is not installed."""
    registry = import_hub("textarena", INSTALL_HINT).envs.registration.ENV_REGISTRY
    if game not in registry:
        raise UnknownEnvError(f"TextArena has no game {game!r}; e.g. "
                              f"{sorted(k for k in registry if k.endswith('-v0'))[:12]}")


def make_textarena_game(game: str, **kwargs: Any) -> Any:
    """TextArena's game ``game`` with its registered arguments (``kwargs`` on top), without wrappers."""
    check_textarena_game(game)
    spec = import_hub("textarena", INSTALL_HINT).envs.registration.ENV_REGISTRY[game]
    entry = spec.entry_point
    if isinstance(entry, str):
        module, _, name = entry.partition(":")
        entry = getattr(importlib.import_module(module), name)
    return entry(**{**spec.kwargs, **kwargs})


class TextArenaEnv(HubEnv):
    """A TextArena single-player game as a :class:`~milegpo.envs.TextEnv` (see the module docstring).

    :param game: a TextArena env id (``"GuessTheNumber-v0"``, ``"TowerOfHanoi-v0"``, ...).
    :param game_kwargs: arguments of the game on top of its registered ones.
    """

    def __init__(self, game: str, game_kwargs: Mapping[str, Any] | None = None, success_reward: float = 1.0,
                 commands: Sequence[str] | None = None, state_key_fn: Callable[[Any], str] | None = None,
                 invalid_action_penalty: float = 0.0, max_episode_steps: int = 100, render_mode: str | None = None):
        super().__init__(success_reward, commands, state_key_fn, invalid_action_penalty, max_episode_steps,
                         render_mode)
        self.game = game
        self.game_kwargs = dict(game_kwargs or {})
        self._ta = import_hub("textarena", INSTALL_HINT)
        self.hub: Any = make_textarena_game(game, **self.game_kwargs)

    def _messages_since(self) -> tuple[list[str], list[str]]:
        """(prompts, other messages) the player received since the last call, its own action left out."""
        kinds = self._ta.ObservationType
        _, messages = self.hub.get_observation()
        prompts = [str(m) for _, m, kind in messages if kind == kinds.PROMPT]
        others = [str(m) for sender, m, kind in messages if kind not in (kinds.PROMPT, kinds.PLAYER_ACTION)]
        return prompts, others

    def _reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        self.hub.reset(num_players=1, seed=self.seed_of(seed))
        if self.hub.state.num_players != 1:
            raise ValueError(f"TextArena game {self.game} is not a single-player game")
        prompts, others = self._messages_since()
        task = "\n".join(prompts).strip()
        observation = "\n".join(others).strip() or NO_OBSERVATION
        opening = "\n\n".join(part for part in (task, "\n".join(others).strip()) if part)
        return observation, {"task": task, "messages": [{"role": "user", "content": opening}]}

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        done, step_info = self.hub.step(action)
        _, others = self._messages_since()
        observation = "\n".join(others).strip() or NO_OBSERVATION
        info: dict[str, Any] = {"textarena_info": dict(step_info or {})}
        reward = 0.0
        if done:
            reward = float(self.hub.state.rewards.get(0, 0.0)) if self.hub.state.rewards else 0.0
            info["textarena_game_info"] = dict(self.hub.state.game_info.get(0, {}))
        info["won"] = bool(done) and reward >= self.success_reward
        info["score"] = reward
        return observation, reward, bool(done), info

    def hub_state_key(self) -> str:
        """TextArena's ``game_state`` (hashed)."""
        state = getattr(self.hub, "state", None)
        return hashed_key(getattr(state, "game_state", None)) if state is not None else super().hub_state_key()
