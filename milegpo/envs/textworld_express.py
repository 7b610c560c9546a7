"""TextWorld-Express games as milegpo text envs (``milegpo/TWX-<game>-v0``).

`TextWorld-Express <https://github.com/cognitiveailab/TextWorldExpress>`_
(Jansen & Cote, 2022) is a fast Java/Scala re-implementation of eight text games:
cookingworld, twc, coin, mapreader, arithmetic, sorting, simonsays, peckingorder.
This adapter plays them through the ``textworld-express`` package
(``pip install "milegpo[twx]"``, needs a Java runtime >= 8 on ``PATH``).

What the adapter maps (everything else is the engine's own behaviour):

- **Tasks and splits.** Upstream defines a list of seeds per fold (train / dev /
  test, 1,000 each). ``split`` is ``"train"``, ``"dev"`` or ``"test"``, or the
  generic milegpo names ``"eval_id"`` (= dev) and ``"eval_ood"`` (= test: upstream
  builds its test games from held-out object/ingredient sets). ``reset(seed=s)``
  plays the ``s % num_tasks``-th seed of the split.
- **Game parameters** (upstream's ``gameParams`` string, e.g. ``numLocations``,
  ``numDistractorItems``, ``includeDoors``) are env kwargs, given as keywords or
  as a ``game_params`` dict/string; booleans become 0/1. Unknown names raise a
  ``ValueError`` listing the game's parameters.
- **Reward** = the change of the engine's normalised score, so an episode's
  rewards sum to its final score (1.0 when won; cookingworld, twc, mapreader,
  ... also pay partial progress). ``won`` is the engine's ``tasksuccess``; the
  episode terminates on ``tasksuccess`` or ``taskfailure``.
- **Admissible commands** are the engine's valid actions, sorted.
- **State key**: the room description (``look``) + inventory + raw score, which
  separates states that print the same feedback text. (Two world states that
  differ only in a closed, out-of-sight container look the same; the engine's
  full object tree would separate them but costs ~0.7 ms a step.)
- **Gold path**: with ``gold_path=True`` the reset info holds upstream's gold
  action sequence under ``"gold_actions"``.
- **Scripted expert** (coin only, needs ``gold_path=True``): :meth:`expert_action`
  walks to the coin along upstream's gold path with its detours cut out (the gold
  path explores: it may step into a room and straight back), opening closed doors on
  the way. After steps of its own the agent may be off that route; the expert then
  walks back the way the agent came until it is on the route again. Coin maps are
  grids, so a move and its opposite return to the same room. The gold path is not always
  the shortest way (it varies from reset to reset), so neither is the expert's.

One JVM is started per process, on first use, and shared by every env of the
process (each env holds its own game on it). Make envs inside the worker process
that steps them: an env created before ``fork`` is bound to the parent's JVM.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from typing import Any

from milegpo.envs.core import TextEnv

try:
    import orjson  # a dependency of textworld-express; 3-4x faster than json on the engine's replies
    from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway
    from textworld_express.constants import BASEPATH, JAR_PATH
except ImportError as exc:
    raise ImportError('TextWorld-Express envs need the textworld-express package: pip install "milegpo[twx]"') from exc

#: milegpo split name -> upstream fold
SPLITS = {"train": "train", "dev": "dev", "test": "test", "eval_id": "dev", "eval_ood": "test"}

OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}
_ROOM = re.compile(r"You are in the ([^.]+)\.")
_CLOSED_DOOR = re.compile(r"To the (North|South|East|West) you see a closed [^.]*door", re.IGNORECASE)

_GATEWAYS: dict[int, Any] = {}  # process id -> py4j JavaGateway of that process's JVM


def _java_gateway() -> Any:
    """The py4j gateway to this process's TextWorld-Express JVM, started on first use."""
    gateway = _GATEWAYS.get(os.getpid())
    if gateway is not None:
        return gateway
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("TextWorld-Express runs on Java, but no `java` executable is on PATH. Install a Java "
                           "runtime >= 8 (e.g. `apt-get install openjdk-17-jre-headless`, or `conda install openjdk`) "
                           "and make sure `java -version` works in this shell.")
    try:
        port, process = launch_gateway(classpath=JAR_PATH, die_on_exit=True, cwd=BASEPATH, java_path=java,
                                       return_proc=True)
        gateway = JavaGateway(gateway_parameters=GatewayParameters(auto_field=True, port=port), java_process=process)
        gateway.jvm.textworldexpress.runtime.PythonInterface()  # fails here if the JVM cannot load the engine
    except Exception as exc:
        raise RuntimeError(f"Could not start the TextWorld-Express JVM with {java} ({type(exc).__name__}: {exc}). "
                           "It needs a working Java runtime >= 8: check `java -version`.") from exc
    _GATEWAYS[os.getpid()] = gateway
    return gateway


def _without_detours(actions: list[str]) -> list[str]:
    """The directions of a walk's moves, with every step that is straight undone by the next cut out."""
    route: list[str] = []
    for action in actions:
        if action.startswith("move "):
            direction = action.removeprefix("move ")
            if route and route[-1] == OPPOSITE[direction]:
                route.pop()
            else:
                route.append(direction)
    return route


def game_param_string(game_params: Mapping[str, Any] | str | None = None, **params: Any) -> str:
    """Upstream's ``gameParams`` string (``"numLocations=3,includeDoors=0"``) from a dict/string and keywords."""
    merged: dict[str, Any] = {}
    if isinstance(game_params, str):
        for item in filter(None, (part.strip() for part in game_params.split(","))):
            name, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"game_params {game_params!r}: expected comma-separated name=value pairs")
            merged[name.strip()] = value.strip()
    elif game_params is not None:
        merged.update(game_params)
    merged.update(params)
    return ",".join(f"{name}={int(value) if isinstance(value, bool) else value}" for name, value in merged.items())


