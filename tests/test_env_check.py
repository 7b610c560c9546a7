"""``milegpo check-env`` / :func:`milegpo.envs.check_text_env`: the built-in envs are clean, and each env of
tests/broken_envs.py and tests/hostile_envs.py is reported in one line naming its fault."""

from __future__ import annotations

import importlib.util

import broken_envs
import hostile_envs
import pytest

from milegpo.cli import main
from milegpo.envs import Finding, TextEnv, UnknownEnvError, check_text_env, make_env

BUILTIN = ["milegpo/House-v0", *(f"milegpo/TWX-{game}-v0" for game in ("coin", "cookingworld", "twc", "simonsays")),
           "milegpo/ALFWorld-v0"]


def engine_installed(env_id: str) -> bool:
    module = {"TWX": "textworld_express", "ALF": "alfworld"}.get(env_id.split("/")[1][:3])
    return module is None or importlib.util.find_spec(module) is not None


@pytest.mark.parametrize("env_id", BUILTIN)
def test_the_built_in_envs_are_clean(env_id: str) -> None:
    if not engine_installed(env_id):
        pytest.skip(f"{env_id}'s engine is not installed")
    assert check_text_env(env_id, seeds=2, steps=12) == []


def test_simonsays_lists_each_command_once() -> None:
    """TextWorld-Express's simonsays lists some commands twice (seed 1: 'take grapefruit'); the adapter keeps one."""
    if not engine_installed("milegpo/TWX-simonsays-v0"):
        pytest.skip("textworld-express is not installed")
    commands = make_env("milegpo/TWX-simonsays-v0").reset(seed=1)[1]["admissible_commands"]
    assert len(commands) == len(set(commands))


def checks_of(env: type[TextEnv]) -> list[tuple[str, str]]:
    findings = check_text_env(env)
    assert all(isinstance(f, Finding) and "\n" not in str(f) for f in findings)
    return [(f.check, f.message) for f in findings]


@pytest.mark.parametrize(("env", "check", "says"), [
    (broken_envs.UnseededResetEnv, "reset", "two resets of one instance (an episode apart) gave different "
                                            "observations: 'you are on cell 0.' and 'you are on cell 1.'"),
    (broken_envs.LeakyResetEnv, "reset", "gave different observations: 'episode 1: you are on cell 0.' and "
                                         "'episode 2: you are on cell 0.'"),
    (broken_envs.UnseededTaskEnv, "reset", "gave different info['task']: 'reach cell 4 ("),
    (broken_envs.EpisodeIdKeyEnv, "state_key", "at reset; a key is a function of the state (no episode ids"),
    (broken_envs.StepCountKeyEnv, "state_key", "the walk came back at step"),
    (broken_envs.ConstantKeyEnv, "state_key", "the key 'the line' is given to states with different admissible "
                                              "commands (['left'] in one and not the other)"),
    (broken_envs.DuplicateCommandsEnv, "commands", "admissible commands listed more than once: ['left']"),
    (broken_envs.PaddedCommandsEnv, "commands", "the admissible command ' right' has surrounding whitespace"),
    (broken_envs.EmptyCommandListEnv, "commands", "admissible_commands is an empty list while the episode goes on"),
    (broken_envs.LoneSurrogateEnv, "contract", "LoneSurrogateEnv._reset() returned an observation that is not valid "
                                               "Unicode ('\\udcff' at index 16)"),
    (hostile_envs.IntObservationEnv, "contract", "returned the observation 5 of type int"),
    (hostile_envs.NaNRewardEnv, "contract", "NaNRewardEnv._step() returned the reward nan"),
    (hostile_envs.BrokenResetEnv, "reset", "seed 0: reset(seed=0) raised KeyError: 'missing'"),
    (hostile_envs.BrokenStepEnv, "step", "step('wait') raised RuntimeError: the engine crashed"),
    (hostile_envs.NoCommandsEnv, "commands", "admissible_commands is an empty list"),
    (hostile_envs.WizardRoleEnv, "contract", "has the chat role(s) ['wizard']"),
])
def test_each_broken_env_is_reported(env: type[TextEnv], check: str, says: str) -> None:
    findings = checks_of(env)
    assert any(c == check and says in message for c, message in findings), findings


def test_a_correct_env_has_no_findings_and_one_fault_is_one_line() -> None:
    assert checks_of(broken_envs.LineEnv) == [] and checks_of(hostile_envs.CountingEnv) == []
    assert len(checks_of(broken_envs.EpisodeIdKeyEnv)) == 1  # at reset, across instances, on replay: one cause
    assert len(checks_of(broken_envs.UnseededResetEnv)) == 1  # the keys differ because the states do


def test_an_instance_is_checked_alone_and_arguments_are_checked() -> None:
    assert check_text_env(broken_envs.LineEnv(), seeds=1) == []
    assert [f.check for f in check_text_env(broken_envs.LeakyResetEnv(), seeds=1)] == ["reset"]
    with pytest.raises(ValueError, match="seeds and steps must be >= 1"):
        check_text_env(broken_envs.LineEnv, seeds=0)
    with pytest.raises(ValueError, match="already made"):
        check_text_env(broken_envs.LineEnv(), env_kwargs={"max_episode_steps": 3})
    with pytest.raises(UnknownEnvError):
        check_text_env("nobody/Nothing-v0")


def test_cli_exit_status_and_one_line_per_finding(capsys: pytest.CaptureFixture) -> None:
    assert main(["check-env", "milegpo/House-v0", "--seeds", "1"]) == 0
    out, _ = capsys.readouterr()
    assert out.startswith("milegpo/House-v0: no findings over task seeds 0-0")
    assert main(["check-env", "broken_envs:ConstantKeyEnv", "--env-kwargs", '{"max_episode_steps": 6}']) == 1
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "broken_envs:ConstantKeyEnv: state_key: seed 0: the key 'the line' is given to states with different "
        "admissible commands (['left'] in one and not the other); credit would compare steps that had different "
        "choices"]
    assert err == "1 finding(s) in broken_envs:ConstantKeyEnv over task seeds 0-2\n"
    assert main(["check-env", "nobody/Nothing-v0"]) == 2
    assert capsys.readouterr().err.startswith("error: Unknown env id 'nobody/Nothing-v0'")
    assert main(["check-env", "broken_envs:LineEnv", "--env-kwargs", '{"colour": "red"}']) == 2
    assert capsys.readouterr().err.startswith("error: cannot make broken_envs:LineEnv with {'colour': 'red'}: "
                                              "TypeError:")
    assert main(["check-env", "milegpo/House-v0", "--seeds", "0"]) == 2
