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

Conversations stay together (chat prompts, generate mode). When a step's prompt starts with the
previous step's prompt and reply, the two are turns of one conversation
(:func:`conversation_ids`), and the policy reads all of a conversation's replies from one forward
pass over its last turn (:mod:`milegpo.policies.conversation`). So the shuffle permutes whole
conversations, not rows, and lays each one out in turn order: minibatches are then cut as before
(``batch_size`` rows, or ``mini_batch_tokens`` counting each turn's *new* tokens, what one-pass
scoring reads). A conversation that crosses a cut is split at a turn boundary; its later part is
still scored in one pass, over its own last turn, whose prompt carries the earlier turns as
context. The update packs each minibatch's conversation pieces whole into micro-batches
(:func:`milegpo.algos.update.micro_batches`). Rows that continue nothing (template prompts,
choose mode) are conversations of one row: shuffle and cuts are exactly the row shuffle of before.

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
    :param observation: the observation the action was taken in, and ``next_observation`` the one after
        the step (kept batches store them: ``milegpo inspect`` shows the texts behind each state key).
    """

    sample: ActionSample
    state_key: str
    next_state_key: str
    reward: float
    valid: bool
    done: bool
    observation: str = ""
    next_observation: str = ""


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


def continues(previous: ActionSample, sample: ActionSample) -> bool:
    """Whether ``sample`` is the next turn of ``previous``'s conversation: both generated replies
    (choose mode scores candidates, never in one pass) and ``sample``'s prompt starts with
    ``previous``'s prompt and reply."""
    if previous.candidate_ids is not None or sample.candidate_ids is not None:
        return False
    head, reply, prompt = previous.prompt_ids, previous.action_ids, sample.prompt_ids
    if len(prompt) < len(head) + len(reply):
        return False
    return _equal_tokens(prompt[: len(head)], head) and _equal_tokens(prompt[len(head): len(head) + len(reply)], reply)


def _equal_tokens(a: Sequence[int], b: Sequence[int]) -> bool:
    """Whether two token sequences are equal: lists compared as lists (a C loop, no conversion), arrays by numpy."""
    if isinstance(a, list) and isinstance(b, list):
        return a == b
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


def conversation_ids(samples: Sequence[ActionSample], row_traj: np.ndarray) -> np.ndarray:
    """(N,) id ``0, 1, ...`` of each row's conversation, rows in trajectory then step order: a row
    joins the previous row's conversation when it is the same trajectory's next turn
    (:func:`continues`), else starts a new one. O(tokens)."""
    ids = np.zeros(len(samples), dtype=np.int64)
    for r in range(1, len(samples)):
        linked = row_traj[r] == row_traj[r - 1] and continues(samples[r - 1], samples[r])
        ids[r] = ids[r - 1] + (not linked)
    return ids


def turn_tokens(row_tokens: np.ndarray, conversations: np.ndarray) -> np.ndarray:
    """(N,) tokens each row adds to one-pass scoring: a conversation's first row all of its own,
    each later turn what it adds to the turn before (its new observation and reply)."""
    added = row_tokens.astype(np.int64).copy()
    same = np.r_[False, conversations[1:] == conversations[:-1]]
    added[same] -= row_tokens[np.flatnonzero(same) - 1]
    return np.maximum(added, 1)


def conversation_order(rng: np.random.Generator, conversations: np.ndarray) -> np.ndarray:
    """The rows, conversation after conversation in a random order, each in turn order. With every
    row its own conversation this is ``rng.permutation(N)`` itself (same draw)."""
    starts = np.flatnonzero(np.r_[True, conversations[1:] != conversations[:-1]]) if len(conversations) else \
        np.zeros(0, dtype=np.int64)
    sizes = np.diff(np.r_[starts, len(conversations)])
    perm = rng.permutation(len(starts))
    if len(starts) == len(conversations):
        return perm
    lengths = sizes[perm]
    return np.repeat(starts[perm] - np.cumsum(lengths) + lengths, lengths) + np.arange(len(conversations))


def minibatch_rows(rng: np.random.Generator, row_tokens: np.ndarray, batch_size: int | None = None,
                   mini_batch_tokens: int | None = None, conversations: np.ndarray | None = None) -> list[np.ndarray]:
    """Shuffle rows ``0..len(row_tokens)-1`` and cut them into minibatches (one optimizer step each)
    of ``batch_size`` rows or of at most ``mini_batch_tokens`` tokens; with neither, one minibatch.

    ``conversations`` (:func:`conversation_ids`) shuffles whole conversations instead of rows and
    counts each turn's :func:`turn_tokens` against ``mini_batch_tokens``; without it every row is
    its own conversation."""
    if batch_size is not None and mini_batch_tokens is not None:
        raise ValueError("give batch_size (steps) or mini_batch_tokens (tokens) per minibatch, not both")
    if conversations is None:
        conversations = np.arange(len(row_tokens))
    order = conversation_order(rng, conversations)
    if mini_batch_tokens is not None:
        return split_by_tokens(order, turn_tokens(row_tokens, conversations), mini_batch_tokens)
    size = batch_size or max(len(order), 1)
    if size < 1:
        raise ValueError(f"batch_size must be >= 1, got {size}")
    return [order[start : start + size] for start in range(0, len(order), size)]


