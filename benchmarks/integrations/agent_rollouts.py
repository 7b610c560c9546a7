"""Agent programs as environments: rollout throughput with N episodes in flight, and a learning check.

``throughput``: the plain ``openai``-client agent of ``examples/agent_openai_tools.py`` (the 3x3 house)
played by the offline tiny model through :class:`~milegpo.agents.AgentEnv`, one rollout of N episodes
at once (``n_tasks x group_size``), for N in ``--in-flight``. Each step is a real HTTP chat completion
from the program's ``openai.AsyncOpenAI`` client to the agent server. Reported per N: env steps/s
(model calls per second of the rollout's wall time), the policy's share of the wall time, and the
rest per step (the endpoint, the programs, the vec env). ``--tool-latency S`` makes every move of
the program await ``asyncio.sleep(S)`` first (a tool call to a slow service): with the envs in this
process the policy delivers its replies at once, so the programs of a batch wait for their tools
together; ``--worker`` puts the envs in one worker process instead, where each env's step delivers
its reply and waits for that program's next request before the next env is stepped.

``learning``: MileGPO and GRPO side by side training that agent (the tiny model, generate mode, chat
prompts, 2-token replies) with the same settings and task draws; success per iteration
(``rollout/success_rate``: 4 tasks x 8 episodes) against env steps. A random policy reaches the vault
in about a quarter of the episodes.

Outputs in ``benchmarks/results/``: ``agent_rollouts_throughput.{json,md}``,
``agent_rollouts_learning.{json,md,png}``.

    python -m benchmarks.integrations.agent_rollouts throughput
    python -m benchmarks.integrations.agent_rollouts throughput --tool-latency 0.05 [--worker]
    python -m benchmarks.integrations.agent_rollouts learning --seeds 0 1 --steps 3000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

from benchmarks import harness

sys.path.insert(0, str(harness.REPO / "examples"))

import agent_openai_tools as house  # noqa: E402  (the example's agent and house)

from milegpo.agents import AgentEnv  # noqa: E402

POLICY = {"mode": "generate", "prompt_format": "chat", "max_new_tokens": 2}


class SlowToolHouseEnv(AgentEnv):
    """The example's agent, each move awaiting ``latency`` seconds first (a slow tool)."""

    def __init__(self, latency: float = 0.0, **kwargs: Any):
        async def walk(client: Any, start: str) -> float:
            room = start
            for _ in range(house.MAX_MOVES):
                messages = [{"role": "system", "content": house.SYSTEM},
                            {"role": "user", "content": house.describe(room)}]
                reply = (await client.chat.completions.create(model="m", messages=messages,
                                                              tools=house.TOOLS)).choices[0].message
                await asyncio.sleep(latency)
                room = house.move(room, house.nearest_exit(room, reply.content or ""))
                if room == house.GOAL:
                    return 1.0
            return 0.0

        kwargs.setdefault("max_episode_steps", house.MAX_MOVES)
        super().__init__(walk, house.TASKS, vocabulary=[*house.TASKS, house.GOAL, *house.STEPS], **kwargs)


def tiny_policy(seed: int = 0) -> Any:
    """The offline tiny model of the house agent, as the Python API builds it without a model."""
    from milegpo.config import TinyModelConfig
    from milegpo.envs.core import TextSpace
    from milegpo.policies import LLMPolicy
    from milegpo.policies.tiny import cached_env_tiny_model

    env = house.HouseAgentEnv()
    try:
        path = cached_env_tiny_model(env.vocabulary(), TinyModelConfig(), seed=seed)
    finally:
        env.close()
    return LLMPolicy(TextSpace(), TextSpace(), lambda _: 1e-3, model=path, device="cpu", seed=seed, **POLICY)


def throughput(args: argparse.Namespace) -> None:
    from milegpo.algos.rollout import play_episodes
    from milegpo.envs import make_vec_env

    policy = tiny_policy()
    rows = []
    for n in args.in_flight:
        group = min(8, n)
        env = make_vec_env(SlowToolHouseEnv, n_tasks=n // group, group_size=group, seed=0,
                           env_kwargs={"latency": args.tool_latency}, subprocess=args.worker, n_workers=1)
        try:
            for repeat in range(args.repeats + 1):  # the first rollout warms up (server start, caches)
                steps, policy_seconds = 0, 0.0

                def count(step: Any) -> None:
                    nonlocal steps, policy_seconds
                    steps += len(step.active)
                    policy_seconds += step.policy_seconds

                with harness.Stopwatch() as clock:
                    obs = env.reset()
                    play_episodes(policy, env, obs, list(env.reset_infos), deterministic=False, on_step=count,
                                  stream_seed=repeat)
                wall = clock.wall_s
                if repeat:
                    rows.append({"in_flight": n, "repeat": repeat, "steps": steps, "wall_s": wall,
                                 "policy_s": policy_seconds, "steps_per_s": steps / wall,
                                 "other_ms_per_step": 1000 * (wall - policy_seconds) / steps})
                    print(json.dumps(rows[-1]), flush=True)
        finally:
            env.close()
    suffix = f"_tool{args.tool_latency:g}s" if args.tool_latency else ""
    suffix += "_worker" if args.worker else ""
    write(args.out / f"agent_rollouts_throughput{suffix}",
          {"rows": rows, "settings": settings(args), "machine": machine()}, throughput_table(rows, args))


