"""One iteration's rollout side: collect the groups' episodes, then assign their credit.

:class:`RolloutMixin` gives :class:`~milegpo.algos.base.GroupRLAlgorithm` SB3's
``collect_rollouts`` as two seams:

* **collect** (:meth:`RolloutMixin.collect`): a fresh group reset with this iteration's task
  seeds, every episode played to its end (:func:`~milegpo.algos.rollout.play_episodes`), each
  step added to the buffer;
* **assign credit** (:meth:`RolloutMixin.assign_credit`): this rank's credit, the env steps
  and rollout statistics of all ranks, the check that the env could be played, the credit of
  the merged batch, the credit outputs (``credit_diagnostics.jsonl``, ``last_batch.npz``) and
  the iteration's rollout log values.

The update (``train``) is the third seam, in :mod:`milegpo.algos.base`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecEnv

from milegpo.algos import distributed
from milegpo.algos.buffer import TextRolloutBuffer
from milegpo.algos.errors import TrainingError
from milegpo.algos.rollout import RolloutMeter, RolloutStep, play_episodes
from milegpo.algos.run_outputs import write_credit_outputs
from milegpo.envs.vec_env import GroupedTextVecEnv

if TYPE_CHECKING:
    from milegpo.algos.base import GroupRLAlgorithm

#: rollouts in a row that may lose every episode to env errors before training stops
MAX_LOST_ROLLOUTS = 3


@dataclass
class Collected:
    """What :meth:`RolloutMixin.collect` measured: the meter of the played steps, the rollout's
    wall time and this rank's env steps."""

    meter: RolloutMeter
    seconds: float
    local_steps: int


class RolloutMixin:
    """``collect_rollouts`` = :meth:`collect` then :meth:`assign_credit` (see the module docstring)."""

    def collect_rollouts(  # type: ignore[override]
        self: GroupRLAlgorithm,
        env: VecEnv,
        callback: BaseCallback,
        rollout_buffer: TextRolloutBuffer,
        n_rollout_steps: int,
    ) -> bool:
        """Run all groups' episodes to the end, then compute the credit of every step.

        ``n_rollout_steps`` is unused: a rollout ends when every env of the vec env is done.
        """
        assert isinstance(env, GroupedTextVecEnv)
        if self._dump_pending:  # the untrained policy's evaluation (iteration 0): its own row
            self.logger.dump(step=self.num_timesteps)
            self._dump_pending = False
        collected = self.collect(env, callback, rollout_buffer)
        if collected is None:  # a callback stopped training
            return False
        self.assign_credit(env, rollout_buffer, collected)
        callback.update_locals({"rollout_buffer": rollout_buffer, "collected": collected})
        callback.on_rollout_end()
        return True

    def collect(self: GroupRLAlgorithm, env: GroupedTextVecEnv, callback: BaseCallback,
                buffer: TextRolloutBuffer) -> Collected | None:
        """Play every group's episodes from a fresh reset into ``buffer``; None when a callback stops."""
        self.policy.set_training_mode(False)
        timesteps_before = self.num_timesteps
        try:
            if self._last_obs is None:
                self._seed_tasks(env)
                self._last_obs = env.reset()
            observations = self._last_obs
            infos = [dict(info) for info in env.reset_infos]
            buffer.reset(env.task_seeds)
            for i, info in enumerate(infos):
                if info.get("env_error") is not None:
                    buffer.add_reset_error(i, str(info["env_error"]))
            # sampling seeded per (run, iteration, rank): reproducible and resumable on any number of ranks
            self.policy.reseed_sampling(int(np.random.SeedSequence(
                [self.task_seed_base, 2, self._iterations, self.world.rank]).generate_state(1)[0]))
            callback.on_rollout_start()
            meter = RolloutMeter()

            def record(step: RolloutStep) -> bool:
                meter.policy_seconds += step.policy_seconds
                self.num_timesteps += len(step.active)
                for k, i in enumerate(step.active):
                    sample = step.samples[k]
                    buffer.add(int(i), sample, step.infos[i].get("state_key", ""), step.rewards[i],
                               bool(step.dones[i]), step.new_infos[i])
                    meter.add(sample)
                    if step.dones[i]:
                        self._record_episode(buffer, int(i))
                callback.update_locals({"step": step, "rollout_buffer": buffer})
                return callback.on_step()

            assert isinstance(observations, np.ndarray)
            if not play_episodes(self.policy, env, observations, infos, deterministic=False, on_step=record):
                return None
        finally:
            self._last_obs = None  # the next rollout starts from a fresh group reset
        return Collected(meter, time.perf_counter() - meter.started, self.num_timesteps - timesteps_before)

    def assign_credit(self: GroupRLAlgorithm, env: GroupedTextVecEnv, buffer: TextRolloutBuffer,
                      collected: Collected) -> None:
        """Credit of the collected steps (every rank's, merged), its outputs and the rollout log values."""
        started = time.perf_counter()
        credit = None
        if buffer.num_steps:  # none: every env failed at reset (stopped below, once all ranks know)
            credit = buffer.compute_credit(self.credit_method, self.credit_config)
        credit_time = time.perf_counter() - started
        # env steps of all ranks (every rank then agrees on when learn() ends)
        self.num_timesteps += int(distributed.all_reduce_sum([collected.local_steps], self.world)[0]) - \
            collected.local_steps
        stats = distributed.reduce_rollout_stats(buffer.stats(), self.world)
        self._check_rollout_lost(stats, buffer, env)
        batch, credit = distributed.global_credit(self.credit_method, self.credit_config, buffer.batch, credit,
                                                  env.n_tasks, self.world)
        self._rollout_log = collected.meter.log(stats, collected.seconds, credit_time)
        if credit is not None:
            self._rollout_log.update(credit.log_values())
            meta = {"iteration": self._iterations + 1, "num_timesteps": self.num_timesteps,
                    "method": self.credit_method}
            write_credit_outputs(self.logger, credit, batch, meta, stats["success_rate"])

    def _check_rollout_lost(self: GroupRLAlgorithm, stats: dict[str, float], buffer: TextRolloutBuffer,
                            env: GroupedTextVecEnv) -> None:
        """Stop with :class:`TrainingError` when the env cannot be played: no env completed a step
        (all ranks), or :data:`MAX_LOST_ROLLOUTS` rollouts in a row lost every episode to env errors."""
        lost = stats["episodes"] > 0 and stats["env_errors"] >= stats["episodes"]
        self._lost_rollouts = self._lost_rollouts + 1 if lost else 0
        if stats["steps"] and self._lost_rollouts < MAX_LOST_ROLLOUTS:
            return
        errors = [t.env_error for t in buffer.trajectories if t.env_error is not None]
        example = f": {errors[0]}" if errors else ""
        where = f"; tracebacks in {env.errors.path}" if env.errors.path is not None else ""
        what = ("no env completed a step (every episode ended in an env error at reset or its first step)"
                if not stats["steps"] else f"{self._lost_rollouts} rollouts in a row lost every episode to env errors")
        raise TrainingError(f"{what}{example}{where}. The env is broken: fix it and rerun")

    def _record_episode(self: GroupRLAlgorithm, buffer: TextRolloutBuffer, env_index: int) -> None:
        traj = buffer.trajectories[env_index]
        assert self.ep_info_buffer is not None and self.ep_success_buffer is not None
        self.ep_info_buffer.append({"r": traj.outcome, "l": len(traj.steps), "t": time.time() - self.start_time / 1e9})
        self.ep_success_buffer.append(float(traj.won))
        self._episode_num += 1
