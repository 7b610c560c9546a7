"""OpenAI chat messages -> the messages the tokenizer's chat template renders.

The policy's prompts are the tokenizer's chat template over ``{"role", "content"}`` messages
(:class:`~milegpo.policies.prompts.ChatPromptBuilder`), so a request's messages are checked and
brought to that form:

* ``content`` may be a string or a list of text parts (joined with newlines); an image or audio
  part is refused: the policy reads text only;
* ``developer`` is OpenAI's newer name of ``system`` and is rendered as ``system``;
* an ``assistant`` message with ``tool_calls`` (a call the model made earlier) is rendered as the
  model wrote it: as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` text after its
  content, the format of the tool prompt (:data:`~milegpo.policies.tools.TOOL_CHAT_TEMPLATE`), or, for
  a tokenizer whose own template renders tools, as the ``tool_calls`` list that template reads (its
  arguments as a JSON object);
* a ``tool`` message (a call's result) keeps its content, as training's tool results do.

A message that cannot be brought to that form raises :class:`MessageError` naming it (``milegpo serve``
answers it with a 400, :func:`milegpo.serve.request.parse_chat_request`).
"""

from __future__ import annotations

import json
from typing import Any

#: the roles a request may use, and how each is rendered
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


class MessageError(ValueError):
    """A request's message the chat template cannot render; ``param`` is the field at fault (``messages[2].role``)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def chat_messages(messages: Any, native_tools: bool) -> list[dict[str, Any]]:
    """The chat-template messages of a request's ``messages`` (:class:`MessageError` naming the first bad one).

    :param native_tools: the tokenizer's own template renders tools (and the ``tool_calls`` of past
        assistant messages); otherwise past calls are written into the assistant's text.
    """
    if not isinstance(messages, list) or not messages:
        raise MessageError("messages must be a non-empty list of {role, content} objects", param="messages")
    return [_message(message, index, native_tools) for index, message in enumerate(messages)]


def _message(message: Any, index: int, native_tools: bool) -> dict[str, Any]:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise MessageError(f"{where} must be an object with a role and a content", param=where)
    role = message.get("role")
    if role not in ROLES:
        raise MessageError(f"{where}.role is {role!r}: give one of {sorted(ROLES)}", param=f"{where}.role")
    calls = message.get("tool_calls") if role == "assistant" else None
    content = _content(message.get("content"), where, allow_none=bool(calls))
    rendered: dict[str, Any] = {"role": ROLES[role], "content": content}
    if calls:
        plain = _tool_calls(calls, where)
        if native_tools:
            rendered["tool_calls"] = [{"type": "function", "function": call} for call in plain]
        else:
            written = "\n".join(f"<tool_call>\n{json.dumps(call)}\n</tool_call>" for call in plain)
            rendered["content"] = f"{content}\n{written}" if content else written
    if role == "tool" and native_tools and isinstance(message.get("tool_call_id"), str):
        rendered["tool_call_id"] = message["tool_call_id"]
    return rendered


def _content(content: Any, where: str, allow_none: bool) -> str:
    """A message's text: a string, or the text parts of a list joined by newlines."""
    if content is None and allow_none:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        texts = []
        for k, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise MessageError(f"{where}.content[{k}] is a {kind!r} part: the policy reads text only "
                               "({\"type\": \"text\", \"text\": ...} parts or a string)", param=f"{where}.content")
            texts.append(part["text"])
        return "\n".join(texts)
    raise MessageError(f"{where}.content must be a string or a list of text parts, got {type(content).__name__}",
                   param=f"{where}.content")


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """``[{"name", "arguments": {...}}]`` of an assistant message's OpenAI ``tool_calls``."""
    if not isinstance(calls, list):
        raise MessageError(f"{where}.tool_calls must be a list", param=f"{where}.tool_calls")
    plain = []
    for k, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not (isinstance(function, dict) and isinstance(function.get("name"), str)):
            raise MessageError(f"{where}.tool_calls[{k}] must be {{\"type\": \"function\", \"function\": {{\"name\", "
                           "\"arguments\"}}}}", param=f"{where}.tool_calls")
        arguments = function.get("arguments", "{}")
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            raise MessageError(f"{where}.tool_calls[{k}].function.arguments must be a JSON object (as a string)",
                           param=f"{where}.tool_calls")
        plain.append({"name": function["name"], "arguments": arguments})
    return plain
