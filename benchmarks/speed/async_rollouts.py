"""Rollout throughput with slow envs: ``algo.rollout=async`` against lockstep, and what it learns.

The env is House (the built-in env's logic) whose every step waits in its worker process: a
fixed latency (20, 50, 200 ms) or an exponential one with the same mean (heavy-tailed: in
lockstep every round waits for the slowest of all envs). The policy is the CPU demo's (the
offline tiny LM in choose mode, its settings), 4 tasks x 8 copies, one worker process per env.
For each latency, mode and seed, MileGPO trains ``--steps`` env steps; the table gives the
rollout's env steps per second (``time/env_steps_per_s``: env steps over the rollout's wall
time, policy included), the speed-up of async over lockstep (the ratio of medians over seeds),
and held-out success on House's ``eval_id`` split after training (without latency).
Both modes sample each env from its own stream (``algo.per_env_sampling``), so at equal scores
they take the same actions: any difference in success comes from float noise in batched scores.

Held-out success is measured as the CPU demo measures it, with the ``eval`` section of the
``cpu-demo`` preset (read from it, not restated here): its ``n_tasks`` first tasks of ``eval_id``
times its ``copies`` episodes each, actions sampled at its eval temperature (greedy, the
memoryless tiny policy loops and wins next to nothing), the sampling seeded by the run's seed,
so both modes of a seed are evaluated alike.

``--learning`` compares what the two modes learn: at exponential 50 ms, lockstep and async
alternate within each seed for a budget where the demo learns (``--steps``, default the demo's
``run.total_timesteps``); per run, held-out success before and after training, the wall time of
``learn()`` to the budget and the env steps per second, and over seeds the paired difference of
success (async - lockstep, mean and 95% t interval), to
``benchmarks/results/async_rollouts_learning.{json,md}``.

Results go to ``benchmarks/results/async_rollouts.{json,md}`` after every run (interleaved:
lockstep and async alternate within each latency and seed; process CPU time beside wall time;
the load average at start and end of each run).

``--staleness-sweep`` measures ``algo.max_staleness`` instead: at one latency (``--latency``,
``--distribution``) and rollout mode (``--rollout``), staleness 0 and 1 alternate within each
seed, and the table gives the *training* throughput, env steps over the wall time of the whole
``learn()`` (rollouts, credit and updates: what overlapping a rollout with the update can
shorten), beside the rollout's own env steps/s, the update's seconds and the process CPU time,
to ``benchmarks/results/async_staleness.{json,md}``.

    python -m benchmarks.speed.async_rollouts [--steps 2000] [--seeds 0 1 2]
    python -m benchmarks.speed.async_rollouts --learning [--steps 24000]
    python -m benchmarks.speed.async_rollouts --staleness-sweep [--latency 50] [--rollout lockstep]
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

# Every env worker imports this module (it defines their env): what its top level imports, 32
# workers import, so the trainer (torch, transformers) is imported where it is used.
from benchmarks import harness
from milegpo.config.presets import DEMO_PRESET
from milegpo.envs.house import HouseEnv

if TYPE_CHECKING:
    from milegpo import MileGPO
    from milegpo.config.run import TrainConfig

LATENCIES = [("fixed", 0), ("fixed", 20), ("fixed", 50), ("fixed", 200), ("exponential", 20), ("exponential", 50),
             ("exponential", 200)]
LEARNING_LATENCY = ("exponential", 50)  # where async is ~2.9x as fast as lockstep


class LatencyHouse(HouseEnv):
    """House whose steps wait ``latency_ms`` (fixed, or exponential with that mean) before answering,
    as an env behind a server or a tool call would."""

    def __init__(self, latency_ms: float = 50.0, distribution: str = "fixed", **kwargs):
        super().__init__(**kwargs)
        self.latency_s = latency_ms / 1000.0
        self.distribution = distribution
        self._wait_rng = np.random.default_rng()

    def _step(self, action: str):
        wait = self.latency_s if self.distribution == "fixed" else self._wait_rng.exponential(self.latency_s)
        time.sleep(wait)
        return super()._step(action)


def demo_config() -> TrainConfig:
    """The CPU demo's resolved settings (its preset over the defaults)."""
    from milegpo.config.run import resolve_config

    return resolve_config(DEMO_PRESET)


