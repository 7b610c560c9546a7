"""The run-folder files a report reads, and nothing else: the kept batches, the learning curve
(``progress.csv``), the credit diagnostics of each iteration and the run's credit config."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from milegpo.credit import CreditConfig, StepBatch, make_credit_config
from milegpo.credit.batch import load_step_batch
from milegpo.run_folder import (
    CONFIG_FILE,
    CREDIT_DIAGNOSTICS_FILE,
    KEPT_BATCHES_DIR,
    LAST_BATCH_FILE,
    PROGRESS_FILE,
    kept_batch_iteration,
)

#: the progress.csv columns of the learning curve
ITERATION_COLUMN = "time/iterations"
STEPS_COLUMN = "time/total_timesteps"
TRAIN_SUCCESS_COLUMN = "rollout/success_rate"


@dataclass
class KeptBatch:
    """One iteration's StepBatch as the run kept it.

    :param iteration: the iteration (1 = the first update's rollout).
    :param path: the file it was read from.
    :param batch: the steps.
    :param meta: what the run wrote beside them (iteration, num_timesteps, method; newer runs also the
        credit config and the observations behind the states).
    """

    iteration: int
    path: Path
    batch: StepBatch
    meta: dict[str, Any]


def check_run_dir(run_dir: Path) -> None:
    """Raise ``FileNotFoundError`` naming the folder when it is not a run folder."""
    if not (run_dir / CONFIG_FILE).is_file() and not (run_dir / LAST_BATCH_FILE).is_file():
        raise FileNotFoundError(f"{str(run_dir)!r} is not a run folder (no {CONFIG_FILE}, no {LAST_BATCH_FILE}); "
                                "pass the folder `milegpo train` wrote")


def kept_iterations(run_dir: Path) -> dict[int, Path]:
    """The kept batch files by iteration: ``batches/iteration_<N>.npz``, and ``last_batch.npz`` for its
    iteration when no kept file has it (a run from before kept batches has only that one)."""
    found: dict[int, Path] = {}
    folder = run_dir / KEPT_BATCHES_DIR
    if folder.is_dir():
        for path in sorted(folder.iterdir()):
            iteration = kept_batch_iteration(path.name)
            if iteration is not None:
                found[iteration] = path
    last = run_dir / LAST_BATCH_FILE
    if last.is_file():
        iteration = int(load_step_batch(last)[1].get("iteration", -1))
        if iteration not in found:
            found[iteration] = last
    return dict(sorted(found.items()))


def load_kept(iteration: int, path: Path) -> KeptBatch:
    """Read one kept batch (``ValueError`` naming the file when it is corrupt)."""
    batch, meta = load_step_batch(path)
    return KeptBatch(iteration=iteration, path=path, batch=batch, meta=meta)


def run_config(run_dir: Path) -> dict[str, Any]:
    """The run's ``config.json`` as plain values (empty when the folder has none)."""
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        return {}
    try:
        values = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{str(path)!r} is not valid JSON ({error}): the run folder is damaged") from None
    return values if isinstance(values, dict) else {}


def credit_config_of(kept: KeptBatch, config: dict[str, Any]) -> tuple[str, CreditConfig, str]:
    """The credit method and config an iteration was computed with, and where they were found.

    Newer runs write them into each batch's meta (exact even when a resumed run changed its settings
    later); for older runs they are rebuilt from ``config.json`` as the trainer builds them
    (:meth:`milegpo.config.AlgoConfig.credit_config`)."""
    method = str(kept.meta.get("method") or config.get("algo", {}).get("method", "milegpo"))
    if isinstance(kept.meta.get("credit_config"), dict):
        return method, make_credit_config(method, **kept.meta["credit_config"]), "the kept batch"
    algo = config.get("algo")
    if isinstance(algo, dict) and algo.get("method", method) == method:
        from milegpo.config import AlgoConfig
        from milegpo.config.fields import from_dict

        try:
            return method, from_dict(AlgoConfig, {**algo, "method": method}).credit_config(), CONFIG_FILE
        except ValueError as error:
            raise ValueError(f"cannot rebuild iteration {kept.iteration}'s credit config from the run's {CONFIG_FILE} "
                             f"(its algo section: {error})") from None
    return method, make_credit_config(method), "the method's defaults (the run's config was not found)"


def credit_diagnostics(run_dir: Path) -> dict[int, dict[str, Any]]:
    """``credit_diagnostics.jsonl``'s rows by iteration (a line a kill cut short is skipped)."""
    path = run_dir / CREDIT_DIAGNOSTICS_FILE
    rows: dict[int, dict[str, Any]] = {}
    if not path.is_file():
        return rows
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("iteration"), int):
            rows[row["iteration"]] = row
    return rows


def learning_curve(run_dir: Path, eval_splits: list[str]) -> dict[str, Any]:
    """The training and held-out success per iteration from ``progress.csv``: ``iterations``,
    ``steps``, ``train`` and ``eval`` (per split), a value or None where the row has none."""
    path = run_dir / PROGRESS_FILE
    curve: dict[str, Any] = {"iterations": [], "steps": [], "train": [], "eval": {}}
    if not path.is_file() or not path.stat().st_size:
        return curve
    with open(path, newline="") as f:
        rows = [row for row in csv.DictReader(f) if _number(row.get(ITERATION_COLUMN)) is not None]
    columns = rows[0].keys() if rows else []
    splits = [s for s in eval_splits if f"eval/{s}/success_rate" in columns]
    splits += sorted({c.split("/")[1] for c in columns if c.startswith("eval/") and c.endswith("/success_rate")}
                     - set(splits))
    for row in rows:
        curve["iterations"].append(int(_number(row[ITERATION_COLUMN]) or 0))
        curve["steps"].append(_number(row.get(STEPS_COLUMN)))
        curve["train"].append(_number(row.get(TRAIN_SUCCESS_COLUMN)))
        for split in splits:
            curve["eval"].setdefault(split, []).append(_number(row.get(f"eval/{split}/success_rate")))
    return curve


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text not in (None, "") else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None
