"""Credit quality against ground truth, and the paper's tie statistics, on four envs.

The learning benchmark measures credit *through* a tiny learner, which adds its own
noise. Here each method's advantages are scored directly against the truth. For
every env a tracker (:mod:`ground_truth`) gives ``d*(s)``, the steps an optimal
agent still needs to win (House: BFS; TWX coin: the explored map; WebShop: the
purchase funnel; ALFWorld: alfworld's fast-downward planner); a state that cannot
win any more gets ``horizon + 1``. The true quality of a step is its progress
``q_t = d*(s_t) - d*(s_{t+1})``.

Groups of ``K`` rollouts per task are played by the uniform random policy over the
admissible commands (what an untrained agent does); with ``--epsilon``, by a mixture
of the env's scripted expert and that random policy (structured rollouts, closer to a
pretrained agent's, where milestones recur across the group); or, with ``--warm-start``,
by the policy a warm-start learning run starts from (``learning_efficiency.py
--warm-start``: the same model, recipe and seed, sampled at temperature 1 as in training).
Each method's advantages are scored on them, over the tasks with at least one success
(without one every method gives zero step-level credit):

* **pairwise accuracy**: over pairs of steps taken from the *same state* of the same
  task whose true progress differs, the share the advantage orders the same way
  (ties count one half; 0.5 = no information): the choice a policy gradient learns.
* **weighted agreement**: ``sum(dA * sign(dq)) / sum(|dA|)`` over the same pairs, in
  [-1, 1]: each pair weighs by how far apart the advantages put it (what the
  gradient sees; a tie broken by 1e-9 counts for nothing).
* **trap credit**: mean advantage (in advantage-std units) of steps that make the
  task unwinnable or set it back 3 or more steps, minus that of the other steps
  taken from the same states.

**Paper statistics** (MileGPO's Figures 4 and 9; ``credit/diagnostics.py``): the
share of transitions leaving a state two trajectories visit, the share of
same-source, distinct-action pairs GraphGPO ties, the share of those MileGPO
separates (with RCS and with uniform milestone detection), and how often the
separation points the right way where the truth differs.

Five MileGPO options beyond the paper ("(ours)" rows of the committed results: relative
residual, signed traps, dead-end traps, no shaping without success, residual on GraphGPO
ties only) were measured with this script at commit 6488955; none was no worse than
GraphGPO on every env and ahead somewhere, so they were dropped from the library.

    python benchmarks/credit_quality.py                      # all envs, seeds 0-4
    # + HGPO, RLOO:
    python benchmarks/credit_quality.py --out benchmarks/results/credit_quality_hgpo_rloo --seeds 0 1 2 3 4
    python benchmarks/credit_quality.py --envs house --seeds 0
    python benchmarks/credit_quality.py --epsilon 0.5 \
        --out benchmarks/results/credit_quality_mixture_e50             # structured groups
    python benchmarks/credit_quality.py --warm-start \
        --out benchmarks/results/credit_quality_warm_start              # the warm-started learner's groups
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import ground_truth
import learning_efficiency
import numpy as np

from milegpo.credit import StepBatch, build_task_graph, compute_credit
from milegpo.credit.diagnostics import tied_pairs

RESULTS = Path(__file__).resolve().parent / "results"

#: (label, credit method, config overrides); MileGPO rows add the env's preset.
VARIANTS = [
    ("GRPO", "grpo", {}),
    ("RLOO", "rloo", {}),
    ("GiGPO", "gigpo", {}),
    ("HGPO", "hgpo", {}),
    ("GraphGPO", "graphgpo", {}),
    ("GraphGPO gamma_G=0.1 (upstream ALFWorld)", "graphgpo", {"gamma_g": 0.1}),
    ("MileGPO", "milegpo", {}),
    ("MileGPO eta=1", "milegpo", {"eta": 1.0}),
    ("MileGPO no RCS (uniform MD)", "milegpo", {"rcs": False}),
    ("MileGPO no PCC", "milegpo", {"pcc": False}),
    ("MileGPO no BCC", "milegpo", {"bcc": False}),
    ("MileGPO no local progress", "milegpo", {"local_progress": False}),
    ("MileGPO no traps", "milegpo", {"traps": False}),
]
PRESET = {"webshop": "webshop"}  # MileGPO's per-env preset; the others use the ALFWorld (default) one

#: The MileGPO paper's statistics, for the side-by-side table.
PAPER = {"shared_state_share": "≈ 0.74", "tie_share": "0.544 ALFWorld, 0.727 WebShop",
         "ties_broken_rcs": "0.265", "ties_broken_uniform": "0.170"}


#: actor(rng, env, observation, info, history) -> the command to play.
Actor = Callable[[random.Random, object, str, dict, list], str]


def random_actor(rng: random.Random, env, observation: str, info: dict, history: list) -> str:
    return rng.choice(info["admissible_commands"])


def mixture_actor(epsilon: float) -> Actor:
    """The env's scripted expert (``env.expert_action()``) with probability ``1 - epsilon``, else random."""
    def act(rng: random.Random, env, observation: str, info: dict, history: list) -> str:
        expert = env.expert_action() if rng.random() >= epsilon else None
        return expert if expert is not None else rng.choice(info["admissible_commands"])
    return act


