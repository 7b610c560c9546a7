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
import dataclasses
import errno
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from milegpo.envs.core import TextEnv
    from milegpo.run.config import TrainConfig

#: what ``add_subparsers`` returns: each subcommand adds its parser to it
Subparsers = argparse._SubParsersAction

#: Functions adding one subcommand each to the ``milegpo`` parser, in help order.
SUBCOMMANDS: list[Callable[[Subparsers], None]] = []

QUIT = ":q"


def subcommand(add_parser: Callable[[Subparsers], None]) -> Callable[[Subparsers], None]:
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
def _play_parser(subparsers: Subparsers) -> None:
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


# ---------------------------------------------------------------------- train
#: the flags of earlier versions that have another name now (their settings: TrainConfig's RENAMED)
_OLD_FLAGS = ("--algo", "--env", "--model", "--mode", "--group-size", "--n-tasks", "--steps", "--lr", "--lora-r",
              "--kl-coef", "--credit-preset", "--n-eval-tasks", "--eval-freq", "--checkpoint-freq", "--train-split",
              "--rollout-backend", "--device", "--seed", "--report-to", "--eval-split", "--env-kwargs", "--warm-start")


#: TRL's GRPOConfig flags a user may reach for, and what they are here
_TRL_FLAGS = {
    "output_dir": "--run-dir DIR",
    "model_name_or_path": "--policy.model NAME (or policy.model=NAME)",
    "num_generations": "--env.group_size K (rollouts per task: the group)",
    "per_device_train_batch_size": "--algo.batch_size N (steps per minibatch of the update)",
    "max_steps": "--run.total_timesteps N (env steps, not updates)",
    "num_train_epochs": "--run.total_timesteps N (env steps: tasks are drawn per iteration, not by epoch)",
    "beta": "--algo.kl_coef X",
    "epsilon": "--algo.clip_range X",
    "max_completion_length": "--policy.max_new_tokens N",
    "max_prompt_length": "--policy.max_prompt_tokens N",
    "num_iterations": "--algo.n_epochs N",
    "save_steps": "--run.checkpoint_freq N (iterations)",
    "logging_dir": "--run-dir DIR (logs go to the run folder)",
}


@subcommand
def _train_parser(subparsers: Subparsers) -> None:
    from milegpo.run.config import DEMO_PRESET, PRESETS, TrainConfig, describe_value, leaves, lookup, resolve_config

    defaults, demo = TrainConfig(), resolve_config(DEMO_PRESET)
    parser = subparsers.add_parser(
        "train", help=f"train an agent (no arguments: the {DEMO_PRESET} preset, MileGPO on milegpo/House-v0 on a CPU)",
        formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False,
        usage="milegpo train [--preset NAME] [--config FILE] [--print-config] [--run-dir DIR]\n"
              "                     [--resume DIR [--restart]] [--section.field VALUE | section.field=VALUE ...]",
        description="Train MileGPO (or a baseline) and write a run folder with logs, plots and checkpoints.\n\n"
                    "Settings are layered: the defaults (the paper's), then --preset, then --config files, then "
                    "overrides,\ngiven as --section.field VALUE or section.field=VALUE (e.g. algo.learning_rate=1e-5 "
                    "eval.splits=[eval_id]).\n"
                    f"Without --preset and --config the preset is {DEMO_PRESET}. --print-config shows the result.",
    )
    parser.add_argument("overrides", nargs="*", metavar="section.field=VALUE", help="settings to change")
    parser.add_argument("--preset", choices=PRESETS, default=None,
                        help=f"a named set of settings over the defaults (default: {DEMO_PRESET} when no --config is "
                             f"given)")
    parser.add_argument("--config", action="append", default=[], metavar="FILE",
                        help="YAML or JSON file of settings (nested as in --print-config); repeatable, later wins")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    parser.add_argument("--run-dir", default=None, help="run folder (default: runs/<algo>-<env>-<time>)")
    parser.add_argument("--resume", metavar="RUN_DIR", default=None,
                        help="continue a run from its newest intact checkpoint (its logs are cut back to it); its "
                             "saved config is the base, overrides apply on top (e.g. run.total_timesteps=N to train "
                             "further)")
    parser.add_argument("--restart", action="store_true",
                        help="with --resume, when the run has no intact checkpoint: move its logs and checkpoints to "
                             "RUN_DIR/previous-<time>/ and train it again from the start (nothing is deleted)")
    parser.add_argument("--no-progress-bar", action="store_true", help="no progress bar")
    parser.add_argument("--verbose", type=int, choices=(0, 1, 2), default=1,
                        help="console: 0 nothing, 1 one line per iteration (default), 2 every logged value")
    for section in ("env", "algo", "policy", "eval", "run"):
        group = parser.add_argument_group(f"{section} settings")
        for name, kind, text in leaves():
            if name.split(".")[0] != section:
                continue
            default, preset = lookup(defaults, name), lookup(demo, name)
            shown = f"default: {describe_value(default)}" + (
                f"; {DEMO_PRESET}: {describe_value(preset)}" if preset != default else "")
            group.add_argument(f"--{name}", dest=name, action="append", default=None, metavar=_metavar(kind),
                               help=f"{text} ({shown})".replace("%", "%%"))
    parser.set_defaults(func=run_train)


