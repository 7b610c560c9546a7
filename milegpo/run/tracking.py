"""Experiment trackers (Weights & Biases, MLflow) as SB3 logger output formats.

``milegpo train run.report_to=[tensorboard,wandb,mlflow]`` adds one writer per tracker to the
run's SB3 logger, beside ``progress.csv`` (always written, the record a resume restores):
every log row (rollout, credit diagnostics, update and ``eval/*`` values) goes to each
tracker at its env step, the run's :class:`~milegpo.config.run.TrainConfig` is the tracker
run's config / params, and at the end the held-out results become summary metrics and
the plots artifacts.

Where the data goes is the trackers' own business, set as usual by environment variables:
``WANDB_PROJECT`` (default ``milegpo``), ``WANDB_MODE=offline``, ``WANDB_DIR`` (default: the
run folder); ``MLFLOW_TRACKING_URI`` (default: MLflow's, ``sqlite:///mlflow.db`` in the working
directory, which the ``tracking`` extra's SQLAlchemy serves; the store is checked before the run
starts), ``MLFLOW_EXPERIMENT_NAME`` (default ``milegpo``). A resumed run continues the same tracker
run (the ids are kept in
``trackers.json`` of the run folder). Rows the killed session logged after its last
checkpoint stay in the tracker: W&B ignores the re-logged rows of steps it has seen,
MLflow keeps both; ``progress.csv`` holds each iteration exactly once.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from stable_baselines3.common.logger import KVWriter

from milegpo.run_folder import TRACKERS_FILE


def _numbers(key_values: Mapping[str, Any], key_excluded: Mapping[str, Any], name: str) -> dict[str, float]:
    out = {}
    for key, value in key_values.items():
        excluded = key_excluded.get(key) or ()
        if name in excluded or isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            continue
        if np.isfinite(value):
            out[key] = float(value)
    return out


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    flat = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = json.dumps(value) if isinstance(value, (list, tuple)) else str(value)
    return flat


def _ids(run_dir: Path) -> dict[str, str]:
    path = run_dir / TRACKERS_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def _save_id(run_dir: Path, tracker: str, run_id: str) -> None:
    ids = {**_ids(run_dir), tracker: run_id}
    (run_dir / TRACKERS_FILE).write_text(json.dumps(ids, indent=2) + "\n")


def _require(module: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"run.report_to {extra} needs the {module} package: pip install 'milegpo[tracking]' "
                          f"(or pip install {module if module != 'mlflow' else 'mlflow-skinny'})") from None


#: seconds the MLflow store check waits for a tracking server before the run stops
STORE_CHECK_TIMEOUT_S = 5


def check_available(report_to: list[str]) -> None:
    """Before a run starts: ``ImportError`` with the install line when a tracker's package is
    missing, ``ValueError`` when MLflow's tracking store does not answer (one line, what to set)."""
    for name, module in (("wandb", "wandb"), ("mlflow", "mlflow")):
        if name in report_to:
            _require(module, name)
    if "mlflow" in report_to:
        _check_mlflow_store()


def _check_mlflow_store() -> None:
    """Open MLflow's tracking store once (``MLFLOW_TRACKING_URI``, else MLflow's default ``sqlite:///mlflow.db``
    in the working directory, which needs SQLAlchemy: the ``tracking`` extra installs it)."""
    import mlflow

    uri = mlflow.get_tracking_uri()
    # one quick try (MLflow's own settings; the user's values win): a dead server is reported in seconds,
    # not after MLflow's default 7 retries with back-off (minutes)
    quick = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": str(STORE_CHECK_TIMEOUT_S)}
    saved = {name: os.environ.get(name) for name in quick}
    os.environ.update({name: value for name, value in quick.items() if saved[name] is None})
    try:
        mlflow.tracking.MlflowClient().search_experiments(max_results=1)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"run.report_to mlflow: the MLflow tracking store {uri!r} does not work ({first}). Set "
                         "MLFLOW_TRACKING_URI to a store that does (e.g. sqlite:///mlflow.db with SQLAlchemy "
                         "installed: pip install 'milegpo[tracking]', or http://host:5000)") from None
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)


