"""Learning on a hub env: MileGPO vs GRPO on TextArena's FrozenLake in choose mode.

TextArena's ``FrozenLake-v0`` (a 4x4 lake, three holes placed by the task seed, start top left, goal
bottom right; reward 1 at the goal, else TextArena's share of the way covered when the game ends;
walking into the edge twice in a row ends it) through the TextArena adapter
(:class:`milegpo.envs.hubs.TextArenaEnv`), 12 moves at most, played by the offline tiny model of the
CPU demo choosing among ``[up]``, ``[down]``, ``[left]``, ``[right]`` from the board alone
(``policy.prompt_template="{observation}"``). A random policy reaches the goal in about 2 % of the
episodes. Both methods share the model, hyperparameters and task draws (``learning_efficiency.json``
plus :data:`SETTINGS`); only the credit differs. Success is measured on held-out lakes (task seeds
training never draws). ``--env gem-guess`` runs GEM's Guess the Number (easy) instead, whose loss
reward (1 - distance of the last guess) is nearly the win's: there success does not rise.

Outputs in ``benchmarks/results/``: ``hub_learning.runs.jsonl`` (a line per finished run, written
as runs finish), ``hub_learning.json``, ``hub_learning.md`` and ``hub_learning.png`` (held-out
success against env steps).

    python -m benchmarks.learning.hub_learning                          # 2 methods x 2 seeds, about 12 min on one core
    python -m benchmarks.learning.hub_learning --seeds 0 --steps 4000   # a quick look
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from benchmarks import harness
from benchmarks.learning import learning_efficiency as le  # the shared runner, report and plot

#: the benchmark's envs: settings (dotted TrainConfig names) on top of the shared ones
ENVS = {
    "gem-guess": {
        "env.id": "milegpo.envs.hubs:GEMEnv",
        "env.kwargs": {"game": "game:GuessTheNumber-v0-easy", "commands": [f"\\boxed{{{n}}}" for n in range(1, 11)],
                       "max_episode_steps": 4},
        "eval.splits": ["held_out"], "env.train_split": None,
    },
    "ta-frozenlake": {
        "env.id": "milegpo.envs.hubs:TextArenaEnv",
        "env.kwargs": {"game": "FrozenLake-v0", "commands": ["[up]", "[down]", "[left]", "[right]"],
                       "max_episode_steps": 12},
        "eval.splits": ["held_out"], "env.train_split": None,
    },
}


#: settings of every run on top of ``learning_efficiency.json`` (a board-only prompt; the sum of a
#: command's token log-probs, the commands differing in one token; a larger step for the short budget)
SETTINGS = {"eval.n_tasks": 25, "eval.copies": 4, "policy.prompt_template": "{observation}",
            "policy.candidate_score": "sum", "algo.learning_rate": 0.01}


def main() -> None:
    parser = harness.parser(__doc__, harness.RESULTS / "hub_learning",
                            "OUT: the results' path without its suffix (OUT.runs.jsonl, OUT.json, OUT.md, OUT.png)")
    parser.add_argument("--env", default="ta-frozenlake", choices=list(ENVS))
    parser.add_argument("--algos", nargs="+", default=["milegpo", "grpo"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--steps", type=int, default=24000, help="env steps per run")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=JSON", help="override shared settings")
    args = parser.parse_args()
    le.ENVS.update(ENVS)
    shared = {**json.loads(Path(le.__file__).with_suffix(".json").read_text()), **SETTINGS}
    shared.update({key: json.loads(value) for key, value in (item.split("=", 1) for item in args.set)})
    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    runs_file = out.with_suffix(".runs.jsonl")
    done = {(r["algo"], r["seed"]) for r in le.read_runs(runs_file)}
    started = time.time()
    for seed in args.seeds:
        for algo in args.algos:
            if (algo, seed) in done:
                continue
            config = {**le.run_values(algo, args.env, seed, shared), "run.total_timesteps": args.steps}
            run_dir = harness.RUNS / out.name / f"{algo}-s{seed}"
            result = le.run_one({"env": args.env, "name": algo, "config": config, "run_dir": str(run_dir)})
            with runs_file.open("a") as f:  # incremental: a killed benchmark resumes from here
                f.write(json.dumps(result) + "\n")
            le.write_report(out, shared)
            print(f"{algo:8s} seed {seed}: curve {[round(p['success_rate'], 2) for p in result['curve']]} "
                  f"final {result['final']} ({result['wall_s']:.0f} s)", flush=True)
    print(out.with_suffix(".md").read_text())
    print(f"wall clock {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
