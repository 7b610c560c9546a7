"""Reading the action out of a generated ``<think>…</think><action>…</action>`` reply."""

from __future__ import annotations

import re

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
