"""Credit quality of MileGPO's milestone memory against ground truth, over groups drawn in a training sequence.

``credit_quality.py`` scores independent groups; the memory (:mod:`milegpo.credit.memory`) needs a
task's earlier groups. Here each seed plays a *sequence*: ``--iterations`` iterations, each drawing
``--per-iteration`` tasks from a pool of ``--pool`` train tasks (pool and draws seeded by the seed)
and playing ``K`` rollouts of each with the uniform random policy over the admissible commands
(``credit_quality.py``'s random-policy groups, with its trackers and rollouts). Every method
credits each iteration's batch (task ids = task seeds, stable across iterations); MileGPO with
memory carries one memory per half-life and regime through the sequence.

Scoring is ``credit_quality.py``'s: same-true-state pairs of steps whose true progress differs, in
the tasks with a success in the current group; **pairwise accuracy** (ties one half) and
**weighted agreement**, each pooled over the sequence's pairs per seed; both state-key regimes
(``env``, ``observation``) on the same rollouts. ``accuracy_unsolved`` is the pairwise accuracy on
the pairs of groups *without* a success (GraphGPO's step credit is zero there; MileGPO's trap
potential and the memory's remembered milestones still shape them), reported only.

Per seed the memory's run diagnostics are kept: the task recurrence rate, the mean share of
evidence from memory, and bytes per remembered task at the end.

The protocol (docs/concepts/milestone-memory.md, committed before these runs): tuning on House and
TWX coin, seeds 0-2, half-lives 2, 8, inf; the chosen half-life is the one with the highest mean
Δ(memory − MileGPO) over envs × regimes × the two metrics, the shortest among those within 0.002 of
the best (:func:`chosen_half_life`); then ALFWorld and WebShop with it, seeds 0-4, once.

    python -m benchmarks.credit.memory_quality --stage tuning --envs house coin --seeds 0 1 2
    python -m benchmarks.credit.memory_quality --stage heldout --envs alfworld webshop --seeds 0 1 2 3 4
    python -m benchmarks.credit.memory_quality --tables-only

Then the same held-out scoring over a *learning* policy's groups: the learning benchmark's
``milegpo_memory`` runs of ALFWorld and WebShop (random init and warm start, seeds 0-4, trained with
``--set run.keep_batch_every=1``), every iteration's groups replayed with the ground truth
(:mod:`run_groups`), the methods crediting them in the run's order; the memory's evidence there is
what the run's own memory had (the ``env`` regime is the one the runs trained with). The random-init
runs are those of ``learning_efficiency_paper_envs`` trained again with every batch kept (the first
command writes a throwaway runs file; its curves and finals are the committed ones), the warm-start
runs those of ``learning_efficiency_warm_start_memory`` (its command is in learning_efficiency.py)::

    python -m benchmarks.learning.learning_efficiency --envs alfworld webshop --algos milegpo_memory \
        --seeds 0 1 2 3 4 --workers 1 --set run.keep_batch_every=1 \
        --out benchmarks/runs/memory_groups/learning_efficiency_paper_envs
    python -m benchmarks.credit.memory_quality --stage heldout-learning-random-init --envs alfworld webshop \
        --seeds 0 1 2 3 4 --runs-folder benchmarks/runs/learning_efficiency_paper_envs
    python -m benchmarks.credit.memory_quality --stage heldout-learning-warm-start --envs alfworld webshop \
        --seeds 0 1 2 3 4 --runs-folder benchmarks/runs/learning_efficiency_warm_start_memory

The tables end with the task recurrence a learning benchmark run would see (:func:`learning_recurrence`).

Each seed is filed in ``benchmarks/results/memory_quality.json`` when done; the tables go to
``memory_quality.md``.
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import numpy as np

from benchmarks.credit import credit_quality as cq
from benchmarks.credit import ground_truth, run_groups
from benchmarks.harness import RESULTS, parser, write_json, write_text
from benchmarks.learning import learning_efficiency
from milegpo.credit import MilestoneMemory, compute_credit, make_credit_config
from milegpo.credit.memory import TaskCounts, milegpo_with_memory

TUNING_HALF_LIVES = (2.0, 8.0, math.inf)
#: the held-out stages over a learning policy's groups (:mod:`run_groups`): stage -> the runs' start
LEARNING_STAGES = {"heldout-learning-random-init": "random init", "heldout-learning-warm-start": "warm start"}
METRICS = ("pairwise_accuracy", "weighted_agreement")
WITHIN = 0.002  # the protocol's tie margin


def memory_label(half_life: float) -> str:
    return f"memory h={'inf' if math.isinf(half_life) else f'{half_life:g}'}"


def play_sequence(env_name: str, seed: int, pool: int, per_iteration: int, iterations: int,
                  group_size: int) -> list[cq.Groups]:
    """The sequence's groups, one :class:`credit_quality.Groups` per iteration (task ids = task seeds)."""
    env, tracker_factory = ground_truth.make(env_name)
    horizon = env.max_episode_steps
    rng = random.Random(seed)
    tasks = rng.sample(range(env.num_tasks), min(pool, env.num_tasks))
    trackers: dict[int, ground_truth.Tracker] = {}
    sequence = []
    for _ in range(iterations):
        played = []
        for task_seed in rng.sample(tasks, min(per_iteration, len(tasks))):
            tracker = trackers.setdefault(task_seed, tracker_factory(env, task_seed))
            for _ in range(group_size):
                rollout = cq.Rollout.start(env, tracker, task_seed)
                while not rollout.done:
                    rollout.step(cq.random_actor(rng, env, rollout.observation, rollout.info, rollout.history))
                played.append((task_seed, rollout))
        sequence.append(cq.as_groups(played, horizon))
    env.close()
    return sequence


