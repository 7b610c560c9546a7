"""The update's loss: PPO-clip policy gradient (token- or action-level ratio), k3 KL to the reference, entropy bonus.

Pure torch on padded ``[B, T]`` tensors of one micro-batch; ``mask`` marks the real units
(the generated tokens of a reply in ``generate`` mode, the one choice in ``choose`` mode).
Every step's advantage is on each of its units. The micro-batch's loss is its share of
the minibatch mean (``n_units`` / ``n_seqs`` count the whole minibatch, over all ranks), so
summing the gradients of all micro-batches gives the minibatch's gradient.

.. math::
    \\rho = e^{\\log\\pi - \\log\\pi_\\text{old}}, \\qquad
    \\ell_\\text{pg} = \\max(-A\\rho,\\ -A\\,\\text{clip}(\\rho, 1 - \\epsilon, 1 + \\epsilon)),

    \\ell = \\ell_\\text{pg} + \\beta\\,(e^{d} - d - 1) - c_H\\,H, \\qquad d = \\log\\pi_\\text{ref} - \\log\\pi

(the k3 estimator of :math:`KL(\\pi \\| \\pi_\\text{ref})`: unbiased, non-negative), aggregated
by ``"token-mean"`` (every unit of the minibatch weighs the same) or
``"seq-mean-token-mean"`` (every step weighs the same, its units averaged first).

``ratio_level="action"`` replaces the per-unit ratio by one ratio per action (the step's reply,
one row), the exponential of the mean log-ratio over its units, clipped once and shared by them
(GAGPO's action-level ratio, the form of GSPO's sequence ratio):

.. math::
    \\rho_i = \\exp\\Big(\\frac{1}{|y_i|} \\sum_{t \\in y_i} \\log\\pi(y_{i,t}) - \\log\\pi_\\text{old}(y_{i,t})\\Big),

and :math:`\\ell_\\text{pg}` above with :math:`\\rho_i` on every unit of action :math:`i`. The KL and
entropy terms, the aggregation and ``approx_kl`` stay per unit. With one unit per action (``choose``
mode) both levels give the same loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch as th


@dataclass
class LossOutput:
    """The micro-batch's loss to backpropagate and its parts (detached floats, minibatch shares)."""

    loss: th.Tensor
    stats: dict[str, float]


def aggregate(values: th.Tensor, mask: th.Tensor, loss_agg: str, n_units: int, n_seqs: int) -> th.Tensor:
    """This micro-batch's share of the minibatch mean of ``values`` (``[B, T]``, masked)."""
    if loss_agg == "token-mean":
        return (values * mask).sum() / max(n_units, 1)
    per_seq = (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
    return per_seq.sum() / max(n_seqs, 1)


def importance_ratio(log_ratio: th.Tensor, mask: th.Tensor, ratio_level: str) -> th.Tensor:
    """``[B, T]`` the ratio on every unit: its own (``"token"``), or its action's, the exponential
    of the mean of ``log_ratio`` over the row's masked units (``"action"``)."""
    if ratio_level == "token":
        return th.exp(log_ratio)
    if ratio_level != "action":
        raise ValueError(f"ratio_level must be 'token' or 'action', got {ratio_level!r}")
    masked = th.where(mask > 0, log_ratio, th.zeros_like(log_ratio))
    per_action = masked.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
    return th.exp(per_action).unsqueeze(1).expand_as(log_ratio)


def policy_loss(logp: th.Tensor, old_logp: th.Tensor, advantages: th.Tensor, mask: th.Tensor, *, clip_range: float,
                n_units: int, n_seqs: int, loss_agg: str = "token-mean", ratio_level: str = "token",
                ref_logp: th.Tensor | None = None, kl_coef: float = 0.0, entropy: th.Tensor | None = None,
                ent_coef: float = 0.0) -> LossOutput:
    """The loss of one micro-batch (see the module docstring).

    :param logp: ``[B, T]`` log-probs of the taken units under the current policy (with grad).
    :param old_logp: ``[B, T]`` their log-probs when sampled.
    :param advantages: ``[B]`` one advantage per step.
    :param mask: ``[B, T]`` 1 for real units.
    :param ratio_level: ``"token"`` (a ratio per unit) or ``"action"`` (one per row, see the module docstring).
    :param ref_logp: ``[B, T]`` reference log-probs (needed when ``kl_coef`` != 0).
    :param entropy: ``[B, T]`` per-unit entropy (used when ``ent_coef`` != 0).
    :returns: the loss and ``loss``, ``pg_loss``, ``clip_fraction``, ``approx_kl`` (and ``kl``,
        ``entropy`` when they are used) as this micro-batch's shares of the minibatch means.
    """
    mask = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype).unsqueeze(1)
    log_ratio = logp - old_logp.to(logp.dtype)
    ratio = importance_ratio(log_ratio, mask, ratio_level)
    pg = th.maximum(-adv * ratio, -adv * th.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range))
    unit_loss = pg
    kl = None
    if kl_coef != 0.0:
        if ref_logp is None:
            raise ValueError("kl_coef != 0 needs the reference log-probs (ref_logp)")
        diff = ref_logp.to(logp.dtype) - logp
        kl = th.exp(diff) - diff - 1.0
        unit_loss = unit_loss + kl_coef * kl
    if ent_coef != 0.0 and entropy is not None:
        unit_loss = unit_loss - ent_coef * entropy
    loss = aggregate(unit_loss, mask, loss_agg, n_units, n_seqs)
    with th.no_grad():
        stats = {
            "loss": float(loss),
            "pg_loss": float(aggregate(pg, mask, loss_agg, n_units, n_seqs)),
            "clip_fraction": float((((ratio - 1.0).abs() > clip_range).to(logp.dtype) * mask).sum()) / max(n_units, 1),
            "approx_kl": float((((th.exp(log_ratio) - 1.0) - log_ratio) * mask).sum()) / max(n_units, 1),
        }
        if kl is not None:
            stats["kl"] = float(aggregate(kl, mask, loss_agg, n_units, n_seqs))
        if ent_coef != 0.0 and entropy is not None:
            stats["entropy"] = float(aggregate(entropy, mask, loss_agg, n_units, n_seqs))
    return LossOutput(loss=loss, stats=stats)


def pad_right(rows: list[np.ndarray], length: int, device: th.device) -> th.Tensor:
    """Per-step unit arrays (e.g. old log-probs) right-padded with zeros to ``[B, length]``."""
    out = np.zeros((len(rows), length), dtype=np.float32)
    for k, row in enumerate(rows):
        if len(row) > length:
            raise ValueError(f"a sample has {len(row)} old log-probs but the policy scored {length} units")
        out[k, : len(row)] = row
    return th.as_tensor(out, device=device)
