"""Any TextWorld game as a milegpo text env (``milegpo/TextWorld-v0``).

Plays game files made by `TextWorld <https://github.com/microsoft/TextWorld>`_
(``tw-make``, or ``textworld.generator``): a compiled game (``.z8`` / ``.ulx``)
with its ``.json`` beside it (``pip install "milegpo[textworld]"``)::

    tw-make custom --world-size 3 --nb-objects 5 --quest-length 3 --seed 1 --output games/g1.z8
    env = make_env("milegpo/TextWorld-v0", game_files=["games/g1.z8"])

The adapter drives TextWorld's own gym interface (``textworld.gym``, which has
the old 4-tuple ``step`` and reports the *cumulative* score) and maps it:

- ``reset(seed=s)`` plays ``game_files[s % len(game_files)]``; ``num_tasks`` is
  the number of files.
- **Reward** = the change of the game's score, so an episode's rewards sum to its
  final score; ``won`` and the end of the episode (won or lost) come from the
  engine.
- **Admissible commands**, the **task** (the game's objective) and the
  **state key** come from the game's logic state (the ``.json``): the state key
  is the sorted list of facts true in the world, e.g. ``at(P, kitchen: r)``, so
  states are told apart by what is true, not by what was printed.
- Observations are the engine's text unchanged (the first one carries
  TextWorld's banner and the objective).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from milegpo.envs.core import TextEnv


def _textworld() -> Any:
    try:
        import textworld
        import textworld.gym
    except ImportError as exc:
        raise ImportError('The TextWorld env needs the textworld package: pip install "milegpo[textworld]"') from exc
    return textworld


class TextWorldEnv(TextEnv):
    """A list of TextWorld games, one task per file (see the module docstring).

    :param game_files: paths of compiled games (``.z8``/``.ulx``), each with its ``.json``.
    :param max_episode_steps: the horizon.
    :param invalid_action_penalty: reward (negated) of a non-admissible command.
    :param state_key: ``"env"`` (default: :meth:`state_key`) or ``"observation"`` (the paper's key: the
        observation text exactly; see :class:`~milegpo.envs.core.TextEnv`).
    """

    def __init__(self, game_files: Sequence[str | Path] = (), max_episode_steps: int = 50,
                 invalid_action_penalty: float = 0.1, render_mode: str | None = None, state_key: str = "env"):
        super().__init__(invalid_action_penalty=invalid_action_penalty, max_episode_steps=max_episode_steps,
                         render_mode=render_mode, state_key=state_key)
        textworld = _textworld()
        if isinstance(game_files, (str, Path)) or not game_files:
            raise ValueError("game_files must be a non-empty list of TextWorld game paths (.z8/.ulx with their .json), "
                             f"got {game_files!r}; make games with e.g. `tw-make custom --seed 1 --output games/g1.z8`")
        self.game_files = [Path(path) for path in game_files]
        for path in self.game_files:
            if not path.is_file():
                raise FileNotFoundError(f"TextWorld game file not found: {path}")
            if not path.with_suffix(".json").is_file():
                raise FileNotFoundError(f"{path} has no {path.with_suffix('.json').name} beside it: the adapter needs "
                                        "TextWorld's game metadata for admissible commands, facts and the objective")
        request = textworld.EnvInfos(admissible_commands=True, facts=True, objective=True, score=True, won=True,
                                     lost=True)
        # max_episode_steps=None: no TextWorld step limit, the horizon is TextEnv's.
        self._env_ids = [textworld.gym.register_game(str(path), request,
                                                     max_episode_steps=None) for path in self.game_files]
        self._engine: Any = None
        self._game_index: int | None = None
        self._infos: dict[str, Any] = {}
        self._score = 0.0

    @property
    def num_tasks(self) -> int:
        """Number of game files."""
        return len(self.game_files)

    def _reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        index = (int(self.np_random.integers(self.num_tasks)) if seed is None else seed) % self.num_tasks
        if index != self._game_index:
            self.close()
            self._engine = _textworld().gym.make(self._env_ids[index])
            self._game_index = index
        with warnings.catch_warnings():
            # jericho (TextWorld's z-machine) warns that it cannot track the score of TextWorld-made games;
            # TextWorld tracks it itself from the game's logic state, so the warning does not apply here.
            warnings.filterwarnings("ignore", message=".*is not fully supported")
            observation, self._infos = self._engine.reset()
        self._score = float(self._infos["score"])
        return observation, {"task": self._infos["objective"], "score": self._score}

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        observation, score, done, self._infos = self._engine.step(action)
        reward, self._score = float(score) - self._score, float(score)
        return observation, reward, bool(done), {"won": bool(self._infos["won"]), "lost": bool(self._infos["lost"]),
                                                 "score": self._score}

    def admissible_commands(self) -> list[str]:
        return list(self._infos["admissible_commands"])  # a copy: callers may edit the list in info

    def state_key(self) -> str:
        return " ".join(sorted(map(str, self._infos["facts"])))

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
        self._engine, self._game_index = None, None