def throughput_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    import statistics

    where = "one worker process" if args.worker else "this process"
    lines = [f"Agent rollouts, tool latency {args.tool_latency:g} s, envs in {where} (medians of {args.repeats} "
             "rollouts)", "", "| episodes in flight | steps | steps/s | policy share | other ms/step |",
             "|---:|---:|---:|---:|---:|"]
    for n in args.in_flight:
        mine = [r for r in rows if r["in_flight"] == n]
        med = {k: statistics.median(r[k] for r in mine) for k in ("steps", "steps_per_s", "wall_s", "policy_s",
                                                                  "other_ms_per_step")}
        lines.append(f"| {n} | {med['steps']:.0f} | {med['steps_per_s']:.1f} | {med['policy_s'] / med['wall_s']:.0%}"
                     f" | {med['other_ms_per_step']:.1f} |")
    return "\n".join(lines) + "\n"


def learning(args: argparse.Namespace) -> None:
    from stable_baselines3.common.callbacks import BaseCallback

    from milegpo import GRPO, MileGPO
    from milegpo.envs import make_vec_env

    class Curve(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.points: list[tuple[int, float]] = []

        def _on_step(self) -> bool:
            return True

        def _on_rollout_end(self) -> None:
            log = self.model.rollout_state.log
            self.points.append((int(self.model.num_timesteps), float(log["rollout/success_rate"])))

    runs = []
    log_path = args.out / "agent_rollouts_learning.runs.jsonl"
    for seed in args.seeds:
        for name, algo in (("MileGPO", MileGPO), ("GRPO", GRPO)):
            env = make_vec_env(house.HouseAgentEnv, n_tasks=4, group_size=8, seed=seed)
            model = algo("LLMPolicy", env, policy_kwargs=POLICY, learning_rate=args.learning_rate, seed=seed,
                         verbose=0)
            curve = Curve()
            with harness.Stopwatch() as clock:
                model.learn(total_timesteps=args.steps, callback=curve)
            run = {"method": name, "seed": seed, "curve": curve.points, "seconds": clock.wall_s}
            runs.append(run)
            with log_path.open("a") as f:
                f.write(json.dumps(run) + "\n")
            print(f"{name} seed {seed}: success {first_last(curve.points)} in {run['seconds']:.0f} s", flush=True)
            env.close()
    write(args.out / "agent_rollouts_learning", {"runs": runs, "settings": settings(args), "machine": machine()},
          learning_table(runs))
    plot(runs, args.out / "agent_rollouts_learning.png")


def first_last(points: list[tuple[int, float]], k: int = 3) -> str:
    """``first -> last``: the mean success of the first and of the last ``k`` iterations."""
    values = [p[1] for p in points]
    return f"{sum(values[:k]) / len(values[:k]):.2f} -> {sum(values[-k:]) / len(values[-k:]):.2f}"


def learning_table(runs: list[dict[str, Any]]) -> str:
    lines = ["Success of the house agent (rollout success rate, mean of the first and of the last 3 iterations)",
             "", "| method | seed | iterations | env steps | success first -> last | seconds |",
             "|---|---:|---:|---:|---|---:|"]
    for run in runs:
        points = run["curve"]
        lines.append(f"| {run['method']} | {run['seed']} | {len(points)} | {points[-1][0]} | "
                     f"{first_last(points)} | {run['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    colours = {"MileGPO": "tab:blue", "GRPO": "tab:orange"}
    for run in runs:
        steps, success = zip(*run["curve"])
        ax.plot(steps, success, color=colours[run["method"]], alpha=0.8,
                label=f"{run['method']} (seed {run['seed']})",
                linestyle="-" if run["seed"] == runs[0]["seed"] else "--")
    ax.set_xlabel("env steps (model calls)")
    ax.set_ylabel("rollout success rate")
    ax.set_ylim(0, 1)
    ax.set_title("The house agent (openai client) trained with the tiny model")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def machine() -> dict[str, Any]:
    return {"python": platform.python_version(), "cpus": os.cpu_count(), "load_1min": harness.load_1min()}


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The command's arguments as the results record them (the output folder aside)."""
    return {key: value for key, value in vars(args).items() if key != "out"}


def write(out: Path, data: dict[str, Any], table: str) -> None:
    """``out``.json and ``out``.md (the table, printed too)."""
    harness.write_results(out, data, table, indent=1)
    print(table)


def main() -> None:
    parser = harness.parser(__doc__, harness.RESULTS, "the folder the results go to")
    commands = parser.add_subparsers(dest="command", required=True)
    speed = commands.add_parser("throughput", help="env steps/s with N episodes in flight")
    speed.add_argument("--in-flight", type=int, nargs="+", default=[1, 8, 32, 64])
    speed.add_argument("--tool-latency", type=float, default=0.0, help="seconds each move of the program waits")
    speed.add_argument("--worker", action="store_true", help="the envs in one worker process")
    speed.add_argument("--repeats", type=int, default=3)
    learn = commands.add_parser("learning", help="MileGPO and GRPO side by side on the house agent")
    learn.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    learn.add_argument("--steps", type=int, default=3000)
    learn.add_argument("--learning-rate", type=float, default=1e-2)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    throughput(args) if args.command == "throughput" else learning(args)


if __name__ == "__main__":
    main()
