"""`milegpo serve` on a short generate-mode run folder (the offline tiny model, chat prompts), started in a
subprocess and called with the real `openai` client: models, chat completions with and without tools, the
policy's own greedy generation at temperature 0, OpenAI-style errors that leave the server up, 64 concurrent
requests, streaming, seeds, stop strings; exports and a failing model served in-process."""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from milegpo.cli import main

CONFIG = {"run": {"total_timesteps": 16, "checkpoint_freq": 100},
          "env": {"n_tasks": 1, "group_size": 2, "kwargs": {"max_episode_steps": 4}},
          "policy": {"mode": "generate", "prompt_format": "chat", "max_new_tokens": 8},
          "eval": {"freq": 100, "splits": [], "n_tasks": 1, "copies": 1}}
MESSAGES = [{"role": "system", "content": "You are an agent in a house."},
            {"role": "user", "content": "Your task: open the door. You are in the hallway."}]
GUESS_TOOL = {"type": "function", "function": {
    "name": "guess", "description": "Guess the secret number.",
    "parameters": {"type": "object", "properties": {"number": {"type": "integer"}}, "required": ["number"]}}}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("serve")
    (folder / "config.json").write_text(json.dumps(CONFIG))
    subprocess.run([sys.executable, "-m", "milegpo", "train", "--preset", "cpu-demo", "--config",
                    str(folder / "config.json"), "--run-dir", str(folder / "run"), "--no-progress-bar"], check=True,
                   stdout=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    return folder / "run"


def start_server(source: str | Path, log: Path, *flags: str) -> tuple[subprocess.Popen, str]:
    """``milegpo serve SOURCE --port 0`` in a subprocess; returns it and its start line once it listens."""
    with log.open("w") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "milegpo", "serve", str(source), "--port", "0", *flags],
                                   stdout=subprocess.PIPE, stderr=stderr, text=True,
                                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], 300)
    line = process.stdout.readline() if ready else ""
    if not line.startswith("Serving"):
        process.kill()
        raise AssertionError(f"no start line ({line!r}); stderr: {log.read_text()[-3000:]}")
    return process, line


def stop_server(process: subprocess.Popen) -> int:
    process.send_signal(signal.SIGINT)  # Ctrl-C: uvicorn shuts down cleanly
    try:
        return process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        raise


