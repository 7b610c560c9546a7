"""Agent programs as environments (milegpo.agents): token in, token out; state keys; the endpoint's checks.

The programs are real ``openai.AsyncOpenAI`` programs (``agent_programs``) calling the agent server over
HTTP; the policy is the offline tiny model in generate mode with chat prompts."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

import agent_programs
import numpy as np
import openai
import pytest
import torch as th
from stable_baselines3.common.callbacks import BaseCallback

from milegpo import MileGPO
from milegpo.agents import STATE_KEY_HEADER, AgentEnv, AgentNeverCalledModel, AgentRaised
from milegpo.agents import requests as agent_requests
from milegpo.agents.env import EMPTY_REPLY
from milegpo.agents.server import agent_server
from milegpo.envs import make_vec_env
from milegpo.envs.core import TextSpace
from milegpo.policies import LLMPolicy, tiny_model
from milegpo.policies.chat_requests import answer_requests
from milegpo.policies.sample import ActionSample, Turn
from milegpo.policies.tools import TOOL_CHAT_TEMPLATE

GENERATE = {"mode": "generate", "prompt_format": "chat", "max_new_tokens": 4, "lora": {"r": 4, "alpha": 8}}
TOOL = {"type": "function", "function": {"name": "move", "description": "Walk through an exit.", "parameters": {
    "type": "object", "properties": {"direction": {"type": "string"}}, "required": ["direction"]}}}


@pytest.fixture(scope="module")
def agent_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny model whose words are the test programs' (and the tool prompt's)."""
    th.set_num_threads(1)
    texts = [*agent_programs.ThreeTurnsEnv().vocabulary(), "move direction north walk exit", json.dumps(TOOL),
             TOOL_CHAT_TEMPLATE]
    return tiny_model(texts, tmp_path_factory.mktemp("agent-tiny"), hidden_size=32, num_layers=1, num_heads=2)


def make_policy(model: str) -> LLMPolicy:
    return LLMPolicy(TextSpace(), TextSpace(), lambda _: 1e-3, model=model, device="cpu", **GENERATE)


class KeepRollout(BaseCallback):
    """Keeps, before the first update, the minibatch samples the update scores and their log-probs recomputed."""

    def __init__(self) -> None:
        super().__init__()
        self.samples: list[ActionSample] = []
        self.recomputed: list[np.ndarray] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        if self.samples:
            return
        buffer = self.locals["rollout_buffer"]
        self.samples = [s for batch in buffer.get(np.random.default_rng(0)) for s in batch.samples]
        policy = self.model.policy
        policy.set_training_mode(False)
        with th.no_grad():
            logp, mask, _ = policy.evaluate_actions(self.samples)
        self.recomputed = [lp[m].cpu().numpy() for lp, m in zip(logp, mask)]


