"""Worker of tests/test_distributed.py, run alone or under ``torchrun --nproc_per_node 2``.

``update MODEL OUT``: every rank plays the same rollout of 4 task groups (same seeds,
one process's semantics), keeps its own groups (rank r: groups 2r, 2r+1 of 2 ranks; all
4 alone), computes their credit, and runs one training call (2 epochs of several
minibatches). Rank 0 writes the LoRA weights and the last minibatch's gradient after
the update, the logged train/* values, credit diagnostics and rollout statistics to OUT
(torch.save of plain tensors and floats).

``crash MODEL OUT``: rank 1 raises in the second iteration of a distributed run.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np
import torch as th
import torch.distributed as dist

from milegpo.algos import MileGPO, distributed
from milegpo.algos.buffer import TextRolloutBuffer
from milegpo.envs.house import HouseEnv
from milegpo.envs.vec_env import make_vec_env

N_TASKS, GROUP_SIZE = 4, 3


def make_model(model_path: str, n_tasks: int, shard: tuple[int, int] = (0, 1)) -> MileGPO:
    env = make_vec_env(HouseEnv, n_tasks=n_tasks, group_size=GROUP_SIZE, seed=0, shard=shard,
                       env_kwargs={"max_episode_steps": 6})
    return MileGPO("LLMPolicy", env, learning_rate=1e-2, batch_size=7, n_epochs=2, kl_coef=0.05, ent_coef=0.01,
                   seed=0, policy_kwargs={"model": model_path, "mode": "choose", "history_length": 0,
                                          "prompt_template": "{observation}", "temperature": 5.0})


def own_groups(buffer: TextRolloutBuffer, rank: int, world: int) -> TextRolloutBuffer:
    """The part of a full rollout that rank ``rank`` of ``world`` would have played."""
    groups, n_envs = N_TASKS // world, N_TASKS // world * GROUP_SIZE
    mine = TextRolloutBuffer(n_envs, buffer.group_ids[:n_envs])
    mine.trajectories = [replace(traj, env_index=i, group=traj.group - rank * groups)
                         for i, traj in enumerate(buffer.trajectories[rank * n_envs : (rank + 1) * n_envs])]
    return mine


def update(model_path: str, out: str) -> None:
    th.set_num_threads(1)
    model = make_model(model_path, N_TASKS)  # no process group yet: a one-process rollout on every rank
    _, callback = model._setup_learn(1, None)
    model.collect_rollouts(model.env, callback, model.rollout_buffer, 0)
    world = distributed.init_from_environment("cpu")
    model.world = world
    buffer = own_groups(model.rollout_buffer, world.rank, world.size)
    credit = buffer.compute_credit(model.credit_method, model.credit_config)
    model.rollout_buffer = buffer
    stats = distributed.reduce_rollout_stats(buffer.stats(), world)
    _, logged = distributed.global_credit(model.credit_method, model.credit_config, buffer.batch, credit,
                                          N_TASKS // world.size, world)
    model.train()
    if world.is_main:
        lora = [(name, p) for name, p in model.policy.model.named_parameters() if p.requires_grad]
        weights = {name: p.detach().clone() for name, p in lora}
        grads = {name: p.grad.detach().clone() for name, p in lora}  # the last minibatch's summed gradient
        train = {k: v for k, v in model.logger.name_to_value.items() if k.startswith("train/")}
        scalars = {k: float(v) for k, v in logged.diagnostics.items() if isinstance(v, (int, float, np.number))}
        th.save({"weights": weights, "grads": grads, "train": train, "diagnostics": scalars, "stats": stats,
                 "n_updates": model._n_updates}, out)
    if world.distributed:
        dist.destroy_process_group()


class CrashOnRank1:
    """A callback raising on rank 1 at the second rollout."""

    def __call__(self, local_vars: dict, global_vars: dict) -> bool:
        model = local_vars["self"]
        if model.world.rank == 1 and model._iterations >= 1:
            raise RuntimeError("rank 1 failed on purpose")
        return True


def crash(model_path: str) -> None:
    th.set_num_threads(1)
    world = distributed.init_from_environment("cpu")
    model = make_model(model_path, N_TASKS // world.size, shard=(world.rank, world.size))
    model.learn(10_000, callback=CrashOnRank1())


if __name__ == "__main__":
    command, model_path, out = sys.argv[1:4]
    if command == "update":
        update(model_path, out)
    else:
        crash(model_path)
