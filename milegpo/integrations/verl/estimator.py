"""milegpo credit as a verl / verl-agent advantage estimator: token-level advantages from a
step-level ``DataProto``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

import numpy as np

from milegpo.credit import (
    CreditConfig,
    CreditResult,
    G2POConfig,
    GiGPOConfig,
    StepBatch,
    compute_credit,
    make_credit_config,
)
from milegpo.credit.g2po import g2po
from milegpo.integrations.verl.exact import verl_agent_gigpo
from milegpo.integrations.verl.settings import ESTIMATORS, EstimatorSettings
from milegpo.integrations.verl.steps import StepRows, SuccessRule, step_batch_from_verl

if TYPE_CHECKING:
    import torch


class DataProtoLike(StepRows, Protocol):
    """The parts of a ``verl.DataProto`` the estimator reads and writes."""

    batch: dict[str, torch.Tensor]
    meta_info: dict[str, object]


#: success from the env's ``won`` when the batch has it, else from the reward
DEFAULT_SUCCESS = SuccessRule()


def compute_step_advantage(
    data: DataProtoLike, method: str = "milegpo", config: CreditConfig | Mapping[str, object] | None = None, *,
    success: SuccessRule = DEFAULT_SUCCESS, invalid_action_penalty: float = 0.1,
) -> tuple[torch.Tensor, torch.Tensor, CreditResult]:
    """Token-level ``(advantages, returns, credit)`` of a verl-agent step-level batch.

    :param method: a credit method (:data:`milegpo.credit.CREDIT_METHODS`).
    :param config: the method's config, or a dict of overrides (``{"preset": "webshop"}``,
        ``{"eta": 0.0}``, ``{"upstream_exact": True}``); None: the defaults.
    :param success: how a trajectory's success is decided.
    :param invalid_action_penalty: subtracted from the reward of a step whose action was invalid
        (see :func:`~milegpo.integrations.verl.step_batch_from_verl`).
    :returns: two (B, L) float tensors on ``response_mask``'s device (the same values: the
        step advantage on every reply token, 0 on padding and inactive rows; copies of a row
        get its value), and the :class:`~milegpo.credit.CreditResult` with the diagnostics.
    """
    import torch

    batch, row_map = step_batch_from_verl(data, success=success, invalid_action_penalty=invalid_action_penalty)
    if config is None or isinstance(config, Mapping):
        config = make_credit_config(method, **dict(config or {}))
    credit = _credit(method, batch, config, invalid_action_penalty)
    mask = data.batch["response_mask"]
    per_row = torch.zeros(mask.shape[0], dtype=torch.float32, device=mask.device)
    kept = row_map >= 0  # inactive rows keep 0; a copied row reads its step's value
    per_row[torch.as_tensor(kept, device=mask.device)] = torch.as_tensor(
        credit.advantages[row_map[kept]], dtype=torch.float32, device=mask.device)
    advantages = per_row.unsqueeze(-1) * mask.to(torch.float32)
    return advantages, advantages.clone(), credit


def _credit(method: str, batch: StepBatch, config: CreditConfig, invalid_action_penalty: float) -> CreditResult:
    """The credit of ``batch``; with ``upstream_exact``, GiGPO is verl-agent's own arithmetic
    (:func:`~milegpo.integrations.verl.exact.verl_agent_gigpo`) and G2PO the G2PO code's
    (:func:`~milegpo.credit.g2po.g2po` told the penalty), whatever the env pays on invalid steps.

    The other methods' ``upstream_exact`` statistics assume an invalid step earns no env
    reward; a batch where one does is refused rather than given an episode term that is off.
    """
    if not config.upstream_exact or batch.num_steps == 0:
        return compute_credit(method, batch, config)
    if isinstance(config, GiGPOConfig):
        return verl_agent_gigpo(batch, config, invalid_action_penalty)
    if isinstance(config, G2POConfig):
        return g2po(batch, config, invalid_action_penalty=invalid_action_penalty)
    paid = np.flatnonzero(~batch.valid & (batch.rewards + invalid_action_penalty != 0))
    if len(paid):
        reward = batch.rewards[paid[0]] + invalid_action_penalty
        raise ValueError(f"upstream_exact=True for {method!r}: step {batch.step_idx[paid[0]]} of a trajectory has an "
                         f"invalid action that earned an env reward of {reward:g}, which milegpo's {method!r} cannot "
                         "tell from the invalid-action penalty in verl-agent's row statistics; only "
                         "'milegpo.gigpo' and 'milegpo.g2po' reproduce their reference for such rewards (or drop "
                         "upstream_exact)")
    return compute_credit(method, batch, config)


#: the settings of the running trainer per estimator name, set by :func:`configure` (at trainer construction)
_ACTIVE: dict[str, EstimatorSettings] = {}


def configure(settings: EstimatorSettings, estimator: str) -> None:
    """Use ``settings`` whenever the trainer asks :func:`compute_advantage` for ``estimator``."""
    _ACTIVE[estimator] = settings


def compute_advantage(data: DataProtoLike, adv_estimator: object, *args: object,
                      fallback: Callable[..., object] | None = None, **kwargs: object) -> object:
    """verl-agent's ``compute_advantage(data, adv_estimator, ...)`` for milegpo's estimator names.

    Writes ``data.batch["advantages"]`` and ``["returns"]``, and the credit diagnostics as
    ``credit/*`` numbers to ``data.meta_info["milegpo_credit"]`` (which the installed
    trainer adds to its metrics). The settings are those :func:`configure` recorded from the
    trainer's config; the trainer's keyword arguments (gamma, gigpo mode, ...) were read from
    that same config. Any other estimator name goes to ``fallback`` (the trainer's own function)
    with the arguments unchanged.
    """
    name = str(getattr(adv_estimator, "value", adv_estimator))
    if name not in ESTIMATORS:
        if fallback is None:
            raise ValueError(f"unknown advantage estimator {name!r}; milegpo provides {sorted(ESTIMATORS)}")
        return fallback(data, adv_estimator, *args, **kwargs)
    settings = _ACTIVE.get(name)
    if settings is None:
        raise RuntimeError(f"adv_estimator={name!r} reached compute_advantage in a process where milegpo's "
                           "estimator was not configured: the trainer must be built after "
                           "milegpo.integrations.verl.install() in that process (use "
                           "`python -m milegpo.integrations.verl.main_ppo`, which installs it wherever verl's "
                           "trainer is imported)")
    advantages, returns, credit = compute_step_advantage(
        data, settings.method, settings.credit, success=settings.success,
        invalid_action_penalty=settings.invalid_action_penalty)
    data.batch["advantages"] = advantages
    data.batch["returns"] = returns
    data.meta_info["milegpo_credit"] = credit.log_values()
    return data