class Pooled:
    """A method's pair gaps and the truth's signs, pooled over a sequence."""

    def __init__(self) -> None:
        self.gaps: list[np.ndarray] = []
        self.truth: list[np.ndarray] = []
        self.unsolved: list[np.ndarray] = []

    def add(self, advantages: np.ndarray, progress: np.ndarray, pairs, unsolved_pairs) -> None:
        i, j = pairs
        self.gaps.append(advantages[i] - advantages[j])
        self.truth.append(np.sign(progress[i] - progress[j]))
        self.unsolved.append(cq.pair_scores(advantages, progress, unsolved_pairs))

    def scores(self) -> dict:
        gap, truth = np.concatenate(self.gaps), np.concatenate(self.truth)
        agree = np.sign(gap) * truth
        unsolved = np.concatenate(self.unsolved)
        return {"pairwise_accuracy": float(np.mean(np.where(agree == 0, 0.5, (agree > 0).astype(float))))
                if len(gap) else float("nan"),
                "weighted_agreement": float(np.sum(gap * truth) / max(np.sum(np.abs(gap)), 1e-12)),
                "accuracy_unsolved": float(np.mean(unsolved)) if len(unsolved) else float("nan")}


def score_sequence(env_name: str, sequence: list[cq.Groups], half_lives: tuple[float, ...],
                   state_keys: tuple[str, ...]) -> dict:
    """Every method's pooled scores per regime, the pairs, and the memories' diagnostics."""
    preset = cq.variant_config(env_name, "milegpo", {})
    mile_config = make_credit_config("milegpo", **preset)
    memory_configs = {memory_label(h): make_credit_config("milegpo", **preset, memory_half_life=h)
                      for h in half_lives}
    row: dict = {"regimes": {}}
    for state_key in state_keys:
        pooled = {label: Pooled() for label in ("GraphGPO", "MileGPO", *memory_configs)}
        memories = {label: MilestoneMemory() for label in memory_configs}
        shares: dict[str, list[float]] = {label: [] for label in memory_configs}
        pairs_total = unsolved_total = 0
        for groups in sequence:
            truth = groups.batch("env")
            task_ids, true_keys = truth.task_ids, truth.state_keys
            progress = groups.dist - groups.next_dist
            solved = np.isin(task_ids, np.unique(task_ids[truth.success[truth.traj_ids]]))
            pairs = cq.same_state_pairs(task_ids, true_keys, progress, solved)
            unsolved_pairs = cq.same_state_pairs(task_ids, true_keys, progress, ~solved)
            pairs_total += len(pairs[0])
            unsolved_total += len(unsolved_pairs[0])
            batch = groups.batch(state_key)
            pooled["GraphGPO"].add(compute_credit("graphgpo", batch).advantages, progress, pairs, unsolved_pairs)
            pooled["MileGPO"].add(compute_credit("milegpo", batch, mile_config).advantages, progress, pairs,
                                  unsolved_pairs)
            for label, config in memory_configs.items():
                result, memories[label] = milegpo_with_memory(batch, config, memories[label])
                pooled[label].add(result.advantages, progress, pairs, unsolved_pairs)
                shares[label].append(result.diagnostics["memory_evidence_share"])
        row["regimes"][state_key] = {
            "methods": {label: p.scores() for label, p in pooled.items()},
            "memory": {label: {"recurrence_rate": memories[label].recurrence_rate,
                               "evidence_share_mean": float(np.mean(shares[label])),
                               "bytes_per_task": memories[label].nbytes / max(len(memories[label].tasks), 1)}
                       for label in memory_configs}}
        row["pairs"], row["unsolved_pairs"] = pairs_total, unsolved_total
    row["steps"] = int(sum(g.batch("env").num_steps for g in sequence))
    row["trajectories"] = int(sum(len(g.success) for g in sequence))
    row["success_rate"] = float(np.mean([s for g in sequence for s in g.success]))
    row["success_by_iteration"] = [float(np.mean(g.success)) for g in sequence]
    return row


