"""OpenEnv environments through the hub adapter, against the real ``openenv-core`` package (0.3.0).

openenv-core ships no environment of its own to play: the environments here are the echo environment
that OpenEnv's own generator (``openenv init``) writes, and a small number game written the way an
OpenEnv user writes one (subclasses of OpenEnv's ``Environment``, ``Action``, ``Observation``, ``State``).
"""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openenv.core.env_server.interfaces",
                    reason='pip install --no-deps openenv-core==0.3.0 && pip install "milegpo[openenv]"')

from console_script import run_milegpo  # noqa: E402
from example_modules import load_example  # noqa: E402
from fastmcp import FastMCP  # noqa: E402
from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.mcp_environment import MCPEnvironment  # noqa: E402
from openenv.core.env_server.mcp_types import CallToolAction  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402

from milegpo.cli import build_parser, main, play  # noqa: E402
from milegpo.envs import make_env, make_vec_env  # noqa: E402
from milegpo.envs.hubs import OpenEnvEnv, OpenEnvToolEnv, register_hub_env  # noqa: E402
from milegpo.policies.tools import tool_calls_action  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class GuessAction(Action):
    guess: str


class GuessObservation(Observation):
    hint: str = ""


class GuessState(State):
    guesses: list[int] = []


class GuessEnvironment(Environment[GuessAction, GuessObservation, GuessState]):
    """Guess a number from 1 to 8 in three tries; reward 1 and metadata won on the right one."""

    def __init__(self, top: int = 8):
        super().__init__()
        self.top = top
        self._state = GuessState()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: object) -> GuessObservation:
        self.number = random.Random(seed).randint(1, self.top)
        self._state = GuessState(episode_id=episode_id, step_count=0, guesses=[])
        return GuessObservation(hint=f"Guess a number from 1 to {self.top}.")

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: object) -> GuessObservation:
        self._state.step_count += 1
        guess = int(action.guess.strip()) if action.guess.strip().isdigit() else -1
        self._state.guesses = [*self._state.guesses, guess]
        if guess == self.number:
            return GuessObservation(hint="right!", done=True, reward=1.0, metadata={"won": True})
        done = self._state.step_count >= 3
        hint = "higher" if guess < self.number else "lower"
        return GuessObservation(hint=hint, done=done, reward=0.0, metadata={"won": False} if done else {})

    @property
    def state(self) -> GuessState:
        return self._state


GAME = f"{__name__}:GuessEnvironment"


class GuessMCPEnvironment(MCPEnvironment):
    """The number game with a tool: guess(number) through OpenEnv's MCP machinery (FastMCP in-process);
    its step sets reward and done on the tool's observation."""

    def __init__(self) -> None:
        server = FastMCP("guess")

        @server.tool
        def guess(number: int) -> str:
            """Guess the secret number from 1 to 8."""
            self.tries += 1
            self.solved = number == self.number
            return "right" if self.solved else ("higher" if number < self.number else "lower")

        super().__init__(server)
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: object) -> Observation:
        self.number, self.tries, self.solved = random.Random(seed).randint(1, 8), 0, False
        self._state = State(episode_id=episode_id, step_count=0)
        return Observation(metadata={"prompt": "Find the secret number with the guess tool."})

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: object) -> Observation:
        observation = super().step(action, timeout_s=timeout_s, **kwargs)
        if isinstance(action, CallToolAction):
            self._state.step_count += 1
            observation.reward = 1.0 if self.solved else 0.0
            observation.done = self.solved or self.tries >= 3
        return observation

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: object) -> Observation:
        return Observation(metadata={"error": f"unknown action {type(action).__name__}"})

    @property
    def state(self) -> State:
        return self._state


def call(number: int) -> str:
    return tool_calls_action([{"name": "guess", "arguments": {"number": number}}])


@pytest.fixture(scope="module")
def echo_env(tmp_path_factory: pytest.TempPathFactory) -> str:
    """OpenEnv's generated echo environment (``openenv init echo_game``), importable."""
    folder = tmp_path_factory.mktemp("openenv")
    subprocess.run([sys.executable, "-m", "openenv.cli", "init", "echo_game"], cwd=folder, check=True,
                   capture_output=True)
    sys.path.insert(0, str(folder))
    return str(folder)


