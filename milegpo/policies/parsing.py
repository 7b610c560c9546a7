"""Reading the action out of a generated reply: the ``<action>…</action>`` tags of the paper's
prompts, the whole reply for envs that parse their own format, the tool calls of a tool-calling
env (:mod:`milegpo.policies.tools`), or a function of one's own."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any

from milegpo.policies.tools import parse_tool_reply

_ACTION = re.compile(r"<\s*action\s*>(.*?)<\s*/\s*action\s*>", re.IGNORECASE | re.DOTALL)
_WHITESPACE = re.compile(r"\s+")


def parse_action(text: str) -> tuple[str, bool]:
    """``(action, parsed)`` from a model reply.

    The content of the last complete ``<action>…</action>`` pair wins (tags are
    matched case-insensitively and may contain spaces, e.g. ``< Action >``); its
    whitespace is stripped and collapsed. Without a non-empty tagged action the
    reply is returned unchanged with ``parsed=False``: the env then sees the raw
    text and treats it as an invalid action.
    """
    matches = _ACTION.findall(text)
    if matches:
        action = _WHITESPACE.sub(" ", matches[-1]).strip()
        if action:
            return action, True
    return text, False


def parse_message(text: str) -> tuple[str, bool]:
    """``(reply, parsed)``: the whole reply for an env that parses its own format; only an empty
    reply is unparsed."""
    reply = text.strip()
    return reply, bool(reply)


def parse_tools(text: str) -> tuple[str, bool]:
    """``(calls, parsed)``: the reply's tool calls as the canonical JSON a tool env reads
    (:func:`~milegpo.policies.tools.parse_tool_reply`); a reply without a well-formed call is unparsed."""
    return parse_tool_reply(text)


#: the built-in parsers by ``TextEnv.action_format``
PARSERS: dict[str, Callable[[str], tuple[str, bool]]] = {"tags": parse_action, "message": parse_message,
                                                         "tools": parse_tools}


def action_parser(spec: str, tokenizer: Any = None) -> Callable[[str, str], tuple[str, bool]]:
    """``parse(reply, env_action_format) -> (action, parsed)`` for ``PolicyConfig.action_parser``.

    ``"auto"`` follows each env's ``action_format``; ``"tags"`` / ``"message"`` / ``"tools"`` fix one;
    ``"module:function"`` imports ``function(reply) -> str | None`` (None: no action found,
    the reply goes to the env unchanged as an invalid action, as with tags). With ``tokenizer``,
    tool calls are read with its own ``response_template`` when it has one.
    """
    if tokenizer is not None and getattr(tokenizer, "response_template", None):
        def tools_of_tokenizer(text: str) -> tuple[str, bool]:
            return parse_tool_reply(text, tokenizer)

        parsers = {**PARSERS, "tools": tools_of_tokenizer}
    else:
        parsers = PARSERS
    if spec == "auto":
        def by_env(reply: str, env_format: str) -> tuple[str, bool]:
            if env_format not in parsers:
                raise ValueError(f"the env's action_format {env_format!r} is not one of {sorted(parsers)}")
            return parsers[env_format](reply)

        return by_env
    if spec in parsers:
        fixed = parsers[spec]
        return lambda reply, _env_format: fixed(reply)
    module, _, name = spec.partition(":")
    try:
        function = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"action_parser {spec!r} names no function ({error}); give 'module:function'") from None
    if not callable(function):
        raise ValueError(f"action_parser {spec!r} is not callable")

    def custom(reply: str, _env_format: str) -> tuple[str, bool]:
        action = function(reply)
        return (str(action), True) if action is not None else (reply, False)

    return custom