def test_the_update_scores_the_sampled_ids_of_a_multi_turn_episode(agent_model: str) -> None:
    """Token in, token out: an episode's first prompt is the chat template of the messages the program sent;
    each later one (the program re-sends its conversation with the policy's reply kept) is the previous
    prompt, the reply's sampled ids and the template's ids for the new user message, written out here
    from the tiny model's ChatML template; the reply is the tokens whose text the program received, and
    the trainer's log-probs of those tokens (HF sampler, before the update) equal the sampler's within 1e-5."""
    agent_programs.RECORD.clear()
    env = make_vec_env(agent_programs.ThreeTurnsEnv, n_tasks=2, group_size=2, seed=0)
    model = MileGPO("LLMPolicy", env, policy_kwargs={"model": agent_model, **GENERATE}, learning_rate=1e-3,
                    seed=0, n_epochs=1)
    keep = KeepRollout()
    model.learn(total_timesteps=12, callback=keep)
    tokenizer = model.policy.tokenizer
    sent: dict[tuple[int, ...], list[str]] = {}
    for messages, content in agent_programs.RECORD:
        if len(messages) == 2:  # an episode's first request
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
            sent.setdefault(tuple(ids), []).append(content)
    received = [content for _, content in agent_programs.RECORD]
    assert len(keep.samples) == 12 == len(agent_programs.RECORD)  # 4 episodes x 3 requests
    firsts = [s for s in keep.samples if tuple(s.prompt_ids) in sent]
    assert len(firsts) == 4
    eos = tokenizer.eos_token_id
    for sample in keep.samples:
        if sample in firsts:
            assert tokenizer.decode(sample.action_ids, skip_special_tokens=True) in sent[tuple(sample.prompt_ids)]
            continue
        parents = [p for p in keep.samples if p is not sample
                   and list(sample.prompt_ids[: len(p.prompt_ids) + len(p.action_ids)]) == p.prompt_ids + p.action_ids]
        assert parents, "a later turn continues the turn before it"
        parent = max(parents, key=lambda p: len(p.prompt_ids))
        turn = sum(1 for p in parents if len(p.prompt_ids) <= len(parent.prompt_ids))  # 1 or 2 turns before it
        closing = "" if parent.action_ids[-1] == eos else "<|im_end|>"
        tail = (f"{closing}\n<|im_start|>user\nTurn {turn + 1}. You are in the {agent_programs.ROOMS[turn - 1]}."
                "<|im_end|>\n<|im_start|>assistant\n")
        added = sample.prompt_ids[len(parent.prompt_ids) + len(parent.action_ids):]
        assert added == tokenizer(tail, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(sample.action_ids, skip_special_tokens=True) in received
    for sample, recomputed in zip(keep.samples, keep.recomputed):
        assert len(recomputed) == len(sample.action_ids) == len(sample.old_logprobs)
        assert np.abs(recomputed - sample.old_logprobs).max() < 1e-5
    env.close()


def test_a_program_that_rewrites_the_reply_gets_its_own_messages_rendered(agent_model: str) -> None:
    """A program that sends back another assistant message than the policy's reply (here always "go") is
    given the template of its own messages, not the policy's sampled ids."""
    env = agent_programs.FaultyAgentEnv()
    policy = make_policy(agent_model)
    observation, info = env.reset(seed=0)  # task "ok": two requests
    first = policy.act([observation], [info], [[]])[0]
    observation, _, _, _, info = env.step(first.text)
    request = info["agent_request"]
    assert request["continues"] is not None and request["continues"]["reply"]["content"] != "go"
    second = policy.act([observation], [info], [[Turn(observation, first.text, first)]])[0]
    expected = policy.tokenizer.apply_chat_template(request["messages"], add_generation_prompt=True, tokenize=True)
    assert second.prompt_ids == list(expected["input_ids"])
    env.close()


def test_steps_of_a_group_share_states_and_a_program_may_name_its_own(agent_model: str) -> None:
    env = agent_programs.ThreeTurnsEnv()
    observation, info = env.reset(seed=0)
    assert observation == f"system: {agent_programs.SYSTEM}\nuser: You are in the hall."
    assert info["state_key"] == "system: you visit the rooms of a house. user: you are in the hall."
    assert info["agent_request"]["messages"][-1] == {"role": "user", "content": "You are in the hall."}
    observation, reward, done, _, info = env.step("anything")
    assert (observation, info["state_key"], reward, done) == ("user: Turn 2. You are in the hall.",
                                                              "user: turn 2. you are in the hall.", 0.0, False)
    env.step("kitchen")
    observation, reward, done, _, info = env.step("the kitchen")
    assert (observation, reward, done, info["won"]) == ("episode over: reward 1", 1.0, True, True)
    env.close()

    async def keyed(client: openai.AsyncOpenAI, task: str) -> float:
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                             extra_headers={STATE_KEY_HEADER: f"room={task}"})
        return 0.0

    env = AgentEnv(keyed, ["cellar"])
    assert env.reset(seed=0)[1]["state_key"] == "room=cellar"
    assert env.step(EMPTY_REPLY)[4]["state_key"] == "episode over: reward 0"
    env.close()


