"""One optimizer step of the update: micro-batched forward passes, the loss, the gradient step.

The trainer (:meth:`GroupRLAlgorithm.train`) hands its buffer's minibatches to
:func:`run_update`, which calls :func:`optimizer_step` on each. A minibatch is cut into micro-batches of similar lengths
(less padding) of at most ``micro_batch_tokens`` tokens (:func:`micro_batches`: a chat
conversation's turns go together, costing the tokens of its longest turn, the one pass that scores
them all); their gradients add up to the minibatch's (each micro-batch's loss is its share of the minibatch mean, see
:mod:`milegpo.algos.loss`). With several ranks the gradients and statistics are summed
over ranks before the step, so every rank applies the same step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch as th

from milegpo.algos import distributed
from milegpo.algos.buffer import RolloutMinibatch, split_by_tokens
from milegpo.algos.distributed import World
from milegpo.algos.loss import pad_right, policy_loss
from milegpo.contracts import TrainablePolicy

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class UpdateSettings:
    """The algorithm's update hyperparameters (see :class:`GroupRLAlgorithm`)."""

    clip_range: float
    loss_agg: str
    kl_coef: float
    ent_coef: float
    max_grad_norm: float
    micro_batch_tokens: int
    ratio_level: str


@dataclass
class UpdateReport:
    """What one update did: optimizer steps taken and skipped (non-finite), tokens, seconds,
    and the mean of each loss statistic over the applied steps."""

    steps: int = 0
    skipped: int = 0
    tokens: int = 0
    seconds: float = 0.0
    means: dict[str, float] = field(default_factory=dict)


def run_update(policy: TrainablePolicy, optimizer: th.optim.Optimizer, minibatches: Iterable[RolloutMinibatch],
               settings: UpdateSettings, world: World, where: str = "") -> UpdateReport:
    """One optimizer step per minibatch (empty ones are passed over); the statistics of the
    applied steps averaged. ``tokens`` are this rank's."""
    report, sums = UpdateReport(), dict[str, float]()
    start = time.perf_counter()
    for minibatch in minibatches:
        if minibatch.n_seqs == 0:
            continue
        ok, info = optimizer_step(policy, optimizer, minibatch, settings, world, where)
        report.steps += 1
        report.skipped += not ok
        report.tokens += int(minibatch.tokens.sum())
        for key, value in info.items():
            sums[key] = sums.get(key, 0.0) + value
    report.seconds = time.perf_counter() - start
    applied = max(report.steps - report.skipped, 1)
    report.means = {key: value / applied for key, value in sums.items()}
    return report


def optimizer_step(policy: TrainablePolicy, optimizer: th.optim.Optimizer, minibatch: RolloutMinibatch,
                   settings: UpdateSettings, world: World, where: str = "") -> tuple[bool, dict[str, float]]:
    """One optimizer step on ``minibatch`` (gradients accumulated over micro-batches of
    ``settings.micro_batch_tokens``).

    ``n_units`` / ``n_seqs`` are the units and rows of the whole minibatch, over all ranks:
    each rank's loss is its share of the global mean, and the summed gradients are
    those of the global minibatch. Returns whether the step was applied and its
    statistics. A non-finite loss or gradient norm skips the step (nothing is
    applied, on every rank) with a warning.
    """
    optimizer.zero_grad(set_to_none=True)
    sums = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip_fraction": 0.0, "approx_kl": 0.0}
    with_entropy = settings.ent_coef != 0.0
    n_units, n_seqs = minibatch.n_units, minibatch.n_seqs
    for micro in micro_batches(minibatch, settings.micro_batch_tokens):
        batch = [minibatch.samples[k] for k in micro]
        logp, mask, entropy = policy.evaluate_actions(batch, with_entropy=with_entropy)
        ref_logp = None
        if settings.kl_coef != 0.0:
            with th.no_grad():
                ref_logp, _, _ = policy.evaluate_actions(batch, use_reference=True)
        old = pad_right([np.asarray(s.old_logprobs, dtype=np.float32) for s in batch], logp.shape[1], logp.device)
        out = policy_loss(logp, old, th.as_tensor(minibatch.advantages[micro], device=logp.device), mask,
                          clip_range=settings.clip_range, n_units=n_units, n_seqs=n_seqs, loss_agg=settings.loss_agg,
                          ratio_level=settings.ratio_level, ref_logp=ref_logp, kl_coef=settings.kl_coef,
                          entropy=entropy, ent_coef=settings.ent_coef)
        out.loss.backward()
        for key, value in out.stats.items():
            sums[key] += value
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if world.distributed:
        distributed.all_reduce_gradients(params, world)
        sums = dict(zip(sums, distributed.all_reduce_sum(list(sums.values()), world)))
    grad_norm = float(th.nn.utils.clip_grad_norm_(params, settings.max_grad_norm))
    if not (np.isfinite(sums["loss"]) and np.isfinite(grad_norm)):
        optimizer.zero_grad(set_to_none=True)
        logger.warning("non-finite loss (%s) or gradient norm (%s) at %s: optimizer step skipped; the usual "
                       "causes are a learning rate or LoRA scale (alpha / r) too large, or a float16 overflow",
                       sums["loss"], grad_norm, where or "an update")
        return False, {}
    optimizer.step()
    if settings.kl_coef == 0.0:
        sums.pop("kl")
    if not with_entropy:
        sums.pop("entropy")
    return True, {**sums, "grad_norm": grad_norm}


def micro_batches(minibatch: RolloutMinibatch, budget: int) -> list[np.ndarray]:
    """The minibatch's positions in micro-batches of at most ``budget`` tokens, for gradient accumulation.

    The unit is a *piece*: the consecutive rows of one conversation (``minibatch.conversations``;
    a row of its own without). A piece is scored in one forward pass over its last turn, so it
    costs that turn's tokens and is never split (a piece larger than the budget gets a
    micro-batch of its own, as a row larger than the budget always did). Pieces are packed in
    order of cost, similar lengths together (less padding). With one row per piece this is the
    row packing of before: rows sorted by tokens (stable), cut by :func:`split_by_tokens`.
    """
    n = len(minibatch.tokens)
    conversations = minibatch.conversations if minibatch.conversations is not None else np.arange(n)
    starts = np.flatnonzero(np.r_[True, conversations[1:] != conversations[:-1]]) if n else np.zeros(0, np.int64)
    cost = np.maximum.reduceat(minibatch.tokens, starts) if n else np.zeros(0, np.int64)
    if len(starts) == n:
        return split_by_tokens(np.argsort(cost, kind="stable"), cost, budget)
    ends = np.r_[starts[1:], n]
    return [np.concatenate([np.arange(starts[k], ends[k]) for k in chunk])
            for chunk in split_by_tokens(np.argsort(cost, kind="stable"), cost, budget)]

