"""Credit quality against ground truth: does each method credit the right steps?

The learning benchmark measures credit *through* a tiny learner, which adds its own
noise. House knows the truth: from any state its BFS solver gives the optimal number
of steps to win, ``d*(s)`` (unsolvable, e.g. behind the heavy door: ``horizon + 1``).
The true quality of a step is its progress ``q_t = d*(s_t) - d*(s_{t+1})``: +1 for
an optimal move, 0 or less for a wasted or harmful one.

Groups of ``K`` rollouts per task are played by the uniform random policy over the
admissible commands (what an untrained agent does), and each method's advantages are
scored on them:

* **pairwise accuracy**: over pairs of steps taken from the *same state* of the same
  task whose true progress differs, the share that the advantage orders the same way
  (ties count one half; 0.5 = no information). This is exactly the choice a policy
  gradient has to learn: which of the actions tried in a state was better.
* **weighted agreement**: ``sum(dA * sign(dq)) / sum(|dA|)`` over the same pairs, in
  [-1, 1]: like the accuracy but each pair weighs by how far apart the advantages put
  it, which is what the gradient sees (a tie broken by 1e-9 counts for nothing).
* **trap credit**: the mean advantage, in units of the method's advantage std, of
  steps that fall into the pit or through the heavy door (the state becomes
  unsolvable or its d* grows by 3 or more), minus that of the other steps taken from
  the same states.

Also MileGPO's ablations (one flag each). Only tasks with at least one success are
scored (without a success every method gives zero credit).

    python benchmarks/credit_quality.py            # 200 tasks x 8, about a minute
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np

from milegpo.algos.credit import StepBatch, compute_credit
from milegpo.envs import make_env

RESULTS = Path(__file__).resolve().parent / "results"

#: (label, credit method, config overrides)
VARIANTS = [
    ("GRPO", "grpo", {}),
    ("GiGPO", "gigpo", {}),
    ("GraphGPO", "graphgpo", {}),
    ("MileGPO", "milegpo", {}),
    ("MileGPO eta=1", "milegpo", {"eta": 1.0}),
    ("MileGPO no RCS (uniform MD)", "milegpo", {"rcs": False}),
    ("MileGPO no PCC", "milegpo", {"pcc": False}),
    ("MileGPO no BCC", "milegpo", {"bcc": False}),
    ("MileGPO no local progress", "milegpo", {"local_progress": False}),
    ("MileGPO no traps", "milegpo", {"traps": False}),
]


def rollout_groups(n_tasks: int, group_size: int, horizon: int, seed: int) -> tuple[StepBatch, np.ndarray, np.ndarray]:
    """Random-policy groups on House train tasks; returns the batch, d*(s_t) and d*(s_{t+1})."""
    env = make_env("milegpo/House-v0", max_episode_steps=horizon)
    rng = random.Random(seed)
    unsolvable = horizon + 1
    trajectories: dict[str, list] = {k: [] for k in ("states", "success", "task_ids", "actions", "rewards", "valid")}
    distances: list[list[int]] = []  # per trajectory, d* of its states s_0 .. s_T
    for task, task_seed in enumerate(rng.sample(range(env.num_tasks), n_tasks)):
        for _ in range(group_size):
            _, info = env.reset(seed=task_seed)
            states, actions, rewards, valid, dists, done = [info["state_key"]], [], [], [], [], False
            while not done:
                plan = [] if info["won"] else env.solve()
                dists.append(len(plan) if plan is not None else unsolvable)
                action = rng.choice(info["admissible_commands"])
                _, reward, terminated, truncated, info = env.step(action)
                done = terminated or truncated
                states.append(info["state_key"])
                actions.append(action)
                rewards.append(reward)
                valid.append(info["valid_action"])
            plan = [] if info["won"] else env.solve()
            dists.append(len(plan) if plan is not None else unsolvable)
            for key, value in (("states", states), ("success", bool(info["won"])), ("task_ids", task),
                               ("actions", actions), ("rewards", rewards), ("valid", valid)):
                trajectories[key].append(value)
            distances.append(dists)
    batch = StepBatch.from_trajectories(**trajectories)
    dist = np.concatenate([d[:-1] for d in distances]).astype(float)
    next_dist = np.concatenate([d[1:] for d in distances]).astype(float)
    return batch, dist, next_dist


def same_state_pairs(batch: StepBatch, progress: np.ndarray, scored: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs (i, j) of steps from the same task and state whose true progress differs."""
    groups: dict[tuple[int, str], list[int]] = {}
    for i in np.flatnonzero(scored):
        groups.setdefault((int(batch.task_ids[i]), batch.state_keys[i]), []).append(i)
    first, second = [], []
    for members in groups.values():
        members = np.array(members)
        i, j = np.triu_indices(len(members), k=1)
        keep = progress[members[i]] != progress[members[j]]
        first.append(members[i][keep])
        second.append(members[j][keep])
    return (np.concatenate(first), np.concatenate(second)) if first else (np.zeros(0, int), np.zeros(0, int))


