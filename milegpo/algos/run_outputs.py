"""What an iteration writes to the logger's folder beside its log row.

``credit_diagnostics.jsonl`` (one row per iteration: the credit method's full diagnostics,
milestone and trap lists included) and ``last_batch.npz`` (the iteration's StepBatch,
overwritten) are written only when the logger writes files to a folder (csv, json, log
or tensorboard), so a model trained with SB3's default stdout logger leaves no files.

``last_batch.npz``'s meta also holds the credit config the iteration used and, in a
one-process run, the observation behind every state (``milegpo inspect`` shows them);
:class:`KeptBatchCallback` copies it to ``batches/iteration_<N>.npz`` every
``run.keep_batch_every``-th iteration and at the end (:mod:`milegpo.inspect` reads them).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from milegpo.algos.callbacks import IterationCallback
from milegpo.algos.checkpoint import to_builtin
from milegpo.credit.base import CreditConfig
from milegpo.credit.batch import CreditResult, StepBatch, load_step_batch, save_step_batch
from milegpo.run_folder import CREDIT_DIAGNOSTICS_FILE, KEPT_BATCHES_DIR, LAST_BATCH_FILE, kept_batch_name


def writes_files(logger: Any) -> bool:
    """Whether the SB3 logger has a folder and writes files into it."""
    return bool(logger.get_dir()) and any(getattr(f, "own_file", True) for f in logger.output_formats)


def append_credit_diagnostics(folder: str, row: dict[str, Any]) -> None:
    """Append one iteration's row (numpy values made plain) to ``credit_diagnostics.jsonl``."""
    with open(os.path.join(folder, CREDIT_DIAGNOSTICS_FILE), "a") as f:
        f.write(json.dumps(row, default=to_builtin) + "\n")


def observation_table(observations: Sequence[str], next_observations: Sequence[str]) -> dict[str, Any]:
    """The observations of a batch's rows as a table of distinct texts and two columns of indices into
    it (``state``: the observation of ``s_t``, ``next_state``: of ``s_{t+1}``): the text of a state is
    written once, however many steps see it."""
    texts: dict[str, int] = {}
    state = [texts.setdefault(text, len(texts)) for text in observations]
    next_state = [texts.setdefault(text, len(texts)) for text in next_observations]
    return {"texts": list(texts), "state": state, "next_state": next_state}


def write_credit_outputs(logger: Any, credit: CreditResult, batch: StepBatch | None, meta: dict[str, Any],
                         success_rate: float, credit_config: CreditConfig | None = None,
                         observations: tuple[Sequence[str], Sequence[str]] | None = None) -> None:
    """Append the iteration's diagnostics row and overwrite ``last_batch.npz`` (when the logger
    writes files); ``meta`` (iteration, num_timesteps, method) goes into both.

    :param credit_config: the config the credit was computed with, kept in the batch's meta (a
        report recomputes the iteration's advantages from it).
    :param observations: the observation and next observation of each of ``batch``'s rows, kept in
        the batch's meta as :func:`observation_table` (None: not kept).
    """
    if not writes_files(logger):
        return
    append_credit_diagnostics(logger.get_dir(), {**meta, "success_rate": success_rate,
                                                 "diagnostics": credit.diagnostics})
    if batch is not None:
        batch_meta = dict(meta)
        if credit_config is not None:
            batch_meta["credit_config"] = dataclasses.asdict(credit_config)
        if observations is not None and len(observations[0]) == batch.num_steps:
            batch_meta["observations"] = observation_table(*observations)
        save_step_batch(batch, os.path.join(logger.get_dir(), LAST_BATCH_FILE), batch_meta)


def keep_batch(run_dir: str | os.PathLike, iteration: int) -> Path | None:
    """Copy ``last_batch.npz`` to ``batches/iteration_<N>.npz`` when it is iteration ``iteration``'s
    (through a temporary file renamed over the target: a reader never sees half of it). Returns the
    kept file, or None when the last batch is another iteration's (one that had no steps)."""
    source = Path(run_dir) / LAST_BATCH_FILE
    try:
        written = load_step_batch(source)[1].get("iteration")
    except ValueError:
        return None
    if written != iteration:
        return None
    folder = Path(run_dir) / KEPT_BATCHES_DIR
    folder.mkdir(exist_ok=True)
    target = folder / kept_batch_name(iteration)
    tmp = folder / f".{target.name}.tmp-{os.getpid()}"
    try:
        shutil.copyfile(source, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    return target


class KeptBatchCallback(IterationCallback):
    """Keep the StepBatch of every ``every``-th iteration and of the last one in ``run_dir/batches/``.

    Put it before the checkpoint callback: a checkpoint of iteration ``N`` then never exists without
    iteration ``N``'s kept batch, so a run killed in between and resumed keeps the same files as one
    never interrupted (the resume drops the kept batches after its checkpoint:
    :func:`milegpo.run.logs.rollback_logs`).
    """

    def __init__(self, every: int, run_dir: str | os.PathLike, verbose: int = 0):
        super().__init__(every, verbose)
        self.run_dir = Path(run_dir)

    def _on_iteration(self) -> None:
        keep_batch(self.run_dir, self.algorithm.iterations)
