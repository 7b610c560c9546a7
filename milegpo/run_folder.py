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
      eval.jsonl               EVAL_CURVE_FILE: held-out success during training
      checkpoints/             CHECKPOINTS_DIR: periodic checkpoints (a killed run resumes from the last)
      final/                   FINAL_DIR: the final checkpoint
      eval_final.json          EVAL_FINAL_FILE: held-out success per eval split at the end
      env_errors.log           ENV_ERRORS_FILE: full tracebacks of env failures
      trackers.json            TRACKERS_FILE: W&B / MLflow run ids (a resume continues them)
      learning_curve.png  credit_diagnostics.png  trajectory_credit.png
"""

from __future__ import annotations

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

#: the JSON-lines logs with an ``iteration`` field per row (cut back on resume)
JSONL_LOGS = (EVAL_CURVE_FILE, CREDIT_DIAGNOSTICS_FILE)
