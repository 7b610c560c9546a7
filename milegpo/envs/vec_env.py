"""Grouped vectorized text env: ``n_tasks`` tasks x ``group_size`` copies, one SB3 ``VecEnv``.

Group RL (GRPO, GiGPO, GraphGPO, MileGPO) rolls every task out ``group_size``
times from the *same* initial state. :class:`GroupedTextVecEnv` holds
``num_envs = n_tasks * group_size`` :class:`~milegpo.envs.core.TextEnv`
instances; env ``i`` belongs to group ``i // group_size`` and all envs of a group
are reset together with the same task seed.

Differences from SB3's ``DummyVecEnv`` / ``SubprocVecEnv`` (which allocate arrays from ``space.shape``, None for text):

* observations are an ``np.ndarray(dtype=object)`` of ``str`` (text spaces have no
  shape), actions a sequence of ``str``;
* **autoreset is disabled**: an env whose episode ended stays done until the next
  :meth:`~GroupedTextVecEnv.reset`. Stepping it is a no-op that returns its last
  observation, reward 0.0, done ``True`` and its last info with ``"inactive": True``.
  :attr:`~GroupedTextVecEnv.active` tells which episodes are still running;
* an env (or a worker process) that raises, crashes or hangs does not stop the
  batch: its episode is reported truncated with ``info["env_error"]`` and the env
  stays inactive; the worker is restarted and the env rebuilt at the next reset.
  Each distinct error is logged once (then at its 10th, 100th, ... occurrence)
  as one line; full tracebacks go to :attr:`GroupedTextVecEnv.errors` ``.path``
  when set (``milegpo train`` sets ``RUN_DIR/env_errors.log``).

Use with SB3-style code::

    venv = make_vec_env("milegpo/House-v0", n_tasks=4, group_size=8, seed=0)
    obs = venv.reset()                       # (32,) object array of str
    while venv.active.any():
        actions = [info["admissible_commands"][0] for info in infos]  # your policy
        obs, rewards, dones, infos = venv.step(actions)

With ``subprocess=True`` the workers are started with "forkserver" or "spawn"
(never "fork"), so a script must guard its entry point with
``if __name__ == "__main__":`` and the env factory must be picklable by
cloudpickle (a registered id, a class, a function or a lambda all are). SB3's
``VecMonitor`` does not apply (inactive envs report ``done`` on every step):
the trainer counts episodes itself.

Plain Gymnasium users: ``infos`` of :meth:`reset` are in ``venv.reset_infos``;
``terminated``/``truncated`` of a step are ``info["terminated"]`` and
``info["TimeLimit.truncated"]`` (``dones`` is their ``or``); each env is a plain
``gymnasium.Env`` reachable through :meth:`env_method` / :meth:`get_attr`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from milegpo.envs.core import TextEnv
from milegpo.envs.hosted_vec_env import HostedVecEnv
from milegpo.envs.registration import KwargsFactory, RegisteredEnvFactory, takes_split
from milegpo.envs.vec_worker import Result
from milegpo.options import HELD_OUT_SEEDS_START


def _accepts_split(factory: object) -> bool:
    """Whether a callable takes a ``split`` argument (unreadable signature: assumed yes, as for ids)."""
    try:
        return "split" in inspect.signature(factory).parameters  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return True


class GroupedTextVecEnv(HostedVecEnv):
    """``n_tasks`` groups of ``group_size`` copies of a text env, with aligned episodes.

    The envs live in workers, in this process or in worker processes
    (:class:`~milegpo.envs.hosted_vec_env.HostedVecEnv`); this class holds the groups, the task seeds
    and the episodes.

    :param env_fn: factory returning a new :class:`TextEnv` (picklable with
        cloudpickle when ``subprocess=True``); called ``num_envs`` times.
    :param n_tasks: number of groups (distinct tasks per batch).
    :param group_size: copies per task (the group size ``K`` of the credit functions, default 8).
    :param seed: seed of the vec env's RNG that draws the task seeds in :meth:`reset`.
    :param subprocess: host the envs in worker processes instead of this process.
    :param n_workers: number of worker processes (default: one per CPU core, at
        most one per env); envs are split into contiguous blocks.
    :param start_method: ``"forkserver"`` (default where available) or ``"spawn"``;
        ``"fork"`` is refused because it copies the parent's torch threads and locks.
    :param timeout: seconds a worker may take to answer one command before it is
        declared hung, killed and restarted.
    :param shard: ``(rank, world_size)`` for data-parallel training: :meth:`reset` draws
        the task seeds of all ``n_tasks * world_size`` groups (the same draw on every
        rank, given the same seed) and plays this rank's slice, so ranks get disjoint
        tasks and together the batch one process with every group would play.

    Attributes: ``n_tasks``, ``group_size``, ``group_ids`` (int64, env -> group),
    ``task_seeds`` (int64, seed of each group at the last reset, -1 for a group
    left empty by :meth:`reset_groups`), ``reset_infos``, :attr:`active`.
    """

    def __init__(
        self,
        env_fn: Callable[[], TextEnv],
        n_tasks: int = 1,
        group_size: int = 8,
        seed: int | None = 0,
        subprocess: bool = False,
        n_workers: int | None = None,
        start_method: str | None = None,
        timeout: float = 120.0,
        shard: tuple[int, int] = (0, 1),
    ):
        if not 0 <= shard[0] < shard[1]:
            raise ValueError(f"shard must be (rank, world_size) with 0 <= rank < world_size, got {shard}")
        self.shard = (int(shard[0]), int(shard[1]))
        if n_tasks < 1 or group_size < 1:
            raise ValueError(f"n_tasks and group_size must be >= 1, got n_tasks={n_tasks}, group_size={group_size}")
        self.n_tasks = int(n_tasks)
        self.group_size = int(group_size)
        num_envs = self.n_tasks * self.group_size
        self.group_ids = np.arange(num_envs, dtype=np.int64) // self.group_size
        self.task_seeds = np.full(self.n_tasks, -1, dtype=np.int64)
        self._obs = np.array([""] * num_envs, dtype=object)
        self._active = np.zeros(num_envs, dtype=bool)
        self._last_infos: list[dict[str, Any]] = [{"inactive": True} for _ in range(num_envs)]
        self._actions: Sequence[Any] | np.ndarray | None = None
        super().__init__(env_fn, num_envs, subprocess, n_workers, start_method, timeout)
        try:
            self._num_tasks: int | None = int(self.get_attr("num_tasks", indices=[0])[0])
        except (AttributeError, TypeError):
            self._num_tasks = None
        self.seed(seed)

    # ------------------------------------------------------------ properties
    @property
    def env_name(self) -> str:
        """The env's name for messages: its registered id, else its class's or factory's name."""
        fn: object = self.env_fn
        if isinstance(fn, RegisteredEnvFactory):
            return fn.env_id
        fn = fn.factory if isinstance(fn, KwargsFactory) else fn
        return str(getattr(fn, "__name__", None) or type(fn).__name__)

    @property
    def has_task_splits(self) -> bool:
        """Whether the envs play a task split (their constructor takes ``split``): evaluation then plays the
        split's first tasks; without splits it plays held-out task seeds (``HELD_OUT_SEEDS_START`` up), which
        training never draws."""
        fn: object = self.env_fn
        if isinstance(fn, RegisteredEnvFactory):
            return "split" in fn.env_kwargs or takes_split(fn.env_id)
        if isinstance(fn, KwargsFactory):
            return "split" in fn.kwargs or _accepts_split(fn.factory)
        return _accepts_split(fn)

    @property
    def active(self) -> np.ndarray:
        """Bool array: the env's episode is still running (a copy)."""
        return self._active.copy()

    # ---------------------------------------------------------------- resets
    def seed(self, seed: int | None = None) -> list[int | None]:
        """Seed the RNG that draws the task seeds of :meth:`reset` (applies from the next reset)."""
        if seed is None:
            seed = int(np.random.SeedSequence().generate_state(1)[0])
        self._seed = int(seed)
        self._rng = np.random.default_rng(self._seed)
        return [self._seed] * self.num_envs

    def draw_task_seeds(self) -> np.ndarray:
        """Draw ``n_tasks`` task seeds from the vec env's RNG.

        With a finite task list (the env's ``num_tasks``) the seeds are distinct
        task indices when the draw fits in it; otherwise any ints in ``[0, HELD_OUT_SEEDS_START)`` (2**30):
        the seeds above are never trained on, the held-out tasks of an env without splits.
        With a ``shard``, the draw is of every rank's groups and this rank's slice is returned.
        """
        rank, world = self.shard
        total = self.n_tasks * world
        if self._num_tasks is not None and total <= self._num_tasks:
            seeds = self._rng.choice(self._num_tasks, size=total, replace=False).astype(np.int64)
        else:
            seeds = self._rng.integers(0, HELD_OUT_SEEDS_START, size=total, dtype=np.int64)
        return seeds[rank * self.n_tasks : (rank + 1) * self.n_tasks]

    def reset(self) -> np.ndarray:
        """Start new episodes: one fresh task seed per group, the same for all its copies."""
        return self.reset_groups(self.draw_task_seeds())

    def reset_groups(self, task_seeds: Sequence[int] | np.ndarray) -> np.ndarray:
        """Reset group ``g`` with ``task_seeds[g]`` (e.g. seeds 0..n-1 of an eval split).

        Fewer seeds than ``n_tasks`` are allowed: the remaining groups stay
        inactive (empty observation). Options set by :meth:`set_options` apply
        to this reset only.
        """
        seeds = [int(s) for s in task_seeds]
        if len(seeds) > self.n_tasks:
            raise ValueError(f"got {len(seeds)} task seeds for {self.n_tasks} groups")
        self.task_seeds = np.full(self.n_tasks, -1, dtype=np.int64)
        self.task_seeds[: len(seeds)] = seeds
        items: dict[int, list[tuple[int, int | None, dict[str, Any] | None]]] = {}
        for i, (w, j) in enumerate(self._slots):
            group = int(self.group_ids[i])
            if group < len(seeds):
                items.setdefault(w, []).append((j, seeds[group], self._options[i] or None))
        results = self._dispatch("reset", items)
        self._obs[:] = ""
        self._active[:] = False
        self.reset_infos = [{"inactive": True} for _ in range(self.num_envs)]
        for i, (status, value) in results.items():
            if status == "ok":
                self._obs[i], info = value
                self.reset_infos[i] = dict(info)
                self._active[i] = True
            else:
                self.reset_infos[i] = {"env_error": value, "inactive": True}
        self._last_infos = [dict(info) for info in self.reset_infos]
        self._reset_options()
        return self._obs.copy()

    # ----------------------------------------------------------------- steps
    def step_async(self, actions: Sequence[Any] | np.ndarray) -> None:
        if len(actions) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions, got {len(actions)}")
        self._actions = actions

    def step_wait(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        if self._actions is None:
            raise RuntimeError("step_wait() called without step_async()")
        actions, self._actions = self._actions, None
        items: dict[int, list[tuple[int, str]]] = {}
        for i in np.flatnonzero(self._active):
            w, j = self._slots[i]
            action = actions[i]
            items.setdefault(w, []).append((j, action if isinstance(action, str) else str(action)))
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        dones = ~self._active
        results = self._dispatch("step", items)
        # an env that stepped gets its new info; only the others (finished) are given a copy of their last one
        infos = [info if i in results else dict(info, inactive=True) for i, info in enumerate(self._last_infos)]
        self._apply_step(results, rewards, dones, infos)
        return self._obs.copy(), rewards, dones, infos

    def _apply_step(self, results: Mapping[int, Result], rewards: np.ndarray, dones: np.ndarray,
                    infos: list[dict[str, Any]]) -> None:
        """Take per-env step results into the vec env's state, and into ``rewards`` / ``dones`` /
        ``infos`` (indexed by env): an env error ends the episode as truncated."""
        for i, (status, value) in results.items():
            if status == "ok":
                obs, reward, terminated, truncated, info = value
                info = dict(info, terminated=bool(terminated))
                info["TimeLimit.truncated"] = bool(truncated and not terminated)
                self._obs[i], rewards[i] = obs, reward
                done = bool(terminated or truncated)
            else:
                info = dict(self._last_infos[i], env_error=value, terminated=False, valid_action=False, won=False)
                info["TimeLimit.truncated"] = True
                done = True
            if done:
                info["terminal_observation"] = self._obs[i]
                self._active[i] = False
            dones[i] = done
            infos[i] = info
            self._last_infos[i] = info

    # ----------------------------------------------------- asynchronous steps
    # The rollout loop may step some envs while the policy acts for others (``algo.rollout=async``).
    # The unit is a worker process: all the active envs it hosts are stepped by one command, and an
    # env can act again once its worker has answered. Results are as step_wait() gives them.

    def step_worker_send(self, worker: int, actions: Mapping[int, str]) -> None:
        """Send one step to ``worker`` for its active envs (``actions``: env index -> action text)."""
        items = [(self._slots[i][1], str(action)) for i, action in actions.items()]
        if any(self._slots[i][0] != worker or not self._active[i] for i in actions):
            raise ValueError(f"actions must be for active envs of worker {worker}, got envs {sorted(actions)}")
        self._send_to_worker(worker, "step", items)

    def step_workers_ready(self, timeout: float | None = None) -> list[int]:
        """The workers with a step in flight whose answer has arrived, waiting up to ``timeout`` seconds
        for the first (None: until one answers, or one passes its watchdog timeout and is returned
        for :meth:`step_worker_recv` to restart)."""
        return self._workers_ready(timeout)

    def step_worker_recv(self, worker: int) -> tuple[list[int], np.ndarray, np.ndarray, list[dict[str, Any]]]:
        """The answer of ``worker`` to its step: ``(envs, rewards, dones, infos)`` for the envs it stepped
        (rewards, dones and infos indexed by env over all envs, meaningful at the stepped envs only: the
        other entries are their latest infos, not copied); :attr:`active` and the observations are
        updated as by :meth:`step_wait`."""
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        dones = ~self._active
        infos = list(self._last_infos)  # one worker's answer: copying every env's info would cost O(envs) each
        results = self._receive_from_worker(worker)
        self._apply_step(results, rewards, dones, infos)
        return sorted(results), rewards, dones, infos

    @property
    def observations(self) -> np.ndarray:
        """The envs' latest observations (a copy)."""
        return self._obs.copy()

    def infos_of(self, observations: object) -> list[dict[str, Any]] | None:
        """The envs' latest infos when ``observations`` are exactly their latest observations (what
        ``reset`` or ``step`` just returned), else None: lets ``model.predict(obs)`` find the
        admissible commands that ``choose`` mode scores."""
        try:
            current = np.asarray(observations, dtype=object).reshape(-1)
        except (TypeError, ValueError):
            return None
        if current.shape != self._obs.shape or not all(a == b for a, b in zip(current, self._obs)):
            return None
        return [dict(info) for info in self._last_infos]

    def render(self, mode: str | None = None) -> np.ndarray | None:
        """``"ansi"`` (default when the envs have it): the rendered texts; ``"human"``: print them."""
        mode = mode or self.render_mode or "ansi"
        texts = [info if info is not None else obs for info, obs in zip(self.env_method("render"), self._obs)]
        if mode == "human":
            for i, text in enumerate(texts):
                print(f"[env {i}, group {self.group_ids[i]}] {text}")
            return None
        return np.array(texts, dtype=object)

    def get_images(self) -> Sequence[np.ndarray | None]:
        raise NotImplementedError("text envs have no images; use render('ansi')")

    def _restart(self, w: int) -> None:
        """Restart worker ``w``; the episodes of the envs it hosted are over."""
        for i, (worker, _) in enumerate(self._slots):
            if worker == w:
                self._active[i] = False
        super()._restart(w)


def make_vec_env(
    env_id_or_factory: str | Callable[[], TextEnv],
    n_tasks: int = 1,
    group_size: int = 8,
    seed: int | None = 0,
    env_kwargs: dict[str, Any] | None = None,
    subprocess: bool = False,
    n_workers: int | None = None,
    start_method: str | None = None,
    timeout: float = 120.0,
    shard: tuple[int, int] = (0, 1),
) -> GroupedTextVecEnv:
    """Make a :class:`GroupedTextVecEnv` from a registered env id or an env factory.

    :param env_id_or_factory: a registered id (``"milegpo/House-v0"``; an unknown
        id raises :class:`~milegpo.envs.registry.UnknownEnvError` listing the
        known ones) or a callable returning a :class:`TextEnv`.
    :param env_kwargs: constructor arguments of the env (with an id), or
        arguments passed to the factory.
    Other parameters: see :class:`GroupedTextVecEnv`.
    """
    if isinstance(env_id_or_factory, str):
        env_fn: Callable[[], TextEnv] = RegisteredEnvFactory(env_id_or_factory, env_kwargs)
    elif callable(env_id_or_factory):
        env_fn = KwargsFactory(env_id_or_factory, env_kwargs) if env_kwargs else env_id_or_factory
    else:
        raise TypeError(f"env_id_or_factory must be an env id or a callable returning a TextEnv, got "
                        f"{env_id_or_factory!r}")
    return GroupedTextVecEnv(env_fn, n_tasks=n_tasks, group_size=group_size, seed=seed, subprocess=subprocess,
                             n_workers=n_workers, start_method=start_method, timeout=timeout, shard=shard)
