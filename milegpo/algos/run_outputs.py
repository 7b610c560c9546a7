"""What an iteration writes to the logger's folder beside its log row.

``credit_diagnostics.jsonl`` (one row per iteration: the credit method's full diagnostics,
milestone and trap lists included) and ``last_batch.npz`` (the iteration's StepBatch,
overwritten) are written only when the logger writes files to a folder (csv, json, log
or tensorboard), so a model trained with SB3's default stdout logger leaves no files.
"""

from __future__ import annotations

import json
import os
from typing import Any

from milegpo.algos.checkpoint import to_builtin
from milegpo.credit.batch import CreditResult, StepBatch, save_step_batch
from milegpo.run_folder import CREDIT_DIAGNOSTICS_FILE, LAST_BATCH_FILE


def writes_files(logger: Any) -> bool:
    """Whether the SB3 logger has a folder and writes files into it."""
    return bool(logger.get_dir()) and any(getattr(f, "own_file", True) for f in logger.output_formats)


def append_credit_diagnostics(folder: str, row: dict[str, Any]) -> None:
    """Append one iteration's row (numpy values made plain) to ``credit_diagnostics.jsonl``."""
    with open(os.path.join(folder, CREDIT_DIAGNOSTICS_FILE), "a") as f:
        f.write(json.dumps(row, default=to_builtin) + "\n")


def write_credit_outputs(logger: Any, credit: CreditResult, batch: StepBatch | None, meta: dict[str, Any],
                         success_rate: float) -> None:
    """Append the iteration's diagnostics row and overwrite ``last_batch.npz`` (when the logger
    writes files); ``meta`` (iteration, num_timesteps, method) goes into both."""
    if not writes_files(logger):
        return
    append_credit_diagnostics(logger.get_dir(), {**meta, "success_rate": success_rate,
                                                 "diagnostics": credit.diagnostics})
    if batch is not None:
        save_step_batch(batch, os.path.join(logger.get_dir(), LAST_BATCH_FILE), meta)