def global_conversations(per_rank: Sequence[np.ndarray]) -> np.ndarray:
    """The ranks' :func:`conversation_ids` as one numbering over the global batch (rank 0's rows first)."""
    parts, offset = [], 0
    for ids in per_rank:
        parts.append(ids + offset)
        offset += int(ids.max(initial=-1)) + 1
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


@dataclass
class RolloutMinibatch:
    """This process's share of one optimizer step (like SB3's ``RolloutBufferSamples``).

    ``samples[k]``, ``advantages[k]``, ``tokens[k]`` and ``conversations[k]`` belong to buffer row ``rows[k]``
    (a conversation's rows are consecutive, in turn order);
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
    conversations: np.ndarray | None = None  # conversation id of each row (conversation_ids); None: one row each


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
    def reset(self, task_seeds: Sequence[int] | np.ndarray | None = None, policy_version: int = 0) -> None:
        """Empty the buffer for a new rollout; ``task_seeds[g]`` is group ``g``'s task seed,
        ``policy_version`` the version of the weights that sample every step of it (the updates
        applied before them): the update's policy lag is its own version minus this one."""
        self.policy_version = int(policy_version)
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

    def add(self, env_index: int, sample: Any, state_key: str, reward: float, done: bool, info: dict[str, Any],
            observation: str = "", next_observation: str = "") -> None:
        """Record one step of env ``env_index``: ``sample`` was taken in state ``state_key``
        (seen as ``observation``) and the env answered ``reward``, ``done``, ``info`` (and
        ``next_observation``)."""
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
                observation=observation,
                next_observation=next_observation,
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

    def step_observations(self) -> tuple[list[str], list[str]]:
        """The observation and next observation of every row of :meth:`step_batch`'s batch, in row order."""
        if self._rows is None:
            raise RuntimeError("step_observations() reads the rows of step_batch(): build the batch first")
        return [s.observation for s in self._rows], [s.next_observation for s in self._rows]

    def compute_credit(self, method: str, config: CreditConfig | Mapping[str, Any] | None = None) -> CreditResult:
        """Build the :class:`StepBatch` and compute every step's advantage with ``method``."""
        return self.set_credit(method, compute_credit(method, self.step_batch(), config))

    def set_credit(self, method: str, result: CreditResult) -> CreditResult:
        """Take ``result``, ``method``'s credit of :meth:`step_batch` (computed here or, for a credit that reads
        more than the batch, such as MileGPO's milestone memory, by the caller), once it has one advantage per
        step."""
        if self.batch is None:
            raise RuntimeError("call step_batch() first: the credit is of its rows")
        advantages = np.asarray(result.advantages, dtype=np.float64)
        num_steps = self.batch.num_steps
        if advantages.shape != (num_steps,):
            raise ValueError(f"credit method {method!r} returned {advantages.shape} advantages for {num_steps} steps")
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
        conversations = np.zeros(0, dtype=np.int64)
        if n_rows:
            assert self._row_traj is not None  # set with the rows by step_batch()
            conversations = conversation_ids(samples, self._row_traj)
        if not distributed:
            for rows in minibatch_rows(rng, tokens, batch_size, mini_batch_tokens, conversations):
                yield self._minibatch(samples, rows, tokens, conversations, int(units[rows].sum()), len(rows))
            return
        from milegpo.algos.distributed import all_gather_objects

        assert world is not None
        tokens_per_rank, units_per_rank = all_gather_objects(tokens, world), all_gather_objects(units, world)
        conversations_per_rank = all_gather_objects(conversations, world)
        all_tokens, all_units = np.concatenate(tokens_per_rank), np.concatenate(units_per_rank)
        offset = int(sum(len(t) for t in tokens_per_rank[: world.rank]))
        for rows in minibatch_rows(rng, all_tokens, batch_size, mini_batch_tokens,
                                   global_conversations(conversations_per_rank)):
            mine = rows[(rows >= offset) & (rows < offset + n_rows)] - offset
            yield self._minibatch(samples, mine, tokens, conversations, int(all_units[rows].sum()), len(rows))

    def _minibatch(self, samples: list[Any], rows: np.ndarray, tokens: np.ndarray, conversations: np.ndarray,
                   n_units: int, n_seqs: int) -> RolloutMinibatch:
        assert self.advantages is not None  # get() needs compute_credit first
        advantages = self.advantages[rows] if len(rows) else np.zeros(0)
        return RolloutMinibatch(rows=rows, samples=[samples[r] for r in rows], advantages=advantages,
                                tokens=tokens[rows], n_units=n_units, n_seqs=n_seqs,
                                conversations=conversations[rows])

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
