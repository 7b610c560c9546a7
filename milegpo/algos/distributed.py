"""Data parallelism over task groups with ``torch.distributed`` (torchrun, gloo on CPU, NCCL on GPU).

Credit is computed per task, so each process (*rank*) owns whole task groups: it
runs its own envs, sampler and credit, and only these cross processes:

* the rollout's env-step count and episode statistics (:func:`reduce_rollout_stats`);
* each rank's :class:`~milegpo.credit.StepBatch`, gathered on rank 0 for the
  credit diagnostics and the trajectory plot (rank 0 logs those of the global batch);
* each row's token and unit counts, so that every rank cuts the *global* batch into
  the same minibatches (:meth:`milegpo.algos.buffer.TextRolloutBuffer.get`) and normalises its loss by the
  global minibatch size;
* the LoRA gradients, summed (:func:`all_reduce_gradients`), so every rank applies
  the same update: N ranks on a global batch give the weights 1 rank gives.

Launch with ``torchrun --nproc_per_node N -m milegpo train ...``; the Python API
works the same inside any script whose process group is initialised
(:func:`init_from_environment` does it from torchrun's variables).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch as th
import torch.distributed as dist

from milegpo.credit import StepBatch, compute_credit

#: How long a rank waits in a collective for the others (rank 0 evaluates while they wait).
DEFAULT_TIMEOUT_S = 1800


@dataclass(frozen=True)
class World:
    """This process's place: ``rank`` of ``size`` processes (``size`` 1 without a process group)."""

    rank: int = 0
    size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def current_world() -> World:
    """The initialised process group's rank and size, else a single process."""
    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size())
    return World()


def launched_by_torchrun() -> bool:
    """Whether torchrun (or another launcher setting ``WORLD_SIZE``) started several processes."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def group_initialized() -> bool:
    """Whether a torch.distributed process group exists in this process."""
    return dist.is_available() and dist.is_initialized()


def barrier(world: World) -> None:
    """Wait until every rank got here (a no-op for one process)."""
    if world.distributed:
        dist.barrier()


def shutdown() -> None:
    """Destroy this process's process group, if any (before the process exits)."""
    if group_initialized():
        dist.destroy_process_group()


def init_from_environment(device: str = "auto", timeout_s: float = DEFAULT_TIMEOUT_S) -> World:
    """Initialise the process group from torchrun's variables (NCCL when this rank uses CUDA, else gloo).

    A no-op for a single process or an already initialised group. On CUDA each rank
    takes the GPU of its ``LOCAL_RANK``.
    """
    if not launched_by_torchrun() or dist.is_initialized():
        return current_world()
    use_cuda = th.cuda.is_available() and not str(device).startswith("cpu")
    if use_cuda:
        th.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=datetime.timedelta(seconds=timeout_s))
    return current_world()


def rank_device(device: str, world: World) -> str:
    """The device of this rank: ``cuda`` / ``auto`` become ``cuda:LOCAL_RANK`` under torchrun."""
    if world.distributed and th.cuda.is_available() and device in ("auto", "cuda"):
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return device


def broadcast_parameters(params: Sequence[th.Tensor], world: World) -> None:
    """Give every rank rank 0's values of ``params`` (the LoRA weights at the start)."""
    if world.distributed:
        for param in params:
            dist.broadcast(param.data, src=0)


def all_reduce_gradients(params: Sequence[th.nn.Parameter], world: World) -> None:
    """Sum the gradients of ``params`` over ranks, in one flat buffer (missing gradients count as 0)."""
    if not world.distributed:
        return
    grads = [p.grad if p.grad is not None else th.zeros_like(p) for p in params]
    flat = th.cat([g.reshape(-1).float() for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for param, grad in zip(params, grads):
        n = grad.numel()
        param.grad = flat[offset : offset + n].view_as(grad).to(grad.dtype)
        offset += n


def all_reduce_sum(values: Sequence[float], world: World) -> list[float]:
    """Sum a few numbers over ranks (float64)."""
    if not world.distributed:
        return [float(v) for v in values]
    tensor = th.tensor(list(values), dtype=th.float64)
    dist.all_reduce(tensor)
    return tensor.tolist()


def all_gather_objects(value: Any, world: World) -> list[Any]:
    """Every rank's ``value``, in rank order."""
    if not world.distributed:
        return [value]
    out: list[Any] = [None] * world.size
    dist.all_gather_object(out, value)
    return out


def broadcast_from_main(value: Any, world: World) -> Any:
    """Rank 0's ``value`` on every rank (what rank 0 decided: a folder, a checkpoint)."""
    if not world.distributed:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_to_main(value: Any, world: World) -> list[Any] | None:
    """Every rank's ``value`` on rank 0 (in rank order), None on the others."""
    if not world.distributed:
        return [value]
    out: list[Any] | None = [None] * world.size if world.is_main else None
    dist.gather_object(value, out, dst=0)
    return out


def merge_step_batches(batches: Sequence[StepBatch], groups_per_rank: int) -> StepBatch:
    """One StepBatch of the ranks' batches (rank order), task ids offset by ``groups_per_rank``
    per rank: the batch a single process with all the groups would have built."""
    return StepBatch.concat(batches, task_offsets=[r * groups_per_rank for r in range(len(batches))])


def global_credit(method: str, config: Any, batch: StepBatch | None, credit: Any, groups_per_rank: int,
                  world: World) -> tuple[StepBatch | None, Any]:
    """The batch and credit result to log: this rollout's own, or, with several ranks, on rank 0
    those of every rank's groups together (the diagnostics one process would log; credit is per
    task, so the advantages each rank trains on are the same either way). Others get (None, None).
    ``credit`` is None where this rank's rollout had no steps."""
    if not world.distributed:
        return batch, credit
    batches = [b for b in gather_to_main(batch if credit is not None else None, world) or [] if b is not None]
    if not batches:
        return None, None
    merged = merge_step_batches(batches, groups_per_rank)
    return merged, compute_credit(method, merged, config)


def reduce_rollout_stats(stats: dict[str, float], world: World) -> dict[str, float]:
    """The rollout statistics of all ranks' episodes together: means weighted by episodes
    (invalid-action rate by steps), counts summed."""
    if not world.distributed:
        return dict(stats)
    episodes, steps = stats["episodes"], stats["steps"]
    per_episode = ("success_rate", "ep_rew_mean", "ep_len_mean", "score_mean")
    sums = all_reduce_sum([episodes, steps, stats["env_errors"], stats["invalid_action_rate"] * steps,
                           *[stats[k] * episodes for k in per_episode]], world)
    total_episodes, total_steps = sums[0], sums[1]
    reduced = {"episodes": int(total_episodes), "steps": int(total_steps), "env_errors": int(sums[2]),
               "invalid_action_rate": sums[3] / max(total_steps, 1)}
    reduced.update({k: s / max(total_episodes, 1) for k, s in zip(per_episode, sums[4:])})
    return reduced
