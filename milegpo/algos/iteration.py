"""One iteration's rollout side: collect the groups' episodes, then assign their credit.

:meth:`~milegpo.algos.base.GroupRLAlgorithm.collect_rollouts` (SB3's) is two seams:

* **collect** (:func:`collect`): a fresh group reset with this iteration's task
  seeds, every episode played to its end (:func:`~milegpo.algos.rollout.play_episodes`), each
  step added to the buffer;
* **assign credit** (:func:`assign_credit`): this rank's credit, the env steps
  and rollout statistics of all ranks, the check that the env could be played, the credit of
  the merged batch, the credit outputs (``credit_diagnostics.jsonl``, ``last_batch.npz``) and
  the iteration's rollout log values; with MileGPO's milestone memory (``memory_half_life > 0``),
  the credit reads :attr:`RolloutState.credit_memory` (:func:`memory_to_read`: a fresh one where
  the saved one was built under other settings) and the memory is advanced by every rank's
  groups (:func:`remembered_global_credit`).

The update (``train``) is the third seam, in :mod:`milegpo.algos.base`.

Each seam works on what it is given: the policy, the vec env, the buffer, a
:class:`RolloutPlan` (what this iteration's rollout needs to know of the run), the
:class:`RolloutState` the algorithm keeps from one rollout to the next, and
:class:`StepHooks` through which the played steps and episodes reach the run's counters.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from milegpo.algos import distributed
from milegpo.algos.buffer import TextRolloutBuffer
from milegpo.algos.errors import TrainingError
from milegpo.algos.rollout import RolloutMeter, RolloutStep, play_episodes, play_episodes_async
from milegpo.algos.run_outputs import write_credit_outputs
from milegpo.contracts import ActingPolicy
from milegpo.credit import CreditConfig, CreditResult, MileGPOConfig, StepBatch
from milegpo.credit.memory import (
    MilestoneMemory,
    TaskCounts,
    memory_scope,
    remembered_credit,
    scope_differences,
    uses_memory,
)
from milegpo.envs.vec_env import GroupedTextVecEnv

logger = logging.getLogger(__name__)
#: the vec envs whose async rollouts were said to play in lockstep (said once each)
_SAID_LOCKSTEP: set[int] = set()

#: rollouts in a row that may lose every episode to env errors before training stops
MAX_LOST_ROLLOUTS = 3


class SamplingPolicy(ActingPolicy, Protocol):
    """A policy the trainer samples rollouts from: it acts, and its sampling restarts from a seed."""

    def reseed_sampling(self, seed: int) -> None: ...


@dataclass(frozen=True)
class RolloutPlan:
    """What one iteration's rollout needs to know of the run.

    :param iteration: the iterations completed before this rollout (picks its task and sampling seeds).
    :param task_seed_base: the run's seed of the task draws (kept in checkpoints).
    :param world: this process's rank among the data-parallel processes.
    :param rollout: ``algo.rollout`` (``lockstep`` or ``async``).
    :param async_cohorts: ``algo.async_cohorts``: an async call acts for at most this fraction of the envs.
    :param per_env_sampling: ``algo.samples_per_env``: each env samples from its own stream.
    :param credit_method: the credit method of :func:`milegpo.credit.compute_credit`.
    :param credit_config: its settings.
    :param policy_version: the version of the weights that sample this rollout (the updates applied
        before them), recorded in the buffer.
    """

    iteration: int
    task_seed_base: int
    world: distributed.World
    rollout: str
    async_cohorts: int
    per_env_sampling: bool
    credit_method: str
    credit_config: CreditConfig
    policy_version: int

    @property
    def task_seed(self) -> int:
        """The seed of the vec env's task draw for this iteration (the same on every rank and after a resume)."""
        return int(np.random.SeedSequence([self.task_seed_base, 0, self.iteration]).generate_state(1)[0])

    @property
    def sampling_seed(self) -> int:
        """The seed of this rank's action sampling: reproducible and resumable on any number of ranks."""
        return int(np.random.SeedSequence(
            [self.task_seed_base, 2, self.iteration, self.world.rank]).generate_state(1)[0])


@dataclass
class RolloutState:
    """What the rollout side keeps from one iteration to the next (the algorithm owns it).

    :param lost_rollouts: rollouts in a row whose every episode ended in an env error.
    :param log: the last rollout's logged values (rollout/*, time/*, credit/*).
    :param credit_memory: MileGPO's milestone memory after the last rollout (credit ``memory_half_life > 0``;
        None before the first, or without it). Checkpoints keep it.
    """

    lost_rollouts: int = 0
    log: dict[str, float] = field(default_factory=dict)
    credit_memory: MilestoneMemory | None = None


