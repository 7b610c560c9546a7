"""The text rollout buffer: whole grouped episodes, credit assignment, minibatches of steps.

SB3's ``RolloutBuffer`` stores fixed-shape arrays per env step and rejects text
spaces (no fixed shape). Group RL needs something else: every group (task)
is rolled out ``group_size`` times to the end, and only then can the credit of
each step be computed from the whole group. :class:`TextRolloutBuffer`

1. records one :class:`StepRecord` per env step of every trajectory
   (:meth:`~TextRolloutBuffer.add`), one trajectory per env of the vec env;
2. once every episode is finished, flattens them into a
   :class:`~milegpo.credit.StepBatch` (:meth:`~TextRolloutBuffer.step_batch`)
   and runs the credit function on it (:meth:`~TextRolloutBuffer.compute_credit`);
3. yields shuffled minibatches of step rows with their advantages
   (:meth:`~TextRolloutBuffer.get`), split further into micro-batches under a
   token budget by :func:`split_by_tokens` for gradient accumulation.

Conventions (documented choices):

* the outcome ``Z_i`` of trajectory ``i`` is the sum of its rewards (invalid-action
  penalties included); success is ``info["won"]`` at its last step;
* an env error (``info["env_error"]``, a crashed env or worker) ends the trajectory
  as *truncated*: the failed step itself is dropped (the engine never applied its
  action, so it has no next state), the steps before it are kept with the last one
  marked done, and the error is counted in :attr:`~TextRolloutBuffer.stats`. A
  trajectory without any step (error at reset or at its first step) is left out of
  the batch, so it does not enter the group statistics;
* trajectories are numbered ``0..T-1`` in env order over those with at least one step;
  the group (task) id of a step is its env's group in the vec env.

The buffer is numpy only: the action samples of the policy are stored as they
are (their token ids and old log-probs are read by the trainer).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from milegpo.credit import CreditConfig, CreditResult, StepBatch, compute_credit
from milegpo.policies.sample import ActionSample

if TYPE_CHECKING:
    from milegpo.algos.distributed import World


@dataclass
class StepRecord:
    """One env step of one trajectory.

    :param sample: the policy's action sample (``ActionSample``: ``text``,
        ``prompt_ids``, ``action_ids``, ``candidate_ids``, ``old_logprobs``, ...).
    :param state_key: ``info["state_key"]`` of the state the action was taken in.
    :param next_state_key: ``info["state_key"]`` after the step.
    :param reward: the env reward (invalid-action penalty included).
    :param valid: ``info["valid_action"]`` of the step.
    :param done: the step ended the episode (terminated or truncated).
    """

    sample: ActionSample
    state_key: str
    next_state_key: str
    reward: float
    valid: bool
    done: bool


@dataclass
class Trajectory:
    """The steps of one env's episode in the current rollout, and how it ended."""

    env_index: int
    group: int
    task_seed: int
    steps: list[StepRecord]
    finished: bool = False
    won: bool = False
    score: float = 0.0
    env_error: str | None = None

    @property
    def outcome(self) -> float:
        return float(sum(step.reward for step in self.steps))


def step_tokens(sample: ActionSample) -> int:
    """Tokens a forward pass over this step processes: the prompt plus the action
    (generate mode) or plus every candidate command (choose mode)."""
    candidates = getattr(sample, "candidate_ids", None)
    completion = sum(len(c) for c in candidates) if candidates else len(sample.action_ids)
    return len(sample.prompt_ids) + completion


def split_by_tokens(rows: np.ndarray, tokens: np.ndarray, budget: int) -> list[np.ndarray]:
    """Split ``rows`` (in order) into consecutive chunks of at most ``budget`` tokens.

    ``tokens[r]`` is the token count of row ``r``; a row larger than the budget gets
    a chunk of its own (it cannot be split). Used for gradient accumulation.
    """
    if budget < 1:
        raise ValueError(f"the token budget must be >= 1, got {budget}")
    chunks: list[np.ndarray] = []
    start, used = 0, 0
    for k, row in enumerate(rows):
        n = int(tokens[row])
        if k > start and used + n > budget:
            chunks.append(rows[start:k])
            start, used = k, 0
        used += n
    if len(rows) > start:
        chunks.append(rows[start:])
    return chunks


def minibatch_rows(rng: np.random.Generator, row_tokens: np.ndarray, batch_size: int | None = None,
                   mini_batch_tokens: int | None = None) -> list[np.ndarray]:
    """Shuffle rows ``0..len(row_tokens)-1`` and cut them into minibatches (one optimizer step each)
    of ``batch_size`` rows or of at most ``mini_batch_tokens`` tokens; with neither, one minibatch."""
    if batch_size is not None and mini_batch_tokens is not None:
        raise ValueError("give batch_size (steps) or mini_batch_tokens (tokens) per minibatch, not both")
    order = rng.permutation(len(row_tokens))
    if mini_batch_tokens is not None:
        return split_by_tokens(order, row_tokens, mini_batch_tokens)
    size = batch_size or max(len(order), 1)
    if size < 1:
        raise ValueError(f"batch_size must be >= 1, got {size}")
    return [order[start : start + size] for start in range(0, len(order), size)]


