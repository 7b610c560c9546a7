"""The two credit plots a run writes, on a fixed example, for the docs.

Plays 16 House tasks x 8 random rollouts (seed 0), computes every method's credit, and writes
``benchmarks/results/trajectory_credit_example.png`` (one successful trajectory's per-step
credit under each method: what ``trajectory_credit.png`` of a run folder shows) from that
batch.

    python -m benchmarks.credit.credit_plots
"""

from __future__ import annotations

import random

from benchmarks import harness
from milegpo.credit import StepBatch
from milegpo.envs import make_vec_env
from milegpo.run.plots import pick_trajectory, plot_trajectory_credit


def random_house_batch(n_tasks: int = 16, group: int = 8, seed: int = 0) -> StepBatch:
    """Grouped rollouts of uniformly random admissible commands on House, as a StepBatch."""
    rng = random.Random(seed)
    env = make_vec_env("milegpo/House-v0", n_tasks=n_tasks, group_size=group, seed=seed,
                       env_kwargs={"max_episode_steps": 30})
    env.reset()
    infos = env.reset_infos
    keys = [[info["state_key"]] for info in infos]
    actions_taken: list[list[str]] = [[] for _ in infos]
    rewards: list[list[float]] = [[] for _ in infos]
    valid: list[list[bool]] = [[] for _ in infos]
    won = [False] * len(infos)
    while env.active.any():
        active = env.active
        actions = [rng.choice(info["admissible_commands"]) if active[i] else "" for i, info in enumerate(infos)]
        _, step_rewards, _, new_infos = env.step(actions)
        for i in range(len(infos)):
            if active[i]:
                keys[i].append(new_infos[i]["state_key"])
                actions_taken[i].append(actions[i])
                rewards[i].append(float(step_rewards[i]))
                valid[i].append(bool(new_infos[i]["valid_action"]))
                won[i] = bool(new_infos[i]["won"])
        infos = new_infos
    env.close()
    return StepBatch.from_trajectories(keys, won, task_ids=[i // group for i in range(len(keys))],
                                       actions=actions_taken, rewards=rewards, valid=valid)


def main() -> None:
    args = harness.parser(__doc__, harness.RESULTS / "trajectory_credit_example.png").parse_args()
    batch = random_house_batch()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    plot_trajectory_credit(batch, pick_trajectory(batch), args.out,
                           title="House, random rollouts (16 tasks x 8, seed 0)")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
