"""The logs of a run folder, kept whole across kills and resumes.

A run writes one row per iteration to ``progress.csv`` and TensorBoard (SB3's
logger), and one JSON line per iteration to ``credit_diagnostics.jsonl`` and
``eval.jsonl`` (and keeps the last iteration's batch in ``last_batch.npz``, some iterations' in
``batches/``). A run killed at any moment resumes from its last checkpoint,
which holds iteration ``N``; everything logged after ``N`` was lost with the
weights and will be logged again. So before a resumed run writes anything,
:func:`rollback_logs` cuts every log back to iterations ``<= N`` (a half-written
last line included) and drops the TensorBoard events logged after the checkpoint's env
step from the event files, and :func:`configure_run_logger` appends to ``progress.csv``
instead of truncating it. After any number of kill/resume cycles each iteration is logged
exactly once, in order, in every file.
"""

from __future__ import annotations

import csv
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from stable_baselines3.common.logger import CSVOutputFormat, KVWriter, Logger, TensorBoardOutputFormat

from milegpo.algos.console import console_format
from milegpo.credit.batch import load_step_batch
from milegpo.run_folder import (
    BASE_MODEL_DIR,
    CONFIG_FILE,
    JSONL_LOGS,
    KEPT_BATCHES_DIR,
    LAST_BATCH_FILE,
    LOCK_FILE,
    PREVIOUS_PREFIX,
    PROGRESS_FILE,
    kept_batch_iteration,
    write_atomic,
)

#: the progress.csv column holding the iteration (0: the untrained policy's evaluation)
ITERATION_KEY = "time/iterations"
#: SB3's TensorBoard writer puts its event files in the run folder under this pattern
TENSORBOARD_EVENTS = "events.out.tfevents.*"


class AppendingCSVOutputFormat(CSVOutputFormat):
    """SB3's CSV writer, continuing an existing ``progress.csv`` instead of truncating it."""

    def __init__(self, filename: str | os.PathLike):  # not super().__init__: it would truncate the file
        Path(filename).touch()
        self.file = open(filename, "r+")
        header = self.file.readline()
        self.keys: list[str] = next(csv.reader([header])) if header.strip() else []
        self.file.seek(0, os.SEEK_END)
        self.separator = ","
        self.quotechar = '"'

    def write(self, key_values: dict[str, Any], key_excluded: dict[str, Any], step: int = 0) -> None:
        try:
            super().write(key_values, key_excluded, step)
        except OSError as exc:  # name the file: "no space left on device" alone does not say where
            raise OSError(exc.errno, exc.strerror, self.file.name) from exc


def configure_run_logger(run_dir: str | os.PathLike, verbose: int = 1, trackers: Sequence[str] = ("tensorboard",),
                         config: Mapping[str, Any] | None = None) -> Logger:
    """SB3 logger of a run folder: the console (``verbose`` 1: a line per iteration, 2: SB3's full
    table, 0: nothing), ``progress.csv`` (appended, always) and the ``trackers`` (checked names, as a
    run's plan holds them: TensorBoard in the run folder, W&B, MLflow: :mod:`milegpo.run.tracking`).

    :param config: the run's config, logged as the tracker run's config / params.
    """
    from milegpo.run.tracking import tracker_formats

    folder = str(run_dir)
    os.makedirs(folder, exist_ok=True)
    formats: list[KVWriter] = [AppendingCSVOutputFormat(os.path.join(folder, PROGRESS_FILE))]
    if "tensorboard" in trackers:
        formats.append(TensorBoardOutputFormat(folder))
    formats += tracker_formats(trackers, folder, config or {})
    console = console_format(verbose)
    if console is not None:
        formats.insert(0, console)
    return Logger(folder=folder, output_formats=formats)


def rollback_logs(run_dir: str | os.PathLike, iteration: int, last_step: int = -1) -> dict[str, int]:
    """Drop every log row of an iteration after ``iteration`` (and any partial line), and every
    TensorBoard event of an env step after ``last_step`` (the checkpoint's ``num_timesteps``; -1
    when starting over).

    Each file is rewritten atomically (temporary file + rename). Returns the
    number of rows (events) dropped per file.
    """
    run_dir = Path(run_dir)
    dropped = {}
    progress = run_dir / PROGRESS_FILE
    if progress.exists():
        dropped[PROGRESS_FILE] = _rollback_csv(progress, iteration)
    for name in JSONL_LOGS:
        path = run_dir / name
        if path.exists():
            dropped[name] = _rollback_jsonl(path, iteration)
    for path in sorted(run_dir.glob(TENSORBOARD_EVENTS)):
        dropped[path.name] = _rollback_events(path, last_step)
    last_batch = run_dir / LAST_BATCH_FILE
    if last_batch.exists() and _batch_iteration(last_batch) > iteration:
        last_batch.unlink()
        dropped[LAST_BATCH_FILE] = 1
    kept = run_dir / KEPT_BATCHES_DIR
    if kept.is_dir():  # kept batches after the checkpoint, and the temporary file of a copy a kill cut short
        later = [path for path in kept.iterdir()
                 if (kept_batch_iteration(path.name) or 0) > iteration or ".tmp-" in path.name]
        for path in later:
            path.unlink()
        if later:
            dropped[KEPT_BATCHES_DIR] = len(later)
    return dropped


