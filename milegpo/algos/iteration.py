"""One iteration's rollout side: collect the groups' episodes, then assign their credit.

:meth:`~milegpo.algos.base.GroupRLAlgorithm.collect_rollouts` (SB3's) is two seams:

* **collect** (:func:`collect`): a fresh group reset with this iteration's task
  seeds, every episode played to its end (:func:`~milegpo.algos.rollout.play_episodes`), each
  step added to the buffer;
* **assign credit** (:func:`assign_credit`): this rank's credit, the env steps
  and rollout statistics of all ranks, the check that the env could be played, the credit of
  the merged batch, the credit outputs (``credit_diagnostics.jsonl``, ``last_batch.npz``) and
  the iteration's rollout log values.

The update (``train``) is the third seam, in :mod:`milegpo.algos.base`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

from milegpo.algos import distributed
from milegpo.algos.buffer import TextRolloutBuffer
from milegpo.algos.errors import TrainingError
from milegpo.algos.rollout import RolloutMeter, RolloutStep, play_episodes, play_episodes_async
from milegpo.algos.run_outputs import write_credit_outputs
from milegpo.envs.vec_env import GroupedTextVecEnv

if TYPE_CHECKING:
    from milegpo.algos.base import GroupRLAlgorithm

logger = logging.getLogger(__name__)
#: the vec envs whose async rollouts were said to play in lockstep (said once each)
_SAID_LOCKSTEP: set[int] = set()

#: rollouts in a row that may lose every episode to env errors before training stops
MAX_LOST_ROLLOUTS = 3


@dataclass
class Collected:
    """What :func:`collect` measured: the meter of the played steps, the rollout's
    wall time and this rank's env steps."""

    meter: RolloutMeter
    seconds: float
    local_steps: int


def collect(model: GroupRLAlgorithm, env: GroupedTextVecEnv, callback: BaseCallback,
            buffer: TextRolloutBuffer) -> Collected | None:
    """Play every group's episodes from a fresh reset into ``buffer``; None when a callback stops."""
    model.policy.set_training_mode(False)
    timesteps_before = model.num_timesteps
    try:
        if model._last_obs is None:
            model._seed_tasks(env)
            model._last_obs = env.reset()
        observations = model._last_obs
        infos = [dict(info) for info in env.reset_infos]
        buffer.reset(env.task_seeds)
        for i, info in enumerate(infos):
            if info.get("env_error") is not None:
                buffer.add_reset_error(i, str(info["env_error"]))
        # sampling seeded per (run, iteration, rank): reproducible and resumable on any number of ranks
        sampling_seed = int(np.random.SeedSequence(
            [model.task_seed_base, 2, model._iterations, model.world.rank]).generate_state(1)[0])
        model.policy.reseed_sampling(sampling_seed)
        callback.on_rollout_start()
        meter = RolloutMeter()

        def record(step: RolloutStep) -> bool:
            meter.policy_seconds += step.policy_seconds
            model.num_timesteps += len(step.active)
            for k, i in enumerate(step.active):
                sample = step.samples[k]
                buffer.add(int(i), sample, step.infos[i].get("state_key", ""), step.rewards[i],
                           bool(step.dones[i]), step.new_infos[i])
                meter.add(sample)
                if step.dones[i]:
                    record_episode(model, buffer, int(i))
            callback.update_locals({"step": step, "rollout_buffer": buffer})
            return callback.on_step()

        assert isinstance(observations, np.ndarray)
        if rollout_mode(model, env) == "async":
            played = play_episodes_async(model.policy, env, observations, infos, deterministic=False,
                                         on_step=record, stream_seed=sampling_seed)
        else:
            played = play_episodes(model.policy, env, observations, infos, deterministic=False, on_step=record,
                                   stream_seed=sampling_seed if model.config.samples_per_env else None)
        if not played:
            return None
    finally:
        model._last_obs = None  # the next rollout starts from a fresh group reset
    return Collected(meter, time.perf_counter() - meter.started, model.num_timesteps - timesteps_before)

