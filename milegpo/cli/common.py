"""What every ``milegpo`` subcommand shares: the parser type each adds itself to, and one-line
messages for the errors a command reports."""

from __future__ import annotations

import argparse
import errno
import json
from typing import Any

#: what ``add_subparsers`` returns: each subcommand adds its parser to it
Subparsers = argparse._SubParsersAction


def env_kwargs_type(text: str) -> dict[str, Any]:
    """argparse type of ``--env-kwargs``: a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object such as '{{\"max_episode_steps\": 20}}', got {text!r}")
    return value


def os_error_text(exc: OSError) -> str:
    """One line for an OS error: what failed on which path ("no space left on device" for ENOSPC)."""
    reason = "no space left on device" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
    path = f" while writing {exc.filename}" if exc.filename else ""
    return f"{reason}{path}"


def resume_hint(run_dir: str | None) -> str:
    return f": the last intact checkpoint is kept; continue with milegpo train --resume {run_dir or 'RUN_DIR'}"