@dataclass(frozen=True)
class StepHooks:
    """How the played rollout reaches the run: ``rollout_started()`` once before the first step, then
    ``step_played(step, buffer)`` after each step is in the buffer (the run counts its env steps and
    finished episodes and calls its callbacks); a step_played that returns False stops the rollout."""

    rollout_started: Callable[[], None]
    step_played: Callable[[RolloutStep, TextRolloutBuffer], bool]


@dataclass
class Collected:
    """What :func:`collect` measured: the meter of the played steps, the rollout's
    wall time and this rank's env steps."""

    meter: RolloutMeter
    seconds: float
    local_steps: int


def collect(policy: SamplingPolicy, env: GroupedTextVecEnv, buffer: TextRolloutBuffer, plan: RolloutPlan,
            hooks: StepHooks, observations: np.ndarray | None = None) -> Collected | None:
    """Play every group's episodes into ``buffer``; None when ``hooks.step_played`` stops the rollout.

    :param observations: the observations of a group reset already made with ``plan.task_seed``
        (SB3's ``learn`` resets the env before the first rollout); None: reset here.
    """
    policy.set_training_mode(False)
    if observations is None:
        env.seed(plan.task_seed)
        observations = env.reset()
    infos = [dict(info) for info in env.reset_infos]
    buffer.reset(env.task_seeds, plan.policy_version)
    for i, info in enumerate(infos):
        if info.get("env_error") is not None:
            buffer.add_reset_error(i, str(info["env_error"]))
    sampling_seed = plan.sampling_seed
    policy.reseed_sampling(sampling_seed)
    hooks.rollout_started()
    meter = RolloutMeter()
    local_steps = 0
    assert isinstance(observations, np.ndarray)
    seen = observations.copy()  # each env's observation before its next step (kept batches store them)

    def record(step: RolloutStep) -> bool:
        nonlocal local_steps
        meter.policy_seconds += step.policy_seconds
        local_steps += len(step.active)
        after = env.observations  # the acting envs' observations after this step (not stepped again yet)
        for k, i in enumerate(step.active):
            sample = step.samples[k]
            buffer.add(int(i), sample, step.infos[i].get("state_key", ""), step.rewards[i],
                       bool(step.dones[i]), step.new_infos[i], observation=str(seen[i]),
                       next_observation=str(after[i]))
            seen[i] = after[i]
            meter.add(sample)
        return hooks.step_played(step, buffer)

    if rollout_mode(plan.rollout, env) == "async":
        played = play_episodes_async(policy, env, observations, infos, deterministic=False,
                                     on_step=record, stream_seed=sampling_seed, cohorts=plan.async_cohorts)
    else:
        played = play_episodes(policy, env, observations, infos, deterministic=False, on_step=record,
                               stream_seed=sampling_seed if plan.per_env_sampling else None)
    if not played:
        return None
    return Collected(meter, time.perf_counter() - meter.started, local_steps)


def rollout_mode(rollout: str, env: GroupedTextVecEnv) -> str:
    """``rollout`` (``algo.rollout``), or ``lockstep`` where nothing could overlap: envs in this process
    (or in one worker) step only when the policy is not acting; said once per vec env."""
    if rollout != "async" or len(env.worker_envs) > 1:
        return rollout
    if id(env) not in _SAID_LOCKSTEP:
        _SAID_LOCKSTEP.add(id(env))
        why = "in this process" if not env.subprocess else "in one worker process"
        logger.warning("algo.rollout=async: the envs run %s, so nothing can step while the policy acts; playing in "
                       "lockstep (make the vec env with subprocess=True and n_workers >= 2: env.subprocess=true, "
                       "env.n_workers)", why)
    return "lockstep"