def run_contents(run_dir: str | os.PathLike) -> list[str]:
    """What a run folder holds beyond its config and base model, one short description each
    (``progress.csv (12 rows)``, ``checkpoints/corrupt-checkpoint_8_steps``...): what starting the
    run over would lose. Empty files and folders, and earlier restarts' folders, are not counted."""
    run_dir = Path(run_dir)
    found = []
    for path in sorted(run_dir.iterdir(), key=lambda p: (p.name != PROGRESS_FILE, p.name)) if run_dir.is_dir() else []:
        if path.name in (CONFIG_FILE, BASE_MODEL_DIR) or path.name.startswith((PREVIOUS_PREFIX, ".")):
            continue
        if path.is_dir():
            found += [f"{path.name}/{child.name}" for child in sorted(path.iterdir())]
        elif path.stat().st_size:
            rows = path.read_text().count("\n") - 1 if path.name == PROGRESS_FILE else None
            found.append(f"{path.name} ({rows} rows)" if rows is not None else path.name)
    return found


def move_logs_aside(run_dir: str | os.PathLike) -> Path:
    """Move everything of a run folder but its config and base model into a new folder
    ``previous-<time>/`` inside it (nothing is deleted); returns that folder."""
    run_dir = Path(run_dir)
    aside = run_dir / f"{PREVIOUS_PREFIX}{time.strftime('%Y%m%d-%H%M%S')}"
    suffix = 1
    while aside.exists():
        suffix += 1
        aside = aside.with_name(f"{PREVIOUS_PREFIX}{time.strftime('%Y%m%d-%H%M%S')}-{suffix}")
    aside.mkdir()
    for path in sorted(run_dir.iterdir()):
        if path.name not in (CONFIG_FILE, BASE_MODEL_DIR, LOCK_FILE) and not path.name.startswith(PREVIOUS_PREFIX):
            os.replace(path, aside / path.name)
    return aside


def _batch_iteration(path: Path) -> float:
    """The iteration of a saved last batch (infinite when unreadable: it is dropped)."""
    try:
        return float(load_step_batch(path)[1].get("iteration", float("inf")))
    except ValueError:
        return float("inf")


def _rollback_csv(path: Path, iteration: int) -> int:
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):  # killed while writing a row
        lines.pop()
    if not lines:
        write_atomic(path, "")
        return 0
    header = next(csv.reader([lines[0]]))
    kept, dropped = [lines[0]], 0
    for line in lines[1:]:
        row = next(csv.reader([line]), [])
        values = dict(zip(header, row))
        row_iteration = _as_int(values.get(ITERATION_KEY))
        if len(row) == len(header) and row_iteration is not None and row_iteration <= iteration:
            kept.append(line)
        else:
            dropped += 1
    write_atomic(path, "".join(kept))
    return dropped


def _rollback_jsonl(path: Path, iteration: int) -> int:
    kept, dropped = [], 0
    for line in path.read_text().splitlines(keepends=True):
        try:
            row = json.loads(line) if line.endswith("\n") else None
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict) and isinstance(row.get("iteration"), int) and row["iteration"] <= iteration:
            kept.append(line)
        else:
            dropped += 1
    write_atomic(path, "".join(kept))
    return dropped


def _rollback_events(path: Path, last_step: int) -> int:
    """Rewrite a TensorBoard event file without the summaries of steps after ``last_step``
    (records are copied byte for byte; one cut short by a kill ends the file and is dropped)."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    records = list(RawEventFileLoader(str(path)).Load())
    kept = []
    for record in records:
        event = Event.FromString(record)
        if event.WhichOneof("what") != "summary" or event.step <= last_step:
            kept.append(record)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        writer = RecordWriter(f)
        for record in kept:
            writer.write(record)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return len(records) - len(kept)


def _as_int(value: str | None) -> int | None:
    try:
        return int(float(value)) if value not in (None, "") else None
    except ValueError:
        return None

