"""A :class:`~milegpo.serve.engine.Generation` as OpenAI's JSON: a ``chat.completion``, or the
``chat.completion.chunk`` events of a streamed one.

A streamed completion is generated whole first and then sent as events (per reply one chunk with
its message, one with its finish reason; the usage chunk when ``stream_options.include_usage``;
then ``[DONE]``): clients that stream read it as they read any stream, but the first text arrives
when the whole reply is ready, not token by token.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from milegpo.policies.replies import Reply
from milegpo.serve.engine import Generation
from milegpo.serve.request import ChatRequest


def completion_body(generation: Generation, request: ChatRequest, model: str, tokenizer: Any) -> dict[str, Any]:
    """The ``chat.completion`` object of ``generation``."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": i, "message": message(reply), "finish_reason": reply.finish_reason,
                     "logprobs": token_logprobs(reply, tokenizer) if request.logprobs else None}
                    for i, reply in enumerate(generation.replies)],
        "usage": usage(generation), "system_fingerprint": None,
    }  # fmt: skip


def stream_events(generation: Generation, request: ChatRequest, model: str, tokenizer: Any) -> Iterator[str]:
    """The server-sent events of a streamed ``generation`` (see the module docstring)."""
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model, "system_fingerprint": None}
    for i, reply in enumerate(generation.replies):
        delta = message(reply)
        if "tool_calls" in delta:  # a streamed call carries its position
            delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(delta["tool_calls"])]
        logprobs = token_logprobs(reply, tokenizer) if request.logprobs else None
        yield _event({**head, "choices": [{"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": None}]})
        yield _event({**head, "choices": [{"index": i, "delta": {}, "logprobs": None,
                                           "finish_reason": reply.finish_reason}]})
    if request.include_usage:
        yield _event({**head, "choices": [], "usage": usage(generation)})
    yield "data: [DONE]\n\n"


def _event(chunk: dict[str, Any]) -> str:
    return f"data: {json.dumps(chunk)}\n\n"


def message(reply: Reply) -> dict[str, Any]:
    """The assistant message of a reply, its tool calls in OpenAI's form (arguments as a JSON string)."""
    body: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        body["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                               "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}
                              for call in reply.tool_calls]
    return body


def token_logprobs(reply: Reply, tokenizer: Any) -> dict[str, Any]:
    """``{"content": [{"token", "logprob", "bytes", "top_logprobs"}, ...]}`` of a reply's tokens."""
    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        text = tokenizer.decode([token_id])
        return {"token": text, "logprob": float(logprob), "bytes": list(text.encode("utf-8"))}

    tops = reply.top_logprobs or [[] for _ in reply.token_ids]
    return {"content": [{**entry(t, lp), "top_logprobs": [entry(a, alp) for a, alp in top]}
                        for t, lp, top in zip(reply.token_ids, reply.logprobs.tolist(), tops)],
            "refusal": None}


def usage(generation: Generation) -> dict[str, int]:
    """Prompt tokens (counted once, as OpenAI counts them for ``n`` replies) and the replies' tokens."""
    prompt, completion = len(generation.prompt_ids), sum(len(r.token_ids) for r in generation.replies)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
