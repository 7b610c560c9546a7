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
import errno
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from milegpo.credit import CREDIT_METHODS
from milegpo.options import MODES, ROLLOUT_BACKENDS

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
    except KeyboardInterrupt:
        print("\nquit.", file=stdout)
        return 130
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
            print(f"\n{observation}\n=== {outcome}: total reward {total:g} in {info['elapsed_steps']} steps ===", file=stdout)
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


# ---------------------------------------------------------------------- train
#: command-line flag -> (TrainConfig field, type, what the flag adds to the field's description);
#: the description itself is the TrainConfig docstring's. Flags left unset keep the config's value.
TRAIN_FLAGS: dict[str, tuple[str, type, str]] = {
    "--algo": ("algo", str, ""),
    "--env": ("env", str, ""),
    "--model": ("model", str, ""),
    "--mode": ("mode", str, ""),
    "--group-size": ("group_size", int, ""),
    "--n-tasks": ("n_tasks", int, ""),
    "--steps": ("total_timesteps", int, ""),
    "--lr": ("learning_rate", float, ""),
    "--lora-r": ("lora_r", int, ""),
    "--kl-coef": ("kl_coef", float, ""),
    "--credit-preset": ("credit_preset", str, ""),
    "--n-eval-tasks": ("n_eval_tasks", int, ""),
    "--eval-freq": ("eval_freq", int, ""),
    "--checkpoint-freq": ("checkpoint_freq", int, ""),
    "--train-split": ("train_split", str, "'none': the env has no splits"),
    "--rollout-backend": ("rollout_backend", str, "vllm needs pip install 'milegpo[vllm]'"),
    "--device": ("device", str, ""),
    "--seed": ("seed", int, ""),
    "--report-to": ("report_to", str, "comma-separated, or none"),
}

#: one algorithm per credit method (milegpo.algos.ALGORITHMS; the credit package imports no torch)
TRAIN_CHOICES = {"algo": CREDIT_METHODS, "mode": MODES, "rollout_backend": ROLLOUT_BACKENDS}
#: split names meaning "no split"
NO_SPLIT = ("none", "null")


@subcommand
def _train_parser(subparsers: Any) -> None:
    from milegpo.run.train import TrainConfig

    defaults = TrainConfig()
    parser = subparsers.add_parser(
        "train", help="train an agent (no arguments: the CPU demo, MileGPO on milegpo/House-v0)",
        description="Train MileGPO (or a baseline) and write a run folder with logs, plots and checkpoints. "
                    "Flags override the --config file; defaults shown are the CPU demo's.",
    )
    parser.add_argument("--config", help="JSON file of TrainConfig fields (flags override it)")
    described = TrainConfig.field_help()
    for flag, (field, kind, note) in TRAIN_FLAGS.items():
        help_text = f"{described[field]}{f'; {note}' if note else ''} (default: {getattr(defaults, field)})"
        parser.add_argument(flag, dest=field, type=kind, default=None, help=help_text, choices=TRAIN_CHOICES.get(field))
    parser.add_argument("--eval-split", dest="eval_splits", action="append", default=None,
                        help=f"held-out split, repeatable; 'none': no evaluation (default: {' '.join(defaults.eval_splits)})")
    parser.add_argument("--env-kwargs", type=env_kwargs_type, default=None, help="JSON object of env constructor arguments")
    parser.add_argument("--warm-start", type=env_kwargs_type, default=None, metavar="JSON",
                        help="behaviour-clone the env's noisy scripted expert before RL, e.g. "
                             "'{\"episodes\": 64, \"epsilon\": 0.3}' (keys: milegpo.algos.warm_start.WarmStartConfig)")
    parser.add_argument("--run-dir", default=None, help="run folder (default: runs/<algo>-<env>-<time>)")
    parser.add_argument("--resume", metavar="RUN_DIR", default=None,
                        help="continue a run from its newest intact checkpoint (its logs are cut back to it)")
    parser.add_argument("--no-progress-bar", action="store_true", help="no progress bar")
    parser.add_argument("--verbose", type=int, choices=(0, 1, 2), default=1,
                        help="console: 0 nothing, 1 one line per iteration (default), 2 every logged value")
    parser.set_defaults(func=run_train)


