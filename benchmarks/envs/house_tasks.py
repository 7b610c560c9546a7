"""Task statistics of milegpo/House-v0 per split: optimal path lengths and random-policy success.

    python -m benchmarks.envs.house_tasks [--episodes 20]

For every task of each split: the optimal (BFS) solution length, and the
success rate of a uniformly random admissible-command policy over
``--episodes`` episodes at the default horizon (30). Also: how often random
episodes fall into the heavy-door trap or the pit. Writes
``benchmarks/results/house_tasks.json``.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from benchmarks import harness
from milegpo.envs.house import SPLITS, HouseEnv, generate_layout, solve


def split_stats(split: str, episodes: int, seed: int = 0) -> dict:
    env = HouseEnv(split=split)
    rng = np.random.default_rng(seed)
    lengths, task_success, types = [], [], Counter()
    trapped = pitted = 0
    for index in range(env.num_tasks):
        layout = generate_layout(split, index)
        lengths.append(len(solve(layout)))
        types[layout.task_type] += 1
        wins = 0
        for _ in range(episodes):
            _, info = env.reset(seed=index)
            done, saw_trap, saw_pit = False, False, False
            while not done:
                obs, _, terminated, truncated, info = env.step(str(rng.choice(info["admissible_commands"])))
                saw_trap |= "slams shut" in obs
                saw_pit |= "deep pit" in obs
                done = terminated or truncated
            wins += info["won"]
            trapped += saw_trap
            pitted += saw_pit
        task_success.append(wins / episodes)
    total = env.num_tasks * episodes
    return {
        "num_tasks": env.num_tasks,
        "random_success_rate": round(float(np.mean(task_success)), 4),
        "tasks_with_random_success": round(float(np.mean(np.array(task_success) > 0)), 3),
        "optimal_length_mean": round(float(np.mean(lengths)), 2),
        "optimal_length_quartiles": [int(q) for q in np.percentile(lengths, [0, 25, 50, 75, 100])],
        "optimal_length_histogram": dict(sorted(Counter(lengths).items())),
        "random_episodes_trapped": round(trapped / total, 3),
        "random_episodes_in_pit": round(pitted / total, 3),
        "task_types": dict(types),
    }


def main() -> None:
    parser = harness.parser(__doc__, harness.RESULTS / "house_tasks.json")
    parser.add_argument("--episodes", type=int, default=20, help="random episodes per task")
    args = parser.parse_args()
    results = {"episodes_per_task": args.episodes, "horizon": HouseEnv().max_episode_steps,
               "splits": {split: split_stats(split, args.episodes) for split in SPLITS}}
    print(f"{'split':<9} {'tasks':>5} {'random success':>14} {'tasks w/ success':>16} {'opt len mean':>12} "
          f"{'min/q1/med/q3/max':>18} {'trapped':>7} {'pit':>5}")
    for split, row in results["splits"].items():
        quart = "/".join(map(str, row["optimal_length_quartiles"]))
        print(f"{split:<9} {row['num_tasks']:>5} {row['random_success_rate']:>14.3f} "
              f"{row['tasks_with_random_success']:>16.2f} {row['optimal_length_mean']:>12.1f} {quart:>18} "
              f"{row['random_episodes_trapped']:>7.2f} {row['random_episodes_in_pit']:>5.2f}")
    harness.write_json(args.out, results)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