def test_the_endpoint_refuses_what_it_cannot_honour_and_keeps_the_episode(caplog: pytest.LogCaptureFixture,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_requests, "_noticed", set())  # said once per process: this test's process
    errors: list[str] = []

    async def probing(client: openai.AsyncOpenAI, task: str) -> float:
        messages = [{"role": "user", "content": task}]
        for refused in ({"n": 2}, {"stop": ["x"]}, {"logprobs": True}, {"top_p": 0.5, "temperature": 0.2},
                        {"messages": [{"role": "wizard", "content": "x"}]}):
            try:
                await client.chat.completions.create(**{"model": "m", "messages": messages, **refused})
            except openai.BadRequestError as exc:
                errors.append(exc.body["message"])
        models = await client.models.list()
        stream = await client.chat.completions.create(model="m", messages=messages, stream=True)
        chunks = [chunk async for chunk in stream]
        second = asyncio.ensure_future(client.chat.completions.create(model="m", messages=messages))
        await asyncio.sleep(0.2)  # the second request of the same episode waits for its reply ...
        try:
            await client.chat.completions.create(model="m", messages=messages)
        except openai.ConflictError as exc:  # ... and a third at the same time is refused
            errors.append(exc.body["message"])
        reply = await second
        return float(models.data[0].id == "milegpo-policy") + float(chunks[0].choices[0].delta.content == "first") \
            + float(reply.choices[0].message.content == "second")

    env = AgentEnv(probing, ["hello"])
    with caplog.at_level(logging.WARNING, logger="milegpo.agents"):
        env.reset(seed=0)  # the request with temperature and top_p went through: both set aside, said once
        env.step(EMPTY_REPLY)
        env.step(json.dumps({"content": "first", "finish_reason": "stop"}))
        time.sleep(1.0)  # the program tries a third request while the second waits
        _, reward, done, _, _ = env.step(json.dumps({"content": "second", "finish_reason": "stop"}))
    assert (reward, done) == (3.0, True)
    expected = ["n=2: ", "stop is not supported while training", "logprobs are not returned while training",
                "messages[0].role is 'wizard'", "another chat completion of this episode is still waiting"]
    assert len(errors) == len(expected) and all(e.startswith(x) for e, x in zip(errors, expected)), errors
    said = [r.getMessage() for r in caplog.records if "set aside" in r.getMessage()]
    assert len(said) == 2 and "temperature=0.2" in said[0] and "top_p=0.5" in said[1]
    env.close()