#: the learning benchmark's train splits (learning_efficiency.py's env settings): tasks, env-step budget
LEARNING_SPLITS = {"house": (1000, 12_000), "coin": (1000, 12_000), "webshop": (396, 8_000),
                   "alfworld": (48, 8_000), "alfworld-all": (144, 8_000)}


def learning_recurrence(data: dict, half_life: float, runs: int = 20) -> dict:
    """The task recurrence a learning benchmark run would see: its vec env draws 4 distinct tasks per
    iteration from the train split (``env.n_tasks`` 4, ``K`` 8), for budget / (32 x mean episode length)
    iterations (the random policy's episode length, from this file's sequences; ALFWorld's for both
    ALFWorld settings), through a :class:`MilestoneMemory` of ``half_life`` fed each group's 8 trajectories."""
    lengths = {}
    for name, stage in data["stages"].items():
        if name in LEARNING_STAGES:  # a learning policy's episodes, not the random policy's
            continue
        for env_name, seeds in stage["envs"].items():
            groups = [r["steps"] / r["trajectories"] for r in seeds.values() if "trajectories" in r]
            if groups:
                lengths[env_name] = float(np.mean(groups))
    config = make_credit_config("milegpo", memory_half_life=half_life)
    empty = TaskCounts((), np.zeros((0, 3)), (), np.zeros((0, 2)), 8.0, 0.0)
    out = {}
    for env_name, (num_tasks, budget) in LEARNING_SPLITS.items():
        length = lengths.get(env_name.split("-")[0])
        if length is None:
            continue
        iterations = max(int(budget / (32 * length)), 1)
        rates = []
        for run in range(runs):
            rng, memory = np.random.default_rng(run), MilestoneMemory()
            for _ in range(iterations):
                draw = rng.choice(num_tasks, size=min(4, num_tasks), replace=False)
                memory = memory.advance([(int(task), empty) for task in draw], config)
            rates.append(memory.recurrence_rate)
        out[env_name] = {"train_tasks": num_tasks, "budget": budget, "episode_length": length,
                         "iterations": iterations, "recurrence_rate": float(np.mean(rates))}
    return out


def load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"stages": {}}


def interval(values: list[float], base: list[float]) -> dict:
    """Paired difference over seeds: mean, 95 % t interval, verdict (ahead / level / behind)."""
    diff = np.array(values, dtype=float) - np.array(base, dtype=float)
    diff = diff[np.isfinite(diff)]
    if len(diff) < 3:
        return {"mean": float(diff.mean()) if len(diff) else float("nan"), "low": float("nan"),
                "high": float("nan"), "n": len(diff), "verdict": "too few seeds"}
    half = learning_efficiency.t_quantile(len(diff) - 1) * diff.std(ddof=1) / math.sqrt(len(diff))
    low, high = float(diff.mean() - half), float(diff.mean() + half)
    return {"mean": float(diff.mean()), "low": low, "high": high, "n": len(diff),
            "verdict": "ahead" if low > 0 else "behind" if high < 0 else "level"}