def pairwise_accuracy(advantages: np.ndarray, progress: np.ndarray, pairs: tuple[np.ndarray, np.ndarray]) -> float:
    i, j = pairs
    agree = np.sign(advantages[i] - advantages[j]) * np.sign(progress[i] - progress[j])
    return float(np.mean(np.where(agree == 0, 0.5, agree > 0)))


def weighted_agreement(advantages: np.ndarray, progress: np.ndarray, pairs: tuple[np.ndarray, np.ndarray]) -> float:
    i, j = pairs
    gap = advantages[i] - advantages[j]
    return float(np.sum(gap * np.sign(progress[i] - progress[j])) / max(np.sum(np.abs(gap)), 1e-12))


def trap_credit(batch: StepBatch, advantages: np.ndarray, trap_steps: np.ndarray, scored: np.ndarray) -> float:
    """Mean (trap step - same-state siblings) advantage in units of the advantage std."""
    scale = advantages[scored].std() or 1.0
    diffs = []
    for i in np.flatnonzero(trap_steps & scored):
        siblings = scored & ~trap_steps & (batch.task_ids == batch.task_ids[i]) & (batch.state_keys == batch.state_keys[i])
        if siblings.any():
            diffs.append((advantages[i] - advantages[siblings].mean()) / scale)
    return float(np.mean(diffs)) if diffs else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--horizon", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()

    per_seed = []
    started = time.time()
    for seed in args.seeds:
        batch, dist, next_dist = rollout_groups(args.tasks, args.group_size, args.horizon, seed)
        progress = dist - next_dist
        solved_tasks = np.unique(batch.task_ids[batch.success[batch.traj_ids]])
        scored = np.isin(batch.task_ids, solved_tasks)
        trap_steps = (next_dist > args.horizon) & (dist <= args.horizon) | (progress <= -3)
        pairs = same_state_pairs(batch, progress, scored)
        row = {"seed": seed, "steps": batch.num_steps, "scored_steps": int(scored.sum()), "pairs": len(pairs[0]),
               "tasks_with_success": len(solved_tasks), "trap_steps": int((trap_steps & scored).sum()), "methods": {}}
        for label, method, overrides in VARIANTS:
            advantages = compute_credit(method, batch, overrides).advantages
            row["methods"][label] = {"pairwise_accuracy": pairwise_accuracy(advantages, progress, pairs),
                                     "weighted_agreement": weighted_agreement(advantages, progress, pairs),
                                     "trap_credit": trap_credit(batch, advantages, trap_steps, scored)}
        per_seed.append(row)
        print(f"seed {seed}: {row['tasks_with_success']}/{args.tasks} tasks with a success, {row['pairs']} same-state pairs")

    summary = {}
    for label, _, _ in VARIANTS:
        summary[label] = {metric: {"mean": float(np.nanmean([r["methods"][label][metric] for r in per_seed])),
                                   "std": float(np.nanstd([r["methods"][label][metric] for r in per_seed]))}
                          for metric in ("pairwise_accuracy", "weighted_agreement", "trap_credit")}
    report = {"env": "milegpo/House-v0 (train split)", "policy": "uniform random over admissible commands",
              "tasks": args.tasks, "group_size": args.group_size, "horizon": args.horizon, "seeds": args.seeds,
              "wall_s": time.time() - started, "summary": summary, "per_seed": per_seed}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "credit_quality.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = ["| credit | same-state pairwise accuracy (0.5 = chance) | weighted agreement (0 = chance) "
             "| trap-step credit vs siblings (std units) |", "|---|---|---|---|"]
    for label, values in summary.items():
        acc, weighted, trap = values["pairwise_accuracy"], values["weighted_agreement"], values["trap_credit"]
        lines.append(f"| {label} | {acc['mean']:.3f} ± {acc['std']:.3f} | {weighted['mean']:.3f} ± {weighted['std']:.3f} "
                     f"| {trap['mean']:+.2f} ± {trap['std']:.2f} |")
    (RESULTS / "credit_quality.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wall clock {report['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
