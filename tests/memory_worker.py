"""Worker of tests/test_milestone_memory.py, run under ``torchrun --nproc_per_node 2`` (gloo): ``OUT``.

Three iterations of four task groups, two per rank: each rank credits its own groups with the
milestone memory and the trainer's :func:`milegpo.algos.iteration.remembered_global_credit` gathers
the ranks' counts and advances the memory. Each rank writes ``OUT/rank<r>.json`` (its memory and,
rank 0, the credit it logs of the merged batch); rank 0 also writes ``OUT/one.json``, the same of one
process that has all four groups.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from milegpo.algos import distributed
from milegpo.algos.iteration import RolloutPlan, RolloutState, remembered_global_credit
from milegpo.credit import MileGPOConfig, MilestoneMemory, StepBatch, remembered_credit
from milegpo.credit.memory import milegpo_with_memory

#: each iteration's task seeds of the four groups (rank r plays groups 2r, 2r + 1)
SEEDS = [[11, 12, 13, 14], [13, 11, 15, 12], [14, 15, 11, 13]]
CONFIG = MileGPOConfig(memory_half_life=2.0)


def random_batch(seed: int, n_tasks: int = 4, group_size: int = 6, task_ids: list[int] | None = None) -> StepBatch:
    """Random walks on a small state space per task (states shared across iterations)."""
    rng = random.Random(seed)
    trajectories, success, tasks = [], [], []
    for task in (task_ids if task_ids is not None else list(range(n_tasks))):
        for _ in range(group_size):
            states = ["s0"] + [f"s{rng.randint(0, 6)}" for _ in range(rng.randint(1, 6))]
            trajectories.append(states)
            success.append(states[-1] in ("s5", "s6"))
            tasks.append(task)
    return StepBatch.from_trajectories(trajectories, success=success, task_ids=tasks)


def rank_batch(iteration: int, rank: int, group_size: int = 6) -> StepBatch:
    """Rank ``rank``'s two groups (task ids 0, 1) of ``iteration``: random walks over states s0..s6."""
    return random_batch(100 * iteration + rank, group_size=group_size, task_ids=[0, 1])


def rank_keys(draw: list[int], rank: int) -> dict[int, int]:
    """The task seed of each of rank ``rank``'s groups."""
    return {0: draw[2 * rank], 1: draw[2 * rank + 1]}


def main(out: Path) -> None:
    world = distributed.init_from_environment("cpu")
    state = RolloutState()
    logged: list[list[float]] = []
    for iteration, draw in enumerate(SEEDS):
        plan = RolloutPlan(iteration=iteration, task_seed_base=0, world=world, rollout="lockstep", async_cohorts=2,
                           per_env_sampling=False, credit_method="milegpo", credit_config=CONFIG, policy_version=0)
        batch, keys = rank_batch(iteration, world.rank), rank_keys(draw, world.rank)
        memory = state.credit_memory or MilestoneMemory()
        credit, observed = remembered_credit(batch, CONFIG, memory, keys)
        _, merged_credit = remembered_global_credit(plan, batch, keys, credit, observed, memory, state, 2)
        if merged_credit is not None:
            logged.append(merged_credit.advantages.tolist())
    assert state.credit_memory is not None
    (out / f"rank{world.rank}.json").write_text(json.dumps({"memory": state.credit_memory.to_dict(),
                                                           "logged": logged if world.is_main else None}))
    if world.is_main:
        one, advantages = MilestoneMemory(), []
        for iteration, draw in enumerate(SEEDS):
            whole = StepBatch.concat([rank_batch(iteration, rank) for rank in range(2)], task_offsets=[0, 2])
            result, one = milegpo_with_memory(whole, CONFIG, one, task_keys=dict(enumerate(draw)))
            advantages.append(result.advantages.tolist())
        (out / "one.json").write_text(json.dumps({"memory": one.to_dict(), "logged": advantages}))
    distributed.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
