"""The commands that read a run folder: ``milegpo eval``, ``export``, ``serve`` and ``inspect``."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from milegpo.cli.common import Subparsers, os_error_text

if TYPE_CHECKING:
    from milegpo.config.run import TrainConfig


def add_eval(subparsers: Subparsers) -> None:
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
    from milegpo.run.checks import check_setup
    from milegpo.run.finish import evaluate_model, load_run

    try:
        if args.n_tasks is not None and args.n_tasks < 1:
            raise ValueError(f"--n-tasks must be >= 1, got {args.n_tasks}")
        if args.temperature is not None and args.temperature <= 0:
            raise ValueError(f"--temperature must be > 0 (--greedy for greedy actions), got {args.temperature}")
        config, model = load_run(args.run_dir)
        config = config.replace(**{"eval.splits": args.split or config.eval.splits or _default_eval_splits(config)})
        if args.greedy or args.temperature is not None:
            config = config.replace(**{"eval.temperature": None if args.greedy else args.temperature})
        check_setup(config, verbose=0)  # every split makes the env: one line for a split it does not take
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
    from milegpo.envs.registration import takes_split
    from milegpo.options import HELD_OUT_SPLIT

    if not takes_split(config.env.id):
        return [HELD_OUT_SPLIT]
    raise ValueError("the run has no eval splits (its eval.splits is empty): pass --split NAME")


def add_export(subparsers: Subparsers) -> None:
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


def add_serve(subparsers: Subparsers) -> None:
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


def add_inspect(subparsers: Subparsers) -> None:
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
