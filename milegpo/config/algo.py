"""The algorithm's settings: :class:`AlgoConfig` (credit method, update hyperparameters, credit config).

Torch-free. The defaults are the paper's (lr 1e-6, KL 0.01 with the k3 estimator, PPO clip 0.2,
entropy bonus 0.001).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from milegpo.config.fields import check_int, check_number, check_type
from milegpo.credit import CREDIT_METHODS, CreditConfig, make_credit_config
from milegpo.options import CREDIT_PRESETS, LOSS_AGGREGATIONS, RATIO_LEVELS, ROLLOUT_MODES, check_choice


@dataclass(frozen=True)
class AlgoConfig:
    """What the group-RL algorithm does with a rollout (:class:`~milegpo.algos.base.GroupRLAlgorithm`).

    :param method: the credit method: ``"milegpo"``, ``"graphgpo"``, ``"hgpo"``, ``"gigpo"``, ``"rloo"``,
        ``"grpo"``, ``"gagpo"`` or ``"g2po"`` (one trainer; only the step advantages differ).
    :param learning_rate: optimizer learning rate (the paper: 1e-6 for a 1.5B model; tiny CPU models ~3e-3;
        0 leaves the weights as they are).
    :param n_epochs: passes over each rollout's steps.
    :param batch_size: steps per minibatch (one optimizer step); null: ``mini_batch_tokens``, or the
        whole rollout when that is null too.
    :param mini_batch_tokens: tokens per minibatch instead of a step count (exclusive with ``batch_size``).
    :param micro_batch_tokens: tokens per forward/backward pass; gradients are accumulated over a
        minibatch's micro-batches (a memory knob: the update is the same).
    :param clip_range: PPO ratio clip.
    :param loss_agg: ``"token-mean"`` (every unit of a minibatch weighs the same) or
        ``"seq-mean-token-mean"`` (mean over each step's units, then over steps).
    :param ratio_level: ``"token"`` (PPO's per-token importance ratio) or ``"action"`` (one ratio per
        action, the geometric mean of its tokens' ratios, clipped once: GAGPO's action-level ratio).
    :param kl_coef: weight of the k3 KL to the base model (the adapter disabled; 0 skips its forward pass).
    :param ent_coef: entropy bonus weight.
    :param max_grad_norm: gradient-norm clip.
    :param weight_decay: the optimizer's weight decay (unless ``policy.optimizer_kwargs`` sets one).
    :param credit_preset: MileGPO's per-env setting, ``"alfworld"`` or ``"webshop"`` (theta_m, rho, eta,
        kappa_bc; no effect on the baselines), applied before ``credit_kwargs``.
    :param credit_kwargs: overrides of the credit method's config fields (``milegpo.credit.make_credit_config``).
    :param rollout: ``"lockstep"`` (the policy acts for every active env, then every env steps) or
        ``"async"`` (with envs in worker processes: the policy acts for the envs whose workers have
        answered while the others still step; :func:`milegpo.algos.rollout.play_episodes_async`).
    :param async_cohorts: with ``rollout="async"``, the policy acts for at most ``1 / async_cohorts`` of the
        active envs per call, so that the others step meanwhile. Below that cap the loop acts for every env
        whose worker has answered as soon as the policy is free, so its calls usually hold the envs that
        answered during the previous call and the cap shapes mostly the calls after a reset or a slow
        call: on the CPU benchmarks (the docs' speed page) 4 and 8 cohorts were no faster than 2.
    :param per_env_sampling: each env samples from its own stream, seeded by (run, iteration, env,
        step), so an action does not depend on which envs share the policy's call; null: on for
        ``async`` (which needs it to be reproducible), off for ``lockstep``.
    :param max_staleness: 0 (exactly on-policy: every rollout is sampled by the current weights) or 1
        (the next iteration's rollout is sampled while this iteration's update runs, by the weights one
        update behind; its recorded log-probs are the ratio's old log-probs; ``rollout/policy_lag`` is
        logged). 1 keeps a second copy of the adapter, needs the HF sampler and one process, and a
        checkpoint saved with a rollout in flight keeps that rollout's adapter (:mod:`milegpo.algos.staleness`).
    """

    method: str = "milegpo"
    learning_rate: float = 1e-6
    n_epochs: int = 1
    batch_size: int | None = 256
    mini_batch_tokens: int | None = None
    micro_batch_tokens: int = 8192
    clip_range: float = 0.2
    loss_agg: str = "token-mean"
    ratio_level: str = "token"
    kl_coef: float = 0.01
    ent_coef: float = 0.001
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    credit_preset: str | None = None
    credit_kwargs: dict[str, Any] = field(default_factory=dict)
    rollout: str = "lockstep"
    async_cohorts: int = 2
    per_env_sampling: bool | None = None
    max_staleness: int = 0

    def __post_init__(self) -> None:
        check_choice("algo.method", self.method, CREDIT_METHODS)
        check_choice("algo.rollout", self.rollout, ROLLOUT_MODES)
        check_int("algo.async_cohorts", self.async_cohorts, 1)
        check_type("algo.per_env_sampling", self.per_env_sampling, bool, "true, false or null", optional=True)
        if self.rollout == "async" and self.per_env_sampling is False:
            raise ValueError("algo.rollout=async samples per env (what an env does must not depend on which envs "
                             "are ready together): leave algo.per_env_sampling null or true")
        check_number("algo.learning_rate", self.learning_rate, positive=False)  # 0: the weights stay as they are
        check_int("algo.n_epochs", self.n_epochs, 1)
        check_int("algo.batch_size", self.batch_size, 1, optional=True)
        check_int("algo.mini_batch_tokens", self.mini_batch_tokens, 1, optional=True)
        if self.batch_size is not None and self.mini_batch_tokens is not None:
            raise ValueError("algo.batch_size (steps) and algo.mini_batch_tokens (tokens) both set: give one of "
                             "them per minibatch, and null for the other")
        check_int("algo.micro_batch_tokens", self.micro_batch_tokens, 1)
        check_number("algo.clip_range", self.clip_range)
        check_choice("algo.loss_agg", self.loss_agg, LOSS_AGGREGATIONS)
        check_choice("algo.ratio_level", self.ratio_level, RATIO_LEVELS)
        check_int("algo.max_staleness", self.max_staleness, 0)
        if self.max_staleness > 1:
            raise ValueError(f"algo.max_staleness is 0 or 1 (one update of lag at most), got {self.max_staleness}")
        for name in ("kl_coef", "ent_coef", "weight_decay"):
            check_number(f"algo.{name}", getattr(self, name), positive=False)
        check_number("algo.max_grad_norm", self.max_grad_norm)
        if self.credit_preset is not None:
            check_choice("algo.credit_preset", self.credit_preset, CREDIT_PRESETS)
        check_type("algo.credit_kwargs", self.credit_kwargs, dict, "a mapping")
        try:  # unknown or bad credit fields are refused here, not at the first update
            self.credit_config()
        except ValueError as error:  # the config's message names the field; this names where it was set
            raise ValueError(f"algo.credit_kwargs: {error}") from None

    @property
    def samples_per_env(self) -> bool:
        """Whether each env samples from its own stream (``per_env_sampling``, or null and ``async``)."""
        return self.per_env_sampling if self.per_env_sampling is not None else self.rollout == "async"

    def credit_config(self) -> CreditConfig:
        """The credit method's config: its defaults, then the preset (MileGPO only), then ``credit_kwargs``."""
        overrides = dict(self.credit_kwargs)
        if self.credit_preset is not None and self.method == "milegpo":
            overrides["preset"] = self.credit_preset
        return make_credit_config(self.method, **overrides)