def policy_actor(policy) -> Actor:
    """Samples from an :class:`~milegpo.policies.LLMPolicy` (its own seeded generator, temperature 1)."""
    def act(rng: random.Random, env, observation: str, info: dict, history: list) -> str:
        return policy.act([observation], [info], [history])[0].text
    return act


def warm_started_policy(env_name: str, seed: int, workdir: Path):
    """The policy that ``learning_efficiency.py --warm-start`` runs of ``env_name`` and ``seed`` start from."""
    config = learning_efficiency.make_config(learning_efficiency.warm_start_values(env_name, seed))
    model = learning_efficiency.starting_model(config, workdir / f"{env_name}-s{seed}")
    model.policy.reseed_sampling(seed)
    return model.policy


def rollout_groups(env_name: str, n_tasks: int, group_size: int, seed: int, actor: Actor = random_actor):
    """Groups on the env's train tasks played by ``actor``: the batch, d*(s_t) and d*(s_{t+1}).

    The random actor draws exactly the random numbers it always did for a seed.
    """
    env, tracker_factory = ground_truth.make(env_name, expert=actor is not random_actor)
    horizon = env.max_episode_steps
    unsolvable = horizon + 1
    rng = random.Random(seed)
    columns: dict[str, list] = {k: [] for k in ("states", "success", "task_ids", "actions", "rewards", "valid")}
    distances: list[list[int]] = []
    tasks = rng.sample(range(env.num_tasks), min(n_tasks, env.num_tasks))
    for task, task_seed in enumerate(tasks):
        tracker = tracker_factory(env, task_seed)
        for _ in range(group_size):
            observation, info = env.reset(seed=task_seed)
            tracker.observe(None, info)
            states, actions, rewards, valid, done = [info["state_key"]], [], [], [], False
            history: list[tuple[str, str]] = []
            dists = [tracker.distance(info)]
            while not done:
                action = actor(rng, env, observation, info, history)
                history.append((observation, action))
                observation, reward, terminated, truncated, info = env.step(action)
                tracker.observe(action, info)
                done = terminated or truncated
                states.append(info["state_key"])
                actions.append(action)
                rewards.append(reward)
                valid.append(info["valid_action"])
                dists.append(tracker.distance(info))
            for key, value in (("states", states), ("success", bool(info.get("won"))), ("task_ids", task),
                               ("actions", actions), ("rewards", rewards), ("valid", valid)):
                columns[key].append(value)
            distances.append([unsolvable if d is None else d for d in dists])
    env.close()
    batch = StepBatch.from_trajectories(**columns)
    dist = np.concatenate([d[:-1] for d in distances]).astype(float)
    next_dist = np.concatenate([d[1:] for d in distances]).astype(float)
    return batch, dist, next_dist, horizon


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
    if not len(i):
        return float("nan")
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
        same_state = (batch.task_ids == batch.task_ids[i]) & (batch.state_keys == batch.state_keys[i])
        siblings = scored & ~trap_steps & same_state
        if siblings.any():
            diffs.append((advantages[i] - advantages[siblings].mean()) / scale)
    return float(np.mean(diffs)) if diffs else float("nan")


def paper_statistics(batch: StepBatch, progress: np.ndarray, preset: dict) -> dict:
    """The paper's shares (see the module doc), and how often MileGPO's tie-breaks point the right way."""
    out = {}
    graph = build_task_graph(batch)
    for label, overrides in (("rcs", {}), ("uniform", {"rcs": False})):
        result = compute_credit("milegpo", batch, {**preset, **overrides})
        d = result.diagnostics
        out["shared_state_share"], out["tie_share"] = d["shared_state_share"], d["tie_share"]
        out[f"ties_broken_{label}"] = d["ties_broken"]
        r_m = result.components["r_M"]
        i, j, _, separated = tied_pairs(batch, graph, r_m)
        truth = separated & (progress[i] != progress[j])
        right = np.sign(r_m[i] - r_m[j]) == np.sign(progress[i] - progress[j])
        out[f"ties_broken_right_{label}"] = float(right[truth].mean()) if truth.any() else float("nan")
        out[f"ties_broken_with_truth_{label}"] = int(truth.sum())
    return out


