"""Train an OpenAI Agents SDK agent (``openai-agents``) with MileGPO.

The agent is the SDK's own: an ``Agent`` with instructions, a ``@function_tool`` that moves it
through the house of :mod:`agent_openai_tools` (the same 3x3 house, the vault as the goal) and an
``OpenAIChatCompletionsModel`` on the client milegpo gives the program; ``Runner.run`` drives it.
The program plays one move per run: a tool call moves the agent, and a plain final answer is read
as the exit it names most closely; the next run continues the conversation
(``result.to_input_list()``) with the room it is in now. The episode's reward is 1.0 at the vault
within ``MAX_MOVES`` moves. Every chat completion the SDK sends is one step of the episode.

Python: ``python examples/agent_openai_sdk.py --steps 2000``
CLI:    ``milegpo train env.id=examples.agent_openai_sdk:SDKHouseAgentEnv policy.mode=generate
        policy.prompt_format=chat policy.max_new_tokens=2`` (from the repository's root)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_openai_tools import GOAL, MAX_MOVES, STEPS, SYSTEM, TASKS, describe, move, nearest_exit  # noqa: E402

from milegpo.agents import AgentEnv  # noqa: E402


async def walk_with_sdk(client: openai.AsyncOpenAI, start: str) -> float:
    """The Agents SDK agent: 1.0 when it reaches the vault from ``start`` within ``MAX_MOVES`` moves."""
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from agents.exceptions import MaxTurnsExceeded

    set_tracing_disabled(True)  # no traces sent to OpenAI's servers
    state = {"room": start, "moves": 0}

    @function_tool
    def walk(direction: str) -> str:
        """Walk through an exit (north, south, east or west) of the room you are in."""
        state["room"], state["moves"] = move(str(state["room"]), direction), int(state["moves"]) + 1
        return describe(str(state["room"]))

    agent = Agent(name="walker", instructions=SYSTEM, tools=[walk],
                  model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client))
    conversation: Any = describe(start)
    while int(state["moves"]) < MAX_MOVES and state["room"] != GOAL:
        try:
            result = await Runner.run(agent, conversation, max_turns=MAX_MOVES)
        except MaxTurnsExceeded:
            break
        if state["room"] == GOAL:
            break
        room = move(str(state["room"]), nearest_exit(str(state["room"]), str(result.final_output or "")))
        state["room"], state["moves"] = room, int(state["moves"]) + 1
        conversation = [*result.to_input_list(), {"role": "user", "content": describe(room)}]
    return 1.0 if state["room"] == GOAL else 0.0


class SDKHouseAgentEnv(AgentEnv):
    """The SDK agent as an env the CLI can name (``env.id=examples.agent_openai_sdk:SDKHouseAgentEnv``)."""

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("max_episode_steps", MAX_MOVES)
        super().__init__(walk_with_sdk, TASKS, vocabulary=[*TASKS, GOAL, *STEPS], **kwargs)


def main(argv: list[str] | None = None) -> dict[str, float]:
    from milegpo import MileGPO, make_vec_env

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2000, help="env steps (model calls) to train")
    parser.add_argument("--model", default=None, help="a chat model (hub name or folder); default: the tiny one")
    parser.add_argument("--out", default="runs/agent-openai-sdk", help="where to save the trained adapter")
    args = parser.parse_args(argv)

    env = make_vec_env(SDKHouseAgentEnv, n_tasks=4, group_size=8, seed=0)
    policy = {"mode": "generate", "prompt_format": "chat", "max_new_tokens": 2 if args.model is None else 64}
    if args.model is not None:
        policy["model"] = args.model
    model = MileGPO("LLMPolicy", env, policy_kwargs=policy, learning_rate=1e-2, seed=0, verbose=1)
    model.learn(total_timesteps=args.steps)
    model.save(args.out)
    return {"num_timesteps": float(model.num_timesteps)}


if __name__ == "__main__":
    main()
