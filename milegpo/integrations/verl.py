"""MileGPO credit as an advantage estimator of verl / verl-agent.

verl-agent trains agents on a **step-level** batch: one row of its ``DataProto`` per
environment step (prompt = the observation with the last few steps of history,
response = the model's reply). At advantage time the batch holds

================================  ======================================================
``non_tensor_batch["uid"]``        the task group (all rollouts of one task share it)
``non_tensor_batch["traj_uid"]``   the trajectory; its rows come in step order
``non_tensor_batch["anchor_obs"]`` the state the step was taken in (text, or any
                                   hashable value the env provides, e.g. a state hash)
``non_tensor_batch["rewards"]``    the env reward of the step
``non_tensor_batch["is_action_valid"]``  whether the action parsed and was admissible
``non_tensor_batch["active_masks"]``     (optional) False for padding rows
``batch["response_mask"]``         (B, L) the reply's tokens
================================  ======================================================

:func:`step_batch_from_verl` turns those columns into a :class:`~milegpo.credit.StepBatch`,
:func:`compute_step_advantage` runs a credit function on it and returns token-level
``advantages`` and ``returns`` of shape (B, L) (the step's advantage on every token of
its reply, like verl's GRPO/GiGPO estimators), and :func:`compute_advantage` is a
drop-in for the ``compute_advantage`` of verl-agent's ``ray_trainer``.
:func:`install` routes verl-agent's trainer to it, so that a run only needs::

    import milegpo.integrations.verl as milegpo_verl
    milegpo_verl.install()                # before the trainer's fit()
    # ... algorithm.adv_estimator=milegpo (or graphgpo, hgpo, milegpo.gigpo, ...)

Choices made here (documented, each one a parameter):

* **success** of a trajectory: its env reward sum reaches ``success_reward`` (10, the
  ALFWorld/WebShop convention of the verl-agent recipes: 10 on success, else 0);
* **invalid actions**: ``invalid_action_penalty`` (verl-agent's
  ``invalid_action_penalty_coef``, 0.1; pass 0 when ``use_invalid_action_penalty`` is
  off) is one more negative reward of the step, exactly as in milegpo's own trainer;
* **s_{t+1}** of a step is the next row's ``anchor_obs``; a failed trajectory's last
  step goes to a state of its own (the final observation is not in the batch) unless
  the rows carry ``next_anchor_obs``; a successful one's goes to the goal node anyway;
* **episode statistics** once per trajectory (``upstream_exact=True`` in the credit
  config restores verl-agent's row-weighted statistics, where a trajectory with more
  turns weighs more).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from milegpo.credit import (
    CREDIT_METHODS,
    CreditResult,
    StepBatch,
    compute_credit,
    make_credit_config,
)

#: ``algorithm.adv_estimator`` names :func:`install` routes to milegpo: the methods verl-agent's
#: core trainer lacks under their own name, and every method under ``milegpo.<method>``.
ESTIMATORS: dict[str, str] = {"milegpo": "milegpo", "graphgpo": "graphgpo", "hgpo": "hgpo",
                              **{f"milegpo.{method}": method for method in CREDIT_METHODS}}

REQUIRED_COLUMNS = ("uid", "traj_uid", "anchor_obs", "rewards")


def _column(data: Any, name: str) -> np.ndarray:
    try:
        return np.asarray(data.non_tensor_batch[name])
    except KeyError:
        raise KeyError(
            f"the batch has no non_tensor_batch[{name!r}]: milegpo credit needs verl-agent's step-level columns "
            f"{REQUIRED_COLUMNS} (collected by its multi-turn rollout loop)") from None


def _hashable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    return value


def step_batch_from_verl(data: Any, *, success_reward: float = 10.0, invalid_action_penalty: float = 0.1
                         ) -> tuple[StepBatch, np.ndarray]:
    """The :class:`~milegpo.credit.StepBatch` of a verl-agent step-level batch, and the
    indices of the batch rows it holds (rows with ``active_masks`` False are left out).

    :param data: a ``verl.DataProto`` (or anything with its ``non_tensor_batch`` dict).
    :param success_reward: a trajectory succeeded iff its env reward sum is at least this.
    :param invalid_action_penalty: subtracted from the reward of a step whose action was invalid.
    """
    uid, traj_uid, anchor = (_column(data, name) for name in ("uid", "traj_uid", "anchor_obs"))
    env_rewards = _column(data, "rewards").astype(np.float64)
    n = len(uid)
    columns = data.non_tensor_batch
    valid = np.asarray(columns["is_action_valid"]).astype(bool) if "is_action_valid" in columns else np.ones(n, bool)
    active = np.asarray(columns["active_masks"]).astype(bool) if "active_masks" in columns else np.ones(n, bool)
    rows = np.flatnonzero(active)

    task_index: dict[Any, int] = {}
    traj_index: dict[Any, int] = {}
    task_ids = np.array([task_index.setdefault(uid[r], len(task_index)) for r in rows], dtype=np.int64)
    traj_ids = np.array([traj_index.setdefault(traj_uid[r], len(traj_index)) for r in rows], dtype=np.int64)
    step_idx = np.zeros(len(rows), dtype=np.int64)
    seen = np.zeros(len(traj_index), dtype=np.int64)
    for k, t in enumerate(traj_ids):  # rows of a trajectory come in step order
        step_idx[k], seen[t] = seen[t], seen[t] + 1
    keys = np.empty(len(rows), dtype=object)
    keys[:] = [_hashable(anchor[r]) for r in rows]

    outcomes = np.bincount(traj_ids, weights=env_rewards[rows], minlength=len(traj_index))
    success = outcomes >= success_reward
    next_keys = np.empty(len(rows), dtype=object)
    last = np.zeros(len(rows), dtype=bool)
    position = {(t, s): k for k, (t, s) in enumerate(zip(traj_ids.tolist(), step_idx.tolist()))}
    given_next = np.asarray(columns["next_anchor_obs"]) if "next_anchor_obs" in columns else None
    for k, (t, s) in enumerate(zip(traj_ids.tolist(), step_idx.tolist())):
        after = position.get((t, s + 1))
        last[k] = after is None
        if after is not None:
            next_keys[k] = keys[after]
        elif given_next is not None:
            next_keys[k] = _hashable(given_next[rows[k]])
        else:
            next_keys[k] = ("<end of trajectory>", t)
    batch = StepBatch(
        task_ids=task_ids, traj_ids=traj_ids, step_idx=step_idx, state_keys=keys, next_state_keys=next_keys,
        actions=np.full(len(rows), "", dtype=object),
        rewards=env_rewards[rows] - invalid_action_penalty * (~valid[rows]),
        valid=valid[rows], dones=last, outcomes=outcomes, success=success,
    )
    return batch, rows


def compute_step_advantage(
    data: Any, method: str = "milegpo", config: Any = None, *, success_reward: float = 10.0,
    invalid_action_penalty: float = 0.1,
) -> tuple[Any, Any, CreditResult]:
    """Token-level ``(advantages, returns, credit)`` of a verl-agent step-level batch.

    :param method: a credit method (:data:`milegpo.credit.CREDIT_METHODS`).
    :param config: the method's config, or a dict of overrides (``{"preset": "webshop"}``,
        ``{"eta": 0.0}``, ``{"upstream_exact": True}``); None: the defaults.
    :returns: two (B, L) float tensors on ``response_mask``'s device (the same values: the
        step advantage on every reply token, 0 on padding and inactive rows), and the
        :class:`~milegpo.credit.CreditResult` with the diagnostics.
    """
    import torch

    batch, rows = step_batch_from_verl(data, success_reward=success_reward,
                                       invalid_action_penalty=invalid_action_penalty)
    if config is None or isinstance(config, Mapping):
        config = make_credit_config(method, **dict(config or {}))
    credit = compute_credit(method, batch, config)
    mask = data.batch["response_mask"]
    per_row = torch.zeros(mask.shape[0], dtype=torch.float32, device=mask.device)
    per_row[torch.as_tensor(rows, device=mask.device)] = torch.as_tensor(credit.advantages, dtype=torch.float32,
                                                                         device=mask.device)
    advantages = per_row.unsqueeze(-1) * mask.to(torch.float32)
    return advantages, advantages.clone(), credit


#: per estimator name, the keyword arguments of :func:`compute_step_advantage` set by :func:`install`
_SETTINGS: dict[str, dict[str, Any]] = {}


def compute_advantage(data: Any, adv_estimator: Any, *args: Any, fallback: Callable[..., Any] | None = None,
                      **kwargs: Any) -> Any:
    """verl-agent's ``compute_advantage(data, adv_estimator, ...)`` for milegpo's estimator names.

    Writes ``data.batch["advantages"]`` and ``["returns"]`` and the credit diagnostics to
    ``data.meta_info["milegpo_credit"]`` (plain numbers: log them with the trainer's
    metrics). Any other estimator name goes to ``fallback`` (the trainer's own function)
    with the arguments unchanged.
    """
    name = getattr(adv_estimator, "value", adv_estimator)
    if name not in ESTIMATORS:
        if fallback is None:
            raise ValueError(f"unknown advantage estimator {name!r}; milegpo provides {sorted(ESTIMATORS)}")
        return fallback(data, adv_estimator, *args, **kwargs)
    method = ESTIMATORS[name]
    settings = _SETTINGS.get(name, {})
    advantages, returns, credit = compute_step_advantage(data, method, **settings)
    data.batch["advantages"] = advantages
    data.batch["returns"] = returns
    data.meta_info["milegpo_credit"] = credit.log_values()
    return data


def install(configs: Mapping[str, Any] | None = None, *, success_reward: float = 10.0,
            invalid_action_penalty: float = 0.1, module: Any = None) -> None:
    """Route verl-agent's trainer to milegpo for the names in :data:`ESTIMATORS`.

    Replaces ``compute_advantage`` in ``module`` (default: ``verl.trainer.ppo.ray_trainer``,
    where verl-agent's ``RayPPOTrainer.fit`` looks it up) by :func:`compute_advantage`,
    which hands every other estimator to the original function. Calling it again updates
    the settings and does not wrap twice.

    :param configs: per estimator name, its credit config or overrides, e.g.
        ``{"milegpo": {"preset": "webshop"}}`` (default: the method's defaults, which for
        MileGPO are the paper's ALFWorld values).
    :param success_reward: see :func:`step_batch_from_verl`.
    :param invalid_action_penalty: verl-agent's ``invalid_action_penalty_coef`` (0 if unused).
    """
    if module is None:
        import importlib

        module = importlib.import_module("verl.trainer.ppo.ray_trainer")
    unknown = sorted(set(configs or {}) - set(ESTIMATORS))
    if unknown:
        raise ValueError(f"no milegpo estimator named {unknown}; the names are {sorted(ESTIMATORS)}")
    _SETTINGS.clear()
    for name in ESTIMATORS:
        _SETTINGS[name] = {"config": (configs or {}).get(name), "success_reward": success_reward,
                           "invalid_action_penalty": invalid_action_penalty}
    original = module.compute_advantage
    original = getattr(original, "__milegpo_fallback__", original)

    def routed(data: Any, adv_estimator: Any, *args: Any, **kwargs: Any) -> Any:
        return compute_advantage(data, adv_estimator, *args, fallback=original, **kwargs)

    routed.__milegpo_fallback__ = original  # type: ignore[attr-defined]
    routed.__doc__ = compute_advantage.__doc__
    module.compute_advantage = routed
