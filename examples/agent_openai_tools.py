"""Train a plain ``openai``-client tool agent with MileGPO: the agent program is the one you would
write against the OpenAI API, and milegpo trains the model it calls.

The agent walks a 3x3 house to the vault. Each turn it tells the model the room it is in and its
exits, offers a ``move`` tool through ``client.chat.completions.create``, and runs the model's tool
calls, or, when the model answers in plain text, reads the answer as the exit it names most closely
(a forgiving parser, as agents that also accept a plain answer have). It returns 1.0 when it
reaches the vault within ``MAX_MOVES`` moves, else 0.0. Nothing in the program knows about milegpo:
:class:`~milegpo.agents.AgentEnv` gives it a client whose every request is one step of the episode,
answered by the policy being trained.

With no ``--model`` the offline tiny model learns to walk (a word-level LM built from the house's
words, no download, a few minutes on a CPU); ``--model NAME_OR_PATH`` trains a chat model, which
calls the tool itself.

Python: ``python examples/agent_openai_tools.py --steps 2000``
CLI:    ``milegpo train env.id=examples.agent_openai_tools:HouseAgentEnv policy.mode=generate
        policy.prompt_format=chat policy.max_new_tokens=2`` (from the repository's root)
"""

from __future__ import annotations

import argparse
import difflib
import json
from typing import Any

import openai

from milegpo.agents import AgentEnv

#: the house, row by row from the north; the vault is the goal
HOUSE = [["attic", "library", "vault"],
         ["hall", "kitchen", "pantry"],
         ["porch", "garden", "shed"]]
GOAL = "vault"
MAX_MOVES = 6
STEPS = {"north": (-1, 0), "south": (1, 0), "west": (0, -1), "east": (0, 1)}
SYSTEM = "You walk through a house to find the vault. Each turn, move through one exit."
TOOLS = [{"type": "function", "function": {
    "name": "move", "description": "Walk through an exit of the room you are in.",
    "parameters": {"type": "object", "properties": {"direction": {"type": "string", "enum": list(STEPS)}},
                   "required": ["direction"]}}}]
#: the start rooms: one task each
TASKS = [room for row in HOUSE for room in row if room != GOAL]


def where(room: str) -> tuple[int, int]:
    return next((r, c) for r, row in enumerate(HOUSE) for c, name in enumerate(row) if name == room)


def exits(room: str) -> list[str]:
    r, c = where(room)
    return [d for d, (dr, dc) in STEPS.items() if 0 <= r + dr < 3 and 0 <= c + dc < 3]


def describe(room: str) -> str:
    return f"You are in the {room}. Exits: {', '.join(exits(room))}."


def move(room: str, direction: str) -> str:
    """The room ``direction`` leads to (the same room for a wall)."""
    if direction not in exits(room):
        return room
    r, c = where(room)
    dr, dc = STEPS[direction]
    return HOUSE[r + dr][c + dc]


def nearest_exit(room: str, answer: str) -> str:
    """The exit a plain answer names most closely."""
    return difflib.get_close_matches(answer.strip().lower(), exits(room), n=1, cutoff=0.0)[0]


async def walk(client: openai.AsyncOpenAI, start: str) -> float:
    """The agent: 1.0 when it reaches the vault from ``start`` within ``MAX_MOVES`` moves. Each turn it shows
    the model where it is (the house is all the state there is: it keeps no transcript) and makes the move."""
    room = start
    for _ in range(MAX_MOVES):
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                          {"role": "user", "content": describe(room)}]
        response = await client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)
        reply = response.choices[0].message
        if reply.tool_calls:
            for call in reply.tool_calls:
                room = move(room, json.loads(call.function.arguments).get("direction", ""))
        else:
            room = move(room, nearest_exit(room, reply.content or ""))
        if room == GOAL:
            return 1.0
    return 0.0


class HouseAgentEnv(AgentEnv):
    """The agent as an env the CLI can name (``env.id=examples.agent_openai_tools:HouseAgentEnv``)."""

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("max_episode_steps", MAX_MOVES)
        super().__init__(walk, TASKS, vocabulary=[*TASKS, GOAL, *STEPS], **kwargs)


def main(argv: list[str] | None = None) -> dict[str, float]:
    from milegpo import MileGPO, make_vec_env

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2000, help="env steps (model calls) to train")
    parser.add_argument("--model", default=None, help="a chat model (hub name or folder); default: the tiny one")
    parser.add_argument("--out", default="runs/agent-openai-tools", help="where to save the trained adapter")
    args = parser.parse_args(argv)

    env = make_vec_env(HouseAgentEnv, n_tasks=4, group_size=8, seed=0)
    policy = {"mode": "generate", "prompt_format": "chat", "max_new_tokens": 2 if args.model is None else 64}
    if args.model is not None:
        policy["model"] = args.model
    model = MileGPO("LLMPolicy", env, policy_kwargs=policy, learning_rate=1e-2, seed=0, verbose=1)
    model.learn(total_timesteps=args.steps)
    model.save(args.out)
    return {"num_timesteps": float(model.num_timesteps)}


if __name__ == "__main__":
    main()
