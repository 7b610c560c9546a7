"""The JSON an agent program receives for the policy's reply to its request.

The policy answers a request with sampled token ids (:mod:`milegpo.policies.chat_requests`), read as
``milegpo serve`` reads them (:func:`milegpo.policies.replies.make_reply`: the text decoded, tool calls
parsed when the request offered tools, the finish reason). What reaches the env is that reply as
canonical JSON (:func:`~milegpo.policies.replies.reply_action`, read back by
:func:`~milegpo.policies.replies.read_reply`): equal replies are equal actions, as the credit's graphs need.
The env turns it into a ``chat.completion`` (or its stream) with serve's own assistant message
(:func:`milegpo.serve.response.message`).

Usage counts are ``null``: the env never sees token ids (the trainer holds them), and a count that
depends on the conversation would make equal replies different actions.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from milegpo.policies.replies import Reply
from milegpo.serve.response import message


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
