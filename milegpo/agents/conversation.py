"""What a chat completion request says about the episode: its observation and its state key.

An agent program sends the whole conversation with every request. The part that is new since the
model's last reply (the messages after the last ``assistant`` message: the user's question, the
tool results, the program's feedback) is what the environment answered to the model's last move,
so it is the step's observation; on the first request it is the whole opening (system and user
messages). The state key of a step is that observation normalised (lower case, whitespace collapsed:
:func:`~milegpo.envs.normalize_text`), the observation-key regime: two episodes of a task are in
the same state when the program showed the model the same new messages, whatever came before. A
program that knows its own states better sends the key itself in the ``X-Milegpo-State-Key`` header.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from milegpo.envs.core import normalize_text

#: the request header in which a program gives the step's state key itself
STATE_KEY_HEADER = "x-milegpo-state-key"


def message_text(message: Mapping[str, Any]) -> str:
    """A message's text: its content (a string, or its text parts joined by newlines), and for an assistant
    message its tool calls as ``name(arguments)``."""
    content = message.get("content")
    if isinstance(content, list):
        text = "\n".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    else:
        text = "" if content is None else str(content)
    calls = [call.get("function", {}) for call in message.get("tool_calls") or [] if isinstance(call, Mapping)]
    written = [f"{call.get('name')}({call.get('arguments', '')})" for call in calls if isinstance(call, Mapping)]
    return "\n".join([text, *written]) if written else text


def new_messages(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The messages after the last ``assistant`` message (all of them when there is none)."""
    last = max((k for k, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    return list(messages[last + 1:])


def observation(messages: Sequence[Mapping[str, Any]]) -> str:
    """The step's observation: the new messages as ``role: text`` lines (see the module docstring)."""
    return "\n".join(f"{m.get('role')}: {message_text(m)}" for m in new_messages(messages))


def state_key(messages: Sequence[Mapping[str, Any]], given: str | None) -> str:
    """The step's state key: ``given`` (the program's header) when there is one, else the normalised
    observation."""
    return given if given is not None else normalize_text(observation(messages))


def request_texts(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None) -> list[str]:
    """Every text of a request (its messages and its tools' JSON): what a tiny model's vocabulary needs."""
    return [message_text(m) for m in messages] + ([json.dumps(list(tools))] if tools else [])


def continuation(answered: Mapping[str, Any] | None, messages: Sequence[Mapping[str, Any]],
                 tools: Sequence[Mapping[str, Any]] | None) -> dict[str, Any] | None:
    """How a request continues the one the policy answered before it: ``{"length": n, "reply": message}`` when
    its messages start with that request's ``n`` messages and it offers the same tools (the message after
    them is then, if the program kept it, the policy's ``reply``); None otherwise (the first request, or a
    program that rewrote its conversation)."""
    if answered is None:
        return None
    earlier = list(answered["messages"])
    if len(messages) <= len(earlier) or list(messages[: len(earlier)]) != earlier or answered["tools"] != tools:
        return None
    return {"length": len(earlier), "reply": answered["reply"]}
