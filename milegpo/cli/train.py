"""``milegpo train``: the run's settings from the command line (presets, files, overrides, and
the names of earlier versions' and TRL's flags), then :func:`milegpo.run.train.train`."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from milegpo.cli.common import Subparsers, os_error_text, resume_hint

if TYPE_CHECKING:
    from milegpo.config.run import TrainConfig


#: the flags of earlier versions that have another name now (their settings: TrainConfig's RENAMED)
OLD_FLAGS = ("--algo", "--env", "--model", "--mode", "--group-size", "--n-tasks", "--steps", "--lr", "--lora-r",
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


def add_train(subparsers: Subparsers) -> None:
    from milegpo.config.run import DEMO_PRESET, PRESETS, TrainConfig, describe_value, leaves, lookup, resolve_config

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
    from milegpo.config.run import DEMO_PRESET, RENAMED, resolve_config
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
        from milegpo.config.run import TrainConfig

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


def refuse_old_flags(argv: Sequence[str]) -> None:
    """An old ``milegpo train`` flag fails with its new name (they were renamed into the config's sections)."""
    from milegpo.config.run import RENAMED

    for arg in argv:
        flag = arg.split("=", 1)[0]
        if flag in OLD_FLAGS:
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