def held_out_success(model: MileGPO, seed: int) -> dict:
    """Success on House's ``eval_id`` split as the CPU demo's evaluation measures it (its preset's
    tasks, copies and temperature; greedy only where that temperature is null), the sampling seeded
    by ``seed``: the demo's tiny policy has no memory and loops when greedy, so only sampled
    episodes tell what it learned. Returns the success rate, the episodes and how they were played."""
    from milegpo import make_vec_env
    from milegpo.config.run import eval_task_seeds

    config = demo_config().eval
    env = make_vec_env("milegpo/House-v0", n_tasks=config.n_tasks, group_size=config.copies,
                       env_kwargs={"split": "eval_id"})
    try:
        result = model.evaluate(env, task_seeds=eval_task_seeds("eval_id", config.n_tasks),
                                deterministic=config.temperature is None, temperature=config.temperature, seed=seed)
    finally:
        env.close()
    return {"success": result["success_rate"], "episodes": result["n_episodes"], "sampling": result["sampling"]}


def run_one(distribution: str, latency_ms: int, mode: str, seed: int, steps: int, model_path: str,
            cohorts: int | None = None, max_staleness: int = 0, evaluate_before: bool = False) -> dict:
    """Train one run (async: acting for at most ``1 / cohorts`` of the envs per policy call,
    ``algo.async_cohorts``, by default the trainer's); with ``max_staleness`` 1 each rollout but the
    first played during the previous update); its rollout and training speed, CPU time and held-out
    success (and, with ``evaluate_before``, that of the untrained policy, outside the timed ``learn()``)."""
    import csv
    import functools

    from stable_baselines3.common.logger import configure

    from milegpo import MileGPO, make_vec_env
    from milegpo.config import AlgoConfig
    from milegpo.config.presets import preset_section

    cohorts = cohorts or AlgoConfig().async_cohorts

    factory = functools.partial(LatencyHouse, latency_ms=latency_ms, distribution=distribution, split="train")
    env = make_vec_env(factory, n_tasks=4, group_size=8, seed=seed, subprocess=True, n_workers=32)
    load_start = harness.load_1min()
    with harness.Stopwatch() as whole:
        try:
            model = MileGPO("LLMPolicy", env, seed=seed, rollout=mode, async_cohorts=cohorts, per_env_sampling=True,
                            max_staleness=max_staleness,
                            **preset_section(DEMO_PRESET, "algo"),
                            policy_kwargs={"model": model_path, **preset_section(DEMO_PRESET, "policy")})
            before = held_out_success(model, seed) if evaluate_before else None
            calls = PolicyCallCounter(model)
            with tempfile.TemporaryDirectory() as folder:
                model.set_logger(configure(folder, ["csv"]))
                with harness.Stopwatch() as learning:
                    model.learn(steps)
                learn_s = learning.wall_s
                rows = list(csv.DictReader(open(Path(folder) / "progress.csv")))
            calls.stop()
            after = held_out_success(model, seed)
        finally:
            env.close()
    speeds = [float(r["time/env_steps_per_s"]) for r in rows if r.get("time/env_steps_per_s")]
    rollout_s = sum(float(r["time/rollout_s"]) for r in rows if r.get("time/rollout_s"))
    update_s = sum(float(r["time/update_s"]) for r in rows if r.get("time/update_s"))
    lags = [float(r["rollout/policy_lag"]) for r in rows if r.get("rollout/policy_lag")]
    return {"distribution": distribution, "latency_ms": latency_ms, "mode": mode, "cohorts": cohorts, "seed": seed,
            "steps": steps, "max_staleness": max_staleness, "iterations": model.iterations,
            "policy_calls": calls.calls, "policy_call_envs": calls.envs, "policy_call_s": calls.seconds,
            "env_steps_per_s": statistics.median(speeds), "rollout_s": rollout_s, "update_s": update_s,
            "learn_s": learn_s, "env_steps_per_learn_s": model.num_timesteps / learn_s, "policy_lags": lags,
            "wall_s": whole.wall_s, "cpu_s": whole.cpu_s,
            "held_out_success": after["success"], "held_out_episodes": after["episodes"],
            "held_out_sampling": after["sampling"], "held_out_success_before": before["success"] if before else None,
            "load": [load_start, harness.load_1min()]}


class PolicyCallCounter:
    """Counts the policy's ``act`` calls of a training run (rollouts only: evaluation is outside it), the
    envs they acted for and their wall time: async splits a round into more, smaller calls, and each
    call has a fixed cost beside its per-env one."""

    def __init__(self, model: MileGPO) -> None:
        self.policy, self.act = model.policy, model.policy.act
        self.calls, self.envs, self.seconds = 0, 0, 0.0

        def counted(observations, *args, **kwargs):
            start = time.perf_counter()
            samples = self.act(observations, *args, **kwargs)
            self.calls, self.envs, self.seconds = self.calls + 1, self.envs + len(observations), \
                self.seconds + time.perf_counter() - start
            return samples

        self.policy.act = counted

    def stop(self) -> None:
        del self.policy.act  # the class's method again


