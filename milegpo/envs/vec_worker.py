"""Hosting text envs for :class:`~milegpo.envs.vec_env.GroupedTextVecEnv`, in this or a worker process.

:class:`EnvHost` owns a list of envs and runs batched ``reset``/``step`` on them,
turning an exception raised by one env into a per-env error result (the env is
rebuilt from its factory at its next reset), so one broken env never takes down
the batch. :func:`worker_main` is the loop of a worker process around an
``EnvHost``.

The other end of the pipe is here too: :class:`ProcessWorker` (a child process running
:func:`worker_main`, talked to with timeouts, killed and restarted when it dies or hangs)
and :class:`LocalWorker` (the same interface in this process).

This module imports neither stable-baselines3 nor torch: a spawned worker only
pays for numpy, gymnasium and the env itself.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle

from milegpo.envs.core import TextEnv

logger = logging.getLogger(__name__)

#: The EnvHost methods a worker answers (besides "close").
COMMANDS = frozenset({"reset", "step", "get_attr", "set_attr", "env_method", "env_is_wrapped"})

#: A per-env result: ``("ok", value)`` or ``("error", (message, details, kind))`` where
#: ``message`` is ``"ExcType: text"``, ``details`` the full traceback and ``kind`` what
#: identifies the failure across occurrences (:func:`error_kind`).
Result = tuple[str, Any]


def format_exception(exc: BaseException) -> str:
    """``"ExcType: message"``: the text put in ``info["env_error"]``."""
    return f"{type(exc).__name__}: {exc}"


def error_kind(exc: BaseException, where: str) -> str:
    """The exception's type and the line that raised it (``"KeyError in step() at env.py:42"``): the
    same failure has the same kind even when its message changes on every call (an id, a time)."""
    frames = traceback.extract_tb(exc.__traceback__)
    place = f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__} in {where}(){place}"


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
        """Step env ``i`` with ``action`` for each ``(i, action)``; every env is sent its action first
        (:meth:`~milegpo.envs.core.TextEnv.send_action`; an env in a wrapper is not: the wrapper may change the
        action), and an env that fails there fails its step."""
        results = []
        failed: dict[int, Result] = {}
        for i, action in items:
            env = self.envs[i]
            try:
                if isinstance(env, TextEnv):
                    env.send_action(action)
            except Exception as exc:
                failed[i] = self._fail(i, "step", exc)
        for i, action in items:
            if i in failed:
                results.append(failed[i])
                continue
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
        return ("error", (format_exception(exc), f"in {where}():\n{traceback.format_exc()}", error_kind(exc, where)))

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


class EnvWorkerError(RuntimeError):
    """A worker process died, hung past its timeout, or could not start."""


class LocalWorker:
    """Runs an :class:`EnvHost` in this process, with the worker-process interface."""

    def __init__(self, env_fns: Sequence[Callable[[], TextEnv]]):
        self.host = EnvHost(env_fns)
        self._reply: tuple[str, Any] = ("ok", None)

    #: no pipe to wait on: an in-process worker answers within send()
    connection = None
    #: never hung: the host runs in this process
    timeout = float("inf")

    def send(self, command: str, *data: Any) -> None:
        try:
            self._reply = ("ok", getattr(self.host, command)(*data))
        except Exception as exc:
            self._reply = ("raise", exc)

    def recv(self, wait: float | None = None) -> tuple[str, Any]:
        return self._reply

    def restart(self) -> None:  # pragma: no cover - a local worker cannot die
        pass

    def close(self) -> None:
        self.host.close()


class ProcessWorker:
    """An :class:`EnvHost` in a child process, talked to through a pipe with timeouts."""

    def __init__(self, ctx: Any, env_fns: Sequence[Callable[[], TextEnv]], timeout: float, name: str):
        self._ctx = ctx
        self._pickled_fns = cloudpickle.dumps(list(env_fns))
        self.timeout = timeout
        self.name = name
        self._send_error: BaseException | None = None
        self._start()

    def _start(self) -> None:
        self._send_error = None  # an error of the previous process's pipe says nothing about this one
        self.conn, child_conn = self._ctx.Pipe()
        self.process = self._ctx.Process(target=worker_main, args=(child_conn, self._pickled_fns), daemon=True,
                                         name=self.name)
        self.process.start()
        child_conn.close()
        try:
            status, payload = self.recv()
        except EnvWorkerError as exc:
            self._kill()
            raise EnvWorkerError(f"{self.name} failed to start: {exc}") from None
        if status == "raise":
            self._kill()
            raise EnvWorkerError(f"{self.name} failed to build its envs: {payload!r}") from payload

    def send(self, command: str, *data: Any) -> None:
        self._send_error = None
        try:
            self.conn.send((command, data))
        except (OSError, ValueError) as exc:  # broken pipe: the process is gone
            self._send_error = exc

    @property
    def connection(self) -> Any:
        """The pipe end to wait on for this worker's answer (``multiprocessing.connection.wait``)."""
        return self.conn

    def recv(self, wait: float | None = None) -> tuple[str, Any]:
        """The worker's answer, waiting up to ``wait`` seconds (default: its timeout) before it is hung."""
        if self._send_error is not None:
            raise EnvWorkerError(f"{self.name} is not reachable ({self._send_error!r}){self._exit_text()}")
        try:
            if not self.conn.poll(self.timeout if wait is None else wait):
                raise EnvWorkerError(f"{self.name} gave no answer within {self.timeout:g} s (hung env?)")
            return self.conn.recv()
        except (EOFError, OSError) as exc:
            raise EnvWorkerError(f"{self.name} died ({type(exc).__name__}){self._exit_text()}") from None

    def restart(self) -> None:
        self._kill()
        self._start()

    def close(self, wait: float = 5.0) -> None:
        """Ask the worker to close its envs; kill it if it does not finish within ``wait`` seconds."""
        if self.process.is_alive():
            self.send("close")
            try:
                if self._send_error is None and self.conn.poll(wait):
                    self.conn.recv()
            except (EOFError, OSError):
                pass
            self.process.join(timeout=wait)
        self._kill()

    def _exit_text(self) -> str:
        self.process.join(timeout=1)
        code = self.process.exitcode
        return "" if code is None else f", exit code {code}"

    def _kill(self) -> None:
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)
        self.conn.close()
