"""One iteration of group RL inside stable-baselines3's on-policy loop.

:class:`IterationLoop` is the part of :class:`~milegpo.algos.base.GroupRLAlgorithm` that SB3's
``learn`` drives: the rollout (every group's episodes to the end, then their credit:
:mod:`milegpo.algos.iteration`), the update (:mod:`milegpo.algos.update`), the end of an iteration
(callbacks that log, the row, callbacks that save), the run's counters, and the next rollout
played during the update with ``algo.max_staleness=1`` (:mod:`milegpo.algos.staleness`). The
algorithm's face (construction, ``learn``, ``save``/``load``, ``predict``, ``evaluate``) is
:class:`~milegpo.algos.base.GroupRLAlgorithm`.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import ClassVar

import numpy as np
import torch as th
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.type_aliases import MaybeCallback
from stable_baselines3.common.vec_env import VecEnv

from milegpo.algos import distributed, iteration, preemption
from milegpo.algos.buffer import TextRolloutBuffer, Trajectory
from milegpo.algos.callbacks import IterationCallback, as_callback, flatten_callbacks, refuse_sb3_callbacks
from milegpo.algos.console import use_console_format
from milegpo.algos.counters import TrainingCounters
from milegpo.algos.iteration import RolloutPlan, RolloutState, StepHooks
from milegpo.algos.rollout import RolloutStep
from milegpo.algos.staleness import OverlappedRollout, behaviour_copy, copy_weights
from milegpo.algos.update import UpdateSettings, run_update
from milegpo.config import AlgoConfig
from milegpo.credit import CreditConfig
from milegpo.envs.vec_env import GroupedTextVecEnv
from milegpo.policies import LLMPolicy


class IterationLoop(OnPolicyAlgorithm):
    """SB3's on-policy loop with group rollouts, credit and a clipped update (see the module)."""

    #: The credit method of :func:`milegpo.credit.compute_credit` (set by subclasses).
    credit_method: ClassVar[str] = ""

    policy: LLMPolicy  # type: ignore[assignment]  # SB3 declares an ActorCriticPolicy; ours is a BasePolicy
    rollout_buffer: TextRolloutBuffer  # type: ignore[assignment]
    config: AlgoConfig
    credit_config: CreditConfig
    world: distributed.World
    task_seed_base: int
    optimizer: th.optim.Optimizer
    _rng: np.random.Generator

    def _init_iteration_state(self) -> None:
        """The loop's state before the first iteration (a loaded checkpoint then restores the counters)."""
        self._iterations = 0
        self._elapsed_before = 0.0
        self._skipped_steps = 0
        self._dump_pending = False
        #: what the rollout side keeps between iterations (lost rollouts in a row, the last rollout's log)
        self.rollout_state = RolloutState()
        # algo.max_staleness=1 (milegpo.algos.staleness): the rollout in flight, the copy of the weights that
        # samples it, the buffer it fills, and whether a loaded checkpoint's first rollout is the behaviour copy's
        self._in_flight: OverlappedRollout | None = None
        self._behaviour: LLMPolicy | None = None
        self._spare_buffer: TextRolloutBuffer | None = None
        self._behaviour_pending = False
        self._last_update_stats: dict[str, float] = {}
        #: train success of each iteration of the current learn() call (its closing line in the demo setting)
        self._success_curve: list[float] = []

    @property
    def update_settings(self) -> UpdateSettings:
        """The update's hyperparameters, as :func:`milegpo.algos.update.optimizer_step` takes them."""
        c = self.config
        return UpdateSettings(c.clip_range, c.loss_agg, c.kl_coef, c.ent_coef, c.max_grad_norm, c.micro_batch_tokens,
                              c.ratio_level)


    @classmethod
    def _checked_env(cls, env: object) -> GroupedTextVecEnv:
        """``env`` when it is a GroupedTextVecEnv, else ``TypeError`` saying how to make one."""
        if not isinstance(env, GroupedTextVecEnv):
            raise TypeError(
                f"{cls.__name__} needs a GroupedTextVecEnv (G copies of each task), got {type(env).__name__}. "
                "Make one with milegpo.make_vec_env(env_id, n_tasks=16, group_size=8), e.g. "
                "milegpo.make_vec_env('milegpo/House-v0', n_tasks=4, group_size=8)."
            )
        return env

    def _setup_learn(
        self,
        total_timesteps: int,
        callback: MaybeCallback = None,
        reset_num_timesteps: bool = True,
        tb_log_name: str = "run",
        progress_bar: bool = False,
    ) -> tuple[int, BaseCallback]:
        # every rollout starts from a fresh group reset with this iteration's task seeds
        self._last_obs = None
        if reset_num_timesteps:
            self._elapsed_before = 0.0
        elif getattr(self, "start_time", None):  # a second learn() call continues the clock
            self._elapsed_before = self.time_elapsed()
        if self.env is not None:
            self._seed_tasks(self.env)
        total, callback = super()._setup_learn(total_timesteps, callback, reset_num_timesteps, tb_log_name,
                                               progress_bar)
        if not self._custom_logger:  # SB3's default logger: a line per iteration at verbose=1, its table at 2
            use_console_format(self._logger, self.verbose)
        return total, callback

    def _init_callback(self, callback: MaybeCallback, progress_bar: bool = False) -> BaseCallback:
        callback = as_callback(callback, progress_bar)
        refuse_sb3_callbacks(flatten_callbacks(callback))
        callback.init_callback(self)
        self._callback = callback
        return callback

    def _seed_tasks(self, env: VecEnv) -> None:
        """Seed the vec env's task draw for the current iteration (reproducible, resumable)."""
        env.seed(self._rollout_plan().task_seed)

    def _rollout_plan(self) -> RolloutPlan:
        """What the next rollout needs to know of the run (:mod:`milegpo.algos.iteration`)."""
        c = self.config
        return RolloutPlan(iteration=self._iterations, task_seed_base=self.task_seed_base, world=self.world,
                           rollout=c.rollout, async_cohorts=c.async_cohorts, per_env_sampling=c.samples_per_env,
                           credit_method=self.credit_method, credit_config=self.credit_config,
                           policy_version=self._iterations)

    def _step_hooks(self, callback: BaseCallback) -> StepHooks:
        """How the played steps reach this run: its step and episode counters, then ``callback``."""

        def step_played(step: RolloutStep, buffer: TextRolloutBuffer) -> bool:
            self.num_timesteps += len(step.active)
            for i in step.active:
                if step.dones[i]:
                    self._record_episode(buffer.trajectories[int(i)])
            callback.update_locals({"step": step, "rollout_buffer": buffer})
            # a stop request ends a one-process rollout at once; ranks agree on it between iterations
            return callback.on_step() and (self.world.distributed or preemption.stop_requested() is None)

        return StepHooks(callback.on_rollout_start, step_played)

    def _record_episode(self, trajectory: Trajectory) -> None:
        """Count a finished episode in SB3's episode buffers."""
        assert self.ep_info_buffer is not None and self.ep_success_buffer is not None
        self.ep_info_buffer.append({"r": trajectory.outcome, "l": len(trajectory.steps),
                                    "t": time.time() - self.start_time / 1e9})
        self.ep_success_buffer.append(float(trajectory.won))
        self._episode_num += 1

    def training_counters(self) -> TrainingCounters:
        """Where the run stands now (what a checkpoint saves)."""
        return TrainingCounters(num_timesteps=int(self.num_timesteps), n_updates=int(self._n_updates),
                                iterations=int(self._iterations), skipped_steps=int(self._skipped_steps),
                                episode_num=int(self._episode_num), total_timesteps=int(self._total_timesteps),
                                current_progress_remaining=float(self._current_progress_remaining),
                                time_elapsed_s=float(self.time_elapsed()))

    def _restore_counters(self, counters: TrainingCounters) -> None:
        """Set the counters to saved ones (training then continues from there)."""
        self.num_timesteps = counters.num_timesteps
        self._n_updates = counters.n_updates
        self._iterations = counters.iterations
        self._skipped_steps = counters.skipped_steps
        self._episode_num = counters.episode_num
        self._total_timesteps = counters.total_timesteps
        self._current_progress_remaining = counters.current_progress_remaining
        self._elapsed_before = counters.time_elapsed_s

    def time_elapsed(self) -> float:
        """Seconds of training so far, over all sessions of a resumed run."""
        session = (time.time_ns() - self.start_time) / 1e9 if getattr(self, "start_time", None) else 0.0
        return self._elapsed_before + session

    # ---------------------------------------------------------- rollouts
    def collect_rollouts(  # type: ignore[override]
        self,
        env: VecEnv,
        callback: BaseCallback,
        rollout_buffer: TextRolloutBuffer,
        n_rollout_steps: int,
    ) -> bool:
        """Run all groups' episodes to the end (*collect*), then compute the credit of every step
        (*assign credit*); see :mod:`milegpo.algos.iteration`.

        ``n_rollout_steps`` is unused: a rollout ends when every env of the vec env is done.
        """
        assert isinstance(env, GroupedTextVecEnv)
        if self._dump_pending:  # the untrained policy's evaluation (iteration 0): its own row
            self.logger.dump(step=self.num_timesteps)
            self._dump_pending = False
        if preemption.stop_agreed(self.world):  # a stop was requested during the update or evaluation
            return False
        timesteps_before, episodes_before = self.num_timesteps, self._episode_num
        flight, self._in_flight = self._in_flight, None
        replaying = False
        if flight is not None:  # played during the last update (algo.max_staleness=1)
            plan = flight.plan
            self.rollout_buffer, self._spare_buffer = flight.buffer, self.rollout_buffer
            rollout_buffer = self.rollout_buffer
            collected = flight.join(self._step_hooks(callback))
        else:
            plan, policy = self._rollout_plan(), self.policy
            replaying = self._behaviour_pending
            if self._behaviour_pending:  # loaded from a checkpoint saved while this rollout was in flight
                assert self._behaviour is not None
                plan, policy = dataclasses.replace(plan, policy_version=self._iterations - 1), self._behaviour
                self._behaviour_pending = False
            reset_obs = self._last_obs  # SB3's learn resets the env (seeded by _setup_learn) before the first rollout
            assert reset_obs is None or isinstance(reset_obs, np.ndarray)
            try:
                collected = iteration.collect(policy, env, rollout_buffer, plan, self._step_hooks(callback), reset_obs)
            finally:
                self._last_obs = None  # the next rollout starts from a fresh group reset
        if collected is None:  # a callback or a stop request ended the rollout: it is dropped, not counted,
            # so the run stands at the end of its last completed iteration (what a checkpoint now saves)
            self.num_timesteps, self._episode_num = timesteps_before, episodes_before
            if flight is not None or replaying:  # a resumed run plays it again with the same behaviour weights
                self._behaviour_pending = True
            return False
        self.num_timesteps = timesteps_before + iteration.assign_credit(
            env, rollout_buffer, collected, self.rollout_state, plan, self.logger, timesteps_before)
        if "rollout/success_rate" in self.rollout_state.log:
            self._success_curve.append(float(self.rollout_state.log["rollout/success_rate"]))
        callback.update_locals({"rollout_buffer": rollout_buffer, "collected": collected})
        callback.on_rollout_end()
        return True

    def log_row_pending(self) -> None:
        """Values were recorded outside an iteration (the evaluation before training): write them as
        their own log row before the next rollout records anything."""
        self._dump_pending = True

    def dump_logs(self, iteration: int = 0) -> None:
        """Record the rollout values; the dump itself happens at the end of ``train()``
        so that one log row holds one iteration's rollout and update numbers."""
        session = max((time.time_ns() - self.start_time) / 1e9, sys.float_info.epsilon)
        self.logger.record("time/iterations", self._iterations + 1, exclude="tensorboard")
        self.logger.record("time/fps", int((self.num_timesteps - self._num_timesteps_at_start) / session))
        self.logger.record("time/time_elapsed", int(self.time_elapsed()), exclude="tensorboard")
        self.logger.record("time/total_timesteps", self.num_timesteps, exclude="tensorboard")
        for key, value in self.rollout_state.log.items():
            self.logger.record(key, value)
        self._dump_pending = True

    # ------------------------------------------------------------ update
    def train(self) -> None:
        """PPO-clip update of the LoRA parameters on the rollout's steps and advantages."""
        buffer = self.rollout_buffer
        if self.config.max_staleness:
            self.logger.record("rollout/policy_lag", self._iterations - buffer.policy_version)
            if self.num_timesteps < self._total_timesteps:  # another iteration follows: play its rollout now
                self._start_overlapped()
        self.policy.set_training_mode(True)
        self.policy.before_update()
        self._update_learning_rate(self.optimizer)
        has_rows = buffer.advantages is not None and len(buffer.advantages) > 0
        # minibatches of the global batch (every rank's rows; just this rollout's with one process)
        minibatches = (minibatch for _ in range(self.config.n_epochs if has_rows or self.world.distributed else 0)
                       for minibatch in buffer.get(self._rng, self.config.batch_size, self.config.mini_batch_tokens,
                                                   self.world))
        report = run_update(self.policy, self.optimizer, minibatches, self.update_settings, self.world,
                            where=f"update {self._n_updates} ({self._skipped_steps} skipped so far)")
        self.policy.after_update()  # the sampler (a vLLM engine) samples from the new weights from now on
        tokens = report.tokens
        if self.world.distributed:  # throughput of all ranks together
            tokens = int(distributed.all_reduce_sum([tokens], self.world)[0])
        self._n_updates += report.steps - report.skipped
        self._skipped_steps += report.skipped
        self._iterations += 1
        for key in ("loss", "pg_loss", "kl", "entropy", "clip_fraction", "approx_kl", "grad_norm"):
            if key in report.means:
                self.logger.record(f"train/{key}", report.means[key])
        self.logger.record("train/skipped_steps", report.skipped)
        self.logger.record("train/skipped_steps_total", self._skipped_steps)
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self._last_update_stats = {"update_s": report.seconds,
                                   "update_tokens_per_s": tokens / max(report.seconds, 1e-9),
                                   "optimizer_steps": report.steps, "skipped_steps": report.skipped}
        self.logger.record("time/update_s", report.seconds)
        self.logger.record("time/update_tokens_per_s", self._last_update_stats["update_tokens_per_s"])
        self._end_iteration()

    def _start_overlapped(self) -> None:
        """Play the next iteration's rollout in a thread with a copy of the weights as they are now,
        before the update changes them (:mod:`milegpo.algos.staleness`)."""
        env = self._checked_env(self.env)
        if self._behaviour is None:
            self._behaviour = behaviour_copy(self.policy)
        else:
            copy_weights(self.policy, self._behaviour)
        if self._spare_buffer is None:
            self._spare_buffer = TextRolloutBuffer(env.num_envs, env.group_ids)
        plan = dataclasses.replace(self._rollout_plan(), iteration=self._iterations + 1)
        self._in_flight = OverlappedRollout.start(self._behaviour, env, self._spare_buffer, plan)

    def _cancel_overlapped(self) -> None:
        """Stop and drop the rollout in flight, if any."""
        flight, self._in_flight = getattr(self, "_in_flight", None), None
        if flight is not None:
            flight.cancel()

    def _end_iteration(self) -> None:
        """After the update: callbacks that log (evaluation) add to this iteration's row, the row is
        dumped, then callbacks that save (checkpoints) run, so a checkpoint never precedes its row."""
        callbacks = [cb for cb in flatten_callbacks(getattr(self, "_callback", None))
                     if isinstance(cb, IterationCallback)]
        for cb in callbacks:
            if cb.logs_to_row:
                cb.on_iteration_end()
        if self._dump_pending:
            self.logger.dump(step=self.num_timesteps)
            self._dump_pending = False
        for cb in callbacks:
            if not cb.logs_to_row:
                cb.on_iteration_end()
