"""The drop-in point of the library: :class:`TextEnv`, a Gymnasium env over text.

A text environment shows the agent an observation string and takes an action
string. Everything the trainer and the credit assignment need is carried in the
``info`` dict of ``reset`` and ``step``, so any env that subclasses
:class:`TextEnv` works with every algorithm in :mod:`milegpo.algos`:

``info`` keys (always present)
    ``admissible_commands``  list[str] or None - the commands valid now
    ``won``                  bool - the task was solved
    ``task``                 str - the goal text of the episode
    ``valid_action``         bool - the last action was parsable and admissible
    ``state_key``            str - identifies the state: :meth:`TextEnv.state_key` (the env's own key,
                             the default), or with ``state_key="observation"`` the observation text exactly
                             (:meth:`TextEnv.anchor_observation`, the key of the paper's and verl-agent's code)
    ``score``                float - the engine's raw score (reward unless overridden)
    ``action_format``        str - :attr:`TextEnv.action_format`, how a generated reply becomes the action

``info`` keys (optional)
    ``messages``             the episode's opening chat messages (``[{"role", "content"}, ...]``),
                             given by ``_reset`` (e.g. a dataset's system and user prompt); a chat
                             prompt starts from them instead of the task and first observation.
                             Kept on every step's info.
    ``observation_role``     a step's role in a chat prompt (``"user"``, the default, or ``"tool"``)

A subclass implements three methods:

``_reset(seed, options) -> (observation, info)``
    start a new episode. ``seed`` selects the task deterministically (two
    resets with the same seed give the identical initial state: that is how
    the grouped vector env makes the G copies of a task).
``_step(action) -> (observation, reward, terminated, info)``
    apply a *valid* action. ``info`` should carry ``won``.
``admissible_commands() -> list[str] | None``
    the commands the agent may send now, or None if any text is allowed.

and, optionally, ``is_valid_action`` (default: membership in the admissible
commands), ``state_key`` (default: the normalised observation) and ``task``.

Invalid actions never raise: the base class returns the unchanged observation,
``reward = -invalid_action_penalty``, ``valid_action=False``, and counts the step
towards the horizon (``max_episode_steps`` -> ``truncated``).
"""

from __future__ import annotations

import math
import numbers
import re
from typing import Any, ClassVar

import gymnasium as gym

from milegpo.spaces import TextSpace

_WHITESPACE = re.compile(r"\s+")


def normalize_text(text: str) -> str:
    """Lower-case, strip and collapse whitespace: the default state key."""
    return _WHITESPACE.sub(" ", text.strip().lower())


#: where ``info["state_key"]`` comes from (:class:`TextEnv`'s ``state_key`` argument): ``"env"``, the env's own
#: :meth:`TextEnv.state_key`; ``"observation"``, the observation text exactly, as the MileGPO paper's code and
#: verl-agent's GiGPO group steps (their "anchor observation": equal text, one state)
STATE_KEY_SOURCES = ("env", "observation")


class EnvContractError(TypeError):
    """An env returned something the :class:`TextEnv` contract does not allow (a non-``str``
    observation, text that is not valid Unicode, a non-finite reward, an info that is not a dict);
    the message names the env, the method and the value."""


