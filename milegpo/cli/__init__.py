"""The ``milegpo`` command line: ``milegpo play | train | eval | export | serve | check-env | inspect``.

Each subcommand is a function ``add_NAME(subparsers)`` that adds its parser and sets ``func``;
``func(args) -> int`` returns the exit code. :data:`SUBCOMMANDS` lists them in help order. The
commands live by what they work on: :mod:`~milegpo.cli.envs` (play, check-env),
:mod:`~milegpo.cli.train` and :mod:`~milegpo.cli.runs` (eval, export, serve, inspect); what they
share is :mod:`~milegpo.cli.common`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from milegpo.cli.common import Subparsers, env_kwargs_type, os_error_text
from milegpo.cli.envs import add_check_env, add_play, play
from milegpo.cli.runs import add_eval, add_export, add_inspect, add_serve
from milegpo.cli.train import add_train, refuse_old_flags

#: Functions adding one subcommand each to the ``milegpo`` parser, in help order.
SUBCOMMANDS: list[Callable[[Subparsers], None]] = [add_play, add_train, add_eval, add_export, add_serve,
                                                   add_check_env, add_inspect]


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
        refuse_old_flags(argv[1:])
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)  # train's overrides may come between its flags
    if extra and args.command == "train":
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return int(args.func(args))


__all__ = ["SUBCOMMANDS", "build_parser", "env_kwargs_type", "main", "os_error_text", "play"]