def comparisons(stage: dict) -> list[dict]:
    """Per env, regime, memory variant and metric: Δ(memory − MileGPO) and Δ(memory − GraphGPO)."""
    out = []
    for env_name, seeds in stage["envs"].items():
        rows = [seeds[s] for s in sorted(seeds, key=int)]
        for regime in rows[0]["regimes"]:
            labels = [m for m in rows[0]["regimes"][regime]["methods"] if m.startswith("memory")]
            for label in labels:
                for metric in (*METRICS, "accuracy_unsolved"):
                    of = dict.fromkeys(("GraphGPO", "MileGPO", label))
                    for method in of:
                        of[method] = [r["regimes"][regime]["methods"][method][metric] for r in rows]
                    memory = [r["regimes"][regime]["memory"][label] for r in rows]
                    out.append({"env": env_name, "regime": regime, "variant": label, "metric": metric,
                                "seeds": len(rows), "graphgpo": float(np.nanmean(of["GraphGPO"])),
                                "milegpo": float(np.nanmean(of["MileGPO"])), "memory": float(np.nanmean(of[label])),
                                "vs_milegpo": interval(of[label], of["MileGPO"]),
                                "vs_graphgpo": interval(of[label], of["GraphGPO"]),
                                "milegpo_vs_graphgpo": interval(of["MileGPO"], of["GraphGPO"]),
                                "recurrence_rate": float(np.mean([m["recurrence_rate"] for m in memory])),
                                "evidence_share": float(np.mean([m["evidence_share_mean"] for m in memory])),
                                "bytes_per_task": float(np.mean([m["bytes_per_task"] for m in memory])),
                                "pairs_per_seed": float(np.mean([r["pairs"] for r in rows]))})
    return out


def chosen_half_life(tuning: dict) -> tuple[str, dict[str, float]]:
    """The protocol's rule: the highest mean Δ(memory − MileGPO) over envs × regimes × the two metrics;
    the shortest half-life within :data:`WITHIN` of the best."""
    means: dict[str, list[float]] = {}
    for c in comparisons(tuning):
        if c["metric"] in METRICS:
            means.setdefault(c["variant"], []).append(c["vs_milegpo"]["mean"])
    scores = {label: float(np.mean(v)) for label, v in means.items()}
    best = max(scores.values())
    near = [label for label, s in scores.items() if s >= best - WITHIN]
    return min(near, key=lambda label: float(label.split("=")[1])), scores


def _delta(entry: dict) -> str:
    if not math.isfinite(entry["low"]):
        return f"{entry['mean']:+.3f} ({entry['verdict']})"
    return f"{entry['mean']:+.3f} [{entry['low']:+.3f}, {entry['high']:+.3f}] **{entry['verdict']}**"


