"""Hosting text envs for :class:`~milegpo.envs.vec_env.GroupedTextVecEnv`, in this or a worker process.

:class:`EnvHost` owns a list of envs and runs batched ``reset``/``step`` on them,
turning an exception raised by one env into a per-env error result (the env is
rebuilt from its factory at its next reset), so one broken env never takes down
the batch. :func:`worker_main` is the loop of a worker process around an
``EnvHost``.

This module imports neither stable-baselines3 nor torch: a spawned worker only
pays for numpy, gymnasium and the env itself.
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from milegpo.envs.core import TextEnv

logger = logging.getLogger(__name__)

#: The EnvHost methods a worker answers (besides "close").
COMMANDS = frozenset({"reset", "step", "get_attr", "set_attr", "env_method", "env_is_wrapped"})

#: A per-env result: ``("ok", value)`` or ``("error", (message, details))`` where
#: ``message`` is ``"ExcType: text"`` and ``details`` the full traceback.
Result = tuple[str, Any]


def format_exception(exc: BaseException) -> str:
    """``"ExcType: message"``: the text put in ``info["env_error"]``."""
    return f"{type(exc).__name__}: {exc}"


class EnvHost:
    """Builds envs from factories and runs batched commands on them.

    :param env_fns: one factory per hosted env (called with no argument).
    """

    def __init__(self, env_fns: Sequence[Callable[[], TextEnv]]):
        self.env_fns = list(env_fns)
        self.envs: list[TextEnv] = [_build(fn) for fn in self.env_fns]
        self._broken = [False] * len(self.envs)

    def reset(self, items: Sequence[tuple[int, int | None, dict[str, Any] | None]]) -> list[Result]:
        """Reset env ``i`` with ``seed`` and ``options`` for each ``(i, seed, options)``."""
        results = []
        for i, seed, options in items:
            try:
                if self._broken[i]:
                    self._rebuild(i)
                results.append(("ok", self.envs[i].reset(seed=seed, options=options)))
            except Exception as exc:  # an env failure must not stop the other envs
                results.append(self._fail(i, "reset", exc))
        return results

    def step(self, items: Sequence[tuple[int, str]]) -> list[Result]:
        """Step env ``i`` with ``action`` for each ``(i, action)``."""
        results = []
        for i, action in items:
            try:
                results.append(("ok", self.envs[i].step(action)))
            except Exception as exc:
                results.append(self._fail(i, "step", exc))
        return results

    def get_attr(self, indices: Sequence[int], name: str) -> list[Any]:
        return [getattr(self.envs[i], name) for i in indices]

    def set_attr(self, indices: Sequence[int], name: str, value: Any) -> list[None]:
        for i in indices:
            setattr(self.envs[i], name, value)
        return [None for _ in indices]

    def env_method(self, indices: Sequence[int], name: str, args: tuple, kwargs: dict[str, Any]) -> list[Any]:
        return [getattr(self.envs[i], name)(*args, **kwargs) for i in indices]

    def env_is_wrapped(self, indices: Sequence[int], wrapper_class: type) -> list[bool]:
        results = []
        for i in indices:
            env, wrapped = self.envs[i], False
            while hasattr(env, "env") and not wrapped:  # walk gymnasium wrappers
                wrapped = isinstance(env, wrapper_class)
                env = env.env
            results.append(wrapped)
        return results

    def close(self) -> None:
        for env in self.envs:
            try:
                env.close()
            except Exception:  # closing is best effort; the process may be going away
                logger.debug("error while closing an env", exc_info=True)

    def _fail(self, i: int, where: str, exc: Exception) -> Result:
        """Mark env ``i`` for a rebuild and return its error result (the parent reports it once)."""
        self._broken[i] = True
        return ("error", (format_exception(exc), f"in {where}():\n{traceback.format_exc()}"))

    def _rebuild(self, i: int) -> None:
        try:
            self.envs[i].close()
        except Exception:
            logger.debug("error while closing a broken env", exc_info=True)
        self.envs[i] = _build(self.env_fns[i])
        self._broken[i] = False


def _build(env_fn: Callable[[], TextEnv]) -> TextEnv:
    env = env_fn()
    if not isinstance(getattr(env, "unwrapped", None), TextEnv):
        raise TypeError(f"the env factory {env_fn!r} returned a {type(env).__name__}, not a milegpo.envs.TextEnv")
    return env


def worker_main(conn: Any, env_fns_pickled: bytes) -> None:
    """Loop of a worker process: receive ``(command, data)``, answer ``(status, payload)``.

    ``status`` is ``"ok"`` (payload = the command's result) or ``"raise"``
    (payload = the exception, re-raised in the parent for ``get_attr`` & co.).
    The first message sent is ``("ok", "ready")`` once the envs are built.
    """
    import cloudpickle

    try:
        host = EnvHost(cloudpickle.loads(env_fns_pickled))
    except Exception as exc:
        conn.send(("raise", _picklable(exc)))
        conn.close()
        return
    if "torch" in sys.modules:  # an env imported torch: keep the worker off the other cores
        sys.modules["torch"].set_num_threads(1)
    conn.send(("ok", "ready"))
    while True:
        try:
            command, data = conn.recv()
        except (EOFError, OSError):  # the parent went away
            break
        if command == "close":
            host.close()
            conn.send(("ok", None))
            break
        try:
            if command not in COMMANDS:
                raise ValueError(f"unknown worker command {command!r}")
            conn.send(("ok", getattr(host, command)(*data)))
        except Exception as exc:
            conn.send(("raise", _picklable(exc)))
    conn.close()


def _picklable(exc: BaseException) -> BaseException:
    """The exception itself if it survives pickling, else a RuntimeError with its text."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(format_exception(exc))