def table(runs: list[dict]) -> str:
    """The markdown table: per latency, each mode's median speed, the speed-up, the policy's calls and
    their mean size (medians over seeds), and held-out success."""
    lines = ["| latency | lockstep env steps/s | async env steps/s | speed-up | policy calls: envs per call, ms per "
             "call, lockstep / async | held-out success lockstep / async |",
             "|---|---|---|---|---|---|"]
    for distribution, latency in LATENCIES:
        got = {mode: [r for r in runs if (r["distribution"], r["latency_ms"], r["mode"]) == (distribution, latency,
                                                                                           mode)]
               for mode in ("lockstep", "async")}
        if not got["lockstep"] or not got["async"]:
            continue
        speed = {mode: statistics.median(r["env_steps_per_s"] for r in got[mode]) for mode in got}
        success = {mode: "[" + ", ".join(f"{r['held_out_success']:.2f}" for r in got[mode]) + "]" for mode in got}
        calls = {mode: (f"{statistics.median(r['policy_call_envs'] / r['policy_calls'] for r in got[mode]):.1f} envs, "
                        f"{statistics.median(1000 * r['policy_call_s'] / r['policy_calls'] for r in got[mode]):.1f} ms")
                 if all(r.get("policy_calls") for r in got[mode]) else "" for mode in got}
        lines.append(f"| {distribution} {latency} ms | {speed['lockstep']:.0f} | {speed['async']:.0f} | "
                     f"{speed['async'] / speed['lockstep']:.2f}x | {calls['lockstep']} / {calls['async']} | "
                     f"{success['lockstep']} / {success['async']} |")
    return "\n".join(lines) + "\n"