def tables(data: dict) -> str:
    lines = []
    for stage_name, stage in data["stages"].items():
        lines += [f"### {stage_name}: {stage['setting']}", "",
                  "| env | state key | variant | metric | seeds | pairs / seed | GraphGPO | MileGPO | memory "
                  "| Δ(memory − MileGPO) | Δ(memory − GraphGPO) | Δ(MileGPO − GraphGPO) | recurrence "
                  "| evidence from memory | bytes / task |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for c in comparisons(stage):
            lines.append(f"| {c['env']} | {c['regime']} | {c['variant']} | {c['metric']} | {c['seeds']} "
                         f"| {c['pairs_per_seed']:.0f} | {c['graphgpo']:.3f} | {c['milegpo']:.3f} | {c['memory']:.3f} "
                         f"| {_delta(c['vs_milegpo'])} | {_delta(c['vs_graphgpo'])} "
                         f"| {_delta(c['milegpo_vs_graphgpo'])} | {c['recurrence_rate']:.2f} "
                         f"| {c['evidence_share']:.2f} | {c['bytes_per_task']:.0f} |")
        counts: dict[str, dict[str, int]] = {}
        for c in comparisons(stage):
            if c["metric"] not in METRICS:
                continue
            for base in ("vs_milegpo", "vs_graphgpo"):
                key = f"{c['variant']} {base.replace('vs_', 'vs ')}"
                counts.setdefault(key, {"ahead": 0, "level": 0, "behind": 0, "too few seeds": 0})
                counts[key][c[base]["verdict"]] += 1
        lines += ["", "| comparison (pairwise accuracy and weighted agreement) | ahead | level | behind |",
                  "|---|---|---|---|"]
        lines += [f"| {k} | {v['ahead']} | {v['level']} | {v['behind']} |" for k, v in counts.items()]
        if stage_name == "tuning":
            label, scores = chosen_half_life(stage)
            lines += ["", "Mean Δ(memory − MileGPO) over envs × regimes × metrics: "
                      + ", ".join(f"{k} {v:+.4f}" for k, v in scores.items()) + f"; chosen: **{label}**."]
        lines.append("")
    if "tuning" in data["stages"]:
        label = chosen_half_life(data["stages"]["tuning"])[0]
        recurrence = learning_recurrence(data, float(label.split("=")[1]))
        lines += [f"### Task recurrence in the learning benchmark's runs ({label}; simulated draws)", "",
                  "| env | train tasks | env-step budget | random-policy episode length | iterations "
                  "| recurrence rate |", "|---|---|---|---|---|---|"]
        lines += [f"| {e} | {r['train_tasks']} | {r['budget']} | {r['episode_length']:.1f} | {r['iterations']} "
                  f"| {r['recurrence_rate']:.3f} |" for e, r in recurrence.items()]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    arguments = parser(__doc__, RESULTS / "memory_quality")
    arguments.add_argument("--stage", choices=("tuning", "heldout", *LEARNING_STAGES))
    arguments.add_argument("--runs-folder", type=Path, default=None,
                           help="learning stages: the folder of the learning benchmark's memory runs "
                                "(<env>-milegpo_memory-s<seed>, trained with run.keep_batch_every=1)")
    arguments.add_argument("--envs", nargs="+", default=[])
    arguments.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    arguments.add_argument("--pool", type=int, default=8)
    arguments.add_argument("--per-iteration", type=int, default=4)
    arguments.add_argument("--iterations", type=int, default=10)
    arguments.add_argument("--group-size", type=int, default=8)
    arguments.add_argument("--state-key", nargs="+", default=list(cq.STATE_KEYS))
    arguments.add_argument("--tables-only", action="store_true")
    args = arguments.parse_args()
    path = args.out.with_suffix(".json")
    data = load(path)
    if not args.tables_only:
        if args.stage is None:
            arguments.error("--stage is needed unless --tables-only")
        if args.stage != "tuning":
            half_lives = (float(chosen_half_life(data["stages"]["tuning"])[0].split("=")[1]),)
        else:
            half_lives = TUNING_HALF_LIVES
        if args.stage in LEARNING_STAGES:
            if args.runs_folder is None:
                arguments.error(f"--stage {args.stage} needs --runs-folder")
            setting = (f"{LEARNING_STAGES[args.stage]}: every iteration's groups of the memory's own learning runs "
                       f"(the learning benchmark's settings, {args.runs_folder.name}), replayed with the ground "
                       f"truth; half-lives {[memory_label(h) for h in half_lives]}")
        else:
            setting = (f"random-policy groups, {args.iterations} iterations x {args.per_iteration} tasks from a pool "
                       f"of {args.pool}, K = {args.group_size}; half-lives {[memory_label(h) for h in half_lives]}")
        for env_name in args.envs:
            for seed in args.seeds:
                started = time.time()
                if args.stage in LEARNING_STAGES:
                    sequence = run_groups.replay_run(env_name, args.runs_folder / f"{env_name}-milegpo_memory-s{seed}")
                else:
                    sequence = play_sequence(env_name, seed, args.pool, args.per_iteration, args.iterations,
                                             args.group_size)
                row = score_sequence(env_name, sequence, half_lives, tuple(args.state_key))
                row["seconds"] = time.time() - started
                data = load(path)  # another process may have filed seeds meanwhile
                stage = data["stages"].setdefault(args.stage, {"setting": setting, "envs": {}})
                stage["envs"].setdefault(env_name, {})[str(seed)] = row
                write_json(path, data, indent=1)
                print(f"{args.stage} {env_name} seed {seed}: {row['pairs']} pairs, {row['seconds']:.0f} s", flush=True)
    write_text(args.out.with_suffix(".md"), tables(data))
    print(f"wrote {path} and {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
