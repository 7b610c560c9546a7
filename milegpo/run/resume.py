"""A run folder as a run starts in it: a new run's folder checked, a resumed run's checkpoint found.

A new run writes only into a new or empty folder; a resumed one continues from its newest intact
checkpoint (a corrupt one is moved aside), or starts over only when the folder holds nothing to
lose (or ``--restart`` moved it aside). One process writes a run folder at a time (its lock).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from milegpo.run_folder import CHECKPOINTS_DIR, CONFIG_FILE, LOCK_FILE

if TYPE_CHECKING:
    from milegpo.algos.distributed import World
    from milegpo.run.lock import RunFolderLock


class RunFolderError(ValueError):
    """A run folder that training would overwrite or wipe: the message names what is there and the choices."""


def check_new_run_dir(run_dir: Path) -> None:
    """A new run writes only into a new or empty folder: never over another run or a user's files."""
    if not run_dir.exists() or (run_dir.is_dir() and all(child.name == LOCK_FILE for child in run_dir.iterdir())):
        return
    if (run_dir / CONFIG_FILE).exists():
        raise RunFolderError(f"{str(run_dir)!r} is already a run folder: continue it with --resume {run_dir}, "
                             "or choose another --run-dir")
    what = "a file" if not run_dir.is_dir() else "not empty and no run folder"
    raise RunFolderError(f"--run-dir {str(run_dir)!r} is {what}: choose a new or empty folder")


def lock_run_dir(run_dir: Path, world: World, new_run: bool) -> RunFolderLock | None:
    """Rank 0 takes the run folder's writer lock (:mod:`milegpo.run.lock`) and, for a new run, checks the
    folder again under it (another process may have started a run there meanwhile); every rank raises
    what rank 0 found. Returns the held lock (None on the other ranks)."""
    from milegpo.algos import distributed
    from milegpo.run.lock import RunFolderBusyError, RunFolderLock

    lock: RunFolderLock | None = None
    refusal: RunFolderBusyError | RunFolderError | None = None
    if world.is_main:
        try:
            lock = RunFolderLock(run_dir).acquire()
            if new_run:
                check_new_run_dir(run_dir)
        except (RunFolderBusyError, RunFolderError) as exc:
            if lock is not None:
                lock.release()
            refusal = exc
    refusal = distributed.broadcast_from_main(refusal, world)  # the refusal itself: every rank raises the same
    if refusal is not None:
        raise refusal
    return lock


def remove_stale_saves(run_dir: Path, verbose: int) -> None:
    """Delete the temporary folders of checkpoint saves a kill interrupted (run folder and checkpoints/)."""
    from milegpo.algos.checkpoint import remove_stale_saves as remove_in

    done = remove_in(run_dir) + remove_in(run_dir / CHECKPOINTS_DIR)
    if done and verbose:
        print(f"Cleaned up {len(done)} checkpoint save(s) a killed run left unfinished: " + "; ".join(done))


def latest_intact(folder: Path) -> str | None:
    """The newest checkpoint of ``folder`` that reads back intact; a corrupt one is moved aside
    to ``corrupt-<name>`` with a warning and the next older one tried. None when there is none."""
    from milegpo.algos.checkpoint import CheckpointError, checkpoints, read_config

    for path in checkpoints(folder):
        try:
            read_config(path)  # complete, and every file as written (its manifest)
        except CheckpointError as exc:
            aside = path.with_name(f"corrupt-{path.name}")
            os.replace(path, aside)
            print(f"warning: {exc}. Moved it to {aside}; trying the next older checkpoint", file=sys.stderr)
            continue
        return str(path)
    return None


def start_over(run_dir: Path, restart: bool, verbose: int) -> str | None:
    """A resume that found no intact checkpoint: start from scratch when the folder holds nothing to
    lose, or after ``restart`` moved its contents aside; else the refusal to raise (None: go on)."""
    from milegpo.run.logs import move_logs_aside, run_contents

    found = run_contents(run_dir)
    if found and not restart:
        shown = ", ".join(found[:6]) + (f" and {len(found) - 6} more" if len(found) > 6 else "")
        return (f"{run_dir} has no intact checkpoint to resume from (found {shown}); nothing was changed. "
                f"Train anew with --run-dir NEW_DIR, or start this run over with --resume {run_dir} --restart "
                f"(its logs and checkpoints move to {run_dir}/previous-<time>/, nothing is deleted)")
    if found:
        aside = move_logs_aside(run_dir)
        print(f"Restarting {run_dir} from scratch: its earlier logs and checkpoints are in {aside}")
    elif verbose:
        print(f"{run_dir} has no checkpoint and no logs yet: starting the run from the beginning")
    return None


def remove_untrained(run_dir: Path) -> None:
    """Remove a new run's folder that trained nothing (no checkpoint): no stray folder is left behind."""
    if not any((run_dir / CHECKPOINTS_DIR).glob("*")):
        shutil.rmtree(run_dir, ignore_errors=True)


def stopped_message(run_dir: Path, model: Any, saver: Any, signum: signal.Signals | None, created: bool) -> str:
    """The one line of a run stopped on a signal: what is saved and how to continue (a new run stopped
    before its first iteration ended is removed, as any new run that trained nothing)."""
    name = signum.name if signum is not None else "a stop request"
    where = f"iteration {model.iterations}, {model.num_timesteps} env steps"
    if saver is not None and saver.last_path is not None:
        return (f"stopped on {name} at {where}: checkpoint {saver.last_path}; continue with milegpo train --resume "
                f"{run_dir}")
    if model.iterations == 0 and created:
        return (f"stopped on {name} before the first iteration ended: nothing was trained, so the new run folder "
                f"{run_dir} is removed; run the same command again to start over")
    if model.iterations == 0:
        return (f"stopped on {name} before the first iteration ended: nothing trained to save; start the run over "
                f"with milegpo train --resume {run_dir} --restart")
    return f"stopped on {name} at {where}; continue with milegpo train --resume {run_dir}"
