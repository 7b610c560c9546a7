"""Stopping a run cleanly on SIGTERM, SIGINT or SIGUSR1 (what job systems send before they kill).

SLURM, Kubernetes, ``docker stop`` and most schedulers send SIGTERM, wait a grace period, then
kill. Inside :func:`stop_on_signals` the first such signal only *requests* a stop (one line on
stderr); the training loop honours it at the next safe point:

* during a rollout, before the next env step: the unfinished rollout is dropped (its steps are
  not counted), so the state is that of the last completed iteration;
* during an update, evaluation or checkpoint save: when it is done, before the next rollout.

``learn()`` then returns; the checkpoint callback saves that last completed iteration (unless it
was just saved), so ``milegpo train --resume`` continues exactly where an uninterrupted run would
be. A second signal of the same kind stops at once (SIGINT as ``KeyboardInterrupt``, the others
with the signal's default action), keeping the last intact checkpoint.

The request is process-wide (signals are): :func:`stop_requested` is what the trainer reads.
Under ``torchrun`` the ranks agree on it once per iteration (:func:`stop_agreed`), so that every
rank stops at the same iteration; a rollout is then not cut short.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from milegpo.algos.distributed import World

#: the signals that request a stop (SIGUSR1: SLURM's ``--signal`` pre-emption notice)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT) + ((signal.SIGUSR1,) if hasattr(signal, "SIGUSR1") else ())

_requested: signal.Signals | None = None


class RunStopped(Exception):
    """A run stopped on a signal at a safe point; the message says what was saved and how to continue.

    :param signum: the signal that asked for the stop (the process's exit code is :func:`exit_code`).
    """

    def __init__(self, message: str, signum: signal.Signals):
        super().__init__(message)
        self.signum = signum


def stop_requested() -> signal.Signals | None:
    """The signal that requested a stop (None: none was received)."""
    return _requested


def request_stop(signum: signal.Signals) -> None:
    """Request a stop as if ``signum`` had been received (the handler's action; tests and embedders)."""
    global _requested
    _requested = signal.Signals(signum)


def clear() -> None:
    """Forget a stop request (a new run in the same process starts without one)."""
    global _requested
    _requested = None


def exit_code(signum: signal.Signals) -> int:
    """The shell's code for a process ended by ``signum``: 128 + its number (SIGTERM 143, SIGINT 130)."""
    return 128 + int(signum)


def _handle(signum: int, frame: FrameType | None) -> None:
    received = signal.Signals(signum)
    if _requested is not None:  # asked twice: stop now
        if received == signal.SIGINT:
            raise KeyboardInterrupt
        signal.signal(received, signal.SIG_DFL)
        os.kill(os.getpid(), received)
        return
    request_stop(received)
    print(f"\nreceived {received.name}: stopping at the next safe point and saving a checkpoint "
          f"(send {received.name} again to stop at once)", file=sys.stderr, flush=True)


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Within the block, SIGTERM / SIGINT / SIGUSR1 request a clean stop instead of killing the
    process; the previous handlers come back after it. Outside the main thread (where Python
    cannot set handlers) it does nothing."""
    clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _handle) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stop_agreed(world: World) -> bool:
    """Whether to stop now: this process's request, or under torchrun any rank's (a collective:
    every rank must call it at the same point)."""
    from milegpo.algos import distributed

    mine = 1.0 if _requested is not None else 0.0
    if not world.distributed:
        return bool(mine)
    return distributed.all_reduce_sum([mine], world)[0] > 0
