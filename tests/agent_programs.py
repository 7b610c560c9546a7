"""Agent programs the agents tests run, written as users write them (the real ``openai`` client), and the
envs that play them (importable by name: ``milegpo train env.id=agent_programs:...`` finds them)."""

from __future__ import annotations

import asyncio
from typing import Any

import openai

from milegpo.agents import AgentEnv

SYSTEM = "You visit the rooms of a house."
ROOMS = ["hall", "kitchen", "garden"]
#: what the three-turn program sent and received: (the messages of a request, the reply's content)
RECORD: list[tuple[list[dict[str, Any]], str]] = []


async def three_turns(client: openai.AsyncOpenAI, task: str) -> float:
    """Three requests, each with the whole conversation; 1.0 when the last reply names the kitchen."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": f"You are in the {task}."}]
    content = ""
    for turn in range(3):
        response = await client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        content = response.choices[0].message.content or ""
        RECORD.append(([dict(m) for m in messages], content))
        messages += [{"role": "assistant", "content": content},
                     {"role": "user", "content": f"Turn {turn + 2}. You are in the {ROOMS[turn]}."}]
    return 1.0 if "kitchen" in content else 0.0


class ThreeTurnsEnv(AgentEnv):
    def __init__(self, **kwargs: Any):
        super().__init__(three_turns, ["hall", "garden"], **kwargs)


async def faulty(client: openai.AsyncOpenAI, task: str) -> float:
    """Task ``ok`` plays two turns; ``raise`` raises and ``hang`` hangs after its first reply; ``silent``
    returns without calling the model."""
    if task == "silent":
        return 1.0
    messages = [{"role": "user", "content": f"You are in the {task} room."}]
    for turn in range(2):
        await client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        if turn == 1 and task == "raise":
            raise ValueError("the agent broke")
        if turn == 1 and task == "hang":
            await asyncio.sleep(3600)
        messages += [{"role": "assistant", "content": "go"}, {"role": "user", "content": "You moved."}]
    return 1.0


class FaultyAgentEnv(AgentEnv):
    def __init__(self, **kwargs: Any):
        kwargs.setdefault("timeout", 2.0)
        super().__init__(faulty, ["ok", "raise", "hang", "silent"], vocabulary=["room moved go"], **kwargs)


_barrier: asyncio.Barrier | None = None  # per process (a worker's programs share its own)


async def waits_for_the_others(client: openai.AsyncOpenAI, task: str) -> float:
    """Two requests; after the first reply the program waits until four programs of its process have theirs (a
    tool that needs the others' moves), then sends its second request."""
    global _barrier
    for turn in range(2):
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"{task} {turn}"}])
        if turn == 0:
            _barrier = _barrier or asyncio.Barrier(4)
            await asyncio.wait_for(_barrier.wait(), timeout=60)
    return 1.0


class WaitingEnv(AgentEnv):
    def __init__(self, **kwargs: Any):
        kwargs.setdefault("timeout", 20.0)
        super().__init__(waits_for_the_others, ["hall"], **kwargs)
