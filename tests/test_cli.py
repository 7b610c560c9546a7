"""``milegpo play``: a person plays an env on stdin/stdout; errors give exit code 2."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from milegpo.cli import build_parser, main, play
from milegpo.envs.house import HouseEnv


def _play(argv: list[str], typed: str) -> tuple[int, str]:
    args = build_parser().parse_args(["play", *argv])
    out = io.StringIO()
    code = play(args, stdin=io.StringIO(typed), stdout=out)
    return code, out.getvalue()


def test_play_house_to_a_win_by_numbers_and_text():
    env = HouseEnv(split="eval_id")
    env.reset(seed=4)
    path = env.solve()
    # the first command by its number, the rest typed out, plus one invalid command
    numbers = env.admissible_commands().index(path[0]) + 1
    typed = "\n".join([str(numbers), "sing a song", *path[1:]]) + "\n"
    code, out = _play(["milegpo/House-v0", "--seed", "4", "--split", "eval_id"], typed)
    assert code == 0
    assert f"task: {env.task}" in out and "   1. " in out
    assert f"[{path[0]}] reward +0, step 1" in out
    assert "(invalid action: state unchanged)" in out and "reward -0.1" in out
    assert f"=== won: total reward 9.9 in {len(path) + 1} steps ===" in out


def test_play_quit_and_env_kwargs():
    code, out = _play(["milegpo/House-v0", "--env-kwargs", '{"max_episode_steps": 2}'], "look\n:q\n")
    assert code == 0 and "quit. total reward -0.1" in out
    code, out = _play(["milegpo/House-v0", "--env-kwargs", '{"max_episode_steps": 1}'], "look\n")
    assert code == 0 and "=== out of steps" in out


def test_play_unknown_env_exits_2_with_the_listing(capsys):
    assert main(["play", "nobody/Nothing-v0"]) == 2
    err = capsys.readouterr().err
    assert "Unknown env id 'nobody/Nothing-v0'" in err and "milegpo/House-v0" in err
    assert main(["play", "milegpo/House-v0", "--split", "nonsense"]) == 2
    with pytest.raises(SystemExit) as exc:
        main(["play", "milegpo/House-v0", "--env-kwargs", "{oops"])
    assert exc.value.code == 2


def test_console_script_reads_stdin():
    result = subprocess.run([sys.executable, "-m", "milegpo.cli", "play", "milegpo/House-v0", "--seed", "1"],
                            input="1\n:q\n", capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "=== milegpo/House-v0, seed 1 ===" in result.stdout and "quit." in result.stdout


def test_play_forgives_case_empty_lines_and_numbers_out_of_range():
    env = HouseEnv()
    _, info = env.reset(seed=2)
    first = info["admissible_commands"][0]
    typed = "\n".join(["", "99", first.upper(), ":q"]) + "\n"
    code, out = _play(["milegpo/House-v0", "--seed", "2"], typed)
    assert code == 0
    assert "type a command or its number" in out and "no command 99: pick 1-" in out
    assert f"[{first}] reward +0, step 1" in out  # the hints cost no step; the upper-case command is the listed one


def test_play_ctrl_c_quits_without_a_traceback():
    class Interrupt(io.StringIO):
        def readline(self, *args):
            raise KeyboardInterrupt

    args = build_parser().parse_args(["play", "milegpo/House-v0"])
    out = io.StringIO()
    assert play(args, stdin=Interrupt(), stdout=out) == 130 and out.getvalue().endswith("quit.\n")


def test_import_milegpo_registers_the_env_ids():
    code = "import gymnasium, milegpo; print(type(gymnasium.make('milegpo/House-v0').unwrapped).__name__)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "HouseEnv", result.stderr
