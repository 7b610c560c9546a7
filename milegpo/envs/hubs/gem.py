"""`GEM <https://pypi.org/project/gem-llm/>`_ (``gem-llm``) envs as milegpo envs (``gem:<id>``,
e.g. ``gem:game:GuessTheNumber-v0-easy``).

How GEM's conventions map:

* **Task and seed.** ``reset(seed=s)`` is GEM's ``env.reset(seed=s)``, which seeds its game from
  ``s``: a group of K copies starts from one state. The instructions GEM returns at reset are the
  episode's ``task``; with the step prompt GEM puts in ``info["suffix"]`` (the board, "Enter your
  guess.") they are the opening user message of a chat prompt.
* **Observation.** The text GEM returns for a step, then its ``suffix`` (the current board).
* **Reward and success.** GEM's step reward, unchanged; GEM ends the episode (``terminated`` or
  ``truncated``); won is a final reward of at least ``success_reward`` (GEM's
  ``LanguageGameReward.success_reward``, 1). GEM's own format errors end its episodes with its
  format-error reward.
* **Actions.** The whole reply (``action_format="message"``): GEM reads the ``\\boxed{...}`` answer
  in it. ``commands=[...]`` makes a game with a finite move list playable in choose mode.
* **State key.** The normalised observation with the suffix (GEM gives no state of its own; for
  its board games the suffix is the board); ``state_key_fn`` overrides it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from milegpo.envs.core import normalize_text
from milegpo.envs.hubs.base import NO_OBSERVATION, HubEnv, import_hub
from milegpo.envs.registry import UnknownEnvError

INSTALL_HINT = ('pip install --no-deps gem-llm==0.1.0 reasoning-gym==0.1.23 && pip install "milegpo[gem]"  '
                "(gem-llm's own pins would replace omegaconf's antlr4 runtime)")


def import_gem() -> Any:
    """``gem``, imported without the root logging configuration it installs at import."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    gem = import_hub("gem", INSTALL_HINT)
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)
    return gem


def gem_env_ids() -> list[str]:
    """The ids GEM registers."""
    return sorted(import_gem().envs.registration.ENV_REGISTRY)


def check_gem_id(game: str) -> None:
    """Raise :class:`~milegpo.envs.UnknownEnvError` (one line, with its games) when GEM has no env ``game``;
    an ImportError naming the install command when GEM is not installed."""
    registry = import_gem().envs.registration.ENV_REGISTRY
    if game not in registry:
        games = sorted(k for k in registry if k.startswith("game:"))
        raise UnknownEnvError(f"GEM has no env {game!r}; its games: {games}")


class GEMEnv(HubEnv):
    """A GEM env as a :class:`~milegpo.envs.TextEnv` (see the module docstring).

    :param game: a GEM env id (``"game:GuessTheNumber-v0-easy"``, ``"game:TowerofHanoi-v0-easy"``, ...).
    :param game_kwargs: arguments of ``gem.make`` on top of the registered ones.
    """

    def __init__(self, game: str, game_kwargs: Mapping[str, Any] | None = None, success_reward: float = 1.0,
                 commands: Sequence[str] | None = None, state_key_fn: Callable[[Any], str] | None = None,
                 invalid_action_penalty: float = 0.0, max_episode_steps: int = 100, render_mode: str | None = None):
        super().__init__(success_reward, commands, state_key_fn, invalid_action_penalty, max_episode_steps,
                         render_mode)
        gem = import_gem()
        check_gem_id(game)
        self.game = game
        self.game_kwargs = dict(game_kwargs or {})
        self.hub: Any = gem.make(game, **self.game_kwargs)
        self.suffix = ""

    def _with_suffix(self, text: str, info: Mapping[str, Any]) -> str:
        self.suffix = str(info.get("suffix") or "").strip()
        return "\n".join(part for part in (str(text).strip(), self.suffix) if part) or NO_OBSERVATION

    def _reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        instructions, hub_info = self.hub.reset(seed=self.seed_of(seed))
        task = str(instructions).strip()
        observation = self._with_suffix("", hub_info)
        opening = "\n\n".join(part for part in (task, self.suffix) if part)
        return observation, {"task": task, "messages": [{"role": "user", "content": opening}]}

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        text, reward, terminated, truncated, hub_info = self.hub.step(action)
        done = bool(terminated or truncated)
        info = {"won": done and float(reward) >= self.success_reward, "score": float(reward),
                "gem_truncated": bool(truncated)}
        return self._with_suffix(text, hub_info), float(reward), done, info

    def hub_state_key(self) -> str:
        return normalize_text(self._observation)
