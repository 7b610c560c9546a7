"""`OpenEnv <https://pypi.org/project/openenv-core/>`_ environments as milegpo envs
(``openenv:<module>:<EnvironmentClass>``), played in-process.

An OpenEnv environment is a class with ``reset(seed=...)``, ``step(action)`` and ``state``, whose
actions and observations are pydantic models (``openenv.core.env_server.Action`` /
``Observation``); a server wraps the same class for remote use. How its conventions map:

* **Task and seed.** ``reset(seed=s)`` is the environment's ``reset(seed=s)``: a group of K copies
  starts from one state when the environment honours its seed (an environment whose ``reset`` takes
  no seed is reset without one).
* **Actions.** The reply fills one string field of the environment's action class
  (``action_field``; default: its only string field); the whole reply reaches it
  (``action_format="message"``). The action class is the environment's generic parameter
  (``Environment[MyAction, MyObservation, MyState]``), else the annotation of its
  ``step(self, action: MyAction)`` (the environment ``openenv init`` generates), unless ``action_class``
  names it.
* **Module.** ``openenv:my_env.server.my_environment:MyEnvironment`` imports ``my_env`` as ``python -m``
  would: installed, else from the working directory (the folder ``openenv init`` made, beside you).
* **Observation.** The observation's fields other than ``done``, ``reward`` and ``metadata``
  (one string field as it is; several as ``name: value`` lines).
* **Reward and success.** The observation's ``reward`` (None reads 0) and ``done``; won is
  ``metadata["won"]`` / ``metadata["success"]`` when the environment gives one, else a final
  reward of at least ``success_reward``.
* **State key.** The environment's ``state`` without its ``episode_id`` (OpenEnv's own state,
  hashed), else the normalised observation; ``state_key_fn`` overrides it.

An MCP environment (``MCPEnvironment``, tools served by FastMCP) is played with tool calls instead:
:class:`OpenEnvToolEnv` (``action_format="tools"``); ``openenv:`` ids pick the adapter by the class
(:func:`make_openenv_env`).
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Sequence
from typing import Any

from milegpo.envs.hubs.base import NO_OBSERVATION, HubEnv, hashed_key, import_hub
from milegpo.envs.hubs.tools import ToolEnv
from milegpo.envs.registry import UnknownEnvError
from milegpo.envs.user_modules import import_user_module, user_module_error

INSTALL_HINT = 'pip install --no-deps openenv-core==0.3.0 && pip install "milegpo[openenv]"'
_RESERVED = ("done", "reward", "metadata")


def _load(path: str) -> Any:
    """The object ``"module:Name"`` names, its module imported as ``python -m`` would (installed, else from the
    working directory). :class:`~milegpo.envs.UnknownEnvError` when the module or the name is in neither place;
    an ImportError when the module imports a package that is not installed."""
    module, _, name = path.rpartition(":") if ":" in path else path.rpartition(".")
    if not module:
        raise ValueError(f"{path!r} is not 'module:Name'")
    try:
        loaded = import_user_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module.split(".")[0]:
            raise  # the module is there; a package it imports is not installed
        raise user_module_error(module, f"the module of the OpenEnv environment {path!r}", exc) from None
    if not hasattr(loaded, name):
        raise UnknownEnvError(f"{module!r} (imported from {getattr(loaded, '__file__', module)}) defines no {name!r}, "
                              f"the OpenEnv class {path!r} names")
    return getattr(loaded, name)


def check_openenv_id(environment: str) -> None:
    """Raise :class:`~milegpo.envs.UnknownEnvError` when ``"module:Class"`` names nothing (see :func:`_load`)."""
    _load(environment)


def _action_class(environment_class: type) -> type:
    """The environment's action class: the ``ActT`` of ``Environment[ActT, ObsT, StateT]`` in its bases, else
    the annotation of its ``step(action: MyAction)`` (what ``openenv init`` generates)."""
    for klass in environment_class.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            args = typing.get_args(base)
            if args and isinstance(args[0], type):
                return args[0]
    step = getattr(environment_class, "step", None)
    try:
        annotation = typing.get_type_hints(step).get("action") if step is not None else None
    except Exception:  # an annotation that does not resolve (a name imported only for type checkers)
        annotation = None
    base = import_hub("openenv.core.env_server.types", INSTALL_HINT).Action
    if isinstance(annotation, type) and issubclass(annotation, base) and annotation is not base:
        return annotation
    raise TypeError(f"{environment_class.__name__} does not name its action class (Environment[MyAction, ...] or "
                    "step(self, action: MyAction)): pass action_class='module:MyAction' (on the command line: "
                    "--env-kwargs '{\"action_class\": \"module:MyAction\"}', or env.kwargs={action_class: ...})")


class OpenEnvEnv(HubEnv):
    """An OpenEnv environment class as a :class:`~milegpo.envs.TextEnv` (see the module docstring).

    :param environment: ``"module:EnvironmentClass"`` (or the class itself).
    :param environment_kwargs: its constructor's arguments.
    :param action_class: ``"module:ActionClass"`` (or the class); default: the environment's generic parameter,
        else its ``step``'s ``action`` annotation.
    :param action_field: the action's string field that receives the reply; default: its only one.
    :param task: the episode's task text; default: the first observation.
    """

    def __init__(self, environment: str | type, environment_kwargs: dict[str, Any] | None = None,
                 action_class: str | type | None = None, action_field: str | None = None, task: str | None = None,
                 success_reward: float = 1.0, commands: Sequence[str] | None = None,
                 state_key_fn: Callable[[Any], str] | None = None, invalid_action_penalty: float = 0.0,
                 max_episode_steps: int = 50, render_mode: str | None = None):
        super().__init__(success_reward, commands, state_key_fn, invalid_action_penalty, max_episode_steps,
                         render_mode)
        openenv = import_hub("openenv.core.env_server.interfaces", INSTALL_HINT)
        klass = _load(environment) if isinstance(environment, str) else environment
        if not (isinstance(klass, type) and issubclass(klass, openenv.Environment)):
            raise TypeError(f"{environment!r} is not an openenv Environment class")
        self.environment = environment
        self.hub: Any = klass(**dict(environment_kwargs or {}))
        named: Any = _load(action_class) if isinstance(action_class, str) else action_class
        self.action_class: Any = named if named is not None else _action_class(klass)
        fields: dict[str, Any] = dict(getattr(self.action_class, "model_fields", {}))
        text_fields = [name for name, f in fields.items() if name != "metadata" and f.annotation is str]
        if action_field is None:
            if len(text_fields) != 1:
                raise TypeError(f"{self.action_class.__name__} has the string fields {text_fields}: pass "
                                "action_field= to say which one receives the reply")
            action_field = text_fields[0]
        elif action_field not in fields:
            raise TypeError(f"{self.action_class.__name__} has no field {action_field!r}")
        self.action_field = action_field
        self.task_text = task

    @staticmethod
    def render_observation(observation: Any) -> str:
        """An OpenEnv observation's text: its fields other than done / reward / metadata."""
        values = {name: value for name, value in observation.model_dump().items() if name not in _RESERVED}
        if len(values) == 1:
            text = str(next(iter(values.values())))
        else:
            text = "\n".join(f"{name}: {value}" for name, value in values.items())
        return text.strip() or NO_OBSERVATION

    def _reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        seeded = "seed" in inspect.signature(self.hub.reset).parameters  # OpenEnv's template env takes none
        result = self.hub.reset(seed=self.seed_of(seed)) if seeded else self.hub.reset()
        observation = self.render_observation(result)
        task = self.task_text if self.task_text is not None else observation
        opening = observation if self.task_text is None else f"{self.task_text}\n\n{observation}"
        return observation, {"task": task, "messages": [{"role": "user", "content": opening}]}

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        result = self.hub.step(self.action_class(**{self.action_field: action}))
        reward = float(result.reward) if result.reward is not None else 0.0
        done = bool(result.done)
        metadata = dict(result.metadata or {})
        flag = metadata.get("won", metadata.get("success"))
        won = bool(flag) if flag is not None else done and reward >= self.success_reward
        info = {"won": won, "score": reward, "openenv_metadata": metadata}
        return self.render_observation(result), reward, done, info

    def hub_state_key(self) -> str:
        try:
            state = self.hub.state
        except NotImplementedError:
            return super().hub_state_key()
        if hasattr(state, "model_dump"):
            return hashed_key({k: v for k, v in state.model_dump().items() if k != "episode_id"})
        return super().hub_state_key()