def score_env(env_name: str, n_tasks: int, group_size: int, seed: int, actor: Actor = random_actor) -> dict:
    batch, dist, next_dist, horizon = rollout_groups(env_name, n_tasks, group_size, seed, actor)
    progress = dist - next_dist
    solved_tasks = np.unique(batch.task_ids[batch.success[batch.traj_ids]])
    scored = np.isin(batch.task_ids, solved_tasks)
    trap_steps = ((next_dist > horizon) & (dist <= horizon)) | (progress <= -3)
    pairs = same_state_pairs(batch, progress, scored)
    preset = {"preset": PRESET[env_name]} if env_name in PRESET else {}
    row = {"seed": seed, "steps": batch.num_steps, "scored_steps": int(scored.sum()), "pairs": len(pairs[0]),
           "tasks": len(np.unique(batch.task_ids)), "tasks_with_success": len(solved_tasks),
           "success_rate": float(batch.success.mean()), "trap_steps": int((trap_steps & scored).sum()),
           "paper": paper_statistics(batch, progress, preset), "methods": {}}
    for label, method, overrides in VARIANTS:
        advantages = compute_credit(method, batch, {**(preset if method == "milegpo" else {}), **overrides}).advantages
        row["methods"][label] = {"pairwise_accuracy": pairwise_accuracy(advantages, progress, pairs),
                                 "weighted_agreement": weighted_agreement(advantages, progress, pairs),
                                 "trap_credit": trap_credit(batch, advantages, trap_steps, scored)}
    return row


METRICS = ("pairwise_accuracy", "weighted_agreement", "trap_credit")


def summarize(per_seed: list[dict]) -> dict:
    """Mean ± std over seeds, and each variant's paired difference to GraphGPO (mean, min, max)."""
    summary = {}
    for label, _, _ in VARIANTS:
        entry = {}
        for metric in METRICS:
            values = np.array([r["methods"][label][metric] for r in per_seed])
            base = np.array([r["methods"]["GraphGPO"][metric] for r in per_seed])
            entry[metric] = {"mean": float(np.nanmean(values)), "std": float(np.nanstd(values)),
                             "vs_graphgpo_mean": float(np.nanmean(values - base)),
                             "vs_graphgpo_min": float(np.nanmin(values - base)),
                             "vs_graphgpo_max": float(np.nanmax(values - base))}
        summary[label] = entry
    paper = {key: {"mean": float(np.nanmean([r["paper"][key] for r in per_seed])),
                   "std": float(np.nanstd([r["paper"][key] for r in per_seed]))}
             for key in per_seed[0]["paper"]}
    return {"methods": summary, "paper": paper}