def invalid_unicode(text: str) -> str | None:
    """Where ``text`` is not valid Unicode (a lone surrogate such as ``"\\ud800"``, left by bytes decoded with
    ``errors="surrogateescape"`` or a broken ``\\u`` escape): ``"'\\ud800' at index 7"``; None when it is valid.
    A tokenizer cannot encode such text (it fails deep inside, far from the env)."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"{text[exc.start:exc.end]!r} at index {exc.start}"
    return None


class TextEnv(gym.Env[str, str]):
    """Base class of every milegpo text environment (see the module docstring).

    :param invalid_action_penalty: reward given (negated) for an invalid action.
    :param max_episode_steps: horizon; the episode is truncated after this many steps.
    :param state_key: what ``info["state_key"]`` is (:data:`STATE_KEY_SOURCES`): ``"env"`` (default), the
        env's :meth:`state_key`; ``"observation"``, :meth:`anchor_observation`, the observation text with no
        normalisation, so states that print the same text share a key (the paper's regime: fewer repeats
        of long texts, and collisions such as "Nothing happens." in different places).
    """

    metadata = {"render_modes": ["ansi", "human"]}
    #: how a generated reply becomes this env's action (the policy's ``action_parser="auto"`` follows it):
    #: ``"tags"``, the content of its ``<action>…</action>`` tags (the paper's envs); ``"message"``, the whole
    #: reply, for envs that parse their own format (``#### 42``, ``<sql>…</sql>``, tool calls)
    action_format: ClassVar[str] = "tags"

    def __init__(self, invalid_action_penalty: float = 0.1, max_episode_steps: int = 50,
                 render_mode: str | None = None, state_key: str = "env"):
        if invalid_action_penalty < 0:
            raise ValueError(f"invalid_action_penalty must be >= 0 (it is subtracted), got {invalid_action_penalty}")
        if max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        if state_key not in STATE_KEY_SOURCES:
            raise ValueError(f"state_key must be one of {list(STATE_KEY_SOURCES)}, got {state_key!r}")
        self.state_key_source = state_key
        self.invalid_action_penalty = float(invalid_action_penalty)
        self.max_episode_steps = int(max_episode_steps)
        self.render_mode = render_mode
        self.observation_space = TextSpace()
        self.action_space = TextSpace()
        self._observation = ""
        self._messages: list[dict[str, str]] | None = None
        self._task = ""
        self._won = False
        self._elapsed_steps = 0
        self._episode_over = True

    # ----------------------------------------------------------- subclass API
    def _reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        raise NotImplementedError

    def admissible_commands(self) -> list[str] | None:
        """The commands valid in the current state, or None when free text is allowed."""
        return None

    def is_valid_action(self, action: str) -> bool:
        """Whether ``action`` may be sent to the engine. Default: it is admissible."""
        commands = self.admissible_commands()
        return bool(action.strip()) if commands is None else action.strip() in commands

    def send_action(self, action: str) -> None:
        """Start the step with ``action`` ahead of :meth:`step` (default: nothing). A vec env calls it for each
        env of a batch before it steps them one after the other, so envs whose step waits on something outside
        the process (an agent program's next request) wait together instead of in turn. :meth:`step` still
        takes the same action and must not act on it twice."""

    def expert_action(self) -> str | None:
        """A scripted expert's next command from the current state (demonstrations for a
        supervised warm start); None when the expert has no move left. Envs without an
        expert raise ``NotImplementedError``."""
        raise NotImplementedError(f"{type(self).__name__} has no scripted expert (expert_action)")

    def state_key(self) -> str:
        """A string that identifies the current state across rollouts of a task.

        Default: the normalised current observation. Override it when different
        states can print the same text (e.g. "Nothing happens.").
        """
        return normalize_text(self._observation)

    def anchor_observation(self) -> str:
        """The current observation as the paper's code keys states by it (``state_key="observation"``):
        the text exactly, no normalisation. An env whose upstream agent code reformats the observation
        before grouping overrides this with the same reformatting (WebShop)."""
        return self._observation

    def info_extras(self) -> dict[str, Any]:
        """Keys this env adds to every ``info`` of ``reset`` and ``step`` (default: none); e.g. a tool env's
        ``tools`` and ``observation_role``. The base keys (module docstring) are set after them."""
        return {}

    @property
    def task(self) -> str:
        """The goal text of the current episode."""
        return self._task

    # ------------------------------------------------------------- gym API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        observation, info = self._reset(seed, options)
        self._check_returned("_reset", observation, info)
        self._observation = observation
        self._task = str(info.get("task", self._task))
        self._messages = _chat_messages(info.get("messages"), type(self).__name__)
        self._won = False
        self._elapsed_steps = 0
        self._episode_over = False
        return observation, self._complete_info(info, valid_action=True)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._episode_over:
            raise RuntimeError("step() called on a finished episode: call reset() first")
        action = action if isinstance(action, str) else str(action)
        self._elapsed_steps += 1
        if self.is_valid_action(action):
            observation, reward, terminated, info = self._step(action.strip())
            self._check_returned("_step", observation, info, reward)
            self._observation = observation
            self._won = bool(info.get("won", False))
            valid = True
        else:
            observation, reward, terminated, info = self._observation, -self.invalid_action_penalty, False, {}
            valid = False
        truncated = not terminated and self._elapsed_steps >= self.max_episode_steps
        self._episode_over = terminated or truncated
        info = self._complete_info(info, valid_action=valid)
        return observation, float(reward), bool(terminated), bool(truncated), info

    def render(self) -> str | None:
        text = self._observation
        if self.render_mode == "human":
            print(text)
            return None
        return text

    # ------------------------------------------------------------ helpers
    def _check_returned(self, method: str, observation: object, info: object, reward: object = 0.0) -> None:
        """Stop a contract violation where it enters, naming the env, the method and the value:
        a non-str observation would become a wrong state key, a NaN reward a NaN loss."""
        name = self.spec.id if self.spec is not None else type(self).__name__
        if not isinstance(observation, str):
            raise EnvContractError(f"{name}: {type(self).__name__}.{method}() returned the observation "
                                   f"{observation!r} of type {type(observation).__name__}; a TextEnv observation "
                                   "must be a str")
        if not isinstance(info, dict):
            raise EnvContractError(f"{name}: {type(self).__name__}.{method}() returned the info {info!r} of type "
                                   f"{type(info).__name__}; it must be a dict")
        # float and int first: the ABC check of numbers.Real costs a Python call per step
        if not isinstance(reward, (float, int, numbers.Real)) or not math.isfinite(reward):
            raise EnvContractError(f"{name}: {type(self).__name__}.{method}() returned the reward {reward!r}; "
                                   "a reward must be a finite number")
        task = info.get("task")
        texts = (("an observation", observation), ("an info['task']", task if isinstance(task, str) else ""))
        for field, text in texts:
            where = invalid_unicode(text)
            if where is not None:
                raise EnvContractError(f"{name}: {type(self).__name__}.{method}() returned {field} that is not valid "
                                       f"Unicode ({where}); decode the engine's bytes with errors='replace' (a "
                                       "tokenizer cannot encode it)")

    def _refuse_command_text(self, commands: list[str]) -> None:
        """Raise :class:`EnvContractError` naming the first admissible command that is not valid Unicode."""
        name = self.spec.id if self.spec is not None else type(self).__name__
        for index, command in enumerate(commands):
            where = invalid_unicode(command) if isinstance(command, str) else None
            if where is not None:
                raise EnvContractError(f"{name}: {type(self).__name__}.admissible_commands()[{index}] is text that is "
                                       f"not valid Unicode ({where}); decode the engine's bytes with errors='replace' "
                                       "(a tokenizer cannot encode it)")

    def _complete_info(self, info: dict[str, Any], valid_action: bool) -> dict[str, Any]:
        info = {**info, **self.info_extras()}
        info.setdefault("score", 1.0 if self._won else 0.0)
        info["won"] = self._won
        info["task"] = self._task
        info["valid_action"] = valid_action
        info["action_format"] = self.action_format
        if self._messages is not None:  # the episode's opening chat messages, on every step (chat prompts)
            info["messages"] = self._messages
        info["admissible_commands"] = commands = self.admissible_commands()
        if commands and invalid_unicode("".join(c for c in commands if isinstance(c, str))) is not None:
            self._refuse_command_text(commands)
        info["state_key"] = self.state_key() if self.state_key_source == "env" else self.anchor_observation()
        info["elapsed_steps"] = self._elapsed_steps
        return info


#: the roles of chat messages that chat templates know
CHAT_ROLES = ("system", "user", "assistant", "tool")


def _chat_messages(value: object, env_name: str) -> list[dict[str, str]] | None:
    """The opening chat messages an env gave in its reset ``info["messages"]`` (None: it gave none),
    checked: a list of ``{"role", "content"}`` with string values."""
    if value is None:
        return None
    if not (isinstance(value, list) and value and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in value)):
        raise EnvContractError(f"{env_name}: info['messages'] at reset must be a non-empty list of "
                               f"{{'role': str, 'content': str}} chat messages, got {value!r}")
    for index, message in enumerate(value):
        where = invalid_unicode(message["content"])
        if where is not None:
            raise EnvContractError(f"{env_name}: info['messages'][{index}]['content'] at reset is text that is not "
                                   f"valid Unicode ({where}); decode the engine's bytes with errors='replace'")
    unknown = sorted({m["role"] for m in value} - set(CHAT_ROLES))
    if unknown:  # a chat template would render it wrongly or fail deep inside the tokenizer
        raise EnvContractError(f"{env_name}: info['messages'] at reset has the chat role(s) {unknown}: a message's "
                               f"role is one of {list(CHAT_ROLES)}")
    return [{"role": m["role"], "content": m["content"]} for m in value]
