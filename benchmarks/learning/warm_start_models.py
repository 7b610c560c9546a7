"""Which learner for the warm-start benchmarks: start success and CPU cost per model size.

The warm-start learning benchmark (``learning_efficiency.py --warm-start``) runs 5 seeds ×
7 credit methods per env, so its learner must be cheap. This script measures, on the
same env, recipe and seed, what a larger learner would cost and where it would start:

* ``decision_ms``: one choose-mode decision (scoring every admissible command), the unit
  of rollouts and evaluations, timed on a batch of real ALFWorld states;
* ``train_ms``: forward + backward of one step sample, the unit of the update and of the
  behaviour cloning;
* the estimated seconds of one benchmark run from those units (warm start, 8,000 rollout
  steps, their update, and the held-out evaluations at the run's eval frequency, episodes
  as long as the demonstrator's; the engine's own time, the same for every model, is left out);
* ``start``: held-out success after the warm start (``eval_id``, the run's 12 × 6 episodes),
  measured where the estimated warm start fits ``--max-fit-s``, and SmolLM2's success
  before any warm start (its pretrained priors alone; one episode on each of the 12 tasks)
  with ``--zero-shot``.

Figures depend on the machine's load: the units are measured back to back in one process,
so their ratios between models hold.

    python -m benchmarks.learning.warm_start_models --out benchmarks/results/warm_start_models
"""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

import torch

from benchmarks import harness
from benchmarks.learning import learning_efficiency
from milegpo import TrainConfig
from milegpo.algos.warm_start import behaviour_clone, collect_demonstrations, nll_backward
from milegpo.config import WarmStartConfig
from milegpo.envs import make_env
from milegpo.run.finish import evaluate_model

#: name -> settings (dotted names) of the learner (the first is the benchmarks' own).
MODELS: dict[str, dict] = {
    "tiny 32×1 (the benchmarks')": {"run.tiny_model": {"hidden_size": 32, "layers": 1, "heads": 2}},
    "tiny 128×2": {"run.tiny_model": {"hidden_size": 128, "layers": 2, "heads": 4}},
    "tiny 256×4": {"run.tiny_model": {"hidden_size": 256, "layers": 4, "heads": 4}},
    "SmolLM2-135M": {"policy.model": "smollm2-135m", "algo.micro_batch_tokens": 1024},
}


def run_config(env_name: str, fields: dict, seed: int) -> TrainConfig:
    """The learning benchmark's warm-start config of ``env_name``, with the learner ``fields``."""
    values = {**learning_efficiency.warm_start_values(env_name, seed), **fields}
    if values.get("policy.model") == "smollm2-135m":
        from milegpo.policies.smollm import smollm2_path

        values["policy.model"] = smollm2_path()
    return learning_efficiency.make_config(values)


def sample_states(config: TrainConfig, count: int, seed: int) -> list[tuple[str, dict, list]]:
    """``count`` (observation, info, history) triples from random play on the training tasks."""
    env = make_env(config.env.id, **config.env.kwargs_for(config.env.train_split))
    rng = random.Random(seed)
    states: list[tuple[str, dict, list]] = []
    try:
        while len(states) < count:
            observation, info = env.reset(seed=rng.randrange(env.num_tasks))
            history: list[tuple[str, str]] = []
            done = False
            while not done and len(states) < count:
                states.append((observation, info, list(history)))
                action = rng.choice(info["admissible_commands"])
                history.append((observation, action))
                observation, _, terminated, truncated, info = env.step(action)
                done = terminated or truncated
    finally:
        env.close()
    return states


def time_units(policy, states: list[tuple[str, dict, list]], samples: list,
               micro_batch_tokens: int) -> dict[str, float]:
    """Milliseconds per decision (batched like a group's step) and per trained sample (one
    minibatch's forward and backward in micro-batches, as the warm start and the update run)."""
    observations, infos, histories = (list(column) for column in zip(*states))
    policy.act(observations[:2], infos[:2], histories[:2])  # warm-up
    with harness.Stopwatch() as acting:
        policy.act(observations, infos, histories)
    decision = acting.wall_s / len(states)
    policy.set_training_mode(True)
    with harness.Stopwatch() as training:
        nll_backward(policy, samples, micro_batch_tokens)
    train = training.wall_s / len(samples)
    policy.set_training_mode(False)
    policy.optimizer.zero_grad(set_to_none=True)
    return {"decision_ms": 1e3 * decision, "train_ms": 1e3 * train}


def estimate_run_seconds(config: TrainConfig, units: dict[str, float], demo_steps: int,
                         episode_length: float) -> dict[str, float]:
    """Seconds of one benchmark run spent in the model (the units times the run's counts)."""
    decision, train = units["decision_ms"] / 1e3, units["train_ms"] / 1e3
    warm = config.run.warm_start or WarmStartConfig()
    steps_per_iteration = config.env.n_tasks * config.env.group_size * episode_length
    iterations = config.run.total_timesteps / steps_per_iteration
    evals = iterations / config.eval.freq + 1 + len(config.eval.splits)  # the curve, its start, the final splits
    eval_decisions = evals * config.eval.n_tasks * config.eval.copies * episode_length
    out = {"warm_start": demo_steps * warm.epochs * train, "rollout": config.run.total_timesteps * decision,
           "update": config.run.total_timesteps * config.algo.n_epochs * train, "eval": eval_decisions * decision}
    out["total"] = sum(out.values())
    return out