def assign_credit(env: GroupedTextVecEnv, buffer: TextRolloutBuffer, collected: Collected, state: RolloutState,
                  plan: RolloutPlan, run_logger: Any, timesteps_before: int) -> int:
    """Credit of the collected steps (every rank's, merged), its outputs (through ``run_logger``, SB3's
    logger) and the rollout log values (``state.log``); returns the rollout's env steps on all ranks.

    :param timesteps_before: the run's env steps (all ranks) before this rollout.
    """
    started = time.perf_counter()
    credit = None
    memory = state.credit_memory = memory_to_read(state.credit_memory, plan.credit_config, env)
    task_keys = group_task_keys(buffer, env_task_count(env)) if memory is not None else {}
    observed: list[tuple[int, TaskCounts]] = []
    if buffer.num_steps:  # none: every env failed at reset (stopped below, once all ranks know)
        if memory is not None:
            assert isinstance(plan.credit_config, MileGPOConfig)
            credit, observed = remembered_credit(buffer.step_batch(), plan.credit_config, memory, task_keys)
            buffer.set_credit(plan.credit_method, credit)
        else:
            credit = buffer.compute_credit(plan.credit_method, plan.credit_config)
    credit_time = time.perf_counter() - started
    # env steps of all ranks (every rank then agrees on when learn() ends)
    steps = int(distributed.all_reduce_sum([collected.local_steps], plan.world)[0])
    stats = distributed.reduce_rollout_stats(buffer.stats(), plan.world)
    check_rollout_lost(state, stats, buffer, env)
    if memory is not None:
        batch, credit = remembered_global_credit(plan, buffer.batch, task_keys, credit, observed, memory, state,
                                                 env.n_tasks)
    else:
        batch, credit = distributed.global_credit(plan.credit_method, plan.credit_config, buffer.batch, credit,
                                                  env.n_tasks, plan.world)
    state.log = collected.meter.log(stats, collected.seconds, credit_time)
    if credit is not None:
        state.log.update(credit.log_values())
        meta = {"iteration": plan.iteration + 1, "num_timesteps": timesteps_before + steps,
                "method": plan.credit_method}
        # one process: the batch is this rollout's, in the buffer's row order (several: ranks merged, texts not sent)
        observations = buffer.step_observations() if not plan.world.distributed else None
        if not plan.world.distributed:  # the task seed each of the batch's task ids (groups) played
            meta["task_seeds"] = group_task_seeds(buffer)
        write_credit_outputs(run_logger, credit, batch, meta, stats["success_rate"], plan.credit_config, observations)
    return steps


def group_task_seeds(buffer: TextRolloutBuffer) -> list[int]:
    """The task seed each of the buffer's groups played, by group index (a one-process batch's task ids):
    with the env's settings, a seed names the task exactly, so a kept batch's episodes can be replayed."""
    seeds = group_task_keys(buffer, None)  # with no task count, a group's key is its seed
    return [seeds[group] for group in range(max(seeds) + 1)] if seeds else []


def group_task_keys(buffer: TextRolloutBuffer, num_tasks: int | None) -> dict[int, int]:
    """The memory's key of each of the buffer's groups (its batch's task ids): the task the group played,
    which is the same in every iteration (the group index is not).

    :param num_tasks: the env's task count (:func:`env_task_count`): seed ``s`` plays task
        ``s % num_tasks``, and a draw of more groups than that draws any seeds
        (:meth:`~milegpo.envs.vec_env.GroupedTextVecEnv.draw_task_seeds`), so the key is the seed modulo
        it; None (no finite task list): the seed, which then names its task."""
    return {traj.group: traj.task_seed % num_tasks if num_tasks else traj.task_seed for traj in buffer.trajectories}


def env_task_count(env: GroupedTextVecEnv) -> int | None:
    """The env's ``num_tasks`` (its finite task list), None when it has none."""
    value = _env_attribute(env, "num_tasks")
    return None if value is None else int(value)


def _env_attribute(env: GroupedTextVecEnv, name: str) -> Any:
    """Attribute ``name`` of the vec env's first env, None when it has none."""
    try:
        return env.get_attr(name, indices=[0])[0]
    except (AttributeError, TypeError):
        return None


def env_scope(env: GroupedTextVecEnv) -> dict[str, Any]:
    """The env as the milestone memory records it (:func:`milegpo.credit.memory.memory_scope`): its name,
    split and task count (None where it has none)."""
    split = _env_attribute(env, "split")
    return {"name": env.env_name, "split": None if split is None else str(split), "num_tasks": env_task_count(env)}


def memory_if_used(memory: MilestoneMemory | None, config: CreditConfig) -> MilestoneMemory | None:
    """``memory`` when the credit uses a milestone memory; else None, a memory still held (a run resumed with
    the memory off) dropped with one warning line, so that it is neither saved again nor read later."""
    if memory is not None and not uses_memory(config):
        logger.warning("the milestone memory of %d task(s) is dropped: the credit no longer uses it "
                       "(memory_half_life is 0); turning it on again starts a fresh one", len(memory.tasks))
        return None
    return memory


