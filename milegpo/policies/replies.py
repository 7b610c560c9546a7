"""One sampled completion -> one reply: stop strings, finish reason and tool calls.

The sampler returns token ids (the policy's sampler: they end at an end-of-turn token, at the
policy's ``</action>`` stop text, or at ``max_tokens``). Here a reply is cut before the first
of the request's ``stop`` strings (its tokens and log-probs with it: the sampler stops at its own
ends only, so a stop string cuts what it generated past it), its text decoded as the policy
decodes it (special tokens skipped), and, when the request gave tools, its tool calls read by the
parser training uses (:func:`~milegpo.policies.parsing.action_parser` with ``"tools"``).

``milegpo serve`` sends a reply as OpenAI's JSON (:mod:`milegpo.serve.response`); the policy's reply to an
agent program's request is an env action (:func:`reply_action`), read back by the env (:func:`read_reply`):
the reply as canonical JSON, ``{"content": ..., "finish_reason": ..., "tool_calls": [...]}`` (sorted keys, no
token ids), so equal replies are equal actions, as the credit's graphs need.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from milegpo.policies.sampling import STOP_TEXT, Completion
from milegpo.policies.tools import TOOL_CALL_RESPONSE_TEMPLATE, read_tool_calls


@dataclass
class Reply:
    """One reply of a chat completion, token by token and as the client reads it.

    :param token_ids: the reply's tokens (up to its stop string).
    :param logprobs: each token's log-prob under the distribution it was drawn from.
    :param text: the decoded reply.
    :param content: the message text (without its tool calls); None when only calls were written.
    :param tool_calls: the calls read from it, ``{"name", "arguments": {...}}`` each.
    :param finish_reason: ``"tool_calls"``, ``"stop"`` (an end-of-turn token, the policy's stop text
        or a stop string) or ``"length"`` (``max_tokens`` reached).
    :param top_logprobs: per token, the most likely ``(token id, log-prob)`` pairs, when asked for.
    """

    token_ids: list[int]
    logprobs: np.ndarray
    text: str
    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = "stop"
    top_logprobs: list[list[tuple[int, float]]] | None = None


def make_reply(completion: Completion, tokenizer: Any, eos_ids: Collection[int], stop: Sequence[str],
               parse_tools: Callable[[str, str], tuple[str, bool]] | None) -> Reply:
    """The :class:`Reply` of ``completion`` (see the module docstring).

    :param eos_ids: the policy's end-of-turn tokens.
    :param parse_tools: the tool-call parser, when the request gave tools; else None.
    """
    ids, logprobs = list(completion.token_ids), np.asarray(completion.logprobs, dtype=np.float32)
    text = tokenizer.decode(ids, skip_special_tokens=True)
    ended = bool(ids) and (ids[-1] in eos_ids or STOP_TEXT in tokenizer.decode(ids[-16:]))
    cuts = [text.find(s) for s in stop if s in text]
    if cuts:  # cut before the first stop string; the tokens kept are those wholly before it
        cut = min(cuts)
        keep = bisect.bisect_left(range(len(ids) + 1), True,
                                  key=lambda k: len(tokenizer.decode(ids[:k], skip_special_tokens=True)) > cut) - 1
        ids, logprobs, text, ended = ids[:keep], logprobs[:keep], text[:cut], True
    calls: list[dict[str, Any]] = []
    content: str | None = text
    if parse_tools is not None:
        action, parsed = parse_tools(text, "tools")
        calls = (read_tool_calls(action) or []) if parsed else []
        if calls:
            content = _content_beside_calls(text, tokenizer)
    finish = "tool_calls" if calls else ("stop" if ended else "length")
    return Reply(ids, logprobs, text, content, calls, finish)


def _content_beside_calls(text: str, tokenizer: Any) -> str | None:
    """The text of a reply outside its tool calls (the response template's ``content`` field: the
    schema the tool-call parser reads with), or None when there is none."""
    from transformers.utils.chat_parsing import parse_response

    schema = getattr(tokenizer, "response_template", None) or TOOL_CALL_RESPONSE_TEMPLATE
    try:
        content = parse_response(text, schema, prefix="").get("content")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
    return (content.strip() or None) if isinstance(content, str) else None


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