def _metavar(annotation: Any) -> str:
    """The kind of value a setting takes, for --help: ``int``, ``float|null``, ``[str,...]``, ``{key:value}``."""
    import typing

    args = typing.get_args(annotation)
    if type(None) in args:  # X | None
        return f"{_metavar(next(a for a in args if a is not type(None)))}|null"
    origin = typing.get_origin(annotation)
    if origin is list:
        return f"[{_metavar(args[0])},...]"
    if origin is dict or (isinstance(annotation, type) and dataclasses.is_dataclass(annotation)):
        return "{key:value}"
    return getattr(annotation, "__name__", str(annotation))


def _config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The run's config from --resume / --preset / --config and the overrides (``ValueError`` naming what is wrong)."""
    from milegpo.run.config import DEMO_PRESET, RENAMED, resolve_config
    from milegpo.run_folder import CONFIG_FILE

    overrides = [f"{name}={value}" for name, values in vars(args).items() if "." in name and values is not None
                 for value in values]
    for item in args.overrides:  # a flag argparse did not know first: its value alone would be named otherwise
        if item.startswith("-"):
            name = item.lstrip("-").split("=", 1)[0]
            new = RENAMED.get(name) or RENAMED.get(name.replace("-", "_"))
            trl = _TRL_FLAGS.get(name.replace("-", "_"))
            hint = (f": it is --{new} VALUE (or {new}=VALUE)" if new else f" (a TRL flag): here it is {trl}" if trl
                    else "; settings are --section.field VALUE")
            raise ValueError(f"unknown flag {item.split('=', 1)[0]}{hint}; see milegpo train --help")
    for item in args.overrides:
        if "=" not in item:
            hint = f" (the flag --{item.lstrip('-')} is now --{RENAMED[item]})" if item in RENAMED else ""
            raise ValueError(f"unexpected argument {item!r}: overrides are section.field=VALUE{hint}")
        overrides.append(item)
    names = [item.split("=", 1)[0] for item in overrides]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:  # the later value would silently win
        raise ValueError(f"{', '.join(twice)} given more than once on the command line: give each setting once")
    if args.resume:
        if not os.path.isfile(os.path.join(args.resume, CONFIG_FILE)):
            raise FileNotFoundError(f"{args.resume!r} is not a run folder (no {CONFIG_FILE}); pass the folder "
                                    "`milegpo train` wrote")
        if args.preset or args.config:
            raise ValueError("--resume continues a run with its saved config: give overrides, not --preset/--config")
        from milegpo.run.config import TrainConfig

        base = TrainConfig.from_file(os.path.join(args.resume, CONFIG_FILE))
        return resolve_config(overrides=overrides, base=base)
    model = _named_model(overrides)
    # the CPU demo's settings (lr 3e-3, choose mode...) are for its offline tiny model: a named model gets the
    # defaults, the paper's settings, exactly as MileGPO("LLMPolicy", env, policy_kwargs={"model": ...}) does
    preset = args.preset or (None if args.config or model else DEMO_PRESET)
    config = resolve_config(preset, args.config, overrides)
    if args.verbose and not args.preset:
        if preset == DEMO_PRESET:
            line = (f"Using the {DEMO_PRESET} preset (algo.method={config.algo.method}, policy.mode="
                    f"{config.policy.mode}, an offline tiny model); --preset or --config for other settings, "
                    "--print-config to see them all")
        elif args.config:
            line = (f"{', '.join(args.config)} on top of the defaults, the paper's GPU settings (generate mode with "
                    f"<think>, lr 1e-6): add --preset {DEMO_PRESET} to start from the CPU demo's instead; "
                    "--print-config shows every setting")
        else:
            line = (f"policy.model={model}: using the defaults, the paper's settings (no preset: generate mode with "
                    f"<think>, lr 1e-6, KL 0.01, 16 tasks x 8 rollouts); --preset {DEMO_PRESET} for the CPU demo's "
                    "settings instead, --print-config to see them all")
        print(line, file=sys.stderr if args.print_config else sys.stdout)
    return config


