"""ALFWorld as a :class:`~milegpo.envs.TextEnv`: the real alfworld TextWorld-PDDL engine.

The engine stack is the one alfworld's ``AlfredTWEnv.init_env`` builds for one
game: textworld's ``GenericEnvironment`` (a ``PddlEnv`` for ``.tw-pddl`` files)
wrapped in alfworld's ``AlfredDemangler`` (names such as ``cabinet 1``) and
``AlfredInfos``, plus alfworld's ``AlfredExpert`` when ``expert_type`` is
given (attached here with the expert type in the right argument; alfworld
0.4.2's ``init_env`` passes it in the wrong slot).

Rewards: ``success_reward`` (default 10) on the step that wins, else 0; an
action that is not in the engine's admissible commands is an *invalid action*
(TextEnv's penalty path, the engine is not called). ``info["score"]`` is the
engine's raw score (1 on won).

State key (see :meth:`ALFWorldEnv.state_key`): the agent's place, what it
holds, and every dynamic PDDL fact that differs from the game's initial state
(objects moved, receptacles opened, objects cleaned/heated/cooled, lamps
toggled). Texts that read the same in different states ("You are not
carrying anything." anywhere; "The cabinet 1 is closed." with empty hands or
holding the target) therefore get different keys.

Speed (measured on this 2-core machine while shared with other jobs, random
admissible actions on the generated games): load a game 0.18-0.26 s (once per
game change; resetting the loaded game again reuses it), reset 0.02 s,
step 0.02 s median (0.045 s p90), about 25-30 env steps/s including resets in
one process. Two pure engine computations are memoised for this
(:mod:`milegpo.envs.alfworld.speedups`; without them: reset ~0.2-0.5 s, step
~0.05-0.08 s).
"""

from __future__ import annotations

import collections
import json
import os
import re
from collections.abc import Iterable
from typing import Any

from milegpo.envs.alfworld import speedups
from milegpo.envs.alfworld.data import canonical_split, canonical_task_types, game_files, resolve_data_root
from milegpo.envs.core import TextEnv

#: PDDL predicates that change during an episode (``checked`` is bookkeeping of look/examine, left out).
DYNAMIC_PREDICATES = frozenset({"inreceptacle", "opened", "isclean", "ishot", "iscool", "istoggled", "ison",
                                "issliced", "inreceptacleobject", "isreceptacleobjectfull"})
_TASK_RE = re.compile(r"Your task is to:\s*(.*)", re.S)


def _require_alfworld():
    try:
        import alfworld  # noqa: F401
        import textworld  # noqa: F401
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError("milegpo/ALFWorld-v0 needs the alfworld engine: pip install 'milegpo[alfworld]' "
                          "(alfworld==0.4.2; it compiles the fast-downward planner: needs cmake and g++)") from err


