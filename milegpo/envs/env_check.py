"""Check a text env before training on it: :func:`check_text_env` (and ``milegpo check-env ENV_ID``).

stable-baselines3's ``check_env`` expects numeric spaces and fails on text observations; this checks
what the trainer and the credit methods rely on, by playing the env:

``contract``
    ``reset`` and ``step`` return what :class:`~milegpo.envs.TextEnv` promises: a ``str`` observation
    in the observation space, valid Unicode (a tokenizer cannot encode a lone surrogate), a finite
    reward, the ``info`` keys every algorithm reads with their types, a known ``action_format``; an
    action that is not admissible leaves the observation and the state key unchanged.
``reset``
    the same seed gives the same observation and ``info`` (a group's K copies of a task start from one
    state): twice on one instance (the second time after an episode, so state left over from it shows)
    and on a second instance.
``state_key``
    the key is a function of the state: equal at the reset of a seed, equal when a random walk comes
    back to a state it was in (the same observation, commands and env attributes), equal when a second
    instance replays the walk into the same observations; and states that offer different admissible
    commands do not share a key (credit would compare steps that had different choices).
``commands``
    admissible commands are a list of non-empty strings, without duplicates or surrounding whitespace
    (the action is stripped before it is compared), each one accepted by ``is_valid_action``.
``step``, ``reset``
    an exception the env raised, with the seed and the actions that led to it.

Each finding is one line; an env with none is ready for every algorithm. The walk picks random admissible
commands (seeded: the same env gives the same findings); a free-text env (no admissible commands) is
walked with its scripted expert (``expert_action``) when it has one, else only reset and checked at its
first state.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import pickle
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from milegpo.envs.core import EnvContractError, TextEnv, invalid_unicode
from milegpo.envs.registration import make_env

#: the ``info`` keys every ``reset`` and ``step`` must carry, and their types
INFO_TYPES: dict[str, tuple[type, ...]] = {"won": (bool,), "task": (str,), "valid_action": (bool,),
                                           "state_key": (str,), "score": (numbers.Real,), "action_format": (str,)}
#: the ``action_format`` values a policy's ``action_parser="auto"`` reads
ACTION_FORMATS = ("tags", "message", "tools")
#: the attributes of TextEnv and gymnasium's Env themselves: not the env's state (counters, generators)
_BASE_ATTRIBUTES = frozenset({"_observation", "_messages", "_task", "_won", "_elapsed_steps", "_episode_over",
                              "state_key_source", "invalid_action_penalty", "max_episode_steps", "render_mode",
                              "observation_space", "action_space", "spec", "_np_random", "_np_random_seed"})
#: how many characters of a text a finding quotes
QUOTE_CHARS = 80
#: the action sent to check the invalid-action contract of an env with a command list
NOT_A_COMMAND = "(not an admissible command)"


@dataclasses.dataclass(frozen=True)
class Finding:
    """One problem :func:`check_text_env` found: the check (``contract``, ``reset``, ``state_key``,
    ``commands``, ``step``) and what it saw, in one line."""

    check: str
    message: str

    def __str__(self) -> str:
        return f"{self.check}: {self.message}"


def _quote(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS - 3] + "..."


def _raised(exc: Exception, call: str) -> str:
    """What ``call`` raised, in one line: the exception's type and the first line of its message (a contract
    error's message alone: it names the env, the method and the value)."""
    first = str(exc).splitlines()[0] if str(exc) else ""
    if isinstance(exc, EnvContractError):
        return first
    return f"{call} raised {type(exc).__name__}: {first}" if first else f"{call} raised {type(exc).__name__}"


def _same(a: Any, b: Any) -> bool:
    """``a == b``, for values whose ``==`` is not a bool (arrays) by their ``repr``."""
    try:
        return bool(a == b)
    except Exception:
        return repr(a) == repr(b)


@dataclasses.dataclass
class _Point:
    """What the walk saw at one state: the observation, the commands, the env's own attributes (pickled;
    None when they do not pickle) and the state key."""

    observation: str
    commands: tuple[str, ...] | None
    attributes: bytes | None
    key: str


