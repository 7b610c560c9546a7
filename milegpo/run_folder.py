"""The names of everything in a run folder, in one place (torch-free, imports nothing of milegpo).

::

    RUN_DIR/
      config.json              CONFIG_FILE: the full TrainConfig (resume and eval read it)
      base_model/              BASE_MODEL_DIR: the offline tiny model, when no model was given
      warm_start.json          WARM_START_FILE: the supervised warm start's demonstrations and fit
      progress.csv             PROGRESS_FILE: SB3's per-iteration log (rollout/*, train/*, credit/*, eval/*)
      events.out.tfevents.*    the same numbers for TensorBoard
      credit_diagnostics.jsonl CREDIT_DIAGNOSTICS_FILE: milestones/traps of every update
      last_batch.npz           LAST_BATCH_FILE: the last iteration's StepBatch (trajectory_credit.png)
      batches/                 KEPT_BATCHES_DIR: the StepBatch of every run.keep_batch_every-th iteration and
                               of the last, iteration_<N>.npz (kept_batch_name; milegpo inspect reads them)
      eval.jsonl               EVAL_CURVE_FILE: held-out success during training
      checkpoints/             CHECKPOINTS_DIR: periodic checkpoints (a killed run resumes from the last)
      final/                   FINAL_DIR: the final checkpoint
      eval_final.json          EVAL_FINAL_FILE: held-out success per eval split at the end
      env_errors.log           ENV_ERRORS_FILE: full tracebacks of env failures
      trackers.json            TRACKERS_FILE: W&B / MLflow run ids (a resume continues them)
      learning_curve.png  credit_diagnostics.png  trajectory_credit.png
      report.html              INSPECT_REPORT_FILE: ``milegpo inspect``'s interactive report (default output)
      previous-<time>/         PREVIOUS_PREFIX: the logs of a run restarted with --resume RUN --restart
      .milegpo.lock            LOCK_FILE: the writer lock (who trains the folder now; milegpo.run.lock)

Paths inside the run folder are resolved against the folder itself, never against the working
directory: a run folder can be moved or copied and used from anywhere.

The columns of ``progress.csv`` (also the TensorBoard / W&B / MLflow scalars), one row per
iteration:

* ``rollout/`` success_rate, ep_rew_mean, ep_len_mean, score_mean, invalid_action_rate,
  env_errors, episodes; with a vLLM sampler sampler_logprob_gap_max / _mean_step (the largest
  gap between the sampler's and the trainer's behaviour log-probs of a step's tokens); with
  ``algo.max_staleness=1`` policy_lag (updates between the weights that sampled the rollout and
  those it trains);
* ``train/`` loss, pg_loss, kl (with ``kl_coef``), entropy (with ``ent_coef``), clip_fraction,
  approx_kl, grad_norm (before clipping), skipped_steps (non-finite loss or gradient),
  learning_rate, n_updates;
* ``time/`` rollout_s, credit_s, update_s, env_steps_per_s (env steps over the rollout's wall
  time, policy included), rollout_tokens_per_s (prompt + action or candidate tokens over the
  policy's time), action_tokens_per_s, update_tokens_per_s (tokens of the trained steps over
  the update's wall time);
* ``credit/`` every scalar of the credit method's diagnostics (the full diagnostics, milestone
  and trap lists included, go to ``credit_diagnostics.jsonl``: :mod:`milegpo.algos.run_outputs`);
* ``eval/<split>/`` success_rate, mean_return, mean_length, mean_score of every held-out split, in the
  iterations with an evaluation (the first split is also the learning curve, ``eval.jsonl``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

CONFIG_FILE = "config.json"
BASE_MODEL_DIR = "base_model"
WARM_START_FILE = "warm_start.json"
PROGRESS_FILE = "progress.csv"
CREDIT_DIAGNOSTICS_FILE = "credit_diagnostics.jsonl"
LAST_BATCH_FILE = "last_batch.npz"
EVAL_CURVE_FILE = "eval.jsonl"
CHECKPOINTS_DIR = "checkpoints"
FINAL_DIR = "final"
EVAL_FINAL_FILE = "eval_final.json"
ENV_ERRORS_FILE = "env_errors.log"
TRACKERS_FILE = "trackers.json"
LEARNING_CURVE_PNG = "learning_curve.png"
CREDIT_DIAGNOSTICS_PNG = "credit_diagnostics.png"
TRAJECTORY_CREDIT_PNG = "trajectory_credit.png"
KEPT_BATCHES_DIR = "batches"
INSPECT_REPORT_FILE = "report.html"

#: written by ``milegpo export`` into its output: the mark of a folder ``export --overwrite`` may replace
EXPORT_MARKER = "milegpo_export.json"

#: the exclusive writer lock of a run folder (:mod:`milegpo.run.lock`); never moved, counted or exported
LOCK_FILE = ".milegpo.lock"

#: ``milegpo train --resume RUN --restart`` moves the old logs into ``RUN/previous-<time>/``
PREVIOUS_PREFIX = "previous-"

#: the JSON-lines logs with an ``iteration`` field per row (cut back on resume)
JSONL_LOGS = (EVAL_CURVE_FILE, CREDIT_DIAGNOSTICS_FILE)


def kept_batch_name(iteration: int) -> str:
    """The file name of iteration ``iteration``'s kept batch in :data:`KEPT_BATCHES_DIR`."""
    return f"iteration_{iteration:06d}.npz"


def kept_batch_iteration(name: str) -> int | None:
    """The iteration a :func:`kept_batch_name` names (None for any other name: a temporary file)."""
    match = re.fullmatch(r"iteration_(\d+)\.npz", name)
    return int(match.group(1)) if match else None


def inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` lies strictly inside ``folder`` (both taken as absolute, symlinks resolved)."""
    path, folder = path.resolve(), folder.resolve()
    return path != folder and folder in path.parents


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary sibling renamed over it: a reader (``milegpo eval``,
    ``export``, a plot) sees the old file or the new one, never half of it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
