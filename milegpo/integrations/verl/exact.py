"""verl-agent's GiGPO arithmetic on a step batch, for ``milegpo.gigpo`` with ``upstream_exact=True``.

milegpo's credit functions split a step's reward into env reward and invalid-action
penalty by assuming an invalid action earns nothing from the env (true of milegpo's own
envs, which never apply an invalid action). verl-agent's envs do apply it and may pay for
it: Sokoban pays -0.1 for every step, an invalid one included. Here the split is exact,
because the adapter knows the penalty it subtracted, so verl-agent's GiGPO is reproduced
for any reward on any step:

* a row's step return is the discounted sum of the trajectory's **env** rewards from that
  step on, minus the penalty of that row only (verl-agent subtracts the penalty after the
  discounting, so it never reaches earlier steps);
* a row's episode score is its trajectory's env-reward sum minus the penalty of that row,
  normalised over all rows of the task (longer trajectories weigh more);
* the step groups are the task's rows taken from one anchor state.

Two differences from verl-agent remain, both deliberate and documented: a row copied by
``adjust_batch`` is counted once, and a task with a single row gets an episode term of 0
(verl-agent keeps its raw score).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from milegpo.credit import CreditResult, StepBatch, build_task_graph
from milegpo.credit.base import common_diagnostics, step_group_diagnostics
from milegpo.credit.gigpo import GiGPOConfig, discounted_returns
from milegpo.credit.norm import group_normalize


def verl_agent_gigpo(batch: StepBatch, config: GiGPOConfig, invalid_action_penalty: float) -> CreditResult:
    """GiGPO credit of ``batch`` as verl-agent computes it (see the module docstring).

    :param batch: a step batch from :func:`~milegpo.integrations.verl.step_batch_from_verl`,
        whose rewards are the env rewards minus ``invalid_action_penalty`` on invalid steps.
    :param config: the GiGPO settings (gamma, norm, w_step, w_episode, epsilon).
    :param invalid_action_penalty: the penalty that was subtracted (0 when it is off).
    """
    graph = build_task_graph(batch)
    penalties = invalid_action_penalty * (~batch.valid)
    env_rewards = batch.rewards + penalties
    returns = discounted_returns(dataclasses.replace(batch, rewards=env_rewards), config.gamma) - penalties
    env_return = np.bincount(batch.traj_ids, weights=env_rewards, minlength=batch.num_trajectories)
    scores = env_return[batch.traj_ids] - penalties
    episode = group_normalize(scores, graph.row_task, graph.num_tasks, config.norm, config.epsilon)
    step = group_normalize(returns, graph.row_src, graph.num_nodes, config.norm, config.epsilon)
    advantages = config.w_step * step + config.w_episode * episode
    diagnostics = {"method": "gigpo", **common_diagnostics(graph, advantages, episode),
                   **step_group_diagnostics(graph)}
    return CreditResult(advantages=advantages, diagnostics=diagnostics,
                        components={"step_return": returns, "A_step": step, "episode": episode})