class _Checker:
    """Runs the checks of one env (see the module docstring), collecting each kind of finding once."""

    def __init__(self, env: TextEnv, second: TextEnv | None, steps: int):
        self.env, self.second, self.steps = env, second, steps
        self.findings: list[Finding] = []
        self._kinds: set[str] = set()

    def add(self, check: str, kind: str, message: str) -> None:
        """Record a finding, once per ``kind`` (the same fault at every step is one line)."""
        if kind not in self._kinds:
            self._kinds.add(kind)
            self.findings.append(Finding(check, message))

    # ------------------------------------------------------------ playing
    def reset(self, env: TextEnv, seed: int, where: str) -> tuple[str, dict[str, Any]] | None:
        try:
            observation, info = env.reset(seed=seed)
        except Exception as exc:
            check = "contract" if isinstance(exc, EnvContractError) else "reset"
            self.add(check, f"reset:{type(exc).__name__}", f"{where}: {_raised(exc, f'reset(seed={seed})')}")
            return None
        self.check_returned(env, observation, info, f"{where}: reset(seed={seed})", over=False)
        return observation, info

    def step(self, env: TextEnv, action: str, where: str) -> tuple[str, float, bool, bool, dict[str, Any]] | None:
        try:
            result = env.step(action)
        except Exception as exc:
            check = "contract" if isinstance(exc, EnvContractError) else "step"
            self.add(check, f"step:{type(exc).__name__}", f"{where}: {_raised(exc, f'step({_quote(action)})')}")
            return None
        observation, reward, terminated, truncated, info = result
        self.check_returned(env, observation, info, f"{where}: step({_quote(action)})", over=bool(terminated))
        if not (isinstance(reward, numbers.Real) and math.isfinite(reward)):
            self.add("contract", "reward", f"{where}: step({_quote(action)}) returned the reward {reward!r}; a reward "
                     "must be a finite number")
        if not (isinstance(terminated, bool) and isinstance(truncated, bool)):
            self.add("contract", "done", f"{where}: step({_quote(action)}) returned terminated={terminated!r}, "
                     f"truncated={truncated!r}; both must be bool")
        return result

    # ------------------------------------------------------------ contract
    def check_returned(self, env: TextEnv, observation: Any, info: Any, where: str, over: bool) -> None:
        if not isinstance(observation, str):
            self.add("contract", "observation", f"{where} returned the observation {_quote(observation)} of type "
                     f"{type(observation).__name__}; it must be a str")
        elif not env.observation_space.contains(observation):
            self.add("contract", "observation-space", f"{where} returned an observation of {len(observation)} "
                     "characters, outside the env's observation_space")
        if not isinstance(info, dict):
            self.add("contract", "info", f"{where} returned the info {_quote(info)}; it must be a dict")
            return
        for key, types in INFO_TYPES.items():
            if key not in info:
                self.add("contract", f"info-{key}", f"{where}: info has no {key!r} (TextEnv's reset and step set it; "
                         "an env that overrides them must too)")
            elif not isinstance(info[key], types) or (key == "score" and isinstance(info[key], bool)):
                self.add("contract", f"info-{key}", f"{where}: info[{key!r}] is {_quote(info[key])} of type "
                         f"{type(info[key]).__name__}; it must be {' or '.join(t.__name__ for t in types)}")
        if info.get("action_format", "tags") not in ACTION_FORMATS:
            self.add("contract", "action-format", f"{where}: info['action_format'] is {info['action_format']!r}; "
                     f"a policy reads one of {list(ACTION_FORMATS)}")
        for key in ("task", "state_key"):
            text = info.get(key)
            where_bad = invalid_unicode(text) if isinstance(text, str) else None
            if where_bad is not None:
                self.add("contract", f"unicode-{key}", f"{where}: info[{key!r}] is not valid Unicode ({where_bad})")
        if "admissible_commands" not in info:
            self.add("contract", "info-admissible_commands", f"{where}: info has no 'admissible_commands' (None for "
                     "free text)")
        else:
            self.check_commands(env, info["admissible_commands"], where, over)

    def check_commands(self, env: TextEnv, commands: Any, where: str, over: bool) -> None:
        if commands is None:
            return
        if not isinstance(commands, list):
            self.add("commands", "type", f"{where}: admissible_commands is a {type(commands).__name__}; it must be a "
                     "list of str (or None for free text)")
            return
        if not commands and not over:
            self.add("commands", "none", f"{where}: admissible_commands is an empty list while the episode goes on: no "
                     "action is valid (None means any text is)")
        for command in commands:
            if not isinstance(command, str) or not command.strip():
                self.add("commands", "empty", f"{where}: the admissible command {_quote(command)} is not a non-empty "
                         "str")
            elif command != command.strip():
                self.add("commands", "whitespace", f"{where}: the admissible command {_quote(command)} has surrounding "
                         "whitespace; the action is stripped before it is compared, so it can never be taken")
            elif invalid_unicode(command) is not None:
                self.add("commands", "unicode", f"{where}: the admissible command {_quote(command)} is not valid "
                         f"Unicode ({invalid_unicode(command)})")
            elif not self._accepts(env, command):
                self.add("commands", "invalid", f"{where}: the admissible command {_quote(command)} is refused by "
                         "is_valid_action")
        strings = [c for c in commands if isinstance(c, str)]
        twice = sorted({c for c in strings if strings.count(c) > 1})
        if twice:
            self.add("commands", "duplicate", f"{where}: admissible commands listed more than once: "
                     f"{_quote(twice)} (choose mode would weigh them twice)")

    def _accepts(self, env: TextEnv, command: str) -> bool:
        try:
            return bool(env.is_valid_action(command))
        except Exception as exc:
            self.add("step", "is-valid-action", f"is_valid_action({_quote(command)}) raised {type(exc).__name__}: "
                     f"{exc}")
            return True

    def check_invalid_action(self, env: TextEnv, seed: int, observation: str, info: dict[str, Any]) -> None:
        """An action that is not admissible: invalid, the observation and the key unchanged, not the end."""
        action = NOT_A_COMMAND if info.get("admissible_commands") else ""
        result = self.step(env, action, f"seed {seed}")
        if result is None:
            return
        after, _, terminated, _, after_info = result
        where = f"seed {seed}: the invalid action {action!r}"
        if after_info.get("valid_action") is not False:
            self.add("contract", "invalid-valid", f"{where} was counted valid (info['valid_action'] is "
                     f"{after_info.get('valid_action')!r})")
        elif terminated:
            self.add("contract", "invalid-ends", f"{where} ended the episode; an invalid action leaves the state as it "
                     "was")
        elif after_info.get("state_key") != info.get("state_key"):
            self.add("state_key", "invalid-key", f"{where} changed the state key from {_quote(info.get('state_key'))} "
                     f"to {_quote(after_info.get('state_key'))}; an invalid action leaves the state as it was")
        elif after != observation and info.get("action_format") != "tools":  # a tool env says what was wrong
            self.add("contract", "invalid-observation", f"{where} changed the observation from {_quote(observation)} "
                     f"to {_quote(after)}; an invalid action leaves it as it was")

    # ------------------------------------------------------------ reset and state keys
    def compare_resets(self, seed: int, first: tuple[str, dict[str, Any]], again: tuple[str, dict[str, Any]],
                       how: str) -> None:
        (observation, info), (observation2, info2) = first, again
        if not _same(observation, observation2):
            self.add("reset", "observation", f"seed {seed}: {how} gave different observations: "
                     f"{_quote(observation)} and {_quote(observation2)}; reset(seed) must select the task "
                     "deterministically (seed every random draw from it, keep nothing from the last episode)")
            return
        if info.get("state_key") != info2.get("state_key"):
            self.add("state_key", "function", f"seed {seed}: {how} gave the state keys "
                     f"{_quote(info.get('state_key'))} and {_quote(info2.get('state_key'))} at reset; a key is a "
                     "function of the state (no episode ids, counters, times or object ids)")
        for key in sorted(set(info) | set(info2)):
            if key != "state_key" and not _same(info.get(key), info2.get(key)):
                self.add("reset", "info", f"seed {seed}: {how} gave different info[{key!r}]: "
                         f"{_quote(info.get(key))} and {_quote(info2.get(key))}")
                return

    def point(self, env: TextEnv, observation: str, info: dict[str, Any]) -> _Point:
        commands = info.get("admissible_commands")
        try:
            attributes: bytes | None = pickle.dumps({k: v for k, v in vars(env).items() if k not in _BASE_ATTRIBUTES})
        except Exception:  # an engine object that does not pickle: states are not compared by attributes
            attributes = None
        return _Point(observation, tuple(commands) if isinstance(commands, list) else None, attributes,
                      str(info.get("state_key")))

    def walk(self, env: TextEnv, seed: int, start: tuple[str, dict[str, Any]], actions: Sequence[str] | None,
             where: str) -> tuple[list[str], list[_Point]]:
        """Play from ``start``: ``actions`` when given (a replay), else random admissible commands (the expert's
        for a free-text env); the actions taken and the points seen, the start's first."""
        rng = random.Random(seed)
        observation, info = start
        points, taken = [self.point(env, observation, info)], list[str]()
        for index in range(self.steps if actions is None else len(actions)):
            commands = info.get("admissible_commands")
            if actions is not None:
                action: str | None = actions[index]
            elif isinstance(commands, list) and commands:
                action = str(rng.choice(commands))
            else:
                action = self.expert(env)
            if action is None:
                break
            result = self.step(env, action, f"{where} after {_quote(taken)}" if taken else where)
            if result is None:
                break
            taken.append(action)
            observation, _, terminated, truncated, info = result
            points.append(self.point(env, observation, info))
            if terminated or truncated:
                break
        return taken, points

    @staticmethod
    def expert(env: TextEnv) -> str | None:
        try:
            return env.expert_action()
        except Exception:  # no expert (NotImplementedError), or none from here: the walk stops
            return None

    def check_keys(self, seed: int, walk: Sequence[_Point], replay: Sequence[_Point]) -> None:
        """Same state, same key (a return in the walk; the replay's same observations); different admissible
        commands, different keys."""
        for j, later in enumerate(walk):
            for i, earlier in enumerate(walk[:j]):
                if (later.attributes is not None and later.attributes == earlier.attributes
                        and later.observation == earlier.observation and later.commands == earlier.commands
                        and later.key != earlier.key):
                    self.add("state_key", "return", f"seed {seed}: the walk came back at step {j} to the state of step "
                             f"{i} (same observation, commands and env attributes) but the key changed from "
                             f"{_quote(earlier.key)} to {_quote(later.key)}; a key that counts steps or history makes "
                             "every state unique (no steps to compare)")
        for i, (original, again) in enumerate(zip(walk, replay)):
            if original.observation != again.observation or original.commands != again.commands:
                break  # the env's steps are random: the replay left the walk's path
            if original.key != again.key:
                self.add("state_key", "function", f"seed {seed}: a second instance replaying the walk reached step "
                         f"{i}'s observation with the key {_quote(again.key)} instead of {_quote(original.key)}; a key "
                         "is a function of the state (no episode ids, object ids, times or random draws)")
                break
        by_key: dict[str, tuple[str, ...]] = {}
        for p in [*walk, *replay]:
            if p.commands is None:
                continue
            seen = by_key.setdefault(p.key, p.commands)
            if set(seen) != set(p.commands):
                self.add("state_key", "shared", f"seed {seed}: the key {_quote(p.key)} is given to states with "
                         f"different admissible commands ({_quote(sorted(set(seen) ^ set(p.commands)))} in one and "
                         "not the other); credit would compare steps that had different choices")
                break

    def check_seed(self, seed: int) -> None:
        first = self.reset(self.env, seed, f"seed {seed}")
        if first is None:
            return
        actions, walk = self.walk(self.env, seed, first, None, f"seed {seed}")
        again = self.reset(self.env, seed, f"seed {seed}")
        if again is not None:
            self.compare_resets(seed, first, again, "two resets of one instance (an episode apart)")
        replay: list[_Point] = []
        if self.second is not None:
            other = self.reset(self.second, seed, f"seed {seed}, second instance")
            if other is None:
                return
            self.compare_resets(seed, first, other, "two instances")
            self.check_invalid_action(self.second, seed, *other)
            other = self.reset(self.second, seed, f"seed {seed}, second instance")
            if other is not None:
                _, replay = self.walk(self.second, seed, other, actions, f"seed {seed}, second instance")
        elif again is not None:
            self.check_invalid_action(self.env, seed, *again)
        self.check_keys(seed, walk, replay)


