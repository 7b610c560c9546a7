"""The one loop that plays grouped episodes, for training rollouts and held-out evaluation alike.

After a group reset of a :class:`~milegpo.envs.vec_env.GroupedTextVecEnv`, every env
plays until its episode ends (autoreset is off: a finished env stays done while the
others of the batch go on). Each round the policy acts for the active envs only, with
each env's own history of ``(observation, action)`` pairs, and the caller sees the round
as a :class:`RolloutStep`: the trainer records it in its buffer, the evaluation in its
episode results.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch as th

from milegpo.algos.buffer import step_tokens
from milegpo.contracts import ActingPolicy
from milegpo.envs.vec_env import GroupedTextVecEnv
from milegpo.policies.sample import ActionSample


@dataclass
class RolloutStep:
    """One round of the loop: the envs that acted and what came back.

    ``samples[k]`` is the action of env ``active[k]``; ``infos`` are the infos of the
    states the actions were taken in, ``new_infos`` / ``rewards`` / ``dones`` what the
    step returned (all indexed by env); ``policy_seconds`` the time the policy took.
    """

    active: np.ndarray
    samples: list[Any]
    infos: list[dict[str, Any]]
    rewards: np.ndarray
    dones: np.ndarray
    new_infos: list[dict[str, Any]]
    policy_seconds: float


def play_episodes(policy: ActingPolicy, env: GroupedTextVecEnv, obs: np.ndarray, infos: list[dict[str, Any]], *,
                  deterministic: bool, on_step: Callable[[RolloutStep], bool | None]) -> bool:
    """Play ``env``'s episodes from ``obs`` / ``infos`` (right after a group reset) until all are done.

    :param on_step: called after every round; returning False stops the loop early.
    :returns: False if ``on_step`` stopped it, else True.
    """
    histories: list[list[tuple[str, str]]] = [[] for _ in range(env.num_envs)]
    while env.active.any():
        active = np.flatnonzero(env.active)
        start = time.perf_counter()
        with th.no_grad():
            samples = policy.act([obs[i] for i in active], [infos[i] for i in active],
                                 [histories[i] for i in active], deterministic=deterministic)
        policy_seconds = time.perf_counter() - start
        actions = np.full(env.num_envs, "", dtype=object)
        for k, i in enumerate(active):
            actions[i] = samples[k].text
        new_obs, rewards, dones, new_infos = env.step(actions)
        assert isinstance(new_obs, np.ndarray)  # a text vec env's observations: an object array of str
        for k, i in enumerate(active):
            histories[i].append((str(obs[i]), policy.history_text(samples[k])))
        if on_step(RolloutStep(active, samples, infos, rewards, dones, new_infos, policy_seconds)) is False:
            return False
        obs, infos = new_obs, new_infos
    return True


@dataclass
class RolloutMeter:
    """The time and token counts of one training rollout, turned into its ``rollout/`` and ``time/`` log values."""

    started: float = field(default_factory=time.perf_counter)
    policy_seconds: float = 0.0
    tokens: int = 0  # prompt + action (or candidate) tokens the policy read
    action_tokens: int = 0
    logprob_gaps: list[float] = field(default_factory=list)  # per step: max |sampler - trainer| behaviour log-prob

    def add(self, sample: ActionSample) -> None:
        """Count one step's sample."""
        self.tokens += step_tokens(sample)
        self.action_tokens += len(sample.action_ids)
        if getattr(sample, "sampler_logprobs", None) is not None:
            self.logprob_gaps.append(float(np.abs(sample.sampler_logprobs - sample.old_logprobs).max(initial=0.0)))

    def log(self, stats: dict[str, float], rollout_seconds: float, credit_seconds: float) -> dict[str, float]:
        """The iteration's rollout values from the buffer's episode ``stats`` (all ranks) and the timings."""
        values = {
            **{f"rollout/{k}": v for k, v in stats.items() if k not in ("episodes", "steps")},
            "rollout/episodes": stats["episodes"],
            "time/rollout_s": rollout_seconds,
            "time/credit_s": credit_seconds,
            "time/env_steps_per_s": stats["steps"] / max(rollout_seconds, 1e-9),
            "time/rollout_tokens_per_s": self.tokens / max(self.policy_seconds, 1e-9),
            "time/action_tokens_per_s": self.action_tokens / max(self.policy_seconds, 1e-9),
        }
        if self.logprob_gaps:  # another sampler (vLLM) than the trainer's model: how well they agree
            values["rollout/sampler_logprob_gap_max"] = max(self.logprob_gaps)
            values["rollout/sampler_logprob_gap_mean_step"] = float(np.mean(self.logprob_gaps))
        return values