def test_a_tool_call_reaches_the_program_as_openai_tool_calls(agent_model: str) -> None:
    """The policy's reply is read as serve reads it: a ``<tool_call>`` becomes the request's tool call."""
    received: list[Any] = []

    async def tool_user(client: openai.AsyncOpenAI, task: str) -> float:
        messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
        reply = (await client.chat.completions.create(model="m", messages=messages, tools=[TOOL])).choices[0]
        received.append(reply)
        messages += [reply.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": reply.message.tool_calls[0].id, "content": "You walk north."}]
        await client.chat.completions.create(model="m", messages=messages, tools=[TOOL])
        return 1.0

    policy = make_policy(agent_model)
    env = AgentEnv(tool_user, ["walk north"])
    observation, info = env.reset(seed=0)
    prompt = policy.build_prompt(observation, info, [])
    assert "move" in policy.tokenizer.decode(prompt)  # the tools are in the prompt (the tool chat template)
    written = '<tool_call>\n{"name": "move", "arguments": {"direction": "north"}}\n</tool_call>'
    ids = policy.tokenizer(written, add_special_tokens=False)["input_ids"] + [policy.tokenizer.eos_token_id]
    sample = ActionSample(text="", prompt_ids=prompt, action_ids=ids, candidate_ids=None, chosen=None,
                          old_logprobs=np.zeros(len(ids), dtype=np.float32), parsed=False)
    answer_requests(policy, [sample], [info])
    assert json.loads(sample.text) == {"content": None, "finish_reason": "tool_calls",
                                       "tool_calls": [{"name": "move", "arguments": {"direction": "north"}}]}
    observation, _, _, _, info = env.step(sample.text)
    call = received[0].message.tool_calls[0]
    assert received[0].finish_reason == "tool_calls" and call.function.name == "move"
    assert json.loads(call.function.arguments) == {"direction": "north"}
    assert observation == "tool: You walk north." and info["state_key"] == "tool: you walk north."
    env.close()


def test_what_the_env_refuses_at_once() -> None:
    def not_async(client: Any, task: str) -> float:
        return 1.0

    with pytest.raises(TypeError, match="program must be an async function"):
        AgentEnv(not_async, ["a"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"no tasks for split 'eval_id': the splits are \['train'\]"):
        AgentEnv(agent_programs.faulty, {"train": ["ok"]}, split="eval_id")
    env = AgentEnv(agent_programs.faulty, ["silent"])
    with pytest.raises(AgentNeverCalledModel, match="returned 1.0 without calling the model"):
        env.reset(seed=0)

    async def returns_text(client: openai.AsyncOpenAI, task: str) -> Any:
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": task}])
        return "done"

    env = AgentEnv(returns_text, ["x"])
    env.reset(seed=0)
    with pytest.raises(AgentRaised, match=r"the agent program returned 'done', not a reward"):
        env.step(EMPTY_REPLY)


def test_a_rubric_scores_the_finished_conversation() -> None:
    seen: list[list[dict[str, Any]]] = []

    async def rubric(task: str, messages: list[dict[str, Any]]) -> float:
        seen.append(messages)
        return float(messages[-1]["content"] == task)

    env = AgentEnv(agent_programs.faulty, ["ok"], rubric=rubric)
    env.reset(seed=0)
    env.step("go")
    assert env.step("ok")[1:3] == (1.0, True)
    assert [m["role"] for m in seen[0]] == ["user", "assistant", "user", "assistant"]
    assert seen[0][-1] == {"role": "assistant", "content": "ok"}
    env.close()


def test_the_tiny_models_vocabulary_holds_what_the_program_shows(tmp_path: Path) -> None:
    words = " ".join(agent_programs.ThreeTurnsEnv(vocabulary=["extra"]).vocabulary())
    assert all(w in words for w in ("visit", "hall", "Turn 2", "garden", "extra"))


def test_a_request_does_not_wait_for_a_delayed_ack() -> None:
    """The endpoint's listening socket names TCP, so asyncio turns Nagle's algorithm off on its connections: a small
    request and its reply do not wait ~40 ms for a delayed ACK (40 agent steps took ~2 s before, ~0.1 s after:
    benchmarks/integrations/agent_rollouts.py). Checked on the socket itself, not by timing."""
    import socket

    from milegpo.serve.server import bind

    sock = bind("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()


def test_an_episode_cut_at_its_step_limit_cancels_its_program_and_answers_its_open_request() -> None:
    seen: list[BaseException] = []

    async def endless(client: openai.AsyncOpenAI, task: str) -> float:
        try:
            while True:
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": task}])
        except BaseException as exc:  # what the program sees when its episode is cut
            seen.append(exc)
            raise

    env = AgentEnv(endless, ["again"], max_episode_steps=2)
    env.reset(seed=0)
    session = env._session
    assert session is not None
    env.step(EMPTY_REPLY)
    assert env.step(EMPTY_REPLY)[2:4] == (False, True)  # truncated at the second step, with the third request open
    time.sleep(0.5)
    assert len(seen) == 1 and isinstance(seen[0], asyncio.CancelledError)
    assert session._pending is None  # the open request was answered (404): nothing of the episode is held
    assert session.id not in agent_server().sessions


def test_check_env_finds_nothing_wrong_with_the_examples_agent() -> None:
    """An empty action (no reply of the policy is one) is invalid and leaves the request open; an episode's info is
    the same for two resets of a task (no session ids in it)."""
    from milegpo.envs import check_text_env

    findings = check_text_env(agent_programs.ThreeTurnsEnv, seeds=2)
    assert findings == []
    env = agent_programs.ThreeTurnsEnv()
    observation, info = env.reset(seed=0)
    after, reward, done, truncated, after_info = env.step("")
    assert (after, reward, done, truncated, after_info["valid_action"]) == (observation, 0.0, False, False, False)
    assert env.step("the kitchen")[4]["valid_action"] is True  # the same request, answered now
    env.close()


def test_the_programs_of_a_batch_get_their_replies_at_once(agent_model: str) -> None:
    """With the envs in the policy's process, every program of a batch gets its reply before any env is stepped
    (the vec env sends each env its action first): four programs that each wait, after their first reply, until
    all four have theirs (a tool that needs the others' moves) all go on to their second request. Stepped one env
    after the other, the first would wait for the others' replies in vain and end with a timeout."""
    barrier = asyncio.Barrier(4)

    async def waits_for_the_others(client: openai.AsyncOpenAI, task: str) -> float:
        for turn in range(2):
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"{task} {turn}"}])
            if turn == 0:
                await asyncio.wait_for(barrier.wait(), timeout=60)
        return 1.0

    policy = make_policy(agent_model)
    env = make_vec_env(lambda: AgentEnv(waits_for_the_others, ["hall"]), n_tasks=1, group_size=4, seed=0)
    env.reset()
    samples = policy.act(list(env.observations), env.reset_infos, [[] for _ in range(4)])
    _, _, dones, infos = env.step([s.text for s in samples])
    assert not dones.any() and not any(info.get("env_error") for info in infos)
    assert all(info["agent_request"]["messages"][0]["content"] == "hall 1" for info in infos)
    env.close()