@dataclass
class RolloutMinibatch:
    """This process's share of one optimizer step (like SB3's ``RolloutBufferSamples``).

    ``samples[k]``, ``advantages[k]`` and ``tokens[k]`` belong to buffer row ``rows[k]``;
    ``n_units`` / ``n_seqs`` are the units (tokens or choices) and steps of the whole
    minibatch over every process, for the loss normalisation. With several processes a
    rank's share may be empty (it still takes part in the gradient sum).
    """

    rows: np.ndarray
    samples: list[Any]
    advantages: np.ndarray
    tokens: np.ndarray
    n_units: int
    n_seqs: int


class TextRolloutBuffer:
    """Grouped text episodes of one rollout, their credit, and minibatches of steps.

    :param num_envs: envs of the vec env (one trajectory each per rollout).
    :param group_ids: (num_envs,) group (task) index of each env.
    """

    def __init__(self, num_envs: int, group_ids: Sequence[int] | np.ndarray):
        self.num_envs = int(num_envs)
        self.group_ids = np.asarray(group_ids, dtype=np.int64)
        if len(self.group_ids) != self.num_envs:
            raise ValueError(f"group_ids has {len(self.group_ids)} entries for {self.num_envs} envs")
        self.reset()

    # ------------------------------------------------------------ filling
    def reset(self, task_seeds: Sequence[int] | np.ndarray | None = None) -> None:
        """Empty the buffer for a new rollout; ``task_seeds[g]`` is group ``g``'s task seed."""
        seeds = np.full(int(self.group_ids.max(initial=-1)) + 1, -1, dtype=np.int64)
        if task_seeds is not None:
            seeds[: len(task_seeds)] = np.asarray(task_seeds, dtype=np.int64)[: len(seeds)]
        self.trajectories = [
            Trajectory(env_index=i, group=int(g), task_seed=int(seeds[g]),
                       steps=[]) for i, g in enumerate(self.group_ids)
        ]
        self.reset_errors = 0
        self._rows: list[StepRecord] | None = None
        self._row_traj: np.ndarray | None = None
        self.batch: StepBatch | None = None
        self.credit: CreditResult | None = None
        self.advantages: np.ndarray | None = None

    def add_reset_error(self, env_index: int, message: str) -> None:
        """Record that env ``env_index`` failed at reset: its trajectory is empty and finished."""
        traj = self.trajectories[env_index]
        traj.finished, traj.env_error = True, message
        self.reset_errors += 1

    def add(self, env_index: int, sample: Any, state_key: str, reward: float, done: bool, info: dict[str, Any]) -> None:
        """Record one step of env ``env_index``: ``sample`` was taken in state ``state_key``
        and the env answered ``reward``, ``done``, ``info``."""
        traj = self.trajectories[env_index]
        if traj.finished:
            raise RuntimeError(f"env {env_index} already finished its episode in this rollout")
        if info.get("env_error") is not None:
            traj.finished, traj.env_error = True, str(info["env_error"])
            if traj.steps:
                traj.steps[-1].done = True
            return
        traj.steps.append(
            StepRecord(
                sample=sample,
                state_key=str(state_key),
                next_state_key=str(info.get("state_key", "")),
                reward=float(reward),
                valid=bool(info.get("valid_action", True)),
                done=bool(done),
            )
        )
        if done:
            traj.finished = True
            traj.won = bool(info.get("won", False))
            traj.score = float(info.get("score", 0.0))

    @property
    def full(self) -> bool:
        """Every trajectory of the rollout has finished."""
        return all(traj.finished for traj in self.trajectories)

    # ----------------------------------------------------------- credit
    def kept_trajectories(self) -> list[Trajectory]:
        """The trajectories that enter the batch (at least one step), in env order."""
        return [traj for traj in self.trajectories if traj.steps]

    def step_batch(self) -> StepBatch:
        """Flatten the finished rollout into a :class:`StepBatch` (rows in trajectory, then step order)."""
        if not self.full:
            unfinished = [t.env_index for t in self.trajectories if not t.finished]
            raise RuntimeError(f"the rollout is not finished: envs {unfinished[:10]} are still running")
        kept = self.kept_trajectories()
        rows = [step for traj in kept for step in traj.steps]
        row_traj = np.repeat(np.arange(len(kept)), [len(traj.steps) for traj in kept])
        self._rows, self._row_traj = rows, row_traj
        self.batch = StepBatch(
            task_ids=np.array([kept[t].group for t in row_traj], dtype=np.int64),
            traj_ids=row_traj,
            step_idx=np.concatenate([np.arange(len(traj.steps)) for traj in kept]) if kept else np.zeros(0, np.int64),
            state_keys=np.array([s.state_key for s in rows], dtype=object),
            next_state_keys=np.array([s.next_state_key for s in rows], dtype=object),
            actions=np.array([s.sample.text for s in rows], dtype=object),
            rewards=np.array([s.reward for s in rows], dtype=np.float64),
            valid=np.array([s.valid for s in rows], dtype=bool),
            dones=np.array([s.done for s in rows], dtype=bool),
            outcomes=np.array([traj.outcome for traj in kept], dtype=np.float64),
            success=np.array([traj.won for traj in kept], dtype=bool),
        )
        return self.batch

    def compute_credit(self, method: str, config: CreditConfig | Mapping[str, Any] | None = None) -> CreditResult:
        """Build the :class:`StepBatch` and compute every step's advantage with ``method``."""
        batch = self.step_batch()
        result = compute_credit(method, batch, config)
        advantages = np.asarray(result.advantages, dtype=np.float64)
        if advantages.shape != (batch.num_steps,):
            raise ValueError(f"credit method {method!r} returned {advantages.shape} advantages for {batch.num_steps} "
                             f"steps")
        self.credit, self.advantages = result, advantages
        return result

    # -------------------------------------------------------- training data
    @property
    def num_steps(self) -> int:
        return sum(len(traj.steps) for traj in self.trajectories)

    @property
    def samples(self) -> list[Any]:
        """The action samples of the batch rows (same order as :attr:`batch`)."""
        if self._rows is None:
            raise RuntimeError("call step_batch() or compute_credit() first")
        return [step.sample for step in self._rows]

    def row_tokens(self) -> np.ndarray:
        """(N,) tokens a forward pass over each row processes (see :func:`step_tokens`)."""
        return np.array([step_tokens(s) for s in self.samples], dtype=np.int64)

    def get(self, rng: np.random.Generator, batch_size: int | None = None, mini_batch_tokens: int | None = None,
            world: World | None = None) -> Iterator[RolloutMinibatch]:
        """Shuffled minibatches covering every step exactly once, one per optimizer step.

        A minibatch holds ``batch_size`` steps, or as many steps as fit in
        ``mini_batch_tokens`` tokens; with neither, the whole rollout is one minibatch.
        With a data-parallel ``world`` (:mod:`milegpo.algos.distributed`) the minibatches
        are cut from the global batch (every rank's steps, rank 0's first) with the same
        permutation on every rank - those one process would make of the whole batch - and
        each rank gets its own steps of them.
        """
        distributed = world is not None and world.distributed
        if self.advantages is None and not distributed:
            raise RuntimeError("call compute_credit() before get()")
        n_rows = 0 if self.advantages is None else len(self.advantages)
        samples = self.samples if n_rows else []  # built once: the property makes a new list each time
        tokens = np.array([step_tokens(s) for s in samples], dtype=np.int64)
        units = np.array([len(s.old_logprobs) for s in samples], dtype=np.int64)
        if not distributed:
            for rows in minibatch_rows(rng, tokens, batch_size, mini_batch_tokens):
                yield self._minibatch(samples, rows, tokens, int(units[rows].sum()), len(rows))
            return
        from milegpo.algos.distributed import all_gather_objects

        assert world is not None
        tokens_per_rank, units_per_rank = all_gather_objects(tokens, world), all_gather_objects(units, world)
        all_tokens, all_units = np.concatenate(tokens_per_rank), np.concatenate(units_per_rank)
        offset = int(sum(len(t) for t in tokens_per_rank[: world.rank]))
        for rows in minibatch_rows(rng, all_tokens, batch_size, mini_batch_tokens):
            mine = rows[(rows >= offset) & (rows < offset + n_rows)] - offset
            yield self._minibatch(samples, mine, tokens, int(all_units[rows].sum()), len(rows))

    def _minibatch(self, samples: list[Any], rows: np.ndarray, tokens: np.ndarray, n_units: int,
                   n_seqs: int) -> RolloutMinibatch:
        assert self.advantages is not None  # get() needs compute_credit first
        advantages = self.advantages[rows] if len(rows) else np.zeros(0)
        return RolloutMinibatch(rows=rows, samples=[samples[r] for r in rows], advantages=advantages,
                                tokens=tokens[rows], n_units=n_units, n_seqs=n_seqs)

    # ------------------------------------------------------------ stats
    def stats(self) -> dict[str, float]:
        """Episode statistics of the rollout (all trajectories, including empty ones)."""
        trajs = self.trajectories
        steps = [step for traj in trajs for step in traj.steps]
        return {
            "episodes": len(trajs),
            "success_rate": float(np.mean([t.won for t in trajs])) if trajs else 0.0,
            "ep_rew_mean": float(np.mean([t.outcome for t in trajs])) if trajs else 0.0,
            "ep_len_mean": float(np.mean([len(t.steps) for t in trajs])) if trajs else 0.0,
            "score_mean": float(np.mean([t.score for t in trajs])) if trajs else 0.0,
            "invalid_action_rate": float(np.mean([not s.valid for s in steps])) if steps else 0.0,
            "env_errors": sum(t.env_error is not None for t in trajs),
            "steps": len(steps),
        }
