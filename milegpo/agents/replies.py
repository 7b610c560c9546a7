"""The policy's reply to an agent program's request: the env's action, and the JSON the program receives.

The policy answers a request with sampled token ids (:mod:`milegpo.agents.policy_step`), read as
``milegpo serve`` reads them (:func:`milegpo.serve.replies.make_reply`: the text decoded, tool calls
parsed when the request offered tools, the finish reason). What reaches the env is that reply as
canonical JSON, ``{"content": ..., "finish_reason": ..., "tool_calls": [...]}`` (sorted keys, no
token ids): equal replies are equal actions, as the credit's graphs need. The env turns it into a
``chat.completion`` (or its stream) with serve's own assistant message (:func:`milegpo.serve.response.message`).

Usage counts are ``null``: the env never sees token ids (the trainer holds them), and a count that
depends on the conversation would make equal replies different actions.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np

from milegpo.serve.replies import Reply
from milegpo.serve.response import message


def reply_action(reply: Reply) -> str:
    """The env action of a reply: its content, finish reason and tool calls as canonical JSON."""
    action: dict[str, Any] = {"content": reply.content, "finish_reason": reply.finish_reason}
    if reply.tool_calls:
        action["tool_calls"] = reply.tool_calls
    return json.dumps(action, sort_keys=True)


def read_reply(action: str) -> Reply:
    """The reply an action describes; any other text (an env stepped by hand, a random action of a
    checker) is a plain reply with that text as its content."""
    try:
        fields = json.loads(action)
    except (ValueError, RecursionError):
        fields = None
    calls = fields.get("tool_calls", []) if isinstance(fields, dict) else None
    if not (isinstance(fields, dict) and set(fields) <= {"content", "finish_reason", "tool_calls"}
            and isinstance(fields.get("content"), (str, type(None))) and isinstance(calls, list)
            and fields.get("finish_reason") in ("stop", "length", "tool_calls")):
        return Reply([], np.zeros(0, dtype=np.float32), action, action, [], "stop")
    content = fields["content"]
    return Reply([], np.zeros(0, dtype=np.float32), content or "", content, calls, fields["finish_reason"])


def completion_json(reply: Reply, model: str) -> dict[str, Any]:
    """The ``chat.completion`` object of a reply (one choice, usage ``null``)."""
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "message": message(reply), "finish_reason": reply.finish_reason,
                                         "logprobs": None}],
            "usage": None, "system_fingerprint": None}


def completion_events(reply: Reply, model: str) -> Iterator[str]:
    """The server-sent events of a streamed reply: its message, its finish reason, ``[DONE]``."""
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model, "system_fingerprint": None}
    delta = message(reply)
    if "tool_calls" in delta:  # a streamed call carries its position
        delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(delta["tool_calls"])]
    for choice in ({"index": 0, "delta": delta, "logprobs": None, "finish_reason": None},
                   {"index": 0, "delta": {}, "logprobs": None, "finish_reason": reply.finish_reason}):
        yield f"data: {json.dumps({**head, 'choices': [choice]})}\n\n"
    yield "data: [DONE]\n\n"
