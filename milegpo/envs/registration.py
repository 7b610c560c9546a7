"""Gymnasium registration of the milegpo environments, with errors a user can act on.

Every env id of the library lives in :data:`BUILTIN_ENVS`; entry points are
strings, so optional engines (alfworld, textworld-express, ...) are imported only
when their env is made. Register your own env with :func:`register_env`; outside the
registering process it is found in two ways:

* ``"my_package.envs:myorg/Maze-v0"`` (gymnasium's convention): the module before the
  colon is imported first, and registers the id after it when imported;
* ``"my_package.envs:MazeEnv"``: a :class:`TextEnv` subclass of that module, registered under
  that whole string when first named (its constructor's defaults are the env's defaults);
* ``"textarena:Wordle-v0"``, ``"gem:..."``, ``"openenv:..."``, ``"verifiers:..."``: an env of another library through
  its adapter (:mod:`milegpo.envs.hubs`; these prefixes name hubs, not modules);

the module is imported as ``python -m`` would: from the installed packages, else from the
working directory (a module file beside you is found by the ``milegpo`` command too);
* a package's entry point in the group :data:`ENTRY_POINT_GROUP` (``milegpo.envs``),
  e.g. in its ``pyproject.toml``::

      [project.entry-points."milegpo.envs"]
      maze = "my_package.envs:register"     # a function that calls register_env, or a module

  Every entry point of the group is loaded the first time an id is not found.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any, cast

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

from milegpo.envs.core import TextEnv
from milegpo.envs.registry import UnknownEnvError, register_env
from milegpo.envs.user_modules import import_user_module, user_module_error

TWX_GAMES = ("cookingworld", "twc", "coin", "mapreader", "arithmetic", "sorting", "simonsays", "peckingorder")

#: id -> (entry point, default kwargs)
BUILTIN_ENVS: dict[str, tuple[str, dict[str, Any]]] = {
    "milegpo/House-v0": ("milegpo.envs.house:HouseEnv", {}),
    "milegpo/ALFWorld-v0": ("milegpo.envs.alfworld:ALFWorldEnv", {}),
    "milegpo/WebShop-v0": ("milegpo.envs.webshop:WebShopEnv", {}),
    "milegpo/TextWorld-v0": ("milegpo.envs.textworld:TextWorldEnv", {}),
    **{
        f"milegpo/TWX-{game}-v0": ("milegpo.envs.textworld_express:TextWorldExpressEnv", {"game": game})
        for game in TWX_GAMES
    },
}


#: the entry-point group through which installed packages register their envs
ENTRY_POINT_GROUP = "milegpo.envs"

_entry_points_loaded = False


def registered_env_ids() -> list[str]:
    """The ids of all registered text envs (library and user-registered)."""
    ids = []
    for env_id, spec in gym.registry.items():
        entry = spec.entry_point
        if env_id in BUILTIN_ENVS or (isinstance(entry, type) and issubclass(entry, TextEnv)):
            ids.append(env_id)
        elif isinstance(entry, str) and entry.startswith("milegpo."):
            ids.append(env_id)
    return sorted(ids)


def resolve_env_id(env_id: str) -> str:
    """The registered id ``env_id`` names, importing what registers it: the module of a
    ``"module:Id"`` id, else (for an id not registered yet) the :data:`ENTRY_POINT_GROUP`
    entry points. Raises :class:`UnknownEnvError` listing the registered ids."""
    if ":" in env_id:
        if env_id in gym.registry:  # a module:ClassName or hub id registered earlier
            return env_id
        from milegpo.envs.hubs import register_hub_env  # here, not at the top: the hubs' adapters import torch

        if register_hub_env(env_id):  # textarena:, gem:, openenv:, verifiers: (the prefixes are the hubs', not modules)
            return env_id
        module_name, _, name = env_id.partition(":")
        module = _import_env_module(module_name, env_id)
        attribute = getattr(module, name, None)
        if name not in gym.registry and isinstance(attribute, type) and issubclass(attribute, TextEnv):
            # by name: worker processes import the module themselves; with the defaults the module registers the
            # class with (its max_episode_steps...), when it registers it under one id
            register_env(env_id, env_id, **_registered_defaults(attribute, env_id))
            return env_id
        if name not in gym.registry:
            what = f"a {type(attribute).__name__}, not a TextEnv class" if attribute is not None else "not defined"
            raise UnknownEnvError(f"env id {env_id}: {module_name!r} imported, but it registers no env id {name!r} "
                                  f"and {name!r} is {what} there. Registered text envs:\n  "
                                  + "\n  ".join(registered_env_ids()))
        env_id = name
    if env_id not in gym.registry:
        _load_entry_points()
    if env_id not in gym.registry:
        known = "\n  ".join(registered_env_ids())
        raise UnknownEnvError(f"Unknown env id {env_id!r}. Registered text envs:\n  {known}\n"
                              "Register your own with milegpo.envs.register_env(id, MyTextEnv), and name it as "
                              f"'your_module:{env_id}' (or name a TextEnv class as 'your_module:YourEnv') or "
                              f"through a {ENTRY_POINT_GROUP!r} entry point so that `milegpo train env.id=...` "
                              "finds it.")
    return env_id


def _registered_defaults(env_class: type[TextEnv], env_id: str) -> dict[str, Any]:
    """The default arguments ``env_class``'s module registered it with (``register_env(id, cls, **defaults)``):
    a ``module:ClassName`` id then plays as the registered id does. Registered under several ids with different
    defaults: none (the constructor's), said in one line naming the ids to choose from."""
    registered = {other: dict(spec.kwargs) for other, spec in gym.registry.items()
                  if spec.entry_point is env_class and other != env_id}
    choices = {repr(sorted(kwargs.items())) for kwargs in registered.values()}
    if len(choices) > 1:
        module = env_id.partition(":")[0]
        print(f"note: {env_id} uses {env_class.__name__}'s constructor defaults: its module registers it as "
              f"{', '.join(sorted(registered))} with different defaults; name one of them (e.g. "
              f"{module}:{sorted(registered)[0]}) for its defaults", file=sys.stderr)
        return {}
    return next(iter(registered.values()), {})


def _import_env_module(module: str, env_id: str) -> ModuleType:
    """Import the module of a ``module:...`` env id (:func:`import_user_module`); :class:`UnknownEnvError`
    when it cannot be imported."""
    try:
        return import_user_module(module)
    except ImportError as exc:
        raise user_module_error(module, f"the module of env id {env_id}", exc) from None


def takes_split(env_id: str) -> bool:
    """Whether the env's constructor has a ``split`` argument (task splits such as train / eval_id)."""
    spec = gym.spec(resolve_env_id(env_id))
    creator = spec.entry_point if callable(spec.entry_point) else load_env_creator(str(spec.entry_point))
    try:
        return "split" in inspect.signature(creator).parameters
    except (TypeError, ValueError):  # no signature to read: assume it takes what it is given
        return True


def _load_entry_points() -> None:
    """Load every ``milegpo.envs`` entry point once (a callable is called, a module imported)."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = point.load()
        except Exception as exc:
            raise UnknownEnvError(f"the {ENTRY_POINT_GROUP!r} entry point {point.name} = {point.value} failed to "
                                  f"load: {type(exc).__name__}: {exc}") from None
        if callable(loaded):
            loaded()


def check_env_id(env_id: str) -> None:
    """Raise :class:`UnknownEnvError` (listing the registered ids) if ``env_id`` names no registered env."""
    resolve_env_id(env_id)


def make_env(env_id: str, **kwargs: Any) -> TextEnv:
    """Make a registered text env, with a helpful error for unknown ids.

    Returns the unwrapped :class:`TextEnv` (no Gymnasium wrappers: the horizon
    is the env's own ``max_episode_steps``, which ``kwargs`` may set).
    """
    env_id = resolve_env_id(env_id)
    # Built from the spec, not gym.make: gym.make would take ``max_episode_steps``
    # for its own TimeLimit wrapper instead of passing it to the env.
    spec = gym.spec(env_id)
    if spec.entry_point is None:
        raise UnknownEnvError(f"{env_id} has no entry point")
    creator = spec.entry_point if callable(spec.entry_point) else load_env_creator(spec.entry_point)
    env = creator(**{**spec.kwargs, **kwargs})
    env = getattr(env, "unwrapped", env)
    if isinstance(env, gym.Env):
        env.spec = dataclasses.replace(spec, kwargs={**spec.kwargs, **kwargs})
    if not isinstance(env, TextEnv):
        raise TypeError(f"{env_id!r} made a {type(env).__name__}, which is not a milegpo.envs.TextEnv")
    return env


class RegisteredEnvFactory:
    """Picklable factory of a registered env id: ``make_env(env_id, **env_kwargs)``.

    It carries the id's entry point, so an env registered only in the parent
    process (``register_env`` in a user script) can be made in a spawned worker.
    """

    def __init__(self, env_id: str, env_kwargs: dict[str, Any] | None = None):
        env_id = resolve_env_id(env_id)
        spec = gym.spec(env_id)
        self.env_id = env_id
        if spec.entry_point is None:
            raise UnknownEnvError(f"{env_id} has no entry point")
        self.entry_point = cast("str | type[TextEnv]", spec.entry_point)  # registered by register_env
        self.default_kwargs = dict(spec.kwargs)
        self.env_kwargs = dict(env_kwargs or {})

    def __call__(self) -> TextEnv:
        if self.env_id not in gym.registry:
            register_env(self.env_id, self.entry_point, **self.default_kwargs)
        return make_env(self.env_id, **self.env_kwargs)

    def __repr__(self) -> str:
        return f"RegisteredEnvFactory({self.env_id!r}, {self.env_kwargs!r})"


class KwargsFactory:
    """``factory(**kwargs)`` as a picklable zero-argument callable."""

    def __init__(self, factory: Callable[..., TextEnv], kwargs: dict[str, Any]):
        self.factory, self.kwargs = factory, dict(kwargs)

    def __call__(self) -> TextEnv:
        return self.factory(**self.kwargs)


def _register_builtins() -> None:
    for env_id, (entry_point, kwargs) in BUILTIN_ENVS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point, kwargs=kwargs, disable_env_checker=True,
                         order_enforce=False)


_register_builtins()
