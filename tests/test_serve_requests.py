"""`milegpo serve` without a model: checking a request, rendering its messages, and reading a reply's
tool calls, stop strings and finish reason with a real (word-level) tokenizer."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from milegpo.policies.chat_messages import chat_messages
from milegpo.policies.parsing import action_parser
from milegpo.policies.replies import make_reply
from milegpo.policies.sampling import Completion
from milegpo.policies.tiny import EOS, build_word_tokenizer
from milegpo.serve.engine import Generation
from milegpo.serve.errors import APIError
from milegpo.serve.request import parse_chat_request
from milegpo.serve.response import completion_body, message

USER = [{"role": "user", "content": "hi"}]
CALL_REPLY = 'Let me try.\n<tool_call>\n{"name": "guess", "arguments": {"number": 4}}\n</tool_call>'


def parse(**fields: Any) -> Any:
    return parse_chat_request({"model": "m", "messages": USER, **fields}, "m", 0.7, native_tools=False)


def test_defaults_and_supported_fields() -> None:
    request = parse()
    assert (request.temperature, request.n, request.stop, request.seed, request.max_tokens) == (0.7, 1, (), None, None)
    assert not request.greedy and not request.stream and request.tools is None
    request = parse(temperature=0, n=3, stop="x", seed=5, max_completion_tokens=9, logprobs=True, top_logprobs=2,
                    stream=True, stream_options={"include_usage": True}, top_p=1, user="me", presence_penalty=0)
    assert request.greedy and (request.n, request.stop, request.seed, request.max_tokens) == (3, ("x",), 5, 9)
    assert (request.logprobs, request.top_logprobs, request.stream, request.include_usage) == (True, 2, True, True)
    tool = {"type": "function", "function": {"name": "f"}}
    assert parse(tools=[tool]).tools == [tool] and parse(tools=[tool], tool_choice="none").tools is None


@pytest.mark.parametrize(("fields", "param"), [
    ({"n": 0}, "n"), ({"n": 17}, "n"), ({"n": True}, "n"), ({"temperature": 2.5}, "temperature"),
    ({"temperature": "hot"}, "temperature"), ({"max_tokens": 0}, "max_tokens"), ({"seed": -1}, "seed"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"), ({"stop": [""]}, "stop"), ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": "yes"}, "logprobs"), ({"top_p": 0.9}, "top_p"), ({"frequency_penalty": 0.5}, "frequency_penalty"),
    ({"logit_bias": {"1": 5}}, "logit_bias"), ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"), ({"tools": [{}]}, "tools"),
    ({"functions": []}, "functions"), ({"model": "other"}, "model"), ({"messages": []}, "messages"),
    ({"messages": [{"role": "function", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f",
                                                                                      "arguments": "{oops"}}]}]},
     "messages[0].tool_calls"),
])
def test_a_bad_field_is_a_400_naming_it(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(APIError) as error:
        parse(**fields)
    assert error.value.status == 400 and error.value.param == param
    assert error.value.body()["error"]["type"] == "invalid_request_error"


def test_messages_are_brought_to_the_chat_templates_form() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "guess", "arguments": '{"number": 4}'}}
    messages = [{"role": "developer", "content": [{"type": "text", "text": "be"}, {"type": "text", "text": "brief"}]},
                {"role": "assistant", "content": "Let me try.", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "higher", "name": "guess"}]
    assert chat_messages(messages, native_tools=False) == [
        {"role": "system", "content": "be\nbrief"}, {"role": "assistant", "content": CALL_REPLY},
        {"role": "tool", "content": "higher"}]
    assert chat_messages(messages, native_tools=True)[1:] == [
        {"role": "assistant", "content": "Let me try.",
         "tool_calls": [{"type": "function", "function": {"name": "guess", "arguments": {"number": 4}}}]},
        {"role": "tool", "content": "higher", "tool_call_id": "c1"}]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_word_tokenizer([CALL_REPLY, "go to the kitchen now"])


def completion(tokenizer: Any, text: str, end: bool = True) -> Completion:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + ([tokenizer.convert_tokens_to_ids(EOS)] if end
                                                                    else [])
    return Completion(ids, np.linspace(-1, -2, len(ids)).astype(np.float32))


def test_a_tool_call_reply_comes_back_in_openais_form(tokenizer: Any) -> None:
    eos = [tokenizer.convert_tokens_to_ids(EOS)]
    reply = make_reply(completion(tokenizer, CALL_REPLY), tokenizer, eos, (), action_parser("tools", tokenizer))
    assert reply.text == CALL_REPLY and reply.finish_reason == "tool_calls"
    assert reply.tool_calls == [{"name": "guess", "arguments": {"number": 4}}] and reply.content == "Let me try."
    [call] = message(reply)["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "guess", "arguments": json.dumps({"number": 4})}
    # without tools in the request (or a reply with no well-formed call) the reply is text
    plain = make_reply(completion(tokenizer, CALL_REPLY), tokenizer, eos, (), None)
    assert plain.tool_calls == [] and plain.content == CALL_REPLY and plain.finish_reason == "stop"
    broken = make_reply(completion(tokenizer, CALL_REPLY.replace('"name"', "name")), tokenizer, eos, (),
                        action_parser("tools", tokenizer))
    assert broken.tool_calls == [] and broken.finish_reason == "stop"


def test_stop_strings_cut_the_reply_and_its_tokens(tokenizer: Any) -> None:
    eos = [tokenizer.convert_tokens_to_ids(EOS)]
    unended = completion(tokenizer, "go to the kitchen now", end=False)
    assert make_reply(unended, tokenizer, eos, (), None).finish_reason == "length"
    reply = make_reply(unended, tokenizer, eos, (" the", "now"), None)
    assert (reply.text, reply.finish_reason) == ("go to", "stop")
    assert reply.token_ids == unended.token_ids[:2] and reply.logprobs.tolist() == unended.logprobs[:2].tolist()
    body = completion_body(Generation([1, 2, 3], [reply, reply]), parse(logprobs=True), "m", tokenizer)
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert [t["token"] for t in body["choices"][1]["logprobs"]["content"]] == ["go", " to"]