def test_rewards_and_won_equal_the_environments_own() -> None:
    env = OpenEnvEnv(GuessEnvironment)
    observation, info = env.reset(seed=4)
    assert observation == "Guess a number from 1 to 8." and info["task"] == observation
    number = env.hub.number
    hub = GuessEnvironment()
    for script, wins in (([str(number)], True), ([str((number % 8) + 1)] * 3, False), (["x", "y", str(number)], True)):
        env.reset(seed=4)
        hub.reset(seed=4)
        for guess in script:
            _, reward, terminated, _, info = env.step(guess)
            expected = hub.step(GuessAction(guess=guess))
            assert reward == expected.reward and terminated == expected.done
        assert terminated and info["won"] is wins


def test_a_group_starts_from_one_state_and_the_state_key_is_openenvs_state() -> None:
    venv = make_vec_env(OpenEnvEnv, n_tasks=2, group_size=3, seed=0, env_kwargs={"environment": GAME})
    venv.reset()
    numbers = [hub.number for hub in venv.get_attr("hub")]
    assert numbers[0] == numbers[1] == numbers[2] and numbers[3] == numbers[4] == numbers[5]
    venv.close()
    a, b = OpenEnvEnv(GAME), OpenEnvEnv(GAME)
    a.reset(seed=1)
    b.reset(seed=1)
    assert a.state_key() == b.state_key()  # episode ids differ; the state does not
    a.step("2")
    assert a.state_key() != b.state_key()
    assert register_hub_env(f"openenv:{GAME}")
    assert isinstance(make_env(f"openenv:{GAME}"), OpenEnvEnv)


class UnnamedActionEnvironment(Environment):
    """Names its action class nowhere: neither Environment[MyAction, ...] nor an annotation of step's action."""

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: object) -> GuessObservation:
        return GuessObservation(hint="say something")

    def step(self, action, timeout_s: float | None = None, **kwargs: object) -> GuessObservation:
        return GuessObservation(hint=action.guess, done=True, reward=1.0)

    @property
    def state(self) -> State:
        return State()


def test_the_generated_echo_environment(echo_env: str) -> None:
    from echo_game.models import EchoGameAction
    from echo_game.server.echo_game_environment import EchoGameEnvironment

    # the generated environment names its action class only in step(self, action: EchoGameAction)
    assert OpenEnvEnv(EchoGameEnvironment).action_class is EchoGameAction  # before: TypeError asking for it
    with pytest.raises(TypeError, match=r"UnnamedActionEnvironment does not name its action class .*pass "
                                        r"action_class='module:MyAction' \(on the command line: --env-kwargs"):
        OpenEnvEnv(UnnamedActionEnvironment)
    assert OpenEnvEnv(UnnamedActionEnvironment, action_class=GuessAction).reset(seed=0)[0] == "say something"
    env = OpenEnvEnv(EchoGameEnvironment, action_class="echo_game.models:EchoGameAction", max_episode_steps=2)
    observation, _ = env.reset(seed=0)
    assert "environment ready" in observation and "message_length: 0" in observation
    observation, reward, terminated, truncated, info = env.step("hello")
    assert reward == pytest.approx(0.5) and "echoed_message: hello" in observation and not terminated
    assert info["openenv_metadata"]["original_message"] == "hello"
    *_, truncated, info = env.step("hi")
    assert truncated and not info["won"]


