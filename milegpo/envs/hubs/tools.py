"""Tool-calling envs: :class:`ToolEnv`, a :class:`~milegpo.envs.TextEnv` whose actions are function calls.

A tool env declares its functions as JSON schemas (:meth:`ToolEnv.tools`) and runs a call
(:meth:`ToolEnv.call_tool`). Its ``action_format`` is ``"tools"``: with the policy's chat prompt the
tools are rendered by the chat template (``apply_chat_template(..., tools=...)``), the model's reply is
parsed into tool calls (:mod:`milegpo.policies.tools`), the env receives them as canonical JSON
(``[{"name": ..., "arguments": {...}}]``) and each result comes back as a ``tool`` message. Every
``info`` carries ``tools`` and ``observation_role="tool"``.

An invalid action (penalty, state unchanged, counted in ``valid_action``) is a reply without a
well-formed call (the observation stays as it was), or a call the declared tools refuse: a function
that is not declared, or arguments that break its ``parameters`` JSON schema (checked with
``jsonschema`` before any call runs, so a tool never sees them). A refused call is answered with one
``error: ...`` line saying what was wrong (:meth:`ToolEnv.rejected_call`), as a tool would answer it.
"""

from __future__ import annotations

from typing import Any

from milegpo.envs.core import EnvContractError
from milegpo.envs.hubs.base import HubEnv
from milegpo.policies.tools import arguments_error, read_tool_calls


class ToolEnv(HubEnv):
    """Base of tool-calling envs (see the module docstring): implement :meth:`tools`, :meth:`call_tool`
    and ``_reset``."""

    action_format = "tools"

    def tools(self) -> list[dict[str, Any]]:
        """The functions the agent may call, as ``{"type": "function", "function": {"name", "description",
        "parameters"}}`` JSON schemas."""
        raise NotImplementedError

    def call_tool(self, name: str, arguments: dict[str, Any]) -> tuple[str, float, bool, dict[str, Any]]:
        """Run one call: ``(result text, reward, episode over, info)``; its arguments match the tool's schema."""
        raise NotImplementedError

    def tool_names(self) -> set[str]:
        """The names of the declared functions."""
        return {str(tool.get("function", tool).get("name")) for tool in self.tools()}

    def rejected_call(self, action: str) -> str | None:
        """Why the declared tools refuse the calls of ``action``, as one ``error: ...`` line for the model (the
        first refused call's: a function not declared, or arguments breaking its schema); None when every
        call is accepted, or when ``action`` holds no calls at all."""
        calls = read_tool_calls(action.strip())
        if calls is None:
            return None
        schemas = {}
        for tool in self.tools():
            function = tool.get("function", tool)
            schemas[str(function.get("name"))] = function.get("parameters")
        for call in calls:
            name = call["name"]
            if name not in schemas:
                return f"error: there is no tool {name!r}; the tools are {sorted(schemas)}"
            try:
                problem = arguments_error(schemas[name], call["arguments"])
            except Exception as exc:  # jsonschema's SchemaError, or a schema that is not JSON: the env's bug
                env = self.spec.id if self.spec is not None else type(self).__name__
                raise EnvContractError(f"{env}: the tool {name!r} declares parameters that are not a JSON schema "
                                       f"({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
            if problem is not None:
                return f"error: the arguments of {name} do not match its parameters: {problem}"
        return None

    def is_valid_action(self, action: str) -> bool:
        if read_tool_calls(action) is None or self.rejected_call(action) is not None:
            return False
        return self.commands is None or action.strip() in self.commands

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """:meth:`TextEnv.step`; a refused call's observation is the :meth:`rejected_call` line (the state, its
        key and the observation the next step starts from are unchanged)."""
        observation, reward, terminated, truncated, info = super().step(action)
        if not info["valid_action"]:
            observation = self.rejected_call(action if isinstance(action, str) else str(action)) or observation
        return observation, reward, terminated, truncated, info

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