class ALFWorldEnv(TextEnv):
    """ALFWorld text games on the real alfworld engine (all six task types).

    :param split: ``"train"``, ``"eval_id"`` (ALFWorld's valid_seen) or ``"eval_ood"`` (valid_unseen).
    :param num_tasks: use only the first ``num_tasks`` games of the split (fixed order); None = all.
    :param task_types: restrict to these task types (names or alfworld ids 1..6); None = all six.
    :param data_root: an ALFWorld download or a generated task set; None = ``$ALFWORLD_DATA`` if it
        holds ``json_2.1.1``, else milegpo's generated task set (see :mod:`milegpo.envs.alfworld.data`).
    :param size: play milegpo's generated task set of this size: ``"standard"`` (ALFRED-like rooms)
        or ``"small"`` (4-5 receptacles, few objects: short plans an untrained agent sometimes
        completes, see :func:`~milegpo.envs.alfworld.generate.generate_task_set`).
    :param success_reward: reward of the winning step (the paper's setting: 10).
    :param expert_type: ``"planner"`` (fast-downward plan from the current state) or ``"handcoded"``
        (alfworld's scripted expert); when set, ``info["expert_plan"]`` holds the expert's next commands.
    :param invalid_action_penalty: see :class:`TextEnv`.
    :param state_key: ``"env"`` (default: :meth:`state_key`) or ``"observation"`` (the paper's key: the
        observation text exactly; see :class:`~milegpo.envs.core.TextEnv`).
    :param max_episode_steps: horizon (ALFWorld's standard: 50).

    Seed ``s`` plays game ``s % num_tasks`` of the split; ``reset(seed=None)`` draws one at random.
    """

    def __init__(self, split: str = "train", num_tasks: int | None = None,
                 task_types: Iterable[str | int] | None = None, data_root: str | os.PathLike | None = None,
                 size: str | None = None, success_reward: float = 10.0, expert_type: str | None = None,
                 invalid_action_penalty: float = 0.1, max_episode_steps: int = 50, render_mode: str | None = None,
                 state_key: str = "env"):
        super().__init__(invalid_action_penalty=invalid_action_penalty, max_episode_steps=max_episode_steps,
                         render_mode=render_mode, state_key=state_key)
        _require_alfworld()
        if expert_type not in (None, "planner", "handcoded"):
            raise ValueError(f"expert_type must be None, 'planner' or 'handcoded', got {expert_type!r}")
        self.split = canonical_split(split)
        self.task_types = canonical_task_types(task_types)
        root, self.full_dataset = resolve_data_root(data_root, size)
        self.data_root = str(root)
        files = game_files(self.data_root, self.full_dataset, self.split, self.task_types)
        if num_tasks is not None:
            if num_tasks < 1:
                raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
            files = files[:num_tasks]
        self.game_files: tuple[str, ...] = files
        self.success_reward = float(success_reward)
        self.expert_type = expert_type
        speedups.install()
        self._engine = self._make_engine()
        self._loaded_game: str | None = None
        self._task_type = ""
        self._game_state: Any = None
        self._initial_dynamic: frozenset[tuple[str, ...]] = frozenset()
        self._places: dict[str, str] = {}

    @property
    def num_tasks(self) -> int:
        return len(self.game_files)

    @property
    def gamefile(self) -> str | None:
        """The game file of the current episode."""
        return self._loaded_game

    # ------------------------------------------------------------- engine
    def _make_engine(self):
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredExpert, AlfredInfos
        from textworld.envs.wrappers import GenericEnvironment

        request_infos = textworld.EnvInfos(won=True, admissible_commands=True, facts=True, extras=["gamefile"])
        engine = AlfredInfos(AlfredDemangler(shuffle=False)(GenericEnvironment(request_infos)))
        if self.expert_type is not None:
            engine = AlfredExpert(engine, expert_type=self.expert_type)
        return engine

    def _load(self, gamefile: str) -> None:
        if gamefile != self._loaded_game:
            self._engine.load(gamefile)
            self._loaded_game = gamefile
            with open(os.path.join(os.path.dirname(gamefile), "traj_data.json")) as f:
                self._task_type = json.load(f)["task_type"]

    # ------------------------------------------------------------ TextEnv
    def _reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        index = seed % self.num_tasks if seed is not None else int(self.np_random.integers(self.num_tasks))
        self._load(self.game_files[index])
        state = self._engine.reset()
        self._game_state = state
        facts = self._facts(state)
        self._initial_dynamic = frozenset(f for f in facts if f[0] in DYNAMIC_PREDICATES)
        self._places = self._place_names(facts)
        observation = state.feedback
        match = _TASK_RE.search(observation)
        info = self._engine_info(state)
        info.update(task=match.group(1).strip() if match else "", task_index=index, gamefile=self._loaded_game)
        return observation, info

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        state, score, done = self._engine.step(action)
        self._game_state = state
        won = bool(state["won"])
        info = self._engine_info(state)
        info.update(won=won, score=float(score))
        return state.feedback, self.success_reward if won else 0.0, bool(done or won), info

    def admissible_commands(self) -> list[str] | None:
        if self._game_state is None:
            return None
        return list(self._game_state["admissible_commands"])  # the engine sorts them

    def expert_action(self) -> str | None:
        """The next command of alfworld's expert (needs ``expert_type``: ``"handcoded"`` is the fast one)."""
        if self.expert_type is None:
            raise ValueError("ALFWorldEnv.expert_action needs the env made with expert_type='handcoded' or 'planner'")
        if self._game_state is None:
            return None
        plan = self._game_state.get("extra.expert_plan") or []
        return plan[0] if plan else None

    def state_key(self) -> str:
        """Where the agent is, what it holds, and the dynamic facts changed since the start.

        Example: ``"at countertop 1 | holding apple 1 | +isclean(apple 1) -inreceptacle(apple 1, sinkbasin 1)"``.
        Facts that never change (receptacle types, locations, canContain) and
        ``checked`` (set by look/examine, it changes nothing the agent can do)
        are left out, so the key identifies the world state within a task.
        """
        if self._game_state is None:
            return ""
        facts = self._facts(self._game_state)
        place = next((self._places.get(f[2], f[2]) for f in facts if f[0] == "atlocation"), "?")
        held = sorted(f[2] for f in facts if f[0] == "holds")
        dynamic = frozenset(f for f in facts if f[0] in DYNAMIC_PREDICATES)
        changes = sorted([f"+{_fmt(f)}" for f in dynamic - self._initial_dynamic]
                         + [f"-{_fmt(f)}" for f in self._initial_dynamic - dynamic])
        parts = [f"at {place}", f"holding {', '.join(held) if held else 'nothing'}"]
        if changes:
            parts.append(" ".join(changes))
        return " | ".join(parts)

    def close(self) -> None:
        self._engine.close()
        self._loaded_game, self._game_state = None, None
        super().close()

    # ------------------------------------------------------------ helpers
    def _engine_info(self, state) -> dict[str, Any]:
        info: dict[str, Any] = {"task_type": self._task_type}
        if self.expert_type is not None:
            info["expert_plan"] = list(state.get("extra.expert_plan") or [])
        return info

    @staticmethod
    def _facts(state) -> list[tuple[str, ...]]:
        return [(f.name, *(v.name for v in f.arguments)) for f in state["facts"]]

    @staticmethod
    def _place_names(facts: list[tuple[str, ...]]) -> dict[str, str]:
        """Location name -> the receptacle(s) there; the start location has none ("the middle of the room")."""
        at: dict[str, list[str]] = collections.defaultdict(list)
        for f in facts:
            if f[0] == "receptacleatlocation":
                at[f[2]].append(f[1])
        places = {loc: " + ".join(sorted(names)) for loc, names in at.items()}
        for f in facts:
            if f[0] == "atlocation" and f[2] not in places:
                places[f[2]] = "middle of the room"
        return places


def _fmt(fact: tuple[str, ...]) -> str:
    return f"{fact[0]}({', '.join(fact[1:])})"
