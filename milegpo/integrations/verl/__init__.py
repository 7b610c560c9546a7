"""MileGPO credit as an advantage estimator of verl-agent (verl's multi-turn agent fork).

verl-agent trains agents on a **step-level** batch: one row of its ``DataProto`` per
environment step. At advantage time the batch holds

====================================  ==================================================
``non_tensor_batch["uid"]``            the task group (all rollouts of one task share it)
``non_tensor_batch["traj_uid"]``       the trajectory
``non_tensor_batch["milegpo_step"]``   the step inside the trajectory (added by
                                       :func:`install` while rows are in rollout order)
``non_tensor_batch["milegpo_won"]``    the env's ``won`` for the trajectory (likewise)
``non_tensor_batch["anchor_obs"]``     the state the step was taken in (text, an image or
                                       vector array, ...: keyed by content, :func:`anchor_key`)
``non_tensor_batch["rewards"]``        the env reward of the step
``non_tensor_batch["is_action_valid"]``  whether the action parsed and was admissible
``non_tensor_batch["active_masks"]``   (optional) False for padding rows
``batch["response_mask"]``             (B, L) the reply's tokens
====================================  ==================================================

Run verl-agent's trainer with ``python -m milegpo.integrations.verl.main_ppo`` and
``algorithm.adv_estimator=milegpo`` (see :mod:`~milegpo.integrations.verl.settings` for the
config keys). Choices made here, each documented where it is made: row order and
duplicated rows (:mod:`~milegpo.integrations.verl.steps`); success from the env's ``won``,
else the reward rule; the invalid-action penalty is one more negative reward of the step (on
top of whatever the env paid for it), so it lowers the step's reward and the trajectory's
outcome, as in milegpo's own trainer; ``s_{t+1}`` of a failed trajectory's last step is a state of its own
unless rows carry ``next_anchor_obs``; episode statistics once per trajectory
(``upstream_exact=True`` restores verl-agent's row-weighted statistics, and for
``milegpo.gigpo`` its whole arithmetic: :mod:`~milegpo.integrations.verl.exact`).

This package imports neither torch nor verl until a function that needs them is called.
"""

from milegpo.integrations.verl.estimator import compute_advantage, compute_step_advantage, configure
from milegpo.integrations.verl.hook import setup_worker
from milegpo.integrations.verl.install import install, patch_when_imported
from milegpo.integrations.verl.settings import ESTIMATORS, EstimatorSettings, settings_from_config
from milegpo.integrations.verl.steps import (
    REQUIRED_COLUMNS,
    STEP_COLUMN,
    WON_COLUMN,
    SuccessRule,
    add_step_index,
    anchor_key,
    annotate_rollout,
    step_batch_from_verl,
)

__all__ = [
    "ESTIMATORS", "REQUIRED_COLUMNS", "STEP_COLUMN", "WON_COLUMN", "EstimatorSettings", "SuccessRule",
    "add_step_index", "anchor_key", "annotate_rollout", "compute_advantage", "compute_step_advantage", "configure",
    "install", "patch_when_imported", "settings_from_config", "setup_worker", "step_batch_from_verl",
]