class WandbOutputFormat(KVWriter):
    """Each log row to a W&B run (``wandb.log`` at the row's env step)."""

    def __init__(self, run_dir: str | os.PathLike, config: Mapping[str, Any]):
        wandb = _require("wandb", "wandb")
        run_dir = Path(run_dir)
        run_id = _ids(run_dir).get("wandb") or uuid.uuid4().hex[:8]
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "milegpo"), name=run_dir.name, id=run_id,
                              resume="allow", dir=os.environ.get("WANDB_DIR", str(run_dir)), config=dict(config))
        _save_id(run_dir, "wandb", run_id)

    def write(self, key_values: dict[str, Any], key_excluded: dict[str, Any], step: int = 0) -> None:
        values = _numbers(key_values, key_excluded, "wandb")
        if values:
            self.run.log(values, step=int(step))

    def finish(self, summary: Mapping[str, float], files: list[Path]) -> None:
        import wandb

        self.run.summary.update(dict(summary))
        images = {f"plots/{f.stem}": wandb.Image(str(f)) for f in files if f.suffix == ".png" and f.exists()}
        if images:
            self.run.log(images)

    def close(self) -> None:
        self.run.finish()


class MLflowOutputFormat(KVWriter):
    """Each log row to an MLflow run (metrics at the row's env step; the config as params)."""

    def __init__(self, run_dir: str | os.PathLike, config: Mapping[str, Any]):
        mlflow = _require("mlflow", "mlflow")
        run_dir = Path(run_dir)
        self.client = mlflow.tracking.MlflowClient()
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "milegpo")
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        run_id = _ids(run_dir).get("mlflow")
        if run_id is None:
            run_id = self.client.create_run(experiment_id, run_name=run_dir.name).info.run_id
            params = [mlflow.entities.Param(k, v[:6000]) for k, v in _flatten(config).items()]
            for start in range(0, len(params), 100):
                self.client.log_batch(run_id, params=params[start:start + 100])
            _save_id(run_dir, "mlflow", run_id)
        else:
            self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id
        self._metric = mlflow.entities.Metric

    def write(self, key_values: dict[str, Any], key_excluded: dict[str, Any], step: int = 0) -> None:
        now = int(time.time() * 1000)
        metrics = [self._metric(k, v, now, int(step)) for k, v in _numbers(key_values, key_excluded, "mlflow").items()]
        for start in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[start:start + 1000])

    def finish(self, summary: Mapping[str, float], files: list[Path]) -> None:
        self.write(dict(summary), {}, step=0)
        for file in files:
            if file.exists():
                self.client.log_artifact(self.run_id, str(file))

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def tracker_formats(trackers: Sequence[str], run_dir: str | os.PathLike, config: Mapping[str, Any]) -> list[KVWriter]:
    """The W&B / MLflow writers of ``trackers`` (checked names; TensorBoard is the run logger's own)."""
    writers: list[KVWriter] = []
    try:
        if "wandb" in trackers:
            writers.append(WandbOutputFormat(run_dir, config))
        if "mlflow" in trackers:
            writers.append(MLflowOutputFormat(run_dir, config))
    except BaseException:  # one tracker failed to start: close the ones already open (no dangling W&B run)
        for writer in writers:
            writer.close()
        raise
    return writers


def finish_trackers(logger: Any, results: Mapping[str, Mapping[str, Any]], files: list[Path]) -> None:
    """Held-out results as summary metrics (``final/<split>/<key>``) and the plots as artifacts,
    then close every tracker of ``logger``."""
    summary = {f"final/{split}/{key}": float(value) for split, result in results.items()
               for key, value in result.items() if isinstance(value, (int, float)) and not isinstance(value, bool)}
    for writer in getattr(logger, "output_formats", []):
        if hasattr(writer, "finish"):
            writer.finish(summary, files)
            writer.close()
