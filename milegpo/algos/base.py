"""The shared group-RL algorithm: grouped rollouts, credit assignment, clipped LoRA update.

:class:`GroupRLAlgorithm` is a stable-baselines3 ``OnPolicyAlgorithm``: it keeps SB3's
``learn`` loop, logger (stdout / csv / tensorboard), callbacks and progress bar, and
overrides what text and groups need:

* ``collect_rollouts`` (:mod:`milegpo.algos.iteration`: *collect*, then *assign credit*):
  one *rollout* runs every group's episodes to the end (all
  ``group_size`` copies of each task, until done or the env's horizon), from a fresh
  group reset of the :class:`~milegpo.envs.vec_env.GroupedTextVecEnv`;
* the :class:`~milegpo.algos.buffer.TextRolloutBuffer` then turns the finished
  groups into a :class:`~milegpo.credit.StepBatch` and the subclass's credit
  method (GRPO, GiGPO, GraphGPO, MileGPO) gives every step its advantage;
* ``train``: a PPO-clip loss on every unit of each step's action (a generated token
  in ``generate`` mode, the one choice among candidates in ``choose`` mode) with the
  step's advantage, optional k3 KL to the reference (the base model with the adapter
  disabled) and entropy bonus, AdamW on the LoRA parameters only.

Counting and logging conventions:

* **timesteps are env steps of active envs**: a finished env of a group that is
  still running does not count (``num_timesteps`` grows by the number of envs that
  took an action). ``learn(total_timesteps)`` stops after the rollout that crosses
  ``total_timesteps``;
* SB3 dumps its logs *before* ``train()``. Here ``dump_logs`` only records the
  rollout values and the dump happens at the end of ``train()``, so every row of the
  stdout / csv / tensorboard logs holds the rollout, credit and update numbers of
  the *same* iteration;
* rollout/* statistics are those of the iteration's own episodes (not SB3's moving
  window of the last 100 episodes).

The logged keys (every column of ``progress.csv``) are listed in :mod:`milegpo.run_folder`.

Data parallel (:mod:`milegpo.algos.distributed`, ``torchrun``): every rank plays its own
task groups and computes their credit; ``num_timesteps``, rollout/* and the step counts
of env_steps_per_s / update_tokens_per_s are those of all ranks together, credit/* those
of the merged batch (what one process would log); the other ``time/`` values are rank 0's.
Only rank 0 should be given a logger that writes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar, cast

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback
from stable_baselines3.common.vec_env import VecEnv

from milegpo.algos import distributed, iteration, persistence, preemption
from milegpo.algos.buffer import TextRolloutBuffer, Trajectory
from milegpo.algos.callbacks import IterationCallback, as_callback, flatten_callbacks, refuse_sb3_callbacks
from milegpo.algos.console import use_console_format
from milegpo.algos.counters import TrainingCounters
from milegpo.algos.errors import TrainingError
from milegpo.algos.iteration import RolloutPlan, RolloutState, StepHooks
from milegpo.algos.offline_setting import default_budget, explicit_fields, offline_setting
from milegpo.algos.rollout import RolloutStep
from milegpo.algos.staleness import OverlappedRollout, behaviour_copy, copy_weights
from milegpo.algos.update import UpdateSettings, run_update
from milegpo.config import AlgoConfig, PolicyConfig
from milegpo.config.fields import field_names, from_dict, with_overrides
from milegpo.envs.core import TextSpace
from milegpo.envs.vec_env import GroupedTextVecEnv
from milegpo.policies import LLMPolicy
from milegpo.policies.optim import with_default_weight_decay

logger = logging.getLogger(__name__)

SelfGroupRL = TypeVar("SelfGroupRL", bound="GroupRLAlgorithm")

def _refuse_policy_settings(settings: Mapping[str, Any]) -> None:
    """A policy setting given as an algorithm keyword (``MileGPO(..., model=...)``) is refused with
    where it goes: ``policy_kwargs``, as in stable-baselines3."""
    misplaced = sorted(set(settings) & (field_names(PolicyConfig) - field_names(AlgoConfig)))
    if misplaced:
        example = ", ".join(f"{name!r}: {settings[name]!r}" for name in misplaced)
        what = "is a policy setting" if len(misplaced) == 1 else "are policy settings"
        raise ValueError(f"{', '.join(misplaced)} {what}: pass policy_kwargs={{{example}}}")


class GroupRLAlgorithm(OnPolicyAlgorithm):
    """Critic-free group RL for text agents (the base of MileGPO, GraphGPO, GiGPO, GRPO).

    :param policy: ``"LLMPolicy"`` or a policy class with the LLMPolicy interface.
    :param env: a :class:`~milegpo.envs.vec_env.GroupedTextVecEnv`, made with
        ``milegpo.make_vec_env(env_id, n_tasks, group_size)``.
    :param config: the algorithm's settings (:class:`~milegpo.config.AlgoConfig`; None: the defaults,
        the paper's). Its ``method`` must be this class's credit method.
    :param settings: :class:`~milegpo.config.AlgoConfig` fields replacing those of ``config``, SB3's
        keyword style: ``MileGPO("LLMPolicy", env, learning_rate=3e-3, batch_size=64)``.
    :param stats_window_size: SB3's episode info window (kept for SB3 tools).
    :param tensorboard_log: tensorboard log folder (None: no tensorboard).
    :param policy_kwargs: the policy's settings: a :class:`~milegpo.config.PolicyConfig` or a dict of its
        fields (``model`` path or name, ``mode``, ``lora``, ...).
    :param verbose: 0 silent, 1 one line per iteration on stdout (success, held-out success, loss,
        seconds), 2 SB3's table of every logged value; None (the default): 1 when no model is given (the
        offline demo setting, which then also ends ``learn`` with a line on what was learned), else 0.
    :param seed: seeds python/numpy/torch, the task draws, the minibatch shuffling, the adapter's
        initial weights and the policy's action sampling.
    :param device: ``"auto"``, ``"cpu"``, ``"cuda"`` ... (given to the policy).
    """

    policy_aliases: ClassVar[dict[str, type]] = {"LLMPolicy": LLMPolicy}
    #: The credit method of :func:`milegpo.credit.compute_credit` (set by subclasses).
    credit_method: ClassVar[str] = ""

    policy: LLMPolicy  # type: ignore[assignment]  # SB3 declares an ActorCriticPolicy; ours is a BasePolicy
    rollout_buffer: TextRolloutBuffer  # type: ignore[assignment]

    def __init__(
        self,
        policy: str | type[LLMPolicy],
        env: GroupedTextVecEnv | None,
        config: AlgoConfig | None = None,
        *,
        policy_kwargs: PolicyConfig | Mapping[str, Any] | None = None,
        stats_window_size: int = 100,
        tensorboard_log: str | None = None,
        verbose: int | None = None,
        seed: int | None = None,
        device: th.device | str = "auto",
        _init_setup_model: bool = True,
        **settings: Any,
    ):
        if not self.credit_method:
            raise TypeError(f"{type(self).__name__} has no credit_method: use MileGPO, GraphGPO, GiGPO or GRPO")
        if env is not None:
            self._checked_env(env)
        if isinstance(policy, str) and policy not in self.policy_aliases:  # before a model is built for it
            raise ValueError(f"unknown policy {policy!r}: {type(self).__name__} trains a language model, "
                             f"{sorted(self.policy_aliases)} (SB3's MlpPolicy/CnnPolicy act on arrays, not text)")
        _refuse_policy_settings(settings)
        given_config = config
        config = with_overrides(AlgoConfig, config if config is not None else {"method": self.credit_method},
                                settings, "algo")
        if config.method != self.credit_method:
            raise ValueError(f"{type(self).__name__} assigns credit with {self.credit_method!r}, but its config's "
                             f"method is {config.method!r}: use milegpo.algos.ALGORITHMS[{config.method!r}] or "
                             f"AlgoConfig(method={self.credit_method!r}, ...)")
        self.policy_config = from_dict(PolicyConfig, policy_kwargs, "policy")
        #: whether no model was given and the offline demo setting was chosen (:mod:`milegpo.algos.offline_setting`)
        self.offline_setting = self.policy_config.model is None and env is not None and _init_setup_model
        if self.offline_setting:
            assert env is not None
            algo_given = explicit_fields(given_config, AlgoConfig(method=self.credit_method)) | set(settings)
            config, self.policy_config = offline_setting(
                self._checked_env(env), config, algo_given, self.policy_config,
                explicit_fields(policy_kwargs, PolicyConfig()), seed)
        self.config = config
        if verbose is None:
            verbose = 1 if self.offline_setting else 0

        super().__init__(
            policy,  # type: ignore[arg-type]  # SB3 types its policy classes as ActorCriticPolicy
            env,  # type: ignore[arg-type]
            learning_rate=config.learning_rate,
            n_steps=0,  # a rollout runs every group's episodes to the end
            gamma=1.0,  # discounting, where a credit method uses it, is in its config
            gae_lambda=1.0,
            ent_coef=config.ent_coef,
            vf_coef=0.0,  # critic-free
            max_grad_norm=config.max_grad_norm,
            use_sde=False,
            sde_sample_freq=-1,
            stats_window_size=stats_window_size,
            tensorboard_log=tensorboard_log,
            monitor_wrapper=False,
            policy_kwargs=None,  # the policy's settings are self.policy_config
            verbose=verbose,
            seed=seed,
            device=device,
            _init_setup_model=False,
            supported_action_spaces=(spaces.Text,),
        )
        # seed of the per-iteration task draws; kept in checkpoints so a resumed run sees the same tasks
        self.task_seed_base = int(seed) if seed is not None else int(np.random.SeedSequence().generate_state(1)[0])
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
        if _init_setup_model:
            self._setup_model()

    @property
    def iterations(self) -> int:
        """Completed iterations (a rollout and its update) over all sessions of the run."""
        return int(self._iterations)

    @property
    def timestep_budget(self) -> int:
        """The env steps the current (or last) ``learn()`` call trains to (``num_timesteps`` at its start
        plus its ``total_timesteps``): where its last iteration ends."""
        return int(self._total_timesteps)

    @property
    def last_update_stats(self) -> dict[str, float]:
        """Wall time, tokens/s and optimizer steps of the last update (empty before the first)."""
        return dict(self._last_update_stats)

    @property
    def last_rollout_log(self) -> dict[str, float]:
        """The last rollout's logged values (rollout/*, time/*, credit/*; empty before the first)."""
        return dict(self.rollout_state.log)

    @property
    def update_settings(self) -> UpdateSettings:
        """The update's hyperparameters, as :func:`milegpo.algos.update.optimizer_step` takes them."""
        c = self.config
        return UpdateSettings(c.clip_range, c.loss_agg, c.kl_coef, c.ent_coef, c.max_grad_norm, c.micro_batch_tokens,
                              c.ratio_level)

    # ------------------------------------------------------------- setup
    def _setup_model(self) -> None:
        self._setup_lr_schedule()
        #: this process's rank among the data-parallel processes (see milegpo.algos.distributed)
        self.world = distributed.current_world()
        if self.config.max_staleness and self.policy_config.sampler.backend != "hf":
            raise ValueError("algo.max_staleness=1 samples from a copy of the adapter beside the trainer's model, "
                             "which needs policy.sampler.backend=hf (a vLLM engine sleeps during the update and "
                             "its log-probs are rescored by the trainer's model): use algo.max_staleness=0 with vllm")
        if self.config.max_staleness and self.world.distributed:
            raise ValueError("algo.max_staleness=1 runs in one process (torchrun is not supported with it yet): "
                             "use algo.max_staleness=0 with several processes")
        if self.env is None:  # loaded for prediction only
            self.observation_space, self.action_space = TextSpace(), TextSpace()
        else:
            env = self._checked_env(self.env)
            self.rollout_buffer = TextRolloutBuffer(env.num_envs, env.group_ids)
        self.set_random_seed(self.seed)
        self._rng = np.random.default_rng(np.random.SeedSequence([self.task_seed_base, 1]))
        self.credit_config = self.config.credit_config()
        # the policy builds the one optimizer; weight_decay (an algorithm setting) goes to it unless the
        # policy's optimizer_kwargs set their own
        policy_config = with_overrides(PolicyConfig, self.policy_config, {"optimizer_kwargs": with_default_weight_decay(
            self.policy_config.optimizer_class, self.policy_config.optimizer_kwargs, self.config.weight_decay)})
        # a policy class of LLMPolicy's interface (SB3 types policy_class as its own base class)
        self.policy = cast(LLMPolicy, self.policy_class(self.observation_space, self.action_space, self.lr_schedule,
                                                        config=policy_config, device=str(self.device),
                                                        seed=self.seed if self.seed is not None else 0))
        self.device = self.policy.device
        params = list(self.policy.trainable_parameters())
        if not params:
            raise ValueError("the policy has no trainable (LoRA) parameters: check policy.lora.target_modules")
        distributed.broadcast_parameters(params, self.world)
        self.optimizer = self.policy.optimizer  # SB3 convention: the optimizer lives on the policy

    def set_env(self, env: GymEnv, force_reset: bool = True) -> None:
        """Train on another GroupedTextVecEnv from now on (any number of tasks and group size)."""
        vec_env = self._checked_env(env)
        self.env, self.n_envs = vec_env, vec_env.num_envs
        self._cancel_overlapped()
        self.rollout_buffer = TextRolloutBuffer(vec_env.num_envs, vec_env.group_ids)
        self._spare_buffer = None
        self._last_obs = None

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

    def learn(
        self: SelfGroupRL,
        total_timesteps: int | None = None,
        callback: MaybeCallback = None,
        log_interval: int = 1,
        tb_log_name: str | None = None,
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> SelfGroupRL:
        """SB3's ``learn``: train for ``total_timesteps`` env steps (of active envs).

        Without ``total_timesteps``: ``$MILEGPO_TOTAL_TIMESTEPS`` when set, else the demo's budget when
        the offline demo setting was chosen (no model given), else ``TypeError``.
        To resume a run from a checkpoint towards the same total, load it and call
        ``learn(total - model.num_timesteps, reset_num_timesteps=False)``.
        """
        if self.env is None:
            raise ValueError("this model has no env: load it with load(path, env=...) or call set_env(env)")
        if total_timesteps is None:
            total_timesteps = default_budget(self.offline_setting)
        updates_before, skipped_before = self._n_updates, self._skipped_steps
        steps_before, started = self.num_timesteps, time.monotonic()
        self._success_curve = []
        try:
            super().learn(total_timesteps, callback, log_interval, tb_log_name or type(self).__name__,
                          reset_num_timesteps, progress_bar)
        finally:  # a learn() that failed or was stopped leaves no rollout playing
            self._cancel_overlapped()
        if self.offline_setting and self.verbose and self._success_curve:
            curve = self._success_curve
            print(f"Learned {self.num_timesteps - steps_before:,} env steps in {time.monotonic() - started:.0f} s: "
                  f"train success {curve[0]:.2f} in the first iteration, {curve[-1]:.2f} in the last "
                  f"(best {max(curve):.2f}). Keep it with model.save(DIR); held-out success: model.evaluate(env, "
                  f"n_episodes=N) on make_vec_env(..., env_kwargs={{'split': 'eval_id'}})")
        skipped = self._skipped_steps - skipped_before
        if skipped and self._n_updates == updates_before:
            raise TrainingError(f"no update was applied: all {skipped} optimizer steps of this learn() call had a "
                                "non-finite loss or gradient norm (the weights are unchanged). The usual causes: a "
                                "learning rate or LoRA scale (alpha / r) too large, or a float16 overflow (rewards "
                                "are checked finite at the env, advantages by the credit function)")
        return self

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

    # -------------------------------------------------------- checkpoints
    def save(self, path: str | os.PathLike, exclude: Iterable[str] | None = None,  # type: ignore[override]
             include: Iterable[str] | None = None) -> None:
        """Save a checkpoint directory at ``path`` (LoRA adapter, optimizer state, JSON config and counters;
        :mod:`milegpo.algos.persistence`), written atomically. ``exclude``/``include`` of SB3's signature
        are not supported: the checkpoint content is fixed."""
        if exclude is not None or include is not None:
            raise ValueError("milegpo checkpoints have a fixed content: exclude/include are not supported")
        if os.fspath(path).endswith(".zip"):
            raise ValueError(f"milegpo checkpoints are folders (LoRA adapter, optimizer state, JSON), not SB3 zip "
                             f"files: save to {os.fspath(path)[:-4]!r} instead of {os.fspath(path)!r}")
        memory = self.rollout_state.credit_memory
        state = persistence.RunState(
            algorithm=type(self).__name__, algo=self.config,
            policy_class=persistence.policy_class_name(self.policy_class, self.policy_aliases),
            policy_config=self.policy_config, stats_window_size=self._stats_window_size,
            base_model=persistence.base_model_fingerprint(self.policy.model.config, self.policy_config),
            counters=self.training_counters(), seed=self.seed, task_seed_base=self.task_seed_base,
            minibatch_rng=dict(self._rng.bit_generator.state),
            credit_memory=None if memory is None else memory.to_dict())
        in_flight = self._in_flight is not None or self._behaviour_pending
        persistence.save_checkpoint(path, state, self.policy, self.optimizer, self._behaviour if in_flight else None)

    @classmethod
    def load(  # type: ignore[override]
        cls: type[SelfGroupRL],
        path: str | os.PathLike,
        env: GymEnv | None = None,
        device: th.device | str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        base_model: str | None = None,
        **kwargs: Any,
    ) -> SelfGroupRL:
        """Load a checkpoint saved by :meth:`save`; training resumes from its counters.

        :param env: the vec env to continue training on (None: prediction only).
        :param base_model: load the adapter onto this base model (a path or hub id) instead of the one
            the checkpoint names, e.g. after moving the base model; its architecture must match.
        :param kwargs: :class:`~milegpo.config.AlgoConfig` fields to change (e.g. ``learning_rate``).
        Raises :class:`~milegpo.algos.checkpoint.CheckpointError` for a missing, corrupt or
        mismatching checkpoint (other algorithm, other base model, adapter that does not fit).
        """
        saved = persistence.read_saved_run(path, cls.__name__, cls.policy_aliases, base_model, **kwargs)
        model = cls(saved.policy_class, None if env is None else cls._checked_env(env), saved.algo,
                    policy_kwargs=saved.policy_config, device=device, seed=saved.seed,
                    stats_window_size=saved.stats_window_size, _init_setup_model=False)
        if saved.task_seed_base is not None:
            model.task_seed_base = saved.task_seed_base
        model._setup_model()
        persistence.load_weights(saved, persistence.base_model_fingerprint(model.policy.model.config,
                                                                           model.policy_config),
                                 model.policy, model.optimizer, model.device)
        model._restore_counters(saved.counters)
        if saved.behaviour_adapter is not None and model.config.max_staleness:
            model._behaviour = behaviour_copy(model.policy)
            persistence.load_adapter(model._behaviour, saved.behaviour_adapter)
            model._behaviour_pending = True
        if saved.minibatch_rng is not None:
            model._rng.bit_generator.state = saved.minibatch_rng
        model.rollout_state.credit_memory = iteration.memory_if_used(saved.credit_memory, model.credit_config)
        model.ep_info_buffer = deque(maxlen=model._stats_window_size)
        model.ep_success_buffer = deque(maxlen=model._stats_window_size)
        return model

    def predict(  # type: ignore[override]
        self,
        observation: str | Sequence[str] | np.ndarray,
        state: Any = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
        infos: Sequence[dict[str, Any]] | None = None,
    ) -> tuple[str | np.ndarray, None]:
        """SB3's ``predict``: ``(actions, None)`` for text observations (:meth:`LLMPolicy.predict`).

        Without ``infos``, the infos of the model's env are used when ``observation`` is what that env
        last returned (``obs = env.reset(); model.predict(obs)``). ``episode_start`` is refused:
        stable-baselines3's ``evaluate_policy`` passes it, and would count the finished envs of a
        grouped vec env as new episodes (use :func:`milegpo.evaluate_policy`).
        """
        if episode_start is not None:
            raise TypeError("predict(episode_start=...) is what stable_baselines3's evaluate_policy calls; it would "
                            "count the finished envs of a grouped vec env as episodes. Use milegpo.evaluate_policy("
                            "model, env) (or model.evaluate(env, n_episodes=N))")
        if infos is None and self.env is not None:
            infos = self._checked_env(self.env).infos_of(observation)
        return self.policy.predict(observation, deterministic=deterministic, infos=infos)

    # --------------------------------------------------------- evaluation
    def evaluate(self, env: GroupedTextVecEnv, n_episodes: int | None = None, task_seeds: Sequence[int] | None = None,
                 deterministic: bool = True, temperature: float | None = None, seed: int | None = None,
                 progress: bool = False) -> dict[str, Any]:
        """Evaluation on held-out tasks (see :func:`milegpo.algos.evaluation.evaluate`)."""
        from milegpo.algos.evaluation import evaluate

        return evaluate(self, env, n_episodes=n_episodes, task_seeds=task_seeds, deterministic=deterministic,
                        temperature=temperature, seed=seed, progress=progress)