def cohort_table(runs: list[dict]) -> str:
    """The markdown table of a cohort sweep: per fixed latency, lockstep's and each cohort count's env steps/s
    (medians over seeds; async's speed-up over lockstep), envs per policy call, ms per call and CPU seconds
    per run."""
    cohorts = sorted({r["cohorts"] for r in runs if r["mode"] == "async"})
    lines = ["| fixed latency | lockstep | " + " | ".join(f"async, {c} cohorts" for c in cohorts) + " |",
             "|---|---|" + "---|" * len(cohorts)]
    for latency in sorted({r["latency_ms"] for r in runs}):
        cells, base = [], None
        for mode, count in [("lockstep", None)] + [("async", c) for c in cohorts]:
            got = [r for r in runs if (r["latency_ms"], r["mode"]) == (latency, mode)
                   and (count is None or r["cohorts"] == count)]
            if not got:
                cells.append("")
                continue
            speed = statistics.median(r["env_steps_per_s"] for r in got)
            base = speed if mode == "lockstep" else base
            ratio = f" ({speed / base:.2f}x)" if base and mode == "async" else ""
            calls = (f", {statistics.median(r['policy_call_envs'] / r['policy_calls'] for r in got):.1f} envs / "
                     f"{statistics.median(1000 * r['policy_call_s'] / r['policy_calls'] for r in got):.0f} ms per call"
                     if all(r.get("policy_calls") for r in got) else "")
            cells.append(f"{speed:.0f} steps/s{ratio}{calls}, {statistics.median(r['cpu_s'] for r in got):.1f} s CPU")
        lines.append(f"| {latency} ms | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def staleness_table(runs: list[dict]) -> str:
    """The markdown table of the staleness sweep: medians over seeds of each setting."""
    lines = ["| max_staleness | env steps/s of training (learn wall) | rollout env steps/s | update s per run | "
             "learn s | CPU s | held-out success |", "|---|---|---|---|---|---|---|"]
    base = None
    for staleness in (0, 1):
        got = [r for r in runs if r["max_staleness"] == staleness]
        if not got:
            continue
        speed = statistics.median(r["env_steps_per_learn_s"] for r in got)
        base = speed if staleness == 0 else base
        ratio = f" ({speed / base:.2f}x)" if base and staleness else ""
        rollout_speed = statistics.median(r["env_steps_per_s"] for r in got)
        lines.append(f"| {staleness} | {speed:.0f}{ratio} | {rollout_speed:.0f} | "
                     f"{statistics.median(r['update_s'] for r in got):.2f} | "
                     f"{statistics.median(r['learn_s'] for r in got):.2f} | "
                     f"{statistics.median(r['cpu_s'] for r in got):.2f} | "
                     "[" + ", ".join(f"{r['held_out_success']:.2f}" for r in got) + "] |")
    return "\n".join(lines) + "\n"


def learning_table(runs: list[dict]) -> str:
    """The markdown table of the learning comparison: per mode, held-out success seed by seed, the wall
    time of ``learn()`` to the budget and the env steps per second; then the paired difference of
    success (async - lockstep, seeds that have both) with its 95% t interval, and the speed-ups."""
    from benchmarks.learning.learning_efficiency import paired_difference

    got = {mode: {r["seed"]: r for r in runs if r["mode"] == mode} for mode in ("lockstep", "async")}
    steps = runs[0]["steps"]

    def cells(values: list[float], digits: int) -> str:
        return "[" + ", ".join(f"{v:.{digits}f}" for v in values) + "]"

    lines = [f"| mode | seeds | held-out success per seed (mean) | wall of `learn()` to {steps:,} env steps, s | "
             "rollout env steps/s | training env steps/s |", "|---|---|---|---|---|---|"]
    untrained = {r["seed"]: r["held_out_success_before"] for r in runs}
    lines.append(f"| untrained | {list(untrained)} | {cells(list(untrained.values()), 2)} "
                 f"({statistics.mean(untrained.values()):.3f}) | | | |")
    for mode, by_seed in got.items():
        if not by_seed:
            continue
        done = list(by_seed.values())
        success = [r["held_out_success"] for r in done]
        lines.append(f"| {mode} | {list(by_seed)} | {cells(success, 2)} ({statistics.mean(success):.3f}) | "
                     f"{cells([r['learn_s'] for r in done], 0)} | "
                     f"{statistics.median(r['env_steps_per_s'] for r in done):.0f} | "
                     f"{statistics.median(r['env_steps_per_learn_s'] for r in done):.0f} |")
    paired = sorted(set(got["lockstep"]) & set(got["async"]))
    if len(paired) > 1:
        after = {mode: [got[mode][seed]["held_out_success"] for seed in paired] for mode in got}
        diff = paired_difference(after["async"], after["lockstep"])
        speed_up = {key: statistics.median((got["async"][s][key] / got["lockstep"][s][key]) ** sign for s in paired)
                    for key, sign in (("learn_s", -1), ("env_steps_per_s", 1), ("env_steps_per_learn_s", 1))}
        deltas = [a - b for a, b in zip(after["async"], after["lockstep"])]
        lines.append(f"| async - lockstep (paired) | {paired} | {cells(deltas, 2)} ({diff['mean']:+.3f}, 95% t "
                     f"interval [{diff['ci95'][0]:+.3f}, {diff['ci95'][1]:+.3f}]) | "
                     + " | ".join(f"async {speed_up[key]:.2f}x as fast" for key in speed_up) + " |")
    sampling, episodes = runs[0]["held_out_sampling"], runs[0]["held_out_episodes"]
    loads = [load for r in runs for load in r["load"]]
    lines.append("")
    lines.append(f"Held-out: House `eval_id`, {episodes} episodes (the demo's tasks x copies), {sampling}, sampling "
                 f"seeded by the run's seed. Env steps: {runs[0]['distribution']} {runs[0]['latency_ms']} ms per "
                 f"step, 32 envs in 32 workers. 1-minute load {min(loads):.1f}-{max(loads):.1f} at the runs' starts "
                 "and ends.")
    return "\n".join(lines) + "\n"


def run_meta(steps: int, policy: str, **settings: object) -> dict:
    """What a results file says about its runs: the machine, the env steps per run, the envs and workers
    (32 each), the policy, and ``settings`` of the sweep."""
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "steps": steps, "envs": 32,
            "workers": 32, "policy": policy, **settings}


def save(out: Path, meta: dict, runs: list[dict], table_of: Callable[[list[dict]], str]) -> None:
    """The runs so far, as ``out``.json (with ``meta``) and the table ``table_of`` makes of them as ``out``.md;
    the last run printed."""
    harness.write_results(out, {"meta": meta, "runs": runs}, table_of(runs))
    print(json.dumps(runs[-1]), flush=True)


