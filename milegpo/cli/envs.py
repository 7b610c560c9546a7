"""``milegpo play`` and ``milegpo check-env``: an env played by hand, and checked before training on it."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, TextIO

from milegpo.cli.common import Subparsers, env_kwargs_type

if TYPE_CHECKING:
    from milegpo.envs.core import TextEnv

QUIT = ":q"


def add_play(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "play", help="play a registered text env in the terminal",
        description="Play an env yourself: type a command or its number; ':q' quits.",
    )
    parser.add_argument("env_id", help="an env id: registered (milegpo/House-v0), module:ClassName (my_env:MyEnv) or "
                                       "a hub's (textarena:Wordle-v0, openenv:pkg.server.module:MyEnvironment)")
    parser.add_argument("--seed", type=int, default=0, help="task seed (seed s is task s %% num_tasks)")
    parser.add_argument("--split", default=None, help="task split, e.g. train, eval_id, eval_ood")
    parser.add_argument("--env-kwargs", type=env_kwargs_type, default={},
                        help="JSON object of env constructor arguments (a hub env's: its adapter's, e.g. "
                             "'{\"action_class\": \"pkg.models:MyAction\"}' for an OpenEnv environment)")
    parser.add_argument("--episodes", type=int, default=1, help="episodes to play (seeds seed, seed+1, ...)")
    parser.set_defaults(func=play)


def play(args: argparse.Namespace, stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    """Run ``milegpo play``: an interactive episode loop on stdin/stdout."""
    from milegpo.envs import UnknownEnvError, make_env

    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    kwargs = dict(args.env_kwargs)
    if args.split is not None:
        kwargs["split"] = args.split
    try:
        env = make_env(args.env_id, **kwargs)
    except UnknownEnvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (TypeError, ValueError, KeyError, FileNotFoundError) as exc:  # bad --split / --env-kwargs
        print(f"error: cannot make {args.env_id} with {kwargs}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:  # an optional engine is not installed
        print(f"error: {args.env_id} needs a package that is not installed: {exc}", file=sys.stderr)
        return 1
    try:
        for episode in range(args.episodes):
            if not _play_episode(env, args.env_id, args.seed + episode, stdin, stdout):
                break
    except KeyboardInterrupt:
        print("\nquit.", file=stdout)
        return 130
    finally:
        env.close()
    return 0


def _play_episode(env: TextEnv, env_id: str, seed: int, stdin: TextIO, stdout: TextIO) -> bool:
    """Play one episode; False when the player quit."""
    observation, info = env.reset(seed=seed)
    total = 0.0
    print(f"=== {env_id}, seed {seed} ===", file=stdout)
    print(f"task: {info['task']}", file=stdout)
    while True:
        print(f"\n{observation}", file=stdout)
        commands = info.get("admissible_commands")
        if commands:
            for number, command in enumerate(commands, start=1):
                print(f"  {number:2d}. {command}", file=stdout)
        else:
            print("  (type any command)", file=stdout)
        action = _read_command(commands, stdin, stdout)
        if action is None:  # ':q' or end of input
            print(f"\nquit. total reward {total:g}", file=stdout)
            return False
        observation, reward, terminated, truncated, info = env.step(action)
        total += reward
        note = "" if info["valid_action"] else "  (invalid action: state unchanged)"
        print(f"[{action}] reward {reward:+g}, step {info['elapsed_steps']}{note}", file=stdout)
        if terminated or truncated:
            outcome = "won" if info["won"] else ("out of steps" if truncated else "episode over")
            print(f"\n{observation}\n=== {outcome}: total reward {total:g} in {info['elapsed_steps']} steps ===",
                  file=stdout)
            return True


def _read_command(commands: list[str] | None, stdin: TextIO, stdout: TextIO) -> str | None:
    """Prompt until the player types a command (None: quit). A number picks from ``commands``;
    a command differing from a listed one only in case is taken as that one; an empty line or a
    number out of range is answered with a hint and costs no step."""
    while True:
        print("> ", end="", file=stdout, flush=True)
        line = stdin.readline()
        if not line or line.strip() == QUIT:
            return None
        action = line.strip()
        if not action:
            print(f"  type a command{' or its number' if commands else ''} ({QUIT} quits)", file=stdout)
            continue
        if commands and action.isdigit():
            if 1 <= int(action) <= len(commands):
                return commands[int(action) - 1]
            print(f"  no command {action}: pick 1-{len(commands)}", file=stdout)
            continue
        listed = {command.lower(): command for command in commands or []}
        return listed.get(action.lower(), action)


def add_check_env(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "check-env", help="check a text env before training on it",
        description="Play an env on a few task seeds and report, one line each, what would break training: the "
                    "TextEnv contract (types, valid Unicode, info keys, invalid actions), reset(seed) determinism, "
                    "state keys (same state, same key; different choices, different keys) and admissible commands. "
                    "Exit status 0: no findings; 1: findings; 2: the env cannot be made.")
    parser.add_argument("env_id", help="an env id: registered (milegpo/House-v0), module:ClassName (my_env:MyEnv) or "
                                       "a hub's (textarena:Wordle-v0)")
    parser.add_argument("--env-kwargs", type=env_kwargs_type, default={},
                        help="JSON object of env constructor arguments")
    parser.add_argument("--seeds", type=int, default=3, help="task seeds to play, 0 to N-1 (default 3)")
    parser.set_defaults(func=run_check_env)


def run_check_env(args: argparse.Namespace) -> int:
    """Run ``milegpo check-env``: the findings of :func:`milegpo.envs.check_text_env`, one line each."""
    from milegpo.envs import UnknownEnvError, check_text_env

    if args.seeds < 1:
        print(f"error: --seeds must be >= 1, got {args.seeds}", file=sys.stderr)
        return 2
    try:
        findings = check_text_env(args.env_id, seeds=args.seeds, env_kwargs=args.env_kwargs)
    except UnknownEnvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"error: {args.env_id} needs a package that is not installed: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # the env's constructor failed: nothing to check
        print(f"error: cannot make {args.env_id} with {args.env_kwargs}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    for finding in findings:
        print(f"{args.env_id}: {finding}")
    if findings:
        print(f"{len(findings)} finding(s) in {args.env_id} over task seeds 0-{args.seeds - 1}", file=sys.stderr)
        return 1
    print(f"{args.env_id}: no findings over task seeds 0-{args.seeds - 1} (contract, reset determinism, state keys, "
          "admissible commands)")
    return 0