class TextWorldExpressEnv(TextEnv):
    """One TextWorld-Express game (see the module docstring for the mapping).

    :param game: one of upstream's game names (``"coin"``, ``"cookingworld"``, ...).
    :param split: ``"train"``, ``"dev"``/``"eval_id"`` or ``"test"``/``"eval_ood"``.
    :param game_params: game parameters as a dict or upstream's string; merged
        with (and overridden by) the keyword arguments ``**params``.
    :param gold_path: also generate the gold action sequence at reset
        (``info["gold_actions"]``; makes resets ~25% slower).
    :param max_episode_steps: the horizon (upstream's default step limit is 100).
    :param invalid_action_penalty: reward (negated) of a non-admissible action.
    :param state_key: ``"env"`` (default: :meth:`state_key`) or ``"observation"`` (the paper's key: the
        observation text exactly; see :class:`~milegpo.envs.core.TextEnv`).
    """

    def __init__(self, game: str = "coin", split: str = "train", game_params: Mapping[str, Any] | str | None = None,
                 gold_path: bool = False, max_episode_steps: int = 100, invalid_action_penalty: float = 0.1,
                 render_mode: str | None = None, state_key: str = "env", **params: Any):
        super().__init__(invalid_action_penalty=invalid_action_penalty, max_episode_steps=max_episode_steps,
                         render_mode=render_mode, state_key=state_key)
        if split not in SPLITS:
            raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
        self.game = game
        self.split = split
        self.game_params = game_param_string(game_params, **params)
        self.gold_path = bool(gold_path)
        self._fold = SPLITS[split]
        self._server = _java_gateway().jvm.textworldexpress.runtime.PythonInterface()
        error = self._server.load(game, self.game_params)
        if error:
            raise ValueError(f"TextWorld-Express {game!r} with params {self.game_params!r}: {error.strip()}")
        self._seeds = [int(s) for s in {"train": self._server.getSeedsTrain, "dev": self._server.getSeedsDev,
                                        "test": self._server.getSeedsTest}[self._fold]()]
        self._response: dict[str, Any] = {}
        self._commands: list[str] = []
        self._score = 0.0
        self._tracks_route = game == "coin" and self.gold_path  # what the scripted expert needs
        self._route: list[str] = []  # directions from the start room to the coin's room
        self._walked: list[tuple[str, str]] = []  # the agent's way from the start room: (room, direction taken)

    @property
    def num_tasks(self) -> int:
        """Number of games (upstream seeds) in the split."""
        return len(self._seeds)

    def engine_seed(self, seed: int) -> int:
        """The upstream seed that ``reset(seed=seed)`` plays."""
        return self._seeds[seed % self.num_tasks]

    def _reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        index = int(self.np_random.integers(self.num_tasks)) if seed is None else seed
        self._update(self._server.generateNewGameJSON(self.engine_seed(index), self._fold, self.gold_path))
        self._score = float(self._response["score"])
        info = {"task": self._server.getTaskDescription(), "score": self._score}
        if self.gold_path:
            info["gold_actions"] = [str(a) for a in self._server.getGoldActionSequence()]
        if self._tracks_route:
            self._route = _without_detours(info["gold_actions"])
            self._walked = []
        return self._response["observation"], info

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        room = self._room() if self._tracks_route else None
        self._update(self._server.stepJSON(action))
        if room is not None and self._room() != room:
            self._moved(room, action.removeprefix("move "))
        score = float(self._response["score"])
        reward, self._score = score - self._score, score
        won = bool(self._response["tasksuccess"])
        terminated = won or bool(self._response["taskfailure"])
        return self._response["observation"], reward, terminated, {"won": won, "score": score}

    def _update(self, response_json: str) -> None:
        self._response = orjson.loads(response_json)
        self._commands = sorted(set(self._response["validActions"]))  # the engine lists some twice (simonsays)

    def admissible_commands(self) -> list[str]:
        return list(self._commands)  # a copy: callers may edit the list in info

    def expert_action(self) -> str | None:
        """The coin expert's next command (see the module docstring); None once the coin is taken."""
        if self.game != "coin":
            raise NotImplementedError(f"TextWorld-Express {self.game!r} has no scripted expert (coin has one)")
        if not self.gold_path:
            raise ValueError("the coin expert follows upstream's gold path: make the env with gold_path=True")
        if "take coin" in self._commands:
            return "take coin"
        directions = [direction for _, direction in self._walked]
        if directions == self._route[:len(directions)] and len(directions) < len(self._route):
            direction = self._route[len(directions)]
        elif directions:
            direction = OPPOSITE[directions[-1]]  # off the route: walk back the way the agent came
        else:
            return None
        closed = {match.lower() for match in _CLOSED_DOOR.findall(self._response["look"])}
        return f"open door to {direction}" if direction in closed else f"move {direction}"

    def _room(self) -> str:
        match = _ROOM.search(self._response["look"])
        return match.group(1) if match else ""

    def _moved(self, room: str, direction: str) -> None:
        """Extend the agent's way from the start room by a move, or cut it back to a room already on it."""
        here = self._room()
        rooms = [start for start, _ in self._walked]
        if here in rooms:
            del self._walked[rooms.index(here):]
        else:
            self._walked.append((room, direction))

    def state_key(self) -> str:
        response = self._response  # the engine's text is deterministic: no normalisation needed
        return f"{response['look']}\n{response['inventory']}\nscore {response['scoreRaw']:g}"

    def close(self) -> None:
        self._server = None  # the shared JVM lives on for the process's other envs