def _named_model(overrides: Sequence[str]) -> str | None:
    """The model an override ``policy.model=NAME`` names (None: none, or ``null``)."""
    for item in overrides:
        name, _, value = item.partition("=")
        if name == "policy.model" and value.strip() not in ("", "null", "None", "~"):
            return value.strip()
    return None


def _refuse_old_flags(argv: Sequence[str]) -> None:
    """An old ``milegpo train`` flag fails with its new name (they were renamed into the config's sections)."""
    from milegpo.run.config import RENAMED

    for arg in argv:
        flag = arg.split("=", 1)[0]
        if flag in _OLD_FLAGS:
            new = RENAMED[flag[2:].replace("-", "_")]
            print(f"milegpo train: error: {flag} is now --{new} (or {new}=VALUE); see milegpo train --help",
                  file=sys.stderr)
            raise SystemExit(2)


def run_train(args: argparse.Namespace) -> int:
    from milegpo.algos.checkpoint import CheckpointError
    from milegpo.algos.errors import TrainingError
    from milegpo.algos.preemption import RunStopped, exit_code
    from milegpo.envs import UnknownEnvError
    from milegpo.envs.vec_worker import EnvWorkerError
    from milegpo.run.lock import RunFolderBusyError
    from milegpo.run.train import train

    run_dir = args.resume or args.run_dir
    try:
        config = _config_from_args(args)
        if args.print_config:
            import yaml

            print(yaml.safe_dump(config.to_dict(), sort_keys=False), end="")
            return 0
        train(config, run_dir=run_dir, resume=bool(args.resume), progress_bar=not args.no_progress_bar,
              verbose=args.verbose, restart=args.restart)
    except (ValueError, FileNotFoundError, ImportError, UnknownEnvError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (TrainingError, EnvWorkerError, RunFolderBusyError) as exc:  # the env cannot be played (a worker cannot
        # even restart), or another process trains this run folder
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except RunStopped as exc:  # SIGTERM / SIGINT / SIGUSR1: the last completed iteration is saved
        print(str(exc), file=sys.stderr)
        return exit_code(exc.signum)
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
def _eval_parser(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("eval", help="evaluate a run folder on held-out tasks",
                                   description="Success of a run's final (else latest) checkpoint on held-out splits. "
                                               "Actions are sampled at the run's eval.temperature (greedy when it is "
                                               "null) with a fixed seed per split: the same checkpoint, split and "
                                               "settings always give the same number.")
    parser.add_argument("run_dir", help="a folder written by `milegpo train`")
    parser.add_argument("--split", action="append", default=None,
                        help="eval split (repeatable; default: the run's; held_out: the held-out task seeds of an env "
                             "without splits)")
    parser.add_argument("--n-tasks", type=int, default=None, help="tasks per split (default: the run's n_eval_tasks)")
    sampling = parser.add_mutually_exclusive_group()
    sampling.add_argument("--temperature", type=float, default=None, help="sample at this temperature instead")
    sampling.add_argument("--greedy", action="store_true", help="take the most likely action instead of sampling")
    parser.set_defaults(func=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    from milegpo.algos.checkpoint import CheckpointError
    from milegpo.envs import UnknownEnvError
    from milegpo.run.checks import check_env
    from milegpo.run.train import evaluate_model, load_run

    try:
        if args.n_tasks is not None and args.n_tasks < 1:
            raise ValueError(f"--n-tasks must be >= 1, got {args.n_tasks}")
        if args.temperature is not None and args.temperature <= 0:
            raise ValueError(f"--temperature must be > 0 (--greedy for greedy actions), got {args.temperature}")
        config, model = load_run(args.run_dir)
        config = config.replace(**{"eval.splits": args.split or config.eval.splits or _default_eval_splits(config)})
        if args.greedy or args.temperature is not None:
            config = config.replace(**{"eval.temperature": None if args.greedy else args.temperature})
        check_env(config)  # every split makes the env: one line for a split it does not take
        results = evaluate_model(model, config, n_tasks=args.n_tasks, progress=True)
    except (ValueError, FileNotFoundError, CheckpointError, UnknownEnvError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sampling = "greedy" if config.eval.temperature is None else f"sampled at T={config.eval.temperature:g}"
    for split, result in results.items():
        print(f"{split}: success {result['success_rate']:.3f}, mean return {result['mean_return']:.2f}, "
              f"mean length {result['mean_length']:.1f} over {result['n_episodes']} episodes of {result['n_tasks']} "
              f"tasks ({sampling})")
    return 0


def _default_eval_splits(config: TrainConfig) -> list[str]:
    """What ``milegpo eval`` evaluates for a run with no eval splits: an env without task splits on its
    held-out seeds; an env with splits needs ``--split``."""
    from milegpo.envs.core import HELD_OUT_SPLIT
    from milegpo.envs.registration import takes_split

    if not takes_split(config.env.id):
        return [HELD_OUT_SPLIT]
    raise ValueError("the run has no eval splits (its eval.splits is empty): pass --split NAME")


@subcommand
def _export_parser(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "export", help="write a run's trained policy: the LoRA adapter (peft format) or a merged model",
        description="Export a run's final (else latest) policy with its tokenizer. Without --merged: the LoRA "
                    "adapter (PeftModel.from_pretrained(base, OUT)). With --merged: the adapter folded into the "
                    "base weights, a plain model for AutoModelForCausalLM.from_pretrained(OUT) or vllm.LLM(OUT).")
    parser.add_argument("run_dir", help="a folder written by `milegpo train`")
    parser.add_argument("out", help="the folder to write: new, empty, or a previous export (with --overwrite); never "
                                    "the run folder, a folder around it or inside it")
    parser.add_argument("--merged", action="store_true", help="merge the adapter into the base model")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a previous export in OUT (a folder export wrote; any other folder is refused)")
    parser.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    from milegpo.algos.checkpoint import CheckpointError
    from milegpo.run.export import export_run

    try:
        out = export_run(args.run_dir, args.out, merged=args.merged, overwrite=args.overwrite)
    except (ValueError, FileNotFoundError, FileExistsError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk, a folder it may not write: nothing of OUT was changed
        print(f"error: {os_error_text(exc)}; {args.out} is left as it was", file=sys.stderr)
        return 1
    kind = "merged model" if args.merged else "LoRA adapter"
    print(f"Exported the {kind} of {args.run_dir} to {out}")
    return 0


# ---------------------------------------------------------------------- serve
@subcommand
def _serve_parser(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "serve", help="serve a trained policy behind an OpenAI-compatible endpoint",
        description="Serve a run's policy (or an export, or a model) as an OpenAI-compatible HTTP endpoint: POST "
                    "/v1/chat/completions and GET /v1/models. The server always generates (a choose-mode run's "
                    "model writes free text); at temperature 0 a reply is the policy's own greedy generation.")
    parser.add_argument("source", metavar="RUN_DIR",
                        help="a folder written by `milegpo train` or `milegpo export` (adapter or --merged), or a "
                             "model's folder or hub name")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default: 8000; 0: any free port)")
    parser.add_argument("--model-name", default=None,
                        help="the model name clients send (default: the folder's name, or the hub name)")
    parser.add_argument("--device", default="auto",
                        help="where an export or a model is loaded: auto, cpu, cuda (a run folder: its run.device)")
    parser.add_argument("--access-log", action="store_true", help="log every request")
    parser.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from milegpo.algos.checkpoint import CheckpointError
    from milegpo.serve import serve

    try:
        serve(args.source, host=args.host, port=args.port, model_name=args.model_name, device=args.device,
              access_log=args.access_log)
    except (ValueError, FileNotFoundError, ImportError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # while the model loads (once serving, Ctrl-C stops the server cleanly)
        print("\ninterrupted", file=sys.stderr)
        return 130
    return 0


# ------------------------------------------------------------------ check-env
@subcommand
def _check_env_parser(subparsers: Subparsers) -> None:
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


# -------------------------------------------------------------------- inspect
@subcommand
def _inspect_parser(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "inspect", help="write an HTML report of what a run's credit saw: state graphs, milestones, traps, advantages",
        description="Write one self-contained HTML file (opens offline) of a run folder: the learning curve with the "
                    "kept iterations marked, and per kept iteration and task group the state graph, milestones, "
                    "traps, branching points and each trajectory's step advantages under every credit method, "
                    "recomputed from the kept batch. run.keep_batch_every sets which iterations a run keeps.")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a folder written by `milegpo train`")
    parser.add_argument("--out", default=None, help="the HTML file to write (default: RUN_DIR/report.html)")
    parser.add_argument("--iteration", type=int, action="append", default=None, dest="iterations", metavar="N",
                        help="include only this kept iteration (repeat for several; default: every kept one)")
    parser.set_defaults(func=run_inspect)


def run_inspect(args: argparse.Namespace) -> int:
    from milegpo.inspect import write_report

    try:
        out = write_report(args.run_dir, args.out, args.iterations)
    except (FileNotFoundError, ValueError, IsADirectoryError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {os_error_text(exc)}", file=sys.stderr)
        return 1
    print(f"Wrote {out} ({out.stat().st_size / 1e6:.1f} MB); open it in a browser")
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
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train"]:
        _refuse_old_flags(argv[1:])
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)  # train's overrides may come between its flags
    if extra and args.command == "train":
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