def write_tables(report: dict, path: Path) -> None:
    groups = report.get("groups", "random-policy groups")
    lines = [f"### Credit against ground truth ({groups}; mean ± std over seeds; "
             "Δ = paired difference to GraphGPO, worst..best seed)", ""]
    envs = list(report["envs"])
    for env_name in envs:
        info = report["envs"][env_name]
        summary = info["summary"]["methods"]
        lines += [f"**{env_name}** ({ground_truth.ENVS[env_name][0]}, {info['tasks']} tasks × {info['group_size']}, "
                  f"seeds {info['seeds']}, rollout success {info['success_rate']:.2f}, "
                  f"{info['pairs']:.0f} same-state pairs per seed)", "",
                  "| credit | pairwise accuracy | Δ | weighted agreement | Δ | trap credit (std) |",
                  "|---|---|---|---|---|---|"]
        for label, row in summary.items():
            acc, wag, trap = row["pairwise_accuracy"], row["weighted_agreement"], row["trap_credit"]
            lines.append(
                f"| {label} | {acc['mean']:.3f} ± {acc['std']:.3f} "
                f"| {acc['vs_graphgpo_mean']:+.3f} ({acc['vs_graphgpo_min']:+.3f}..{acc['vs_graphgpo_max']:+.3f}) "
                f"| {wag['mean']:.3f} ± {wag['std']:.3f} "
                f"| {wag['vs_graphgpo_mean']:+.3f} ({wag['vs_graphgpo_min']:+.3f}..{wag['vs_graphgpo_max']:+.3f}) "
                + (f"| {trap['mean']:+.2f} ± {trap['std']:.2f} |" if np.isfinite(trap["mean"]) else "| – |"))
        lines.append("")
    lines += [f"### The paper's statistics side by side (ours: {groups}, tasks with a success)", "",
              "| statistic | " + " | ".join(envs) + " | paper (trained policy) |",
              "|---|" + "---|" * (len(envs) + 1)]
    names = {"shared_state_share": "transitions leaving a shared state",
             "tie_share": "same-source, distinct-action pairs GraphGPO ties",
             "ties_broken_rcs": "of those, separated by MileGPO (RCS)",
             "ties_broken_uniform": "of those, separated by MileGPO (uniform MD)",
             "ties_broken_right_rcs": "separated the right way, where the truth differs (RCS)",
             "ties_broken_right_uniform": "separated the right way, where the truth differs (uniform)"}
    for key, name in names.items():
        cells = []
        for env_name in envs:
            value = report["envs"][env_name]["summary"]["paper"][key]
            cells.append(f"{value['mean']:.3f} ± {value['std']:.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {PAPER.get(key, '–')} |")
    lines.append("")
    path.write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+", default=list(ground_truth.ENVS), choices=list(ground_truth.ENVS))
    parser.add_argument("--tasks", type=int, default=100, help="tasks per seed (ALFWorld's train split has 48)")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--epsilon", type=float, default=1.0,
                        help="structured groups: the expert's command with probability 1 - epsilon, else a random one "
                             "(1: the random policy)")
    parser.add_argument("--warm-start", action="store_true",
                        help="groups sampled from the policy warm-start learning runs start from (one per seed)")
    parser.add_argument("--out", default=str(RESULTS / "credit_quality"))
    parser.add_argument("--tables-only", action="store_true", help="redo OUT.md from OUT.json")
    args = parser.parse_args()
    if args.tables_only:
        write_tables(json.loads(Path(args.out).with_suffix(".json").read_text()), Path(args.out).with_suffix(".md"))
        print(Path(args.out).with_suffix(".md").read_text())
        return

    out = Path(args.out)
    if args.warm_start and args.epsilon < 1.0:
        parser.error("--warm-start and --epsilon choose the groups' policy: give one of them")
    if args.warm_start:
        groups, policy = ("groups sampled from the warm-started policy",
                          "the policy warm-start learning runs start from (learning_efficiency.py --warm-start)")
    elif args.epsilon < 1.0:
        groups = f"epsilon-mixture groups: expert w.p. {1 - args.epsilon:.1f}, random w.p. {args.epsilon:.1f}"
        policy = f"scripted expert with probability {1 - args.epsilon:g}, else uniform random"
    else:
        groups, policy = "random-policy groups", "uniform random over admissible commands"
    report = {"policy": policy, "epsilon": args.epsilon, "warm_start": args.warm_start, "groups": groups,
              "group_size": args.group_size, "envs": {}}
    if out.with_suffix(".json").exists():  # keep the other envs' results
        report["envs"] = json.loads(out.with_suffix(".json").read_text()).get("envs", {})
    workdir = tempfile.TemporaryDirectory(prefix="credit_quality_")  # the warm starts' tiny LMs
    for env_name in args.envs:
        started, per_seed = time.time(), []
        for seed in args.seeds:
            if args.warm_start:
                actor = policy_actor(warm_started_policy(env_name, seed, Path(workdir.name)))
            else:
                actor = mixture_actor(args.epsilon) if args.epsilon < 1.0 else random_actor
            row = score_env(env_name, args.tasks, args.group_size, seed, actor)
            per_seed.append(row)
            print(f"{env_name} seed {seed}: {row['tasks_with_success']}/{row['tasks']} tasks with a success, "
                  f"{row['pairs']} same-state pairs", flush=True)
        report["envs"][env_name] = {
            "tasks": per_seed[0]["tasks"], "group_size": args.group_size, "seeds": args.seeds,
            "success_rate": float(np.mean([r["success_rate"] for r in per_seed])),
            "pairs": float(np.mean([r["pairs"] for r in per_seed])), "wall_s": time.time() - started,
            "summary": summarize(per_seed), "per_seed": per_seed}
        out.parent.mkdir(exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
        write_tables(report, out.with_suffix(".md"))
    workdir.cleanup()
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