def _factory(env: str | type[TextEnv] | Callable[..., TextEnv], env_kwargs: Mapping[str, Any]
             ) -> Callable[[], TextEnv]:
    if isinstance(env, str):
        return lambda: make_env(env, **env_kwargs)
    return lambda: env(**env_kwargs)


def check_text_env(env: str | TextEnv | type[TextEnv] | Callable[..., TextEnv], *, seeds: int = 3, steps: int = 20,
                   env_kwargs: Mapping[str, Any] | None = None) -> list[Finding]:
    """Check a text env before training on it (the checks are in the module docstring); one
    :class:`Finding` per problem, none for an env every algorithm can train on.

    :param env: an env id (``"milegpo/House-v0"``, ``"my_module:MyEnv"``, a hub id), a :class:`TextEnv`
        class or a function making one (called with ``env_kwargs``), or an env instance (then no second
        instance is made, and reset determinism is checked on it alone).
    :param seeds: task seeds to check (0 to ``seeds - 1``): a reset, a random walk, resets again.
    :param steps: the longest walk per seed.
    :param env_kwargs: the env's constructor arguments (not for an instance).

    Making the env raises what making it raises (an unknown id: :class:`~milegpo.envs.UnknownEnvError`);
    whatever the env raises after that is a finding.
    """
    if seeds < 1 or steps < 1:
        raise ValueError(f"seeds and steps must be >= 1, got seeds={seeds}, steps={steps}")
    if isinstance(env, TextEnv):
        if env_kwargs:
            raise ValueError("env_kwargs are for an env id or class; this env is already made")
        first, second = env, None
    else:
        make = _factory(env, dict(env_kwargs or {}))
        first = make()
        if not isinstance(first, TextEnv):
            raise TypeError(f"{env!r} made a {type(first).__name__}, which is not a milegpo.envs.TextEnv")
        second = None
    checker = _Checker(first, second, steps)
    try:
        if not isinstance(env, TextEnv):
            try:
                second = make()
            except Exception as exc:
                checker.add("reset", "second", f"a second instance could not be made ({type(exc).__name__}: {exc}); "
                            "a group's copies of a task are separate instances")
            checker.second = second
        for seed in range(seeds):
            checker.check_seed(seed)
    finally:
        for made in (second, first if not isinstance(env, TextEnv) else None):
            if made is not None:
                made.close()
    return checker.findings
