"""The ``milegpo`` command line: ``milegpo play | train | eval``.

Each subcommand is one function that adds its parser and sets ``func``; it is
registered with the :func:`subcommand` decorator. ``func(args) -> int`` returns
the exit code. To add a subcommand::

    @subcommand
    def _train(subparsers):
        parser = subparsers.add_parser("train", help="...")
        parser.add_argument(...)
        parser.set_defaults(func=run_train)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from milegpo.algos.credit import CREDIT_METHODS

#: Functions adding one subcommand each to the ``milegpo`` parser, in help order.
SUBCOMMANDS: list[Callable[[Any], None]] = []

QUIT = ":q"


def subcommand(add_parser: Callable[[Any], None]) -> Callable[[Any], None]:
    """Register a function ``add_parser(subparsers)`` that adds one subcommand."""
    SUBCOMMANDS.append(add_parser)
    return add_parser


def env_kwargs_type(text: str) -> dict[str, Any]:
    """argparse type of ``--env-kwargs``: a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object such as '{{\"max_episode_steps\": 20}}', got {text!r}")
    return value


# ----------------------------------------------------------------------- play
@subcommand
def _play_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "play", help="play a registered text env in the terminal",
        description="Play an env yourself: type a command or its number; ':q' quits.",
    )
    parser.add_argument("env_id", help="a registered env id, e.g. milegpo/House-v0")
    parser.add_argument("--seed", type=int, default=0, help="task seed (seed s is task s %% num_tasks)")
    parser.add_argument("--split", default=None, help="task split, e.g. train, eval_id, eval_ood")
    parser.add_argument("--env-kwargs", type=env_kwargs_type, default={}, help="JSON object of env constructor arguments")
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
    except (TypeError, ValueError) as exc:  # bad --split / --env-kwargs
        print(f"error: cannot make {args.env_id} with {kwargs}: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:  # an optional engine is not installed
        print(f"error: {args.env_id} needs a package that is not installed: {exc}", file=sys.stderr)
        return 1
    try:
        for episode in range(args.episodes):
            if not _play_episode(env, args.env_id, args.seed + episode, stdin, stdout):
                break
    finally:
        env.close()
    return 0


def _play_episode(env: Any, env_id: str, seed: int, stdin: TextIO, stdout: TextIO) -> bool:
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
        print("> ", end="", file=stdout, flush=True)
        line = stdin.readline()
        if not line or line.strip() == QUIT:  # end of input counts as quitting
            print(f"\nquit. total reward {total:g}", file=stdout)
            return False
        action = line.strip()
        if commands and action.isdigit() and 1 <= int(action) <= len(commands):
            action = commands[int(action) - 1]
        observation, reward, terminated, truncated, info = env.step(action)
        total += reward
        note = "" if info["valid_action"] else "  (invalid action: state unchanged)"
        print(f"[{action}] reward {reward:+g}, step {info['elapsed_steps']}{note}", file=stdout)
        if terminated or truncated:
            outcome = "won" if info["won"] else ("out of steps" if truncated else "episode over")
            print(f"\n{observation}\n=== {outcome}: total reward {total:g} in {info['elapsed_steps']} steps ===", file=stdout)
            return True


# ---------------------------------------------------------------------- train
#: command-line flag -> TrainConfig field (flags left unset keep the config's value)
TRAIN_FLAGS: dict[str, tuple[str, type, str]] = {
    "--algo": ("algo", str, "milegpo | graphgpo | gigpo | grpo"),
    "--env": ("env", str, "registered env id"),
    "--model": ("model", str, "hub name or local path of a causal LM (default: an offline tiny model)"),
    "--mode": ("mode", str, "choose (score admissible commands) | generate (free text + <action>)"),
    "--group-size": ("group_size", int, "rollouts per task (K)"),
    "--n-tasks": ("n_tasks", int, "tasks per iteration"),
    "--steps": ("total_timesteps", int, "env-step budget"),
    "--lr": ("learning_rate", float, "AdamW learning rate"),
    "--lora-r": ("lora_r", int, "LoRA rank"),
    "--kl-coef": ("kl_coef", float, "k3 KL weight to the reference policy"),
    "--credit-preset": ("credit_preset", str, "alfworld | webshop (MileGPO's per-env hyperparameters)"),
    "--n-eval-tasks": ("n_eval_tasks", int, "held-out tasks per eval split"),
    "--device": ("device", str, "auto | cpu | cuda"),
    "--seed": ("seed", int, "random seed"),
}

#: one algorithm per credit method (milegpo.algos.ALGORITHMS; the credit package imports no torch)
TRAIN_CHOICES = {"algo": CREDIT_METHODS, "mode": ("choose", "generate")}


@subcommand
def _train_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "train", help="train an agent (no arguments: the CPU demo, MileGPO on milegpo/House-v0)",
        description="Train MileGPO (or a baseline) and write a run folder with logs, plots and checkpoints.",
    )
    parser.add_argument("--config", help="JSON file of TrainConfig fields (flags override it)")
    for flag, (field, kind, help_text) in TRAIN_FLAGS.items():
        parser.add_argument(flag, dest=field, type=kind, default=None, help=help_text, choices=TRAIN_CHOICES.get(field))
    parser.add_argument("--env-kwargs", type=env_kwargs_type, default=None, help="JSON object of env constructor arguments")
    parser.add_argument("--run-dir", default=None, help="run folder (default: runs/<algo>-<env>-<time>)")
    parser.add_argument("--resume", metavar="RUN_DIR", default=None, help="continue a run from its last checkpoint")
    parser.add_argument("--no-progress-bar", action="store_true", help="no progress bar")
    parser.set_defaults(func=run_train)