def test_an_mcp_environment_is_played_with_tool_calls() -> None:
    env = OpenEnvToolEnv(GuessMCPEnvironment, invalid_action_penalty=0.1)
    observation, info = env.reset(seed=3)
    assert observation == "Find the secret number with the guess tool." and info["action_format"] == "tools"
    (tool,) = info["tools"]
    assert tool["function"]["name"] == "guess" and tool["function"]["parameters"]["required"] == ["number"]
    assert info["observation_role"] == "tool"
    number = env.hub.number
    wrong = number % 8 + 1
    observation, reward, terminated, _, info = env.step(call(wrong))
    assert observation == ("higher" if wrong < number else "lower") and reward == 0.0 and not terminated
    _, reward, _, _, info = env.step("I guess four")  # no tool call: invalid, the environment never sees it
    assert reward == -0.1 and not info["valid_action"] and env.hub.tries == 1
    observation, reward, terminated, _, info = env.step(call(number))
    assert observation == "right" and reward == 1.0 and terminated and info["won"]
    assert register_hub_env(f"openenv:{__name__}:GuessMCPEnvironment")
    assert isinstance(make_env(f"openenv:{__name__}:GuessMCPEnvironment"), OpenEnvToolEnv)  # chosen by the class
    venv = make_vec_env(OpenEnvToolEnv, n_tasks=1, group_size=2, seed=0,
                        env_kwargs={"environment": f"{__name__}:GuessMCPEnvironment"})
    venv.reset()
    first, second = venv.get_attr("hub")
    assert first.number == second.number
    venv.close()


def test_cli_trains_evaluates_plays_and_exports(echo_env: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    kwargs = {"environment": GAME, "commands": [str(n) for n in range(1, 9)], "max_episode_steps": 3}
    run = tmp_path / "run"
    assert main(["train", "env.id=milegpo.envs.hubs:OpenEnvEnv", f"env.kwargs={json.dumps(kwargs)}",
                 "env.n_tasks=1", "env.group_size=2", "eval.n_tasks=1", "run.total_timesteps=12",
                 "--run-dir", str(run), "--no-progress-bar"]) == 0
    assert main(["eval", str(run), "--n-tasks", "1"]) == 0
    assert main(["export", str(run), str(tmp_path / "exported")]) == 0
    out = io.StringIO()
    echo = {"environment": "echo_game.server.echo_game_environment:EchoGameEnvironment",
            "action_class": "echo_game.models:EchoGameAction"}
    args = build_parser().parse_args(["play", "milegpo.envs.hubs:OpenEnvEnv", "--env-kwargs", json.dumps(echo)])
    assert play(args, stdin=io.StringIO("hello there\n:q\n"), stdout=out) == 0
    assert "echoed_message: hello there" in out.getvalue()


def test_the_examples_environment_plays_with_tool_calls() -> None:
    """The example's MCP environment through the adapter (its training run, SmolLM2 generating, takes minutes)."""
    example = load_example("openenv_mcp_tools")
    env = OpenEnvToolEnv(example.GuessEnvironment, max_episode_steps=4)
    _, info = env.reset(seed=0)
    assert [tool["function"]["name"] for tool in info["tools"]] == ["guess"]
    observation, reward, terminated, _, info = env.step(call(env.hub.number))
    assert observation == "right" and reward == 1.0 and terminated and info["won"]


def test_an_environment_in_the_working_directory_plays_from_the_command_line(tmp_path: Path) -> None:
    """``openenv init`` in a folder, then ``milegpo play`` there, as the hubs page shows: the module is imported
    from the working directory (as ``module:ClassName`` env ids are), the action class read from ``step``."""
    subprocess.run([sys.executable, "-m", "openenv.cli", "init", "my_echo"], cwd=tmp_path, check=True,
                   capture_output=True)
    env_id = "openenv:my_echo.server.my_echo_environment:MyEchoEnvironment"
    result = run_milegpo("play", env_id, cwd=tmp_path, stdin="hello there\n:q\n")
    assert result.returncode == 0, result.stderr  # before: rc 1, "needs a package that is not installed"
    assert "echoed_message: hello there" in result.stdout
    named = json.dumps({"action_class": "my_echo.models:MyEchoAction"})  # the hubs page's explicit form
    result = run_milegpo("play", env_id, "--env-kwargs", named, cwd=tmp_path, stdin="hi\n:q\n")
    assert result.returncode == 0 and "echoed_message: hi" in result.stdout, result.stderr
    result = run_milegpo("play", "openenv:no_such_env.server:NoSuchEnvironment", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        f"error: cannot import 'no_such_env.server', the module of the OpenEnv environment "
        f"'no_such_env.server:NoSuchEnvironment', from the installed packages or the working directory {tmp_path} "
        "(ModuleNotFoundError: No module named 'no_such_env')"]
