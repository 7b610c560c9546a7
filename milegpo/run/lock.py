"""One writer per run folder: an exclusive OS lock held for the whole of a training run.

Two processes training into one run folder (two ``--resume`` of the same run, a retried job, two
``train --run-dir`` started together) would cut back each other's logs and interleave their rows.
:class:`RunFolderLock` takes an exclusive ``flock`` on ``RUN_DIR/.milegpo.lock`` before anything
in the folder is read for resuming or written; a second writer is refused at once with one line
naming the holder (pid, host, start time, command).

The lock belongs to the open file, so the operating system drops it when the holding process
ends in any way (``kill -9`` included): a stale lock file never blocks the next ``--resume``.
Readers (``milegpo eval``, ``export``, plots) take no lock; the trainer writes every file it
rewrites atomically (a temporary file renamed over the old one) and only appends to its logs.

Written by hand over :mod:`fcntl` rather than with the ``filelock`` package: ``filelock`` truncates
the lock file when it opens it, which would erase the holder's description that the refusal
shows; ``flock`` itself is the whole mechanism either way. POSIX only (Linux, macOS); on
Windows the lock is not taken (said once).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from types import TracebackType

from milegpo.run_folder import LOCK_FILE


class RunFolderBusyError(RuntimeError):
    """Another live process holds the run folder's lock: the message names it."""


def _holder_text(lock_file: Path) -> str:
    """The description the holder wrote into the lock file, as one phrase."""
    try:
        holder = json.loads(lock_file.read_text() or "{}")
    except (OSError, ValueError):
        holder = {}
    if not holder:
        return "another process (it has not described itself yet)"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started", 0)))
    return (f"pid {holder.get('pid')} on {holder.get('host')}, started {started} "
            f"({holder.get('command', 'milegpo')})")


class RunFolderLock:
    """The exclusive writer lock of one run folder (a context manager).

    :param run_dir: the run folder (made when missing: the lock file lives in it).
    """

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._fd: int | None = None
        #: whether :meth:`acquire` made the run folder (a new run's folder, removed if it trains nothing)
        self.created_folder = False

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> RunFolderLock:
        """Take the lock, or raise :class:`RunFolderBusyError` naming the live holder."""
        try:
            import fcntl
        except ImportError:  # Windows: no flock; one writer per folder is then the user's to keep
            print(f"note: {self.run_dir} is not locked on this platform: run one training process per run folder",
                  file=sys.stderr)
            return self
        self.created_folder = not self.run_dir.exists()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # no O_TRUNC: the holder's description stays
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunFolderBusyError(
                f"{self.run_dir} is being trained by {_holder_text(self.path)}: one training process per run folder. "
                f"Wait for it to finish (or stop it: it saves a checkpoint on SIGTERM), then milegpo train --resume "
                f"{self.run_dir}") from None
        description = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                       "command": " ".join(["milegpo", *sys.argv[1:]]) if sys.argv[1:] else "milegpo"}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(description).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Drop the lock (the file stays: removing it would race a process waiting on it)."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        except OSError:
            pass
        os.close(self._fd)  # closing the descriptor releases the flock
        self._fd = None

    def __enter__(self) -> RunFolderLock:
        return self.acquire()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.release()