def learning(steps: int, seeds: list[int], model_path: str, policy: str, out: Path) -> None:
    """The learning comparison: lockstep then async within each seed at :data:`LEARNING_LATENCY`, each run
    written to ``out``'s JSON and table as soon as it ends."""
    distribution, latency = LEARNING_LATENCY
    meta = run_meta(steps, policy, latency=f"{distribution} {latency} ms", eval=dataclasses.asdict(demo_config().eval))
    runs: list[dict] = []
    for seed in seeds:
        for mode in ("lockstep", "async"):
            runs.append(run_one(distribution, latency, mode, seed, steps, model_path, evaluate_before=True))
            save(out, meta, runs, learning_table)


def main() -> None:
    parser = harness.parser(__doc__, harness.RESULTS / "async_rollouts",
                            "OUT: the results' path without its suffix (OUT.json, OUT.md; the sweeps' files beside it)")
    parser.add_argument("--steps", type=int, help="env steps of each training run (default 2000; --learning: the "
                        "demo's run.total_timesteps)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--cohorts-sweep", action="store_true",
                        help="instead: fixed latencies (--latencies), lockstep and async with each of --cohorts "
                             "(algo.async_cohorts), to <out>_cohorts.{json,md}")
    parser.add_argument("--latencies", type=int, nargs="+", default=[20, 50], help="cohort sweep: fixed latencies (ms)")
    parser.add_argument("--cohorts", type=int, nargs="+", default=[2, 4, 8], help="cohort sweep: algo.async_cohorts")
    parser.add_argument("--hidden-size", type=int, default=32,
                        help="the offline model's width (the CPU demo's: 32; wider, its compute dominates a call)")
    parser.add_argument("--num-layers", type=int, default=1, help="the offline model's layers (the demo's: 1)")
    parser.add_argument("--num-heads", type=int, default=2, help="the offline model's attention heads (the demo's: 2)")
    parser.add_argument("--staleness-sweep", action="store_true",
                        help="instead: algo.max_staleness 0 against 1 at one latency (to "
                             "results/async_staleness.{json,md})")
    parser.add_argument("--learning", action="store_true",
                        help="instead: what lockstep and async learn at exponential 50 ms (to "
                             "results/async_rollouts_learning.{json,md})")
    parser.add_argument("--latency", type=int, default=50, help="staleness sweep: the env's latency (ms)")
    parser.add_argument("--distribution", choices=("fixed", "exponential"), default="fixed",
                        help="staleness sweep: the latency's distribution")
    parser.add_argument("--rollout", choices=("lockstep", "async"), default="lockstep",
                        help="staleness sweep: algo.rollout")
    args = parser.parse_args()

    import torch

    from milegpo.policies import tiny_model

    torch.set_num_threads(1)
    model_path = tiny_model(HouseEnv.vocabulary(), tempfile.mkdtemp(prefix="async-tiny-"), hidden_size=args.hidden_size,
                            num_layers=args.num_layers, num_heads=args.num_heads)
    policy = (f"offline LM {args.hidden_size} wide, {args.num_layers} layers, {args.num_heads} heads (the cpu-demo's: "
              "32, 1, 2), the cpu-demo's policy settings (choose mode), 1 torch thread")
    out = args.out
    runs: list[dict] = []
    if args.learning:
        learning(args.steps or demo_config().run.total_timesteps, args.seeds, model_path, policy,
                 out.with_name(out.name + "_learning"))
        return
    args.steps = args.steps or 2000
    if args.staleness_sweep:
        out = out.with_name("async_staleness")
        meta = run_meta(args.steps, policy, latency=f"{args.distribution} {args.latency} ms", rollout=args.rollout)
        for seed in args.seeds:
            for staleness in (0, 1):
                runs.append(run_one(args.distribution, args.latency, args.rollout, seed, args.steps, model_path,
                                    max_staleness=staleness))
                save(out, meta, runs, staleness_table)
        return
    if args.cohorts_sweep:
        out = out.with_name(out.name + "_cohorts")
        meta = run_meta(args.steps, policy)
        for latency in args.latencies:
            for seed in args.seeds:
                for mode, cohorts in [("lockstep", None)] + [("async", c) for c in args.cohorts]:
                    runs.append(run_one("fixed", latency, mode, seed, args.steps, model_path, cohorts))
                    save(out, meta, runs, cohort_table)
        return
    meta = run_meta(args.steps, policy)
    for distribution, latency in LATENCIES:
        for seed in args.seeds:
            for mode in ("lockstep", "async"):
                runs.append(run_one(distribution, latency, mode, seed, args.steps, model_path))
                save(out, meta, runs, table)


if __name__ == "__main__":
    main()