@pytest.fixture(scope="module")
def server(run: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    process, line = start_server(run, tmp_path_factory.mktemp("log") / "stderr.txt")
    base_url = re.search(r"at (http://\S+/v1)", line).group(1)
    try:
        yield base_url, line
    finally:
        assert stop_server(process) == 0


@pytest.fixture(scope="module")
def client(server: tuple[str, str]) -> openai.OpenAI:
    return openai.OpenAI(base_url=server[0], api_key="none", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def policy(run: Path) -> Any:
    from milegpo.run.finish import load_run

    return load_run(run)[1].policy


def own_greedy(policy: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> Any:
    """The policy's own greedy generation for a conversation (a chat-format env's opening messages)."""
    info = {"messages": messages, "action_format": "tools" if tools else "message", **({"tools": tools} if tools
                                                                                     else {})}
    return policy.act([""], [info], [[]], deterministic=True)[0]


def test_models_and_the_start_line(server: tuple[str, str], client: openai.OpenAI) -> None:
    base_url, line = server
    assert line.startswith("Serving 'run' (run folder) at http://127.0.0.1:") and "model='run'" in line
    assert "choose mode" not in line  # a generate-mode run
    assert [m.id for m in client.models.list().data] == ["run"]
    assert client.models.retrieve("run").owned_by == "milegpo"


def test_greedy_reply_is_the_policys_own_generation(client: openai.OpenAI, policy: Any) -> None:
    conversations = [MESSAGES, [*MESSAGES, {"role": "assistant", "content": "go to kitchen"},
                                {"role": "user", "content": "You are in the kitchen."}]]
    for messages in conversations:
        reply = client.chat.completions.create(model="run", messages=messages, temperature=0, logprobs=True)
        sample = own_greedy(policy, messages)
        choice = reply.choices[0]
        assert choice.message.content == sample.raw_text and choice.message.tool_calls is None
        assert reply.usage.prompt_tokens == len(sample.prompt_ids)
        assert reply.usage.completion_tokens == len(sample.action_ids) <= 8  # the run's max_new_tokens
        ended = sample.action_ids[-1] in policy.eos_ids or "</action>" in sample.raw_text
        assert choice.finish_reason == ("stop" if ended else "length")
        # greedy replies carry the model's own log-probs (T = 1, the run's temperature too)
        np.testing.assert_allclose([t.logprob for t in choice.logprobs.content], sample.old_logprobs, atol=1e-4)


def test_tools_are_rendered_and_the_reply_is_the_policys_own(client: openai.OpenAI, policy: Any) -> None:
    reply = client.chat.completions.create(model="run", messages=MESSAGES, tools=[GUESS_TOOL], temperature=0)
    sample = own_greedy(policy, MESSAGES, [GUESS_TOOL])
    plain = client.chat.completions.create(model="run", messages=MESSAGES, temperature=0, max_tokens=1)
    assert reply.usage.prompt_tokens == len(sample.prompt_ids) > plain.usage.prompt_tokens  # the schema is in it
    assert reply.choices[0].message.content == sample.raw_text  # junk from the tiny model: no call in it
    assert reply.choices[0].message.tool_calls is None and reply.choices[0].finish_reason != "tool_calls"
    # a past call and its result go back in as the model writes them (the tool prompt's <tool_call> format)
    call = {"id": "call_1", "type": "function", "function": {"name": "guess", "arguments": '{"number": 4}'}}
    history = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": "higher"}]
    again = client.chat.completions.create(model="run", messages=history, tools=[GUESS_TOOL], temperature=0)
    written = [*MESSAGES, {"role": "assistant", "content": '<tool_call>\n{"name": "guess", "arguments": {"number": 4}}'
                                                           '\n</tool_call>'}, {"role": "tool", "content": "higher"}]
    assert again.usage.prompt_tokens == len(policy.chat.encode(written, [GUESS_TOOL]))
    assert again.choices[0].message.content == own_greedy(policy, written, [GUESS_TOOL]).raw_text
    none = client.chat.completions.create(model="run", messages=MESSAGES, tools=[GUESS_TOOL], tool_choice="none",
                                          temperature=0, max_tokens=1)
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens  # tool_choice "none": no tools in the prompt


def post(server: tuple[str, str], body: str | dict[str, Any]) -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)
    return httpx.post(f"{server[0]}/chat/completions", content=content, timeout=120,
                      headers={"content-type": "application/json"})


@pytest.mark.parametrize(("body", "param", "code"), [
    ("{not json", None, None),
    ("[" * 100_000, None, None),  # nested past the JSON decoder's recursion limit
    ({"model": "run"}, "messages", None),
    ({"model": "gpt-4o", "messages": MESSAGES}, "model", "model_not_found"),
    ({"model": "run", "messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role", None),
    ({"model": "run", "messages": MESSAGES, "n": 17}, "n", None),
    ({"model": "run", "messages": [{"role": "user", "content": "go " * 5000}]}, "messages", "context_length_exceeded"),
    ({"model": "run", "messages": MESSAGES, "max_tokens": 5000}, "messages", "context_length_exceeded"),
    ({"model": "run", "messages": MESSAGES, "top_p": 0.5}, "top_p", None),
    ({"model": "run", "messages": MESSAGES, "temperature": -1}, "temperature", None),
    ({"model": "run", "messages": MESSAGES, "tool_choice": "required", "tools": [GUESS_TOOL]}, "tool_choice", None),
    ({"model": "run", "messages": MESSAGES, "best_of": 2}, "best_of", None),
    ({"model": "run", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content", None),
])
def test_a_bad_request_is_a_400_json_error_and_the_server_keeps_answering(
        server: tuple[str, str], client: openai.OpenAI, body: str | dict[str, Any], param: str | None,
        code: str | None) -> None:
    response = post(server, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert (error["param"], error["code"]) == (param, code) and error["message"]
    answer = client.chat.completions.create(model="run", messages=MESSAGES, max_tokens=2).choices[0]  # still serving
    assert answer.finish_reason in ("stop", "length") and isinstance(answer.message.content, str)


def test_the_openai_client_raises_its_own_errors(server: tuple[str, str], client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="is not served here"):
        client.chat.completions.create(model="other", messages=MESSAGES)
    missing = httpx.get(f"{server[0]}/nothing", timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["message"] == "Not Found"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other")


def test_64_concurrent_requests_are_all_answered(server: tuple[str, str]) -> None:
    async def ask_all() -> list[Any]:
        async with openai.AsyncOpenAI(base_url=server[0], api_key="none", max_retries=0, timeout=600) as client:
            return await asyncio.gather(*(client.chat.completions.create(
                model="run", messages=[{"role": "user", "content": f"step {k}: go to the kitchen"}], max_tokens=4,
                seed=k) for k in range(64)))

    replies = asyncio.run(ask_all())
    assert len(replies) == 64 and all(r.choices[0].message.content is not None for r in replies)
    assert all(1 <= r.usage.completion_tokens <= 4 for r in replies)


def test_seeds_n_stop_and_streaming(client: openai.OpenAI) -> None:
    three = client.chat.completions.create(model="run", messages=MESSAGES, n=3, seed=11, temperature=1.0)
    one = client.chat.completions.create(model="run", messages=MESSAGES, seed=12, temperature=1.0)
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert three.choices[1].message.content == one.choices[0].message.content  # reply k samples from seed + k
    assert three.usage.completion_tokens <= 3 * 8 and three.usage.prompt_tokens == one.usage.prompt_tokens

    greedy = client.chat.completions.create(model="run", messages=MESSAGES, temperature=0, logprobs=True)
    text, tokens = greedy.choices[0].message.content, [t.token for t in greedy.choices[0].logprobs.content]
    stop = tokens[3]
    cut = client.chat.completions.create(model="run", messages=MESSAGES, temperature=0, stop=[stop, "zzz"],
                                         logprobs=True)
    at = text.index(stop)
    assert cut.choices[0].message.content == text[:at] and cut.choices[0].finish_reason == "stop"
    before = [k for k in range(len(tokens)) if len("".join(tokens[:k + 1])) <= at]  # the tokens wholly before it
    assert [t.token for t in cut.choices[0].logprobs.content] == tokens[:len(before)]

    tops = client.chat.completions.create(model="run", messages=MESSAGES, temperature=0, logprobs=True,
                                          top_logprobs=3).choices[0].logprobs.content
    for token in tops:  # greedy: the chosen token is the most likely one
        assert len(token.top_logprobs) == 3 and token.top_logprobs[0].token == token.token
        assert token.top_logprobs[0].logprob == pytest.approx(token.logprob, abs=1e-4)

    chunks = list(client.chat.completions.create(model="run", messages=MESSAGES, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.completion_tokens == greedy.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == greedy.choices[0].finish_reason


def engine_for(source: Path | str) -> Any:
    from milegpo.serve import ChatEngine, load_served_policy

    served = load_served_policy(str(source), "cpu")
    return served, ChatEngine(served.policy, served.name)


def greedy_ids(engine: Any, messages: list[dict[str, Any]] = MESSAGES) -> list[int]:
    request = engine.parse({"model": engine.name, "messages": messages, "temperature": 0, "max_tokens": 8})
    return engine.generate(request).replies[0].token_ids


def test_exports_serve_the_runs_policy(run: Path, policy: Any, tmp_path: Path) -> None:
    want = own_greedy(policy, MESSAGES).action_ids
    for flags, kind in (([], "adapter"), (["--merged"], "model")):
        out = tmp_path / f"export{len(flags)}"
        assert main(["export", str(run), str(out), *flags]) == 0
        served, engine = engine_for(out)
        try:
            assert (served.kind, served.name) == (kind, out.name)
            assert greedy_ids(engine) == want
        finally:
            engine.close()


def test_a_failure_while_generating_is_a_500_and_the_server_stays_up(run: Path) -> None:
    from fastapi.testclient import TestClient

    from milegpo.serve.app import build_app

    _, engine = engine_for(run)
    try:
        engine.policy.model.to("meta")  # the weights are gone: every generation fails inside torch
        with TestClient(build_app(engine)) as http:
            response = http.post("/v1/chat/completions", json={"model": "run", "messages": MESSAGES})
            assert response.status_code == 500
            error = response.json()["error"]
            assert error["type"] == "server_error" and error["message"].startswith("generation failed: ")
            assert http.get("/v1/models").json()["data"][0]["id"] == "run"
    finally:
        engine.close()


def test_serve_refuses_a_missing_source_and_a_taken_port(run: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    assert main(["serve", str(tmp_path / "missing"), "--port", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: model path ")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        assert main(["serve", str(run), "--port", str(taken.getsockname()[1])]) == 2
    assert "cannot listen on 127.0.0.1:" in capsys.readouterr().err
    assert main(["serve", str(run), "--port", "70000"]) == 2
    assert capsys.readouterr().err.startswith("error: cannot listen on 127.0.0.1:70000 (")


def test_a_choose_mode_run_is_served_generating_and_says_so(tmp_path: Path) -> None:
    (tmp_path / "choose.json").write_text(json.dumps({**CONFIG, "policy": {"mode": "choose"}}))
    subprocess.run([sys.executable, "-m", "milegpo", "train", "--preset", "cpu-demo", "--config",
                    str(tmp_path / "choose.json"), "--run-dir", str(tmp_path / "run"), "--no-progress-bar"],
                   check=True, stdout=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    process, line = start_server(tmp_path / "run", tmp_path / "stderr.txt", "--model-name", "house-agent")
    try:
        assert "Serving 'house-agent'" in line and "trained in choose mode" in line
        base_url = re.search(r"at (http://\S+/v1)", line).group(1)
        reply = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0).chat.completions.create(
            model="house-agent", messages=MESSAGES, max_tokens=3)
        assert reply.usage.completion_tokens <= 3 and reply.choices[0].message.content is not None
    finally:
        assert stop_server(process) == 0
