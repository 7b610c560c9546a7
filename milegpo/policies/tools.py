"""Tool-calling actions (``action_format="tools"``): tools in the chat template, tool calls out of the reply.

An env whose actions are function calls declares its tools as JSON schemas (``info["tools"]``, the
``[{"type": "function", "function": {"name", "description", "parameters"}}]`` list that
``apply_chat_template(..., tools=...)`` takes). The chat prompt renders them through the tokenizer's
own chat template when that template knows tools, else through :data:`TOOL_CHAT_TEMPLATE` (ChatML with
``<tool_call>`` JSON calls, the format of the Qwen 2.5 / Hermes family, e.g. for SmolLM2, whose
template has no tools). The model's reply is parsed by transformers' own response parser
(``tokenizer.parse_response``) with the tokenizer's ``response_template`` where it has one, else
:data:`TOOL_CALL_RESPONSE_TEMPLATE` (the same ``<tool_call>`` format). The env receives the calls as one
canonical JSON string (:func:`tool_calls_action`), ``[{"name": ..., "arguments": {...}}, ...]``; a reply
without a well-formed call is unparsed (the env then counts an invalid action: penalty, state unchanged).
A reply too deeply nested for Python's JSON decoder (``RecursionError``) is unparsed too. The env checks
each call's arguments against its tool's JSON schema (:func:`arguments_error`, by ``jsonschema``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

#: a ChatML chat template that renders ``tools`` (used when the tokenizer's own template ignores them)
TOOL_CHAT_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\\n' }}"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\\n\\n' }}{% endif %}"
    "{{ 'You may call one or more functions. Their signatures are JSON schemas inside <tools></tools>:\\n<tools>\\n' }}"
    "{% for tool in tools %}{{ tool | tojson }}{{ '\\n' }}{% endfor %}"
    "{{ '</tools>\\nCall a function with a JSON object inside <tool_call></tool_call> tags:\\n<tool_call>\\n' }}"
    "{{ '{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{% elif messages[0]['role'] == 'system' %}"
    "{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}{% if not (loop.first and message['role'] == 'system') %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

#: transformers ``response_template`` of replies with ``<tool_call>{json}</tool_call>`` calls
TOOL_CALL_RESPONSE_TEMPLATE: dict[str, Any] = {
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "content": {"content": "text"},
        "tool_calls": {"open": "<tool_call>", "close": "</tool_call>", "content": "json", "repeats": True,
                       "transform": {"type": "function", "function": "{content}"}},
    },
}


def renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template uses the ``tools`` it is given."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "tools" in template


def chat_template_for_tools(tokenizer: Any) -> str | None:
    """The chat template to render tools with: None (the tokenizer's own) or :data:`TOOL_CHAT_TEMPLATE`."""
    return None if renders_tools(tokenizer) else TOOL_CHAT_TEMPLATE


def render_chat(tokenizer: Any, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None,
                tokenize: bool) -> Any:
    """``tokenizer.apply_chat_template`` of ``messages`` with the next assistant turn's generation prompt, as text
    or as ids (what the tokenizer returns); ``tools`` (JSON schemas) go to the template, rendered by
    :data:`TOOL_CHAT_TEMPLATE` when the tokenizer's own template ignores tools."""
    conversation = [dict(m) for m in messages]
    if tools:
        return tokenizer.apply_chat_template(conversation, tools=[dict(t) for t in tools],
                                             chat_template=chat_template_for_tools(tokenizer),
                                             add_generation_prompt=True, tokenize=tokenize)
    return tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=tokenize)


def tool_calls_action(calls: Sequence[Mapping[str, Any]]) -> str:
    """The env's action for ``calls`` (``{"name", "arguments"}`` each, or the ``{"type": "function",
    "function": {...}}`` form): canonical JSON (sorted keys), so equal calls are equal actions."""
    plain = []
    for call in calls:
        function = call.get("function", call)
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            arguments = json.loads(arguments)
        plain.append({"name": function["name"], "arguments": arguments})
    return json.dumps(plain, sort_keys=True)


def read_tool_calls(action: str) -> list[dict[str, Any]] | None:
    """The calls of an action :func:`tool_calls_action` wrote; None when ``action`` is not such a list."""
    try:
        calls = json.loads(action)
    except (TypeError, ValueError, RecursionError):  # RecursionError: nested deeper than the decoder's limit
        return None
    if not (isinstance(calls, list) and calls and all(
            isinstance(c, dict) and isinstance(c.get("name"), str) and isinstance(c.get("arguments"), dict)
            for c in calls)):
        return None
    return calls


def parse_tool_reply(reply: str, tokenizer: Any = None, tools: Sequence[Mapping[str, Any]] | None = None,
                     ) -> tuple[str, bool]:
    """``(action, parsed)`` of a reply: its tool calls as :func:`tool_calls_action`, by transformers'
    response parser (the tokenizer's ``response_template``, else :data:`TOOL_CALL_RESPONSE_TEMPLATE`;
    argument values cast by the ``tools``' schemas). No call, or a malformed one: ``(reply, False)``; so is a
    call nested deeper than the JSON decoder's recursion limit (a reply of a thousand ``[``)."""
    from transformers.utils.chat_parsing import parse_response

    schema = getattr(tokenizer, "response_template", None) or TOOL_CALL_RESPONSE_TEMPLATE
    schemas: list[Any] | None = [dict(tool) for tool in tools] if tools else None
    try:
        if tokenizer is not None:
            message = tokenizer.parse_response(reply, schema=schema, prefix="", tools=schemas)
        else:
            message = parse_response(reply, schema, prefix="", tools=schemas)
        calls = message.get("tool_calls") or []
        return (tool_calls_action(calls), True) if calls else (reply, False)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return reply, False


#: the longest explanation of a schema mismatch :func:`arguments_error` gives (an error can quote a whole value)
MAX_ERROR_CHARS = 200


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    """The ``jsonschema`` validator of a tool's parameters schema (given as sorted JSON, so it is cached),
    the schema itself checked first (``SchemaError`` for a schema that is not one)."""
    from jsonschema.validators import validator_for

    schema = json.loads(schema_json)
    cls = validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def arguments_error(parameters: Mapping[str, Any] | None, arguments: Mapping[str, Any]) -> str | None:
    """Why ``arguments`` break a tool's ``parameters`` JSON schema, in one short line (the most relevant
    error, ``jsonschema``'s ``best_match``, with its path: ``"number: 'abc' is not of type 'integer'"``);
    None when they match, or when the tool declares no schema. A schema that is not a valid JSON schema
    raises ``jsonschema.SchemaError`` (the env's bug, not the model's)."""
    if not parameters:
        return None
    from jsonschema.exceptions import best_match

    error = best_match(_validator(json.dumps(parameters, sort_keys=True)).iter_errors(dict(arguments)))
    if error is None:
        return None
    where = ".".join(str(part) for part in error.absolute_path)
    text = f"{where}: {error.message}" if where else error.message
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS - 3] + "..."
