"""The shared group-RL algorithm: grouped rollouts, credit assignment, clipped LoRA update.

:class:`GroupRLAlgorithm` is a stable-baselines3 ``OnPolicyAlgorithm``: it keeps SB3's
``learn`` loop, logger (stdout / csv / tensorboard), callbacks and progress bar, and
overrides what text and groups need. This module is its face (construction, ``learn``,
``save``/``load``, ``predict``, ``evaluate``); the iteration SB3's loop drives is
:class:`~milegpo.algos.loop.IterationLoop`:

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

import logging
import os
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar, cast

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback

from milegpo.algos import distributed, iteration, persistence
from milegpo.algos.buffer import TextRolloutBuffer
from milegpo.algos.errors import TrainingError
from milegpo.algos.loop import IterationLoop
from milegpo.algos.offline_setting import default_budget, explicit_fields, offline_setting
from milegpo.algos.staleness import behaviour_copy
from milegpo.config import AlgoConfig, PolicyConfig
from milegpo.config.fields import field_names, from_dict, with_overrides
from milegpo.envs.vec_env import GroupedTextVecEnv
from milegpo.policies import LLMPolicy
from milegpo.policies.optim import with_default_weight_decay
from milegpo.spaces import TextSpace

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


class GroupRLAlgorithm(IterationLoop):
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
        self._init_iteration_state()
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