def memory_to_read(memory: MilestoneMemory | None, config: CreditConfig,
                   env: GroupedTextVecEnv) -> MilestoneMemory | None:
    """The milestone memory this iteration's credit reads: ``memory`` when it was built under the run's
    settings (:func:`milegpo.credit.memory.memory_scope`); a fresh one when there is none, or, said in one
    warning line, when the saved one was built under another half-life, other caps or another env (its
    counts would be read as evidence of other ages or other tasks); None when the credit does not use it,
    a memory still held (a run resumed with the memory off) dropped with one warning line."""
    if not uses_memory(config):
        return memory_if_used(memory, config)
    assert isinstance(config, MileGPOConfig)
    scope = memory_scope(config, env_scope(env))
    if memory is None:
        return MilestoneMemory(scope=scope)
    differences = scope_differences(memory.scope, scope)
    if differences:
        logger.warning("starting a fresh milestone memory: the saved one (%d task(s)) was built under other "
                       "settings (%s), and its counts would be read as evidence of other ages or tasks",
                       len(memory.tasks), "; ".join(differences))
        return MilestoneMemory(scope=scope)
    return memory


def remembered_global_credit(plan: RolloutPlan, batch: StepBatch | None, task_keys: dict[int, int],
                             credit: CreditResult | None, observed: list[tuple[int, TaskCounts]],
                             memory: MilestoneMemory, state: RolloutState,
                             groups_per_rank: int) -> tuple[StepBatch | None, CreditResult | None]:
    """:func:`milegpo.algos.distributed.global_credit` with the milestone memory, and the memory advanced
    (``state.credit_memory``).

    :param batch: this rank's batch (``credit`` None: it had no steps).
    :param task_keys: the memory's key of each of its task ids (:func:`group_task_keys`).
    :param credit: this rank's credit, from :func:`milegpo.credit.memory.remembered_credit` with ``memory``.
    :param observed: the batch's own counts, which that call returned.

    With several ranks, every rank's observed counts are gathered on every rank (rank order) and each
    advances the same memory by them: the memories stay equal and are what one process with every group
    would hold. Rank 0 credits the merged batch with the memory read by every rank, for its logs (the
    advantages each rank trains on are the same either way: credit is per task)."""
    assert isinstance(plan.credit_config, MileGPOConfig)
    world = plan.world
    if not world.distributed:
        state.credit_memory = memory.advance(observed, plan.credit_config)
        return batch, credit
    gathered = distributed.all_gather_objects(observed, world)
    state.credit_memory = memory.advance([pair for part in gathered for pair in part], plan.credit_config)
    mine = (batch, task_keys) if credit is not None else None
    parts = [(rank, part) for rank, part in enumerate(distributed.gather_to_main(mine, world) or [])
             if part is not None]
    if not parts:
        return None, None
    merged = distributed.merge_step_batches([batch for _, (batch, _) in parts], groups_per_rank)
    # merge_step_batches offsets the task ids by the rank's position among the non-empty batches
    keys = {position * groups_per_rank + group: key for position, (_, (_, part_keys)) in enumerate(parts)
            for group, key in part_keys.items()}
    return merged, remembered_credit(merged, plan.credit_config, memory, keys)[0]


def check_rollout_lost(state: RolloutState, stats: dict[str, float], buffer: TextRolloutBuffer,
                       env: GroupedTextVecEnv) -> None:
    """Stop with :class:`TrainingError` when the env cannot be played: no env completed a step
    (all ranks), or :data:`MAX_LOST_ROLLOUTS` rollouts in a row lost every episode to env errors."""
    lost = stats["episodes"] > 0 and stats["env_errors"] >= stats["episodes"]
    state.lost_rollouts = state.lost_rollouts + 1 if lost else 0
    if stats["steps"] and state.lost_rollouts < MAX_LOST_ROLLOUTS:
        return
    errors = [t.env_error for t in buffer.trajectories if t.env_error is not None]
    example = f": {errors[0]}" if errors else ""
    where = f"; tracebacks in {env.errors.path}" if env.errors.path is not None else ""
    what = ("no env completed a step (every episode ended in an env error at reset or its first step)"
            if not stats["steps"] else f"{state.lost_rollouts} rollouts in a row lost every episode to env errors")
    raise TrainingError(f"{what}{example}{where}. The env is broken: fix it and rerun")
