"""A ``POST /v1/chat/completions`` body, checked field by field into a :class:`ChatRequest`.

Supported: ``model``, ``messages``, ``tools``, ``tool_choice`` (``"auto"`` or ``"none"``),
``temperature`` (0: greedy), ``top_p`` (1 only), ``max_tokens`` / ``max_completion_tokens``, ``n``,
``stop``, ``seed``, ``logprobs``, ``top_logprobs``, ``stream`` and ``stream_options``. A field
whose value would change the reply in a way the policy cannot honour (``top_p`` below 1, a
penalty, a logit bias, a JSON response format, a forced tool call) is refused with a 400 naming
it, and so is a field the server does not know: a reply never silently ignores what was asked.
Fields that only label a request (``user``, ``metadata``, ``store``, ...) are accepted and unused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from milegpo.policies.chat_messages import MessageError, chat_messages
from milegpo.serve.errors import APIError

#: most replies one request may ask for (``n``)
MAX_N = 16
#: most stop strings (OpenAI's limit) and most alternatives per token (``top_logprobs``)
MAX_STOP = 4
MAX_TOP_LOGPROBS = 20

#: fields that label a request and do not change its reply
LABELS = frozenset({"user", "metadata", "store", "service_tier", "parallel_tool_calls", "prompt_cache_key",
                    "safety_identifier"})
SUPPORTED = frozenset({"model", "messages", "tools", "tool_choice", "temperature", "top_p", "max_tokens",
                       "max_completion_tokens", "n", "stop", "seed", "logprobs", "top_logprobs", "stream",
                       "stream_options", "frequency_penalty", "presence_penalty", "logit_bias", "response_format"})


@dataclass(frozen=True)
class ChatRequest:
    """What a chat completion asks for, checked.

    :param messages: the conversation as the chat template renders it (:mod:`milegpo.policies.chat_messages`).
    :param tools: the function schemas to render into the prompt and to read calls for (None: no tools,
        or ``tool_choice="none"``).
    :param temperature: the sampling temperature; 0 is greedy decoding.
    :param max_tokens: the longest reply in tokens (None: the server's default).
    :param n: how many replies.
    :param stop: strings that end a reply (not included in it).
    :param seed: the first reply's sampling seed (reply ``k`` uses ``seed + k``); None: a fresh one.
    :param logprobs: return each reply token's log-prob.
    :param top_logprobs: and the ``top_logprobs`` most likely tokens at each position.
    :param stream: answer as server-sent events.
    :param include_usage: with ``stream``, end with a chunk holding the token counts.
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    temperature: float = 1.0
    max_tokens: int | None = None
    n: int = 1
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    stream: bool = False
    include_usage: bool = False

    @property
    def greedy(self) -> bool:
        """Temperature 0: the most likely token at every step."""
        return self.temperature == 0


def parse_chat_request(body: Any, model_name: str, default_temperature: float, native_tools: bool) -> ChatRequest:
    """The :class:`ChatRequest` of a request body (``APIError`` 400 naming the first bad field).

    :param model_name: the served model's name: ``model`` must be it.
    :param default_temperature: the temperature of a request that gives none (the policy's own).
    :param native_tools: the tokenizer's own chat template renders tools
        (:func:`~milegpo.policies.chat_messages.chat_messages`).
    """
    if not isinstance(body, dict):
        raise APIError("the request body must be a JSON object")
    unknown = sorted(set(body) - SUPPORTED - LABELS)
    if unknown:
        raise APIError(f"unsupported field(s) {unknown}: this server takes {sorted(SUPPORTED)}", param=unknown[0])
    _refuse_unsupported_values(body)
    model = body.get("model")
    if model != model_name:
        raise APIError(f"model {model!r} is not served here: this server serves {model_name!r} (GET /v1/models)",
                       param="model", code="model_not_found")
    if "messages" not in body:
        raise APIError("messages is missing: give the conversation as [{\"role\": \"user\", \"content\": ...}]",
                       param="messages")
    tools = _tools(body.get("tools"), body.get("tool_choice"))
    max_tokens = _integer(body, "max_completion_tokens", 1) or _integer(body, "max_tokens", 1)
    top_logprobs = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS) or 0
    logprobs = _flag(body, "logprobs")
    if top_logprobs and not logprobs:
        raise APIError("top_logprobs needs logprobs: true", param="top_logprobs")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise APIError("stream_options must be an object such as {\"include_usage\": true}", param="stream_options")
    temperature = _number(body, "temperature", 0.0, 2.0)
    try:
        messages = chat_messages(body["messages"], native_tools)
    except MessageError as exc:
        raise APIError(str(exc), param=exc.param) from None
    return ChatRequest(
        messages=messages, tools=tools,
        temperature=default_temperature if temperature is None else temperature, max_tokens=max_tokens,
        n=_integer(body, "n", 1, MAX_N) or 1, stop=_stop(body.get("stop")), seed=_integer(body, "seed", 0),
        logprobs=logprobs, top_logprobs=top_logprobs, stream=_flag(body, "stream"),
        include_usage=bool(stream_options.get("include_usage")),
    )  # fmt: skip


