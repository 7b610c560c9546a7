"""Agent programs as environments: train an agent that calls an LLM through the OpenAI API.

``AgentEnv(program, tasks)`` makes an ``async def program(client, task) -> reward`` (a tool loop with
the ``openai`` client, an OpenAI Agents SDK agent, a verifiers harness, ...) a step-wise text env:
every chat completion the program sends through ``client`` is one step, answered by the policy
being trained, and the program's return value is the episode's reward. The modules, one job each:
``env`` (the env), ``server`` (the per-process endpoint, a session per episode), ``session`` (one
episode's program run), ``requests`` (checking a request), ``replies`` (the reply as JSON),
``conversation`` (observations and state keys), ``errors`` (the faults of a program). The policy's side
of a step (the prompt from a request's messages, the reply as the env's action) is
:mod:`milegpo.policies.chat_requests`. Serving needs ``pip install 'milegpo[agents]'``.
"""

from milegpo.agents.conversation import STATE_KEY_HEADER
from milegpo.agents.env import AgentEnv
from milegpo.agents.errors import AgentError, AgentNeverCalledModel, AgentRaised, AgentTimedOut
from milegpo.agents.requests import MODEL_NAME

__all__ = ["MODEL_NAME", "STATE_KEY_HEADER", "AgentEnv", "AgentError", "AgentNeverCalledModel", "AgentRaised",
           "AgentTimedOut"]
