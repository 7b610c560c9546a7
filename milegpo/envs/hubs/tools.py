"""Tool-calling envs: :class:`ToolEnv`, a :class:`~milegpo.envs.TextEnv` whose actions are function calls.

A tool env declares its functions as JSON schemas (:meth:`ToolEnv.tools`) and runs a call
(:meth:`ToolEnv.call_tool`). Its ``action_format`` is ``"tools"``: with the policy's chat prompt the
tools are rendered by the chat template (``apply_chat_template(..., tools=...)``), the model's reply is
parsed into tool calls (:mod:`milegpo.policies.tools`), the env receives them as canonical JSON
(``[{"name": ..., "arguments": {...}}]``) and each result comes back as a ``tool`` message. A reply
without a well-formed call of a declared function is an invalid action (penalty, state unchanged,
counted in ``valid_action``). Every ``info`` carries ``tools`` and ``observation_role="tool"``.
"""

from __future__ import annotations

from typing import Any

from milegpo.envs.hubs.base import HubEnv
from milegpo.policies.tools import read_tool_calls


class ToolEnv(HubEnv):
    """Base of tool-calling envs (see the module docstring): implement :meth:`tools`, :meth:`call_tool`
    and ``_reset``."""

    action_format = "tools"

    def tools(self) -> list[dict[str, Any]]:
        """The functions the agent may call, as ``{"type": "function", "function": {"name", "description",
        "parameters"}}`` JSON schemas."""
        raise NotImplementedError

    def call_tool(self, name: str, arguments: dict[str, Any]) -> tuple[str, float, bool, dict[str, Any]]:
        """Run one call: ``(result text, reward, episode over, info)``."""
        raise NotImplementedError

    def tool_names(self) -> set[str]:
        """The names of the declared functions."""
        return {str(tool.get("function", tool).get("name")) for tool in self.tools()}

    def is_valid_action(self, action: str) -> bool:
        calls = read_tool_calls(action)
        if calls is None or any(call["name"] not in self.tool_names() for call in calls):
            return False
        return self.commands is None or action.strip() in self.commands

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        results, total, done, info = [], 0.0, False, dict[str, Any]()
        for call in read_tool_calls(action) or []:
            text, reward, done, info = self.call_tool(call["name"], dict(call["arguments"]))
            results.append(str(text))
            total += float(reward)
            if done:
                break
        return "\n".join(results), total, done, dict(info)

    def info_extras(self) -> dict[str, Any]:
        return {"tools": self.tools(), "observation_role": "tool"}
