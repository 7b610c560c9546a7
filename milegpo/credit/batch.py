"""The data every credit function reads: a flat batch of steps from grouped rollouts.

A batch holds several tasks; every task was rolled out ``K`` times (its group)
from the same initial state. Steps are stored flat, one row per environment
step, in any order; trajectories and tasks are identified by integer ids.

Pure numpy: no torch, no env, no model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class StepBatch:
    """One row per step ``t`` of trajectory ``i`` of task ``q``.

    :param task_ids: (N,) int - the task/group ``q`` of each step.
    :param traj_ids: (N,) int - the trajectory ``i`` of each step (unique across the batch).
    :param step_idx: (N,) int - ``t``, the position of the step inside its trajectory.
    :param state_keys: (N,) str - state key of ``s_t`` (the state the action was taken in).
    :param next_state_keys: (N,) str - state key of ``s_{t+1}``.
    :param actions: (N,) str - the action text ``a_t``.
    :param rewards: (N,) float - ``r_t`` (including any invalid-action penalty).
    :param valid: (N,) bool - the action was valid.
    :param dones: (N,) bool - ``s_{t+1}`` is the last state of the trajectory
        (terminated or truncated).
    :param outcomes: (T,) float - ``Z_i`` per trajectory id ``0..T-1``; by default
        the sum of the trajectory's rewards.
    :param success: (T,) bool - trajectory ``i`` succeeded (won).
    """

    task_ids: np.ndarray
    traj_ids: np.ndarray
    step_idx: np.ndarray
    state_keys: np.ndarray
    next_state_keys: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    valid: np.ndarray
    dones: np.ndarray
    outcomes: np.ndarray
    success: np.ndarray

    def __post_init__(self) -> None:
        self.task_ids = np.asarray(self.task_ids, dtype=np.int64)
        self.traj_ids = np.asarray(self.traj_ids, dtype=np.int64)
        self.step_idx = np.asarray(self.step_idx, dtype=np.int64)
        self.state_keys = np.asarray(self.state_keys, dtype=object)
        self.next_state_keys = np.asarray(self.next_state_keys, dtype=object)
        self.actions = np.asarray(self.actions, dtype=object)
        self.rewards = np.asarray(self.rewards, dtype=np.float64)
        self.valid = np.asarray(self.valid, dtype=bool)
        self.dones = np.asarray(self.dones, dtype=bool)
        self.outcomes = np.asarray(self.outcomes, dtype=np.float64)
        self.success = np.asarray(self.success, dtype=bool)
        n = len(self.task_ids)
        for name in ("traj_ids", "step_idx", "state_keys", "next_state_keys", "actions", "rewards", "valid", "dones"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"StepBatch.{name} has {len(getattr(self, name))} rows, task_ids has {n}")
        if len(self.outcomes) != len(self.success):
            raise ValueError("StepBatch.outcomes and StepBatch.success must have one entry per trajectory")
        if n and (self.traj_ids.min() < 0 or self.traj_ids.max() >= len(self.outcomes)):
            raise ValueError("StepBatch.traj_ids must index into outcomes (0..T-1)")

    @classmethod
    def from_trajectories(
        cls,
        states: Sequence[Sequence[str]],
        success: Sequence[bool],
        *,
        task_ids: Sequence[int] | None = None,
        actions: Sequence[Sequence[str]] | None = None,
        rewards: Sequence[Sequence[float]] | None = None,
        valid: Sequence[Sequence[bool]] | None = None,
        outcomes: Sequence[float] | None = None,
        success_reward: float = 10.0,
    ) -> StepBatch:
        """Build a batch from per-trajectory lists (tests, examples, small studies).

        Trajectory ``i`` gets id ``i``; its rows are in step order, trajectories
        one after the other.

        :param states: per trajectory its state keys ``s_0 .. s_T`` (``T + 1`` keys
            for ``T`` steps; at least two).
        :param success: per trajectory, whether it succeeded.
        :param task_ids: per trajectory its task ``q`` (default: all task 0).
        :param actions: per trajectory ``T`` action texts (default: ``"to <s_{t+1}>"``,
            so the same transition gets the same action text).
        :param rewards: per trajectory ``T`` rewards (default: 0 everywhere except
            ``success_reward`` on the last step of a successful trajectory).
        :param valid: per trajectory ``T`` flags (default: all valid).
        :param outcomes: ``Z_i`` per trajectory (default: the sum of its rewards).
        :param success_reward: the default final reward of a success (ALFWorld: 10).
        """
        n_traj = len(states)
        if len(success) != n_traj:
            raise ValueError(f"success has {len(success)} entries for {n_traj} trajectories")
        for name, per_traj in (("task_ids", task_ids), ("actions", actions), ("rewards", rewards),
                               ("valid", valid), ("outcomes", outcomes)):
            if per_traj is not None and len(per_traj) != n_traj:
                raise ValueError(f"{name} has {len(per_traj)} entries for {n_traj} trajectories")
        cols: dict[str, list[Any]] = {k: [] for k in ("task_ids", "traj_ids", "step_idx", "state_keys",
                                                      "next_state_keys", "actions", "rewards", "valid", "dones")}
        z = []
        for i, keys in enumerate(states):
            n = len(keys) - 1
            if n < 1:
                raise ValueError(f"trajectory {i} needs at least two states (s_0 and s_1), got {len(keys)}")
            acts = list(actions[i]) if actions is not None else [f"to {k}" for k in keys[1:]]
            if rewards is not None:
                rews = [float(r) for r in rewards[i]]
            else:
                rews = [0.0] * n
                rews[-1] = float(success_reward) if success[i] else 0.0
            vals = list(valid[i]) if valid is not None else [True] * n
            for name, col in (("actions", acts), ("rewards", rews), ("valid", vals)):
                if len(col) != n:
                    raise ValueError(f"{name}[{i}] has {len(col)} entries for {n} steps")
            cols["task_ids"] += [int(task_ids[i]) if task_ids is not None else 0] * n
            cols["traj_ids"] += [i] * n
            cols["step_idx"] += list(range(n))
            cols["state_keys"] += list(keys[:-1])
            cols["next_state_keys"] += list(keys[1:])
            cols["actions"] += acts
            cols["rewards"] += rews
            cols["valid"] += vals
            cols["dones"] += [False] * (n - 1) + [True]
            z.append(float(outcomes[i]) if outcomes is not None else float(sum(rews)))
        return cls(**{k: np.array(v, dtype=object) if k in ("state_keys", "next_state_keys", "actions")
                      else np.asarray(v) for k, v in cols.items()},
                   outcomes=np.array(z, dtype=np.float64), success=np.array(success, dtype=bool))

    @classmethod
    def concat(cls, batches: Sequence[StepBatch], task_offsets: Sequence[int] | None = None) -> StepBatch:
        """The rows of ``batches`` one after the other; trajectory ids are renumbered so they stay
        unique, and batch ``k``'s task ids are shifted by ``task_offsets[k]`` (default: none, so
        equal task ids of different batches are the same task)."""
        if not batches:
            raise ValueError("StepBatch.concat needs at least one batch")
        task_offsets = [0] * len(batches) if task_offsets is None else list(task_offsets)
        if len(task_offsets) != len(batches):
            raise ValueError(f"{len(task_offsets)} task offsets for {len(batches)} batches")
        traj_offsets = np.cumsum([0, *[b.num_trajectories for b in batches[:-1]]])
        fields = {name: np.concatenate([getattr(b, name) for b in batches])
                  for name in ("step_idx", "state_keys", "next_state_keys", "actions", "rewards", "valid", "dones",
                               "outcomes", "success")}
        return cls(task_ids=np.concatenate([b.task_ids + off for b, off in zip(batches, task_offsets)]),
                   traj_ids=np.concatenate([b.traj_ids + off for b, off in zip(batches, traj_offsets)]), **fields)

    def success_mask(self, threshold: float | None = None) -> np.ndarray:
        """(T,) bool - success per trajectory: ``success`` as given when
        ``threshold`` is None, else ``outcomes >= threshold`` (continuous scores,
        e.g. a WebShop score in [0, 1])."""
        if threshold is None:
            return self.success.copy()
        return self.outcomes >= float(threshold)

    @property
    def num_steps(self) -> int:
        return len(self.task_ids)

    @property
    def num_trajectories(self) -> int:
        return len(self.outcomes)


@dataclass
class CreditResult:
    """What a credit function returns.

    :param advantages: (N,) float - the advantage ``A_t`` of each step row of the
        batch (same order as the rows); the trainer puts it on every token of the
        step's action.
    :param diagnostics: plain, JSON-able numbers and small lists/dicts describing the
        credit (milestones, traps, ties broken, ...); logged by the trainer.
    :param components: optional named (N,) arrays (e.g. the raw step returns) for
        plots and tests.
    """

    advantages: np.ndarray
    diagnostics: dict[str, Any] = field(default_factory=dict)
    components: dict[str, np.ndarray] = field(default_factory=dict)

    def log_values(self) -> dict[str, float]:
        """The diagnostics that are numbers, as ``credit/<name>`` scalars (what a logger plots)."""
        return {f"credit/{key}": float(value) for key, value in self.diagnostics.items()
                if isinstance(value, (bool, int, float, np.integer, np.floating))}


_NUMERIC_FIELDS = ("task_ids", "traj_ids", "step_idx", "rewards", "valid", "dones", "outcomes", "success")
_TEXT_FIELDS = ("state_keys", "next_state_keys", "actions")


def save_step_batch(batch: StepBatch, path: str | os.PathLike, meta: dict[str, Any] | None = None) -> None:
    """Write ``batch`` to ``path`` as an ``.npz`` that loads without unpickling (atomically).

    Numeric fields are arrays; the text fields and ``meta`` are the UTF-8 bytes
    (``uint8`` arrays) of their JSON. :func:`load_step_batch` reads it back.
    """
    arrays = {name: getattr(batch, name) for name in _NUMERIC_FIELDS}
    for name in _TEXT_FIELDS:
        arrays[name] = _utf8_json([str(text) for text in getattr(batch, name)])
    arrays["meta"] = _utf8_json(meta or {})
    tmp = f"{os.fspath(path)}.tmp.npz"
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, path)


def load_step_batch(path: str | Path) -> tuple[StepBatch, dict[str, Any]]:
    """Read a file of :func:`save_step_batch`: the batch and its ``meta`` (nothing is unpickled).

    Raises ``ValueError`` naming the file when it is missing, corrupt or incomplete.
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            fields = {name: data[name] for name in _NUMERIC_FIELDS}
            fields.update({name: _from_utf8_json(data[name]) for name in _TEXT_FIELDS})
            meta = _from_utf8_json(data["meta"]) if "meta" in data else {}
        return StepBatch(**fields), meta
    except (OSError, KeyError, ValueError) as error:
        raise ValueError(f"cannot read a StepBatch from {str(path)!r}: {error}") from error


def _utf8_json(value: Any) -> np.ndarray:
    return np.frombuffer(json.dumps(value).encode("utf-8"), dtype=np.uint8)


def _from_utf8_json(array: np.ndarray) -> Any:
    return json.loads(bytes(array).decode("utf-8"))
