"""How hard are small TextWorld-Express settings? Random-policy success and gold path length.

A uniform random choice among the admissible commands is what a ``choose``-mode
LLM policy starts near, so its success rate at the horizon tells whether a
setting gives group RL a learning signal (some, not all, of a task's K rollouts
succeed) and room to improve. Per setting: success rate of the random policy
(K rollouts per task, horizon 30), the share of tasks whose group of K has at
least one and not all successes, the number of admissible commands, and the
length of upstream's gold path (without its leading ``look around``; upstream's
paths are not minimal) and of the shortest win found by breadth-first search over
state keys (with a budget of expanded states per task).

    python -m benchmarks.envs.twx_random_policy        # writes benchmarks/results/twx_random_policy.json
"""

from __future__ import annotations

import random
import statistics
from collections import deque

from benchmarks import harness
from milegpo.envs.textworld_express import TextWorldExpressEnv

SETTINGS = {
    "coin-3rooms": ("coin", {"numLocations": 3, "numDistractorItems": 0, "includeDoors": 0}),
    "coin-5rooms-doors": ("coin", {"numLocations": 5, "numDistractorItems": 0, "includeDoors": 1}),
    "cooking-1room-1ingr": ("cookingworld", {"numLocations": 1, "numIngredients": 1, "numDistractorItems": 0,
                                             "includeDoors": 0}),
    "coin-8rooms-doors": ("coin", {"numLocations": 8, "numDistractorItems": 0, "includeDoors": 1}),
}


def shortest_win(env: TextWorldExpressEnv, task: int, max_expansions: int) -> int | None:
    """Length of the shortest winning action sequence (BFS over state keys, replaying from reset), or None."""
    def replay(actions: tuple[str, ...]) -> dict:
        _, info = env.reset(seed=task)
        for action in actions:
            info = env.step(action)[-1]
        return info

    start = replay(())
    seen, frontier = {start["state_key"]}, deque([()])
    while frontier and max_expansions > 0:
        path = frontier.popleft()
        max_expansions -= 1
        for action in replay(path)["admissible_commands"]:
            *_, terminated, _, info = env.step(action)
            if info["won"]:
                return len(path) + 1
            if not terminated and info["state_key"] not in seen:
                seen.add(info["state_key"])
                frontier.append(path + (action,))
            replay(path)
    return None


def measure(game: str, params: dict, split: str, n_tasks: int, group: int, horizon: int, rng: random.Random,
            n_optimal: int, max_expansions: int) -> dict:
    env = TextWorldExpressEnv(game, split=split, game_params=params, gold_path=True, max_episode_steps=horizon)
    wins, gold_lengths, n_commands, mixed_groups = [], [], [], 0
    for task in range(n_tasks):
        task_wins = []
        for _ in range(group):
            _, info = env.reset(seed=task)
            gold = info["gold_actions"]
            done = False
            while not done:
                n_commands.append(len(info["admissible_commands"]))
                _, _, terminated, truncated, info = env.step(rng.choice(info["admissible_commands"]))
                done = terminated or truncated
            task_wins.append(info["won"])
        gold_lengths.append(len(gold) - (gold[:1] == ["look around"]))
        wins += task_wins
        mixed_groups += 0 < sum(task_wins) < group
    search = TextWorldExpressEnv(game, split=split, game_params=params, max_episode_steps=horizon + 1)
    optimal = [shortest_win(search, task, max_expansions) for task in range(min(n_optimal, n_tasks))]
    found = [length for length in optimal if length is not None]
    return {"split": split, "tasks": n_tasks, "group": group, "horizon": horizon,
            "random_success": round(sum(wins) / len(wins), 3),
            "groups_with_signal": round(mixed_groups / n_tasks, 3),
            "gold_length_mean": round(statistics.mean(gold_lengths), 2), "gold_length_max": max(gold_lengths),
            "shortest_length_mean": round(statistics.mean(found), 2) if found else None,
            "shortest_found": f"{len(found)}/{len(optimal)}",
            "admissible_commands_mean": round(statistics.mean(n_commands), 1)}


def main() -> None:
    parser = harness.parser(__doc__, harness.RESULTS / "twx_random_policy.json")
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--horizon", type=int, default=30)
    parser.add_argument("--optimal-tasks", type=int, default=10, help="tasks to search the shortest win for")
    parser.add_argument("--max-expansions", type=int, default=300, help="BFS budget (states expanded) per task")
    args = parser.parse_args()
    rng = random.Random(0)
    results = []
    for name, (game, params) in SETTINGS.items():
        for split in ("train", "eval_ood"):
            row = {"setting": name, "game": game, "game_params": params,
                   **measure(game, params, split, args.tasks, args.group, args.horizon, rng, args.optimal_tasks,
                              args.max_expansions)}
            results.append(row)
            print(f"{name:22s} {split:8s} random success {row['random_success']:.3f}  groups with signal "
                  f"{row['groups_with_signal']:.2f}  gold {row['gold_length_mean']:.1f} (max {row['gold_length_max']})"
                  f"  shortest {row['shortest_length_mean']} ({row['shortest_found']})"
                  f"  commands {row['admissible_commands_mean']:.1f}")
    harness.write_json(args.out, {"results": results})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