def _train_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The TrainConfig fields set on the command line."""
    overrides = {field: getattr(args, field) for field, _, _ in TRAIN_FLAGS.values() if getattr(args, field) is not None}
    if str(overrides.get("train_split", "")).lower() in NO_SPLIT:
        overrides["train_split"] = None
    if args.eval_splits is not None:
        overrides["eval_splits"] = [split for split in args.eval_splits if split.lower() not in NO_SPLIT]
    if args.env_kwargs is not None:
        overrides["env_kwargs"] = args.env_kwargs
    if args.warm_start is not None:
        overrides["warm_start"] = args.warm_start
    if "report_to" in overrides:
        from milegpo.run.tracking import parse_report_to

        overrides["report_to"] = parse_report_to(overrides["report_to"])
    return overrides


def run_train(args: argparse.Namespace) -> int:
    from milegpo.algos.checkpoint import CheckpointError
    from milegpo.algos.errors import TrainingError
    from milegpo.envs import UnknownEnvError
    from milegpo.envs.vec_worker import EnvWorkerError
    from milegpo.run.train import TrainConfig, train
    from milegpo.run_folder import CONFIG_FILE

    run_dir = args.resume or args.run_dir
    try:
        if args.resume:
            if not os.path.isfile(os.path.join(args.resume, CONFIG_FILE)):
                raise FileNotFoundError(f"{args.resume!r} is not a run folder (no {CONFIG_FILE}); pass the folder "
                                        "`milegpo train` wrote")
            config = TrainConfig.from_file(f"{args.resume}/{CONFIG_FILE}")
        elif args.config:
            config = TrainConfig.from_file(args.config)
        else:
            config = TrainConfig()
        config = TrainConfig.from_dict({**config.__dict__, **_train_overrides(args)})
        train(config, run_dir=run_dir, resume=bool(args.resume), progress_bar=not args.no_progress_bar,
              verbose=args.verbose)
    except (ValueError, FileNotFoundError, ImportError, UnknownEnvError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (TrainingError, EnvWorkerError) as exc:  # the env cannot be played (a worker cannot even restart)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: {os_error_text(exc)}{resume_hint(run_dir)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\ninterrupted{resume_hint(run_dir)}", file=sys.stderr)
        return 130
    return 0


def os_error_text(exc: OSError) -> str:
    """One line for an OS error: what failed on which path ("no space left on device" for ENOSPC)."""
    reason = "no space left on device" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
    path = f" while writing {exc.filename}" if exc.filename else ""
    return f"{reason}{path}"


def resume_hint(run_dir: str | None) -> str:
    return f": the last intact checkpoint is kept; continue with milegpo train --resume {run_dir or 'RUN_DIR'}"


# ----------------------------------------------------------------------- eval
@subcommand
def _eval_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("eval", help="evaluate a run folder on held-out tasks",
                                   description="Success of a run's final (else latest) checkpoint on held-out splits. "
                                               "Actions are sampled at the run's eval_temperature (greedy when it is "
                                               "null) with a fixed seed per split: the same checkpoint, split and "
                                               "settings always give the same number.")
    parser.add_argument("run_dir", help="a folder written by `milegpo train`")
    parser.add_argument("--split", action="append", default=None, help="eval split (repeatable; default: the run's)")
    parser.add_argument("--n-tasks", type=int, default=None, help="tasks per split (default: the run's n_eval_tasks)")
    sampling = parser.add_mutually_exclusive_group()
    sampling.add_argument("--temperature", type=float, default=None, help="sample at this temperature instead")
    sampling.add_argument("--greedy", action="store_true", help="take the most likely action instead of sampling")
    parser.set_defaults(func=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    from milegpo.algos.checkpoint import CheckpointError
    from milegpo.run.train import TrainConfig, evaluate_model, load_run

    try:
        if args.n_tasks is not None and args.n_tasks < 1:
            raise ValueError(f"--n-tasks must be >= 1, got {args.n_tasks}")
        if args.temperature is not None and args.temperature <= 0:
            raise ValueError(f"--temperature must be > 0 (--greedy for greedy actions), got {args.temperature}")
        config, model = load_run(args.run_dir)
        if not (args.split or config.eval_splits):
            raise ValueError("the run has no eval splits (its eval_splits is empty): pass --split NAME")
        if args.greedy or args.temperature is not None:
            config = TrainConfig.from_dict({**config.__dict__, "eval_temperature": None if args.greedy else args.temperature})
        results = evaluate_model(model, config, splits=args.split, n_tasks=args.n_tasks, progress=True)
    except (ValueError, FileNotFoundError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sampling = "greedy" if config.eval_temperature is None else f"sampled at T={config.eval_temperature:g}"
    for split, result in results.items():
        print(f"{split}: success {result['success_rate']:.3f}, mean return {result['mean_return']:.2f}, "
              f"mean length {result['mean_length']:.1f} over {result['n_episodes']} episodes of {result['n_tasks']} "
              f"tasks ({sampling})")
    return 0


@subcommand
def _export_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "export", help="write a run's trained policy: the LoRA adapter (peft format) or a merged model",
        description="Export a run's final (else latest) policy with its tokenizer. Without --merged: the LoRA "
                    "adapter (PeftModel.from_pretrained(base, OUT)). With --merged: the adapter folded into the "
                    "base weights, a plain model for AutoModelForCausalLM.from_pretrained(OUT) or vllm.LLM(OUT).")
    parser.add_argument("run_dir", help="a folder written by `milegpo train`")
    parser.add_argument("out", help="the folder to write (must be empty or new)")
    parser.add_argument("--merged", action="store_true", help="merge the adapter into the base model")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT")
    parser.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    from milegpo.algos.checkpoint import CheckpointError
    from milegpo.run.export import export_run

    try:
        out = export_run(args.run_dir, args.out, merged=args.merged, overwrite=args.overwrite)
    except (ValueError, FileNotFoundError, FileExistsError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    kind = "merged model" if args.merged else "LoRA adapter"
    print(f"Exported the {kind} of {args.run_dir} to {out}")
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
