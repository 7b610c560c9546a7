"""verl-agent's step-level rows as a :class:`~milegpo.credit.StepBatch`, whatever their order.

verl-agent's trainer reorders the rows of a batch before advantages are computed
(``trainer.balance_batch``, on by default, sorts them into balanced per-rank partitions)
and appends copies of random rows so the batch divides by the micro-batch sizes
(``adjust_batch``, mode "copy"). Row order therefore says nothing about step order, and a
copied row is not a new step. So every row carries its step index in the column
:data:`STEP_COLUMN`, written while the rows are still in rollout order
(:func:`annotate_rollout` on the collector's per-env step lists, or :func:`add_step_index`
on an in-order batch), and a trajectory's step is identified by ``(traj_uid, step)``:

* rows are grouped by that pair, so any permutation of the rows gives the same credit;
* a duplicated row (same pair) is the same step: it is counted once in every group
  statistic and each copy receives that step's advantage. (verl-agent's own GiGPO counts
  a copy as one more member of its anchor-state group, which biases the group mean toward
  whichever rows the padding happened to draw; we do not.) Copies must agree on the state,
  reward and validity, else the batch is refused;
* a batch without the column is refused with a message naming it, never read by row order.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from milegpo.credit import StepBatch

#: the non-tensor column holding each row's step index inside its trajectory (0, 1, ...)
STEP_COLUMN = "milegpo_step"
#: the non-tensor column holding the env's ``won`` of the row's trajectory (from verl-agent's success evaluator)
WON_COLUMN = "milegpo_won"
#: the columns every batch needs
REQUIRED_COLUMNS = ("uid", "traj_uid", "anchor_obs", "rewards", STEP_COLUMN)

_MISSING_STEP = (
    f"non_tensor_batch[{STEP_COLUMN!r}] (each row's step inside its trajectory) is missing. verl-agent's trainer "
    "reorders rows (trainer.balance_batch=True) and duplicates some (adjust_batch), so step order cannot be read "
    "from row order. Start training with `python -m milegpo.integrations.verl.main_ppo ...` (or call "
    "milegpo.integrations.verl.install() in the process that builds the trainer, before rollouts), which adds the "
    "column when verl-agent's TrajectoryCollector gathers the rollout; for a batch of your own whose rows are still "
    "in rollout order, call milegpo.integrations.verl.add_step_index(batch) first.")


class StepRows(Protocol):
    """What is read of a ``verl.DataProto``: its dict of per-row numpy columns."""

    non_tensor_batch: dict[str, np.ndarray]


def _column(data: StepRows, name: str) -> np.ndarray:
    if name not in data.non_tensor_batch:
        if name == STEP_COLUMN:
            raise KeyError(_MISSING_STEP)
        raise KeyError(f"the batch has no non_tensor_batch[{name!r}]: milegpo credit needs verl-agent's step-level "
                       f"columns {REQUIRED_COLUMNS[:-1]} (collected by its multi-turn rollout loop)")
    return np.asarray(data.non_tensor_batch[name])


@dataclass(frozen=True)
class NumericContent:
    """The state key of a numeric array: a digest of its values in row-major order.

    verl-agent's GiGPO groups array anchors by their flattened values (shape aside), so two
    arrays are one state when their values are equal as numbers whatever their dtype (a
    uint8 image and the float image of the same pixels, ``-0.0`` and ``0.0``). The values
    are brought to one form before hashing: integers (and floats that are whole numbers) as
    int64, other floats as float64. ``kind`` keeps the two forms apart."""

    kind: str
    digest: bytes


class NoContentMatch:
    """The key of an anchor holding NaN: equal only to itself, as NaN != NaN (verl-agent's
    grouping and ``np.array_equal`` put such a step in a group of its own)."""


#: plain values that are their own key (compared by value, as verl-agent compares them)
_SCALARS = (str, bytes, bool, int, float, complex)
#: the largest magnitude a float may have to be read as an int64 (the bounds of exact float integers)
_EXACT_INT = 2.0 ** 53


def anchor_key(value: object, row: int, column: str = "anchor_obs", *, nan_matches_nothing: bool = True) -> object:
    """The hashable key of an anchor, equal for two anchors exactly when verl-agent would group them.

    Keyed by content for every type a verl-agent env manager produces: str and bytes by
    value, numbers by value, numpy arrays of any dtype and shape by their flattened values
    (object arrays of numbers, as verl-agent makes of torch anchors, included), torch
    tensors as their numpy array, lists and tuples element by element, dicts by their
    items in any order. ``None``, and a value with neither content nor a value-based hash,
    are refused naming ``row`` and ``column``: grouping them by identity would make every
    step a state of its own without a sign. ``nan_matches_nothing=False`` keys an array
    holding NaN by its bytes instead (to tell whether two rows are copies of one step).
    """
    def key(item: object) -> object:
        return anchor_key(item, row, column, nan_matches_nothing=nan_matches_nothing)

    if value is None:
        raise ValueError(f"non_tensor_batch[{column!r}] at row {row} is (or holds) None: every step needs its anchor "
                         "observation (the env manager's obs['anchor']; verl-agent's GiGPO raises on None too)")
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, _SCALARS):
        return value
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return _array_key(value, key, nan_matches_nothing)
    if isinstance(value, (list, tuple)):
        return tuple(key(item) for item in value)
    if isinstance(value, Mapping):
        return frozenset((name, key(item)) for name, item in value.items())
    if type(value).__hash__ is None or type(value).__eq__ is object.__eq__:
        raise ValueError(f"non_tensor_batch[{column!r}] at row {row} is (or holds) a {type(value).__name__}, which "
                         "compares by identity or not at all, so equal states could not be found: give anchors as "
                         "str, bytes, numbers, arrays, tensors, lists, tuples or dicts of them")
    return value


def _array_key(array: np.ndarray, key: Callable[[object], object], nan_matches_nothing: bool) -> object:
    """The key of a numpy array: its values as numbers (see :class:`NumericContent`), else element by element."""
    flat = array.ravel()
    if flat.dtype == object:  # e.g. a torch anchor that verl-agent turned into an object array of floats
        items = flat.tolist()
        try:
            numbers = np.asarray(items)  # numeric only if every item is a number (a str makes it text)
        except ValueError:  # items of different shapes
            numbers = flat
        if numbers.dtype.kind not in "biuf":
            return tuple(key(item) for item in items)
        flat = numbers.ravel()
    if flat.dtype.kind in "biu":
        if flat.dtype.kind == "u" and flat.size and flat.max() > np.iinfo(np.int64).max:
            return NumericContent("u", _digest(flat.astype(np.uint64)))
        flat = flat.astype(np.int64)
    elif flat.dtype.kind == "f":
        if np.isnan(flat).any():
            return NoContentMatch() if nan_matches_nothing else NumericContent("nan", _digest(flat))
        flat = flat.astype(np.float64) + 0.0  # + 0.0 turns -0.0 into 0.0
        if np.all(np.abs(flat) < _EXACT_INT) and np.all(flat == np.trunc(flat)):
            flat = flat.astype(np.int64)
    else:
        return tuple(key(item) for item in flat.tolist())
    return NumericContent(flat.dtype.kind, _digest(flat))


def _digest(flat: np.ndarray) -> bytes:
    return hashlib.blake2b(flat.tobytes(), digest_size=16).digest()


def add_step_index(data: StepRows) -> None:
    """Write :data:`STEP_COLUMN` into a batch whose rows are still in rollout order
    (each trajectory's rows in step order, trajectories in any order or interleaved)."""
    traj_uid = _column(data, "traj_uid")
    seen: dict[object, int] = {}
    steps = np.empty(len(traj_uid), dtype=np.int64)
    for row, traj in enumerate(traj_uid):
        steps[row] = seen.get(traj, 0)
        seen[traj] = steps[row] + 1
    data.non_tensor_batch[STEP_COLUMN] = steps


def annotate_rollout(step_lists: Sequence[Sequence[dict[str, Any]]], success: Mapping[str, np.ndarray]) -> None:
    """Tag the rows verl-agent's ``TrajectoryCollector.gather_rollout_data`` is about to collate.

    :param step_lists: per env, its step dicts in step order (``total_batch_list``); the
        active ones get their step index under :data:`STEP_COLUMN`.
    :param success: the env manager's ``success_evaluator`` output; its ``success_rate``
        array (the env's ``won`` at each env's last active step) goes to :data:`WON_COLUMN`.
    """
    won = success.get("success_rate")
    if won is not None and len(won) != len(step_lists):
        raise ValueError(f"success_rate has {len(won)} entries for {len(step_lists)} envs")
    for env, steps in enumerate(step_lists):
        active = [row for row in steps if row.get("active_masks", True)]
        for t, row in enumerate(active):
            row[STEP_COLUMN] = t
            if won is not None:
                row[WON_COLUMN] = bool(won[env])


@dataclass(frozen=True)
class SuccessRule:
    """How a trajectory's success is decided.

    :param source: ``"auto"`` (the env's ``won`` where the batch carries it, else the reward
        rule), ``"won"`` (require the column) or ``"reward"`` (the reward rule only).
    :param success_reward: the reward rule: the trajectory's env-reward sum is at least this
        (10 is the ALFWorld/WebShop convention of verl-agent's recipes; verl-agent's search
        env pays 1.0 for a correct answer).
    """

    source: str = "auto"
    success_reward: float = 10.0

    def __post_init__(self) -> None:
        if self.source not in ("auto", "won", "reward"):
            raise ValueError(f"success source must be 'auto', 'won' or 'reward', got {self.source!r}")
        if not np.isfinite(self.success_reward):
            raise ValueError(f"success_reward must be finite, got {self.success_reward}")


def step_batch_from_verl(data: StepRows, *, success: SuccessRule = SuccessRule(),
                         invalid_action_penalty: float = 0.1) -> tuple[StepBatch, np.ndarray]:
    """The :class:`~milegpo.credit.StepBatch` of a verl-agent step-level batch, and for each
    batch row the StepBatch row it maps to (-1 for rows with ``active_masks`` False).

    :param data: a ``verl.DataProto`` (or anything with its ``non_tensor_batch`` dict).
    :param success: how success is decided (see :class:`SuccessRule`; the reward rule reads the
        env rewards alone, so the penalty never turns a success into a failure).
    :param invalid_action_penalty: subtracted from the reward of a step whose action was invalid,
        on top of whatever the env paid for it (verl-agent's Sokoban pays -0.1 for every step, an
        invalid one included: that step's reward is then -0.1 - penalty). A trajectory's outcome is
        the sum of its rewards, penalties included, as in milegpo's own trainer.
    """
    columns = data.non_tensor_batch
    uid, traj_uid, anchor = (_column(data, name) for name in ("uid", "traj_uid", "anchor_obs"))
    step_col = _column(data, STEP_COLUMN).astype(np.int64)
    env_rewards = _column(data, "rewards").astype(np.float64)
    n = len(uid)
    valid = np.asarray(columns["is_action_valid"]).astype(bool) if "is_action_valid" in columns else np.ones(n, bool)
    active = np.asarray(columns["active_masks"]).astype(bool) if "active_masks" in columns else np.ones(n, bool)
    if not np.all(np.isfinite(env_rewards[active])):
        bad = int(np.flatnonzero(active & ~np.isfinite(env_rewards))[0])
        raise ValueError(f"non_tensor_batch['rewards'] holds {env_rewards[bad]} at row {bad} "
                         f"(trajectory {traj_uid[bad]!r}): the env returned a non-finite reward")

    # one StepBatch row per distinct (trajectory, step); copies map to the same row
    traj_index: dict[object, int] = {}
    step_of: dict[tuple[int, int], int] = {}
    row_map = np.full(n, -1, dtype=np.int64)
    first_row: list[int] = []
    first_traj: list[int] = []
    for row in np.flatnonzero(active):
        t = traj_index.setdefault(traj_uid[row], len(traj_index))
        key = (t, int(step_col[row]))
        k = step_of.get(key)
        if k is None:
            k = step_of[key] = len(first_row)
            first_row.append(int(row))
            first_traj.append(t)
        else:
            _check_copy(data, int(row), first_row[k], anchor, env_rewards, valid, uid)
        row_map[row] = k
    rows = np.asarray(first_row, dtype=np.int64)
    traj_ids = np.asarray(first_traj, dtype=np.int64)
    step_idx = step_col[rows]
    _check_steps_complete(traj_ids, step_idx, traj_uid, rows)

    # (a trajectory under two uids is refused by the task graph's build)
    task_index: dict[object, int] = {}
    task_ids = np.array([task_index.setdefault(uid[r], len(task_index)) for r in rows], dtype=np.int64)
    keys = np.empty(len(rows), dtype=object)
    keys[:] = [anchor_key(anchor[r], int(r)) for r in rows]
    rewards = env_rewards[rows] - invalid_action_penalty * (~valid[rows])
    env_returns = np.bincount(traj_ids, weights=env_rewards[rows], minlength=len(traj_index))
    won = _success(columns, rows, traj_ids, env_returns, success)

    position = {(t, s): k for k, (t, s) in enumerate(zip(traj_ids.tolist(), step_idx.tolist()))}
    given_next = np.asarray(columns["next_anchor_obs"]) if "next_anchor_obs" in columns else None
    next_keys = np.empty(len(rows), dtype=object)
    last = np.zeros(len(rows), dtype=bool)
    for k, (t, s) in enumerate(zip(traj_ids.tolist(), step_idx.tolist())):
        after = position.get((t, s + 1))
        last[k] = after is None
        if after is not None:
            next_keys[k] = keys[after]
        elif given_next is not None:
            next_keys[k] = anchor_key(given_next[rows[k]], int(rows[k]), "next_anchor_obs")
        else:
            next_keys[k] = ("<end of trajectory>", t)
    batch = StepBatch(
        task_ids=task_ids, traj_ids=traj_ids, step_idx=step_idx, state_keys=keys, next_state_keys=next_keys,
        actions=np.full(len(rows), "", dtype=object),
        rewards=rewards, valid=valid[rows], dones=last,
        outcomes=np.bincount(traj_ids, weights=rewards, minlength=len(traj_index)), success=won,
    )
    return batch, row_map


def _check_copy(data: StepRows, row: int, first: int, anchor: np.ndarray, rewards: np.ndarray, valid: np.ndarray,
                uid: np.ndarray) -> None:
    same = (anchor_key(anchor[row], row, nan_matches_nothing=False)
            == anchor_key(anchor[first], first, nan_matches_nothing=False) and rewards[row] == rewards[first]
            and valid[row] == valid[first] and uid[row] == uid[first])
    if not same:
        traj = data.non_tensor_batch["traj_uid"][row]
        raise ValueError(f"rows {first} and {row} are both step {data.non_tensor_batch[STEP_COLUMN][row]} of "
                         f"trajectory {traj!r} but differ in state, reward, validity or task: the step column "
                         f"{STEP_COLUMN!r} was written after the rows were reordered")


def _check_steps_complete(traj_ids: np.ndarray, step_idx: np.ndarray, traj_uid: np.ndarray, rows: np.ndarray) -> None:
    """Every trajectory holds steps 0..n-1 (a gap means rows were dropped, e.g. adjust_batch mode "delete")."""
    count = np.bincount(traj_ids)
    top = np.full(len(count), -1, dtype=np.int64)
    np.maximum.at(top, traj_ids, step_idx)
    broken = np.flatnonzero(top + 1 != count)
    if len(broken) or np.any(step_idx < 0):
        t = int(broken[0]) if len(broken) else int(traj_ids[np.argmax(step_idx < 0)])
        name = traj_uid[rows[np.flatnonzero(traj_ids == t)[0]]]
        raise ValueError(f"trajectory {name!r} has steps {sorted(step_idx[traj_ids == t].tolist())}, not 0..n-1: "
                         "rows of it are missing from the batch (adjust_batch with mode='delete' drops rows; "
                         "milegpo credit needs every step of every trajectory)")


def _success(columns: Mapping[str, np.ndarray], rows: np.ndarray, traj_ids: np.ndarray, env_returns: np.ndarray,
             rule: SuccessRule) -> np.ndarray:
    """(T,) each trajectory's success: the env's ``won`` column, else the reward rule on its env return."""
    if rule.source != "reward" and WON_COLUMN in columns:
        won = np.zeros(len(env_returns), dtype=bool)
        won[traj_ids] = np.asarray(columns[WON_COLUMN])[rows].astype(bool)
        return won
    if rule.source == "won":
        raise KeyError(f"success source 'won' needs non_tensor_batch[{WON_COLUMN!r}], which install() adds from "
                       "verl-agent's success evaluator; set algorithm.milegpo.success=reward to use the reward rule")
    return env_returns >= rule.success_reward