def measure(name: str, fields: dict, env_name: str, seed: int, states: int, max_fit_s: float,
            zero_shot: bool, workdir: Path) -> dict:
    config = run_config(env_name, fields, seed)
    # cold: the warm start below is timed and run step by step
    model = learning_efficiency.starting_model(config.replace(**{"run.warm_start": None}),
                                               workdir / name.split()[0] / name.replace(" ", "_"))
    policy = model.policy
    row: dict = {"model": name, "fields": fields,
                 "parameters": sum(p.numel() for p in policy.model.parameters()),
                 "trainable_parameters": sum(p.numel() for p in policy.trainable_parameters())}
    if zero_shot:  # one episode per task: a 135M model's full evaluation takes too long on a CPU
        with harness.Stopwatch() as evaluating:
            result = evaluate_model(model, config.replace(**{"eval.copies": 1}), splits=["eval_id"])["eval_id"]
        row["zero_shot"], row["zero_shot_episodes"] = result["success_rate"], result["n_tasks"]
        row["zero_shot_eval_s"] = evaluating.wall_s
    warm = config.run.warm_start
    assert warm is not None
    demo_env = make_env(config.env.id, **{**config.env.kwargs_for(config.env.train_split), **warm.env_kwargs})
    try:
        samples, demonstrator = collect_demonstrations(policy, demo_env, warm.episodes, warm.epsilon, seed)
    finally:
        demo_env.close()
    row["units"] = time_units(policy, sample_states(config, states, seed), samples[:warm.batch_size],
                              config.algo.micro_batch_tokens)
    row["estimate_s"] = estimate_run_seconds(config, row["units"], len(samples), demonstrator["mean_length"])
    row["demonstration_steps"] = len(samples)
    if row["estimate_s"]["warm_start"] <= max_fit_s:
        with harness.Stopwatch() as fitting:
            behaviour_clone(policy, samples, warm.epochs, warm.learning_rate, warm.batch_size, seed,
                            config.algo.micro_batch_tokens)
        row["fit_s"] = fitting.wall_s
        row["start"] = evaluate_model(model, config, splits=["eval_id"])["eval_id"]["success_rate"]
    return row


def write_table(report: dict, path: Path) -> None:
    lines = [f"### Learner size for the warm-start benchmarks ({report['env']}, seed {report['seed']}, "
             f"{report['threads']} torch thread; load: the 1-minute load average after each row)", "",
             "| learner | parameters (trainable) | decision ms | train ms / sample | est. model time per run | "
             "held-out start after the warm start | before it | load |",
             "|---|---|---|---|---|---|---|---|"]
    for row in report["rows"]:
        estimate, units = row["estimate_s"], row["units"]
        start = f"{row['start']:.3f}" if "start" in row else "not run"
        before = f"{row['zero_shot']:.3f} ({row['zero_shot_episodes']} episodes)" if "zero_shot" in row else "–"
        lines.append(f"| {row['model']} | {row['parameters'] / 1e6:.2f} M ({row['trainable_parameters'] / 1e3:.0f} k) "
                     f"| {units['decision_ms']:.1f} | {units['train_ms']:.1f} | {estimate['total'] / 60:.0f} min "
                     f"(warm start {estimate['warm_start'] / 60:.0f}) | {start} | {before} | {row['load']:.1f} |")
    lines.append("")
    harness.write_text(path, "\n".join(lines))


def main() -> None:
    parser = harness.parser(__doc__, harness.RESULTS / "warm_start_models",
                            "OUT: the results' path without its suffix (OUT.json, OUT.md)")
    parser.add_argument("--env", default="alfworld", choices=list(learning_efficiency.WARM_STARTS))
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--states", type=int, default=32, help="states per timed decision batch (one group step)")
    parser.add_argument("--max-fit-s", type=float, default=900.0,
                        help="run the full warm start and measure the start only where its estimate fits this")
    parser.add_argument("--zero-shot", nargs="*", default=["SmolLM2-135M"], choices=list(MODELS),
                        help="models whose held-out success before any warm start is measured")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    report = {"env": args.env, "seed": args.seed, "threads": args.threads, "rows": []}
    out = args.out
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            with harness.Stopwatch() as clock:
                row = measure(name, MODELS[name], args.env, args.seed, args.states, args.max_fit_s,
                              name in args.zero_shot, Path(tmp))
            row["wall_s"], row["load"] = clock.wall_s, harness.load_1min()
            report["rows"].append(row)
            print(json.dumps(row), flush=True)
            harness.write_json(out.with_suffix(".json"), report)
            write_table(report, out.with_suffix(".md"))
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