def rollout_mode(model: GroupRLAlgorithm, env: GroupedTextVecEnv) -> str:
    """``algo.rollout``, or ``lockstep`` where nothing could overlap: envs in this process (or in one
    worker) step only when the policy is not acting; said once per model."""
    if model.config.rollout != "async" or len(env.worker_envs) > 1:
        return model.config.rollout
    if id(env) not in _SAID_LOCKSTEP:
        _SAID_LOCKSTEP.add(id(env))
        why = "in this process" if not env.subprocess else "in one worker process"
        logger.warning("algo.rollout=async: the envs run %s, so nothing can step while the policy acts; playing in "
                       "lockstep (make the vec env with subprocess=True and n_workers >= 2: env.subprocess=true, "
                       "env.n_workers)", why)
    return "lockstep"


def assign_credit(model: GroupRLAlgorithm, env: GroupedTextVecEnv, buffer: TextRolloutBuffer,
                  collected: Collected) -> None:
    """Credit of the collected steps (every rank's, merged), its outputs and the rollout log values."""
    started = time.perf_counter()
    credit = None
    if buffer.num_steps:  # none: every env failed at reset (stopped below, once all ranks know)
        credit = buffer.compute_credit(model.credit_method, model.credit_config)
    credit_time = time.perf_counter() - started
    # env steps of all ranks (every rank then agrees on when learn() ends)
    model.num_timesteps += int(distributed.all_reduce_sum([collected.local_steps], model.world)[0]) - \
        collected.local_steps
    stats = distributed.reduce_rollout_stats(buffer.stats(), model.world)
    check_rollout_lost(model, stats, buffer, env)
    batch, credit = distributed.global_credit(model.credit_method, model.credit_config, buffer.batch, credit,
                                              env.n_tasks, model.world)
    model._rollout_log = collected.meter.log(stats, collected.seconds, credit_time)
    if credit is not None:
        model._rollout_log.update(credit.log_values())
        meta = {"iteration": model._iterations + 1, "num_timesteps": model.num_timesteps,
                "method": model.credit_method}
        write_credit_outputs(model.logger, credit, batch, meta, stats["success_rate"])

def check_rollout_lost(model: GroupRLAlgorithm, stats: dict[str, float], buffer: TextRolloutBuffer,
                       env: GroupedTextVecEnv) -> None:
    """Stop with :class:`TrainingError` when the env cannot be played: no env completed a step
    (all ranks), or :data:`MAX_LOST_ROLLOUTS` rollouts in a row lost every episode to env errors."""
    lost = stats["episodes"] > 0 and stats["env_errors"] >= stats["episodes"]
    model._lost_rollouts = model._lost_rollouts + 1 if lost else 0
    if stats["steps"] and model._lost_rollouts < MAX_LOST_ROLLOUTS:
        return
    errors = [t.env_error for t in buffer.trajectories if t.env_error is not None]
    example = f": {errors[0]}" if errors else ""
    where = f"; tracebacks in {env.errors.path}" if env.errors.path is not None else ""
    what = ("no env completed a step (every episode ended in an env error at reset or its first step)"
            if not stats["steps"] else f"{model._lost_rollouts} rollouts in a row lost every episode to env errors")
    raise TrainingError(f"{what}{example}{where}. The env is broken: fix it and rerun")

def record_episode(model: GroupRLAlgorithm, buffer: TextRolloutBuffer, env_index: int) -> None:
    """Count the finished episode of env ``env_index`` in SB3's episode buffers."""
    traj = buffer.trajectories[env_index]
    assert model.ep_info_buffer is not None and model.ep_success_buffer is not None
    model.ep_info_buffer.append({"r": traj.outcome, "l": len(traj.steps), "t": time.time() - model.start_time / 1e9})
    model.ep_success_buffer.append(float(traj.won))
    model._episode_num += 1