def _result_text(observation: Any) -> str:
    """An MCP tool call's result as text: its error, its text contents, else its data."""
    error = getattr(observation, "error", None)
    if error is not None:
        return f"error: {getattr(error, 'message', error)}"
    result = getattr(observation, "result", None)
    texts = [str(getattr(part, "text", "")) for part in getattr(result, "content", None) or []]
    if any(texts):
        return "\n".join(text for text in texts if text)
    data = getattr(result, "data", result)
    return str(data) if data is not None else NO_OBSERVATION


class OpenEnvToolEnv(ToolEnv):
    """An OpenEnv MCP environment (``MCPEnvironment``: its tools served by FastMCP) as a tool-calling
    :class:`~milegpo.envs.TextEnv` (``action_format="tools"``, :mod:`milegpo.envs.hubs.tools`).

    The tools are the environment's own (``ListToolsAction``, as JSON schemas for the chat template);
    each call of the reply is a ``CallToolAction``, its result text a ``tool`` message; reward, done,
    won and the state key are read as :class:`OpenEnvEnv` reads them (the environment sets them on
    its observations, e.g. in its ``step``).

    :param environment: ``"module:MCPEnvironmentClass"`` (or the class itself).
    :param environment_kwargs: its constructor's arguments.
    :param task: the episode's task text; default: the first observation (its ``prompt`` metadata, if any).
    """

    def __init__(self, environment: str | type, environment_kwargs: dict[str, Any] | None = None,
                 task: str | None = None, success_reward: float = 1.0, commands: Sequence[str] | None = None,
                 state_key_fn: Callable[[Any], str] | None = None, invalid_action_penalty: float = 0.0,
                 max_episode_steps: int = 50, render_mode: str | None = None):
        super().__init__(success_reward, commands, state_key_fn, invalid_action_penalty, max_episode_steps,
                         render_mode)
        mcp = import_hub("openenv.core.env_server.mcp_environment", INSTALL_HINT)
        self._mcp_types = import_hub("openenv.core.env_server.mcp_types", INSTALL_HINT)
        klass = _load(environment) if isinstance(environment, str) else environment
        if not (isinstance(klass, type) and issubclass(klass, mcp.MCPEnvironment)):
            raise TypeError(f"{environment!r} is not an openenv MCPEnvironment class (text actions: OpenEnvEnv)")
        self.environment = environment
        self.hub: Any = klass(**dict(environment_kwargs or {}))
        self.task_text = task
        self._tools: list[dict[str, Any]] | None = None

    def tools(self) -> list[dict[str, Any]]:
        if self._tools is None:
            listed = self.hub.step(self._mcp_types.ListToolsAction())
            self._tools = [{"type": "function", "function": {"name": tool.name, "description": tool.description,
                                                             "parameters": tool.input_schema}}
                           for tool in listed.tools]
        return self._tools

    def _reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        seeded = "seed" in inspect.signature(self.hub.reset).parameters
        result = self.hub.reset(seed=self.seed_of(seed)) if seeded else self.hub.reset()
        prompt = (result.metadata or {}).get("prompt")
        observation = str(prompt) if prompt else OpenEnvEnv.render_observation(result)
        task = self.task_text if self.task_text is not None else observation
        opening = observation if self.task_text is None else f"{self.task_text}\n\n{observation}"
        return observation, {"task": task, "messages": [{"role": "user", "content": opening}]}

    def call_tool(self, name: str, arguments: dict[str, Any]) -> tuple[str, float, bool, dict[str, Any]]:
        result = self.hub.step(self._mcp_types.CallToolAction(tool_name=name, arguments=arguments))
        reward = float(result.reward) if result.reward is not None else 0.0
        done = bool(result.done)
        metadata = dict(result.metadata or {})
        flag = metadata.get("won", metadata.get("success"))
        won = bool(flag) if flag is not None else done and reward >= self.success_reward
        return _result_text(result), reward, done, {"won": won, "score": reward, "openenv_metadata": metadata}

    def hub_state_key(self) -> str:
        state = self.hub.state
        if hasattr(state, "model_dump"):
            return hashed_key({k: v for k, v in state.model_dump().items() if k != "episode_id"})
        return super().hub_state_key()

    def close(self) -> None:
        self.hub.close()


def make_openenv_env(environment: str | type, **kwargs: Any) -> HubEnv:
    """The adapter an OpenEnv environment class needs: :class:`OpenEnvToolEnv` for an MCP environment
    (tool calls), else :class:`OpenEnvEnv` (text actions). The entry point of ``openenv:`` env ids."""
    mcp = import_hub("openenv.core.env_server.mcp_environment", INSTALL_HINT)
    klass = _load(environment) if isinstance(environment, str) else environment
    if isinstance(klass, type) and issubclass(klass, mcp.MCPEnvironment):
        return OpenEnvToolEnv(environment, **kwargs)
    return OpenEnvEnv(environment, **kwargs)
