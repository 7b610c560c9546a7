"""The installed ``milegpo`` console script run as a user runs it: in a folder of their own, with no
``PYTHONPATH`` (the script does not put the working directory on ``sys.path``; what it imports from there
it finds itself)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_milegpo(*args: str, cwd: Path, stdin: str = "", timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``milegpo ARGS`` in ``cwd`` with ``stdin`` as its input: its exit status, stdout and stderr."""
    script = Path(sys.executable).with_name("milegpo")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    return subprocess.run([str(script), *args], cwd=cwd, env=env, input=stdin, capture_output=True, text=True,
                          timeout=timeout)
