"""Environments of other libraries as milegpo envs: TextArena, GEM, OpenEnv and verifiers.

Each hub has an adapter, a :class:`~milegpo.envs.TextEnv` (so grouping, worker processes, state
keys, chat prompts, credit and every command work unchanged), and env ids with a prefix:

==============  ==========================================  ====================================
prefix          example                                     adapter
==============  ==========================================  ====================================
``textarena:``  ``textarena:GuessTheNumber-v0``             :class:`TextArenaEnv`
``gem:``        ``gem:game:GuessTheNumber-v0-easy``         :class:`GEMEnv`
``openenv:``    ``openenv:my_pkg.server:MyEnvironment``     :class:`OpenEnvEnv` / :class:`OpenEnvToolEnv` (MCP)
``verifiers:``  ``verifiers:my_verifiers_env``              :class:`VerifiersEnv` / :class:`VerifiersToolEnv` (tools)
==============  ==========================================  ====================================

Such an id resolves wherever an env id is taken (the registry registers it through
:func:`register_hub_env`: its adapter with the hub's id as argument); the adapters themselves take
the hub's id as ``game`` / ``environment``, so ``env.id=milegpo.envs.hubs:TextArenaEnv`` with
``env.kwargs={game: GuessTheNumber-v0}`` names the same env.
Importing this package imports no hub: a hub is imported when one of its ids is registered (to check the
id, :data:`HUB_ID_CHECKS`) or an adapter is constructed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from milegpo.envs.hubs.base import HubEnv
from milegpo.envs.hubs.gem import GEMEnv, check_gem_id
from milegpo.envs.hubs.openenv import OpenEnvEnv, OpenEnvToolEnv, check_openenv_id, make_openenv_env
from milegpo.envs.hubs.textarena import TextArenaEnv, check_textarena_game
from milegpo.envs.hubs.tools import ToolEnv
from milegpo.envs.hubs.verifiers import VerifiersEnv, VerifiersToolEnv, check_verifiers_id, make_verifiers_env
from milegpo.envs.registry import register_env

#: prefix -> (adapter or a function making one, the keyword argument that takes the hub's id)
HUBS: dict[str, tuple[Callable[..., HubEnv], str]] = {
    "textarena": (TextArenaEnv, "game"),
    "gem": (GEMEnv, "game"),
    "openenv": (make_openenv_env, "environment"),  # OpenEnvToolEnv for an MCP environment, else OpenEnvEnv
    "verifiers": (make_verifiers_env, "environment"),  # VerifiersToolEnv for an environment with tools
}


#: prefix -> a check of the hub's id, run when the id is registered: it raises ``UnknownEnvError`` (one line)
#: for an id the hub does not know, so that an unknown game is reported before anything else
HUB_ID_CHECKS: dict[str, Callable[[str], None]] = {
    "textarena": check_textarena_game,
    "gem": check_gem_id,
    "openenv": check_openenv_id,
    "verifiers": check_verifiers_id,
}


def split_hub_id(env_id: str) -> tuple[str, str] | None:
    """``(prefix, hub id)`` of a hub env id such as ``"textarena:Sudoku-v0"``; None for any other id."""
    prefix, sep, rest = env_id.partition(":")
    return (prefix, rest) if sep and prefix in HUBS and rest else None


def register_hub_env(env_id: str, **kwargs: Any) -> bool:
    """Register the hub env id ``env_id`` (e.g. ``"gem:game:Sudoku-v0-easy"``) under that id, with
    ``kwargs`` as its default arguments; False when ``env_id`` has no hub prefix. The hub checks the id
    first (:data:`HUB_ID_CHECKS`): :class:`~milegpo.envs.UnknownEnvError` for an id it does not know."""
    parts = split_hub_id(env_id)
    if parts is None:
        return False
    prefix, hub_id = parts
    adapter, argument = HUBS[prefix]
    try:
        HUB_ID_CHECKS[prefix](hub_id)  # UnknownEnvError for an id the hub does not know
    except ImportError:
        pass  # the hub, or a package the env imports, is not installed: making the env says which and how to install
    # a function making the adapter registers like a class (gymnasium calls it with the kwargs)
    register_env(env_id, cast(type[HubEnv], adapter), **{argument: hub_id, **kwargs})
    return True


__all__ = ["GEMEnv", "HUBS", "HUB_ID_CHECKS", "HubEnv", "OpenEnvEnv", "OpenEnvToolEnv", "TextArenaEnv", "ToolEnv",
           "VerifiersEnv", "VerifiersToolEnv", "make_openenv_env", "make_verifiers_env", "register_hub_env",
           "split_hub_id"]
