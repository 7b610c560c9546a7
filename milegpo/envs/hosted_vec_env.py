"""The worker side of :class:`~milegpo.envs.vec_env.GroupedTextVecEnv`: a ``VecEnv`` whose envs live in
workers (:mod:`~milegpo.envs.vec_worker`, in this process or in worker processes).

:class:`HostedVecEnv` splits the envs into contiguous blocks, one per worker, sends each worker one
command for all its envs and collects the per-env results; a worker that dies or hangs is restarted
and the envs it hosted get an error result. Env errors are counted and logged by kind
(:class:`EnvErrorLog`). What the commands mean (groups, task seeds, episodes) is the grouped vec
env's: this module knows envs and workers only.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import time
from collections import Counter
from collections.abc import Callable
from multiprocessing import connection
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices

from milegpo.envs.core import TextEnv
from milegpo.envs.vec_worker import EnvWorkerError, LocalWorker, ProcessWorker, Result
from milegpo.spaces import TextSpace

#: the name env errors have always been logged under (users' log filters name it)
logger = logging.getLogger("milegpo.envs.vec_env")


class EnvErrorLog:
    """Env errors of a vec env: counted by kind, each kind logged as one line.

    A failure's kind is its exception type and the line that raised it (not its message,
    which may name an id or a time that changes on every call). A warning is logged, and when
    :attr:`path` is set the occurrence's full traceback is appended to that file, at the 1st,
    10th, 100th ... occurrence of a kind: a broken env neither floods the console nor grows
    the file without bound (a million failures of one kind write 7 tracebacks).
    :attr:`counts` has every occurrence per kind.
    """

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else None
        self.counts: Counter[str] = Counter()

    def report(self, env_index: int, message: str, details: str, kind: str | None = None) -> None:
        """Count one failure of env ``env_index`` (``kind`` defaults to the message itself)."""
        kind = kind or message
        self.counts[kind] += 1
        count = self.counts[kind]
        if not (count == 1 or str(count).strip("0") == "1"):  # 1, 10, 100, ...
            return
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} env {env_index} (occurrence {count}; "
                        f"only the 1st, 10th, 100th, ... are written): {message}\n{details.rstrip()}\n")
        where = f"; tracebacks in {self.path}" if self.path is not None else ""
        repeat = "" if count == 1 else f" (seen {count} times)"
        logger.warning("env %d failed: %s%s. Its episode is truncated and the env rebuilt at the next "
                       "reset; training goes on%s", env_index, message, repeat, where)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


class HostedVecEnv(VecEnv):
    """``num_envs`` envs made by ``env_fn``, hosted by workers and talked to one command per worker.

    :param env_fn: factory returning a new :class:`TextEnv` (picklable with cloudpickle when
        ``subprocess=True``); called ``num_envs`` times.
    :param num_envs: how many envs.
    :param subprocess: host the envs in worker processes instead of this process.
    :param n_workers: number of worker processes (default: one per CPU core, at most one per env);
        envs are split into contiguous blocks.
    :param start_method: ``"forkserver"`` (default where available) or ``"spawn"``; ``"fork"`` is
        refused because it copies the parent's torch threads and locks.
    :param timeout: seconds a worker may take to answer one command before it is declared hung,
        killed and restarted.
    """

    def __init__(self, env_fn: Callable[[], TextEnv], num_envs: int, subprocess: bool, n_workers: int | None,
                 start_method: str | None, timeout: float):
        self.subprocess = bool(subprocess)
        #: the factory every env of this vec env is made by (a registered id's, or the user's callable)
        self.env_fn = env_fn
        blocks = self._blocks(num_envs, n_workers if subprocess else 1)
        self._slots = [(w, j) for w, block in enumerate(blocks) for j in range(len(block))]  # env -> (worker, local)
        self._workers: list[LocalWorker | ProcessWorker]
        if subprocess:
            ctx = mp.get_context(self._start_method(start_method))
            self._workers = []
            try:
                for w, block in enumerate(blocks):
                    self._workers.append(ProcessWorker(ctx, [env_fn] * len(block), timeout, f"env-worker-{w}"))
            except BaseException:
                for worker in self._workers:
                    worker.close()
                raise
        else:
            self._workers = [LocalWorker([env_fn] * num_envs)]
        self._global_index = {slot: i for i, slot in enumerate(self._slots)}
        #: worker -> (the items of its command in flight, when it was sent): asynchronous commands
        self._sent: dict[int, tuple[list, float]] = {}
        self._closed = False
        #: env errors seen so far (set ``errors.path`` to keep their tracebacks in a file)
        self.errors = EnvErrorLog()
        super().__init__(num_envs, TextSpace(), TextSpace())

    @property
    def worker_envs(self) -> list[list[int]]:
        """The env indices each worker hosts, in worker order."""
        hosted: list[list[int]] = [[] for _ in self._workers]
        for i, (w, _) in enumerate(self._slots):
            hosted[w].append(i)
        return hosted

    # ------------------------------------------------------ attribute access
    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        return self._call_indices("get_attr", indices, attr_name)

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        self._call_indices("set_attr", indices, attr_name, value)

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None,
                   **method_kwargs: Any) -> list[Any]:
        return self._call_indices("env_method", indices, method_name, method_args, method_kwargs)

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        return self._call_indices("env_is_wrapped", indices, wrapper_class)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for worker in self._workers:
            try:
                worker.close()
            except Exception:
                logger.debug("error while closing a worker", exc_info=True)

    # ------------------------------------------------------------- commands
    def _dispatch(self, command: str, items: dict[int, list]) -> dict[int, Result]:
        """Send ``command`` with each worker's items, collect per-env results (env index -> result).

        A worker that dies or hangs is restarted and all its items get an error result.
        """
        for w, worker_items in items.items():
            self._workers[w].send(command, worker_items)
        results: dict[int, Result] = {}
        for w, worker_items in items.items():
            results.update(self._receive(w, worker_items))
        return results

    def _send_to_worker(self, worker: int, command: str, items: list) -> None:
        """Send ``command`` to one worker without waiting for its answer (:meth:`_workers_ready`,
        :meth:`_receive_from_worker`)."""
        self._sent[worker] = (items, time.monotonic())
        self._workers[worker].send(command, items)

    def _workers_ready(self, timeout: float | None = None) -> list[int]:
        """The workers with a command in flight whose answer has arrived, waiting up to ``timeout`` seconds
        for the first (None: until one answers, or one passes its watchdog timeout and is returned for
        :meth:`_receive_from_worker` to restart)."""
        busy: dict[Any, int] = {self._workers[w].connection: w for w in self._sent
                                if self._workers[w].connection is not None}
        if len(busy) < len(self._sent):  # an in-process worker answers at once
            return sorted(w for w in self._sent if self._workers[w].connection is None)
        if not busy:
            return []
        if timeout is None:
            overdue = min(sent + self._workers[w].timeout for w, (_, sent) in self._sent.items())
            timeout = max(0.0, overdue - time.monotonic())
        ready = sorted(busy[conn] for conn in connection.wait(list(busy), timeout))
        now = time.monotonic()
        late = [w for w, (_, sent) in self._sent.items() if now - sent >= self._workers[w].timeout]
        return sorted(set(ready) | set(late))

    def _receive_from_worker(self, worker: int) -> dict[int, Result]:
        """The per-env results of the command in flight at ``worker`` (its watchdog counted from the send)."""
        items, sent = self._sent.pop(worker)
        remaining = max(0.0, sent + self._workers[worker].timeout - time.monotonic())
        return self._receive(worker, items, remaining)

    def _receive(self, w: int, worker_items: list, wait: float | None = None) -> dict[int, Result]:
        """Worker ``w``'s per-env results of the command sent with ``worker_items`` (env index -> result),
        waiting up to ``wait`` seconds (default: its watchdog timeout); a worker that died or hung is
        restarted and its envs get an error result, each reported once."""
        try:
            status, payload = self._workers[w].recv(wait)
            if status != "ok":  # EnvHost.reset/step never raise: a protocol failure
                raise EnvWorkerError(f"env-worker-{w} failed: {payload!r}")
        except EnvWorkerError as exc:
            message = f"{exc}; the worker was restarted and the episodes it hosted were truncated"
            self._restart(w)
            payload = [("error", (message, message, message))] * len(worker_items)
        results: dict[int, Result] = {}
        for (j, *_), (status, value) in zip(worker_items, payload):
            i = self._global_index[(w, j)]
            if status == "error":  # report once here, pass the one-line message on
                message, details, kind = value
                self.errors.report(i, message, details, kind)
                value = message
            results[i] = (status, value)
        return results

    def _call_indices(self, command: str, indices: VecEnvIndices, *data: Any) -> list[Any]:
        env_indices = self._get_indices(indices)
        by_worker: dict[int, list[int]] = {}
        for i in env_indices:
            by_worker.setdefault(self._slots[i][0], []).append(i)
        for w, envs in by_worker.items():
            self._workers[w].send(command, [self._slots[i][1] for i in envs], *data)
        values: dict[int, Any] = {}
        error: BaseException | None = None
        for w, envs in by_worker.items():
            try:
                status, payload = self._workers[w].recv()
            except EnvWorkerError as exc:
                self._restart(w)
                status, payload = "raise", exc
            if status == "raise":
                error = error or payload
                continue
            values.update(zip(envs, payload))
        if error is not None:
            raise error
        return [values[i] for i in env_indices]

    def _restart(self, w: int) -> None:
        """Restart worker ``w`` (its envs are rebuilt from their factory)."""
        self._workers[w].restart()

    def _get_indices(self, indices: VecEnvIndices) -> list[int]:
        if indices is None:
            return list(range(self.num_envs))
        if isinstance(indices, (int, np.integer)):
            return [int(indices)]
        return [int(i) for i in indices]

    @staticmethod
    def _blocks(num_envs: int, n_workers: int | None) -> list[np.ndarray]:
        n_workers = n_workers or os.cpu_count() or 1
        if n_workers < 1:
            raise ValueError(f"n_workers must be >= 1, got {n_workers}")
        return [block for block in np.array_split(np.arange(num_envs), min(n_workers, num_envs))]

    @staticmethod
    def _start_method(start_method: str | None) -> str:
        available = mp.get_all_start_methods()
        if start_method is None:
            return "forkserver" if "forkserver" in available else "spawn"
        if start_method not in ("spawn", "forkserver") or start_method not in available:
            raise ValueError(f"start_method must be 'spawn' or 'forkserver' (available here: {available}), got "
                             f"{start_method!r}")
        return start_method