def _refuse_unsupported_values(body: dict[str, Any]) -> None:
    """400 for the values the policy's sampler cannot honour (it samples softmax(logits / T) as in training)."""
    top_p = _number(body, "top_p", 0.0, 1.0)
    if top_p is not None and top_p != 1:
        raise APIError(f"top_p={top_p:g} is not supported: the policy samples from its whole distribution "
                       "(softmax(logits / temperature), as in training); leave top_p out or set it to 1",
                       param="top_p")
    for name in ("frequency_penalty", "presence_penalty"):
        if _number(body, name, -2.0, 2.0):
            raise APIError(f"{name} is not supported (the policy samples as in training): leave it out or 0",
                           param=name)
    if body.get("logit_bias"):
        raise APIError("logit_bias is not supported (the policy samples as in training)", param="logit_bias")
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise APIError("response_format other than {\"type\": \"text\"} is not supported: the policy's replies "
                       "are not constrained", param="response_format")


def _tools(tools: Any, tool_choice: Any) -> list[dict[str, Any]] | None:
    """The function schemas to render (None when there are none or ``tool_choice`` is ``"none"``)."""
    if tool_choice not in (None, "auto", "none"):
        raise APIError(f"tool_choice {tool_choice!r} is not supported: the policy decides itself whether to call a "
                       "tool; give \"auto\" (the default) or \"none\"", param="tool_choice")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise APIError("tools must be a list of {\"type\": \"function\", \"function\": {...}} objects", param="tools")
    for k, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not (isinstance(tool, dict) and tool.get("type") == "function" and isinstance(function, dict)
                and isinstance(function.get("name"), str)):
            raise APIError(f"tools[{k}] must be {{\"type\": \"function\", \"function\": {{\"name\", \"description\", "
                           "\"parameters\"}}}}", param="tools")
    return tools if tools and tool_choice != "none" else None


def _stop(stop: Any) -> tuple[str, ...]:
    stops = [stop] if isinstance(stop, str) else stop
    if stops is None:
        return ()
    if not (isinstance(stops, list) and len(stops) <= MAX_STOP and all(isinstance(s, str) and s for s in stops)):
        raise APIError(f"stop must be a non-empty string or a list of at most {MAX_STOP} of them", param="stop")
    return tuple(stops)


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise APIError(f"{name} must be true or false, got {value!r}", param=name)
    return value


def _number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise APIError(f"{name} must be a number from {low:g} to {high:g}, got {value!r}", param=name)
    return float(value)


def _integer(body: dict[str, Any], name: str, low: int | None = None, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise APIError(f"{name} must be an integer, got {value!r}", param=name)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"at least {low}" if high is None else f"from {low} to {high}"
        raise APIError(f"{name} must be {bounds}, got {value}", param=name)
    return value