def run_train(args: argparse.Namespace) -> int:
    from milegpo.algos.checkpoint import CheckpointError
    from milegpo.envs import UnknownEnvError
    from milegpo.train import CONFIG_FILE, TrainConfig, train

    try:
        if args.resume:
            config = TrainConfig.from_file(f"{args.resume}/{CONFIG_FILE}")
        elif args.config:
            config = TrainConfig.from_file(args.config)
        else:
            config = TrainConfig()
        overrides = {field: getattr(args, field) for field, _, _ in TRAIN_FLAGS.values() if getattr(args, field) is not None}
        if args.env_kwargs is not None:
            overrides["env_kwargs"] = args.env_kwargs
        config = TrainConfig.from_dict({**config.__dict__, **overrides})
        train(config, run_dir=args.resume or args.run_dir, resume=bool(args.resume), progress_bar=not args.no_progress_bar)
    except (ValueError, FileNotFoundError, UnknownEnvError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


# ----------------------------------------------------------------------- eval
@subcommand
def _eval_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("eval", help="evaluate a run folder on held-out tasks",
                                   description="Greedy success of a trained run on eval splits.")
    parser.add_argument("run_dir", help="a folder written by `milegpo train`")
    parser.add_argument("--split", action="append", default=None, help="eval split (repeatable; default: the run's)")
    parser.add_argument("--n-tasks", type=int, default=None, help="tasks per split (default: the run's n_eval_tasks)")
    parser.set_defaults(func=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    from milegpo.algos.checkpoint import CheckpointError
    from milegpo.train import evaluate_model, load_run

    try:
        config, model = load_run(args.run_dir)
        results = evaluate_model(model, config, splits=args.split, n_tasks=args.n_tasks)
    except (ValueError, FileNotFoundError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for split, result in results.items():
        print(f"{split}: success {result['success_rate']:.3f}, mean return {result['mean_return']:.2f}, "
              f"mean length {result['mean_length']:.1f} over {result['n_episodes']} episodes of {result['n_tasks']} tasks")
    return 0


# ---------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="milegpo", description="Train long-horizon LLM agents with MileGPO.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_parser in SUBCOMMANDS:
        add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``milegpo`` console script."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