def test_a_workers_programs_get_their_replies_before_it_steps_their_envs(agent_model: str) -> None:
    """With the envs in a worker process, the worker sends every env its action before it steps them one after
    the other (``TextEnv.send_action``): the four programs that each wait for the others' first replies all
    reach their second request. Answered only when its env is stepped, the first would wait in vain and end
    with a timeout."""
    policy = make_policy(agent_model)
    env = make_vec_env(agent_programs.WaitingEnv, n_tasks=1, group_size=4, seed=0, subprocess=True, n_workers=1)
    try:
        env.reset()
        samples = policy.act(list(env.observations), env.reset_infos, [[] for _ in range(4)])
        _, _, dones, infos = env.step([s.text for s in samples])
        assert not dones.any() and not any(info.get("env_error") for info in infos)
        assert all(info["agent_request"]["messages"][0]["content"] == "hall 1" for info in infos)
    finally:
        env.close()



@pytest.mark.parametrize("prompt_format", ["chat", "template"])
def test_a_continued_conversation_grows_from_the_sampled_ids_in_either_prompt_format(agent_model: str,
                                                                                     prompt_format: str) -> None:
    """An agent's request brings its own messages whatever the policy's prompt format: in the template format
    too, the second request's prompt is the first prompt, the sampled reply and the new message's ids."""
    policy = LLMPolicy(TextSpace(), TextSpace(), lambda _: 1e-3, model=agent_model, device="cpu",
                       **{**GENERATE, "prompt_format": prompt_format})
    env = agent_programs.ThreeTurnsEnv()
    observation, info = env.reset(seed=0)
    first = policy.act([observation], [info], [[]])[0]
    observation, _, _, _, info = env.step(first.text)
    second = policy.act([observation], [info], [[Turn(observation, first.text, first)]])[0]
    assert second.prompt_ids[: len(first.prompt_ids) + len(first.action_ids)] == first.prompt_ids + first.action_ids
    env.close()
