"""The loops that play grouped episodes, for training rollouts and held-out evaluation alike.

After a group reset of a :class:`~milegpo.envs.vec_env.GroupedTextVecEnv`, every env
plays until its episode ends (autoreset is off: a finished env stays done while the
others of the batch go on). The policy acts with each env's own history of
``(observation, action)`` pairs, and the caller sees each batch of steps as a
:class:`RolloutStep`: the trainer records it in its buffer, the evaluation in its episode
results.

* :func:`play_episodes` (lockstep): each round the policy acts for every active env, then
  every env steps; the slowest env of a round holds up all the others, and the envs idle
  while the policy acts.
* :func:`play_episodes_async`: with envs in worker processes, the policy acts for the envs
  whose workers have answered while the others still step, so env latency overlaps with
  the policy's work and a slow env holds up only its own worker's envs.

With ``stream_seed``, the ``k``-th action of env ``i`` is sampled from its own generator,
seeded by ``(stream_seed, i, k)`` (``per_env_sampling``): in choose mode an env's actions
then depend only on its own observations, not on which envs share a call, and both loops
record the same steps. The asynchronous loop's batches depend on when workers answer, so it
always samples this way. In generate mode both samplers draw each reply from its env's seed (the
HF sampler from the env's own stream of uniforms, vLLM from the request's seed), so there too an
env's replies do not depend on which envs share its call, up to the float noise batching adds to
the logits.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch as th

from milegpo.algos.buffer import step_tokens
from milegpo.contracts import ActingPolicy
from milegpo.envs.vec_env import GroupedTextVecEnv
from milegpo.policies.sample import ActionSample, Turn


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


def sample_seeds(stream_seed: int | None, envs: Sequence[int] | np.ndarray, steps: Sequence[int]) -> list[int] | None:
    """The seeds of the next actions of ``envs`` (each at its step count in ``steps``) under
    ``stream_seed``; None without one (the policy's own generator)."""
    if stream_seed is None:
        return None
    return [int(np.random.SeedSequence([stream_seed, int(i), int(k)]).generate_state(1)[0])
            for i, k in zip(envs, steps)]


def play_episodes(policy: ActingPolicy, env: GroupedTextVecEnv, obs: np.ndarray, infos: list[dict[str, Any]], *,
                  deterministic: bool, on_step: Callable[[RolloutStep], bool | None],
                  stream_seed: int | None = None) -> bool:
    """Play ``env``'s episodes from ``obs`` / ``infos`` (right after a group reset) until all are done.

    :param on_step: called after every round; returning False stops the loop early.
    :param stream_seed: sample each env's actions from its own stream (see the module docstring).
    :returns: False if ``on_step`` stopped it, else True.
    """
    histories: list[list[Turn]] = [[] for _ in range(env.num_envs)]
    while env.active.any():
        active = np.flatnonzero(env.active)
        start = time.perf_counter()
        with th.no_grad():
            samples = policy.act([obs[i] for i in active], [infos[i] for i in active],
                                 [histories[i] for i in active], deterministic=deterministic,
                                 sample_seeds=sample_seeds(stream_seed, active, [len(histories[i]) for i in active]))
        policy_seconds = time.perf_counter() - start
        actions = np.full(env.num_envs, "", dtype=object)
        for k, i in enumerate(active):
            actions[i] = samples[k].text
        new_obs, rewards, dones, new_infos = env.step(actions)
        assert isinstance(new_obs, np.ndarray)  # a text vec env's observations: an object array of str
        for k, i in enumerate(active):
            histories[i].append(Turn(str(obs[i]), policy.history_text(samples[k]), samples[k]))
        if on_step(RolloutStep(active, samples, infos, rewards, dones, new_infos, policy_seconds)) is False:
            return False
        obs, infos = new_obs, new_infos
    return True


#: calls in a row by whose end every env in flight had answered: the envs are faster than the policy
FAST_ENV_CALLS = 3


@dataclass
class _InFlight:
    """A worker's step in flight: the envs it steps, their samples and the infos they acted in."""

    envs: list[int]
    samples: list[ActionSample]
    infos: list[dict[str, Any]]
    policy_seconds: float


@dataclass
class _Pacing:
    """Whether overlapping env steps with policy calls pays in this rollout.

    It pays when an env step takes about as long as a policy call or longer. When every env in flight
    has answered by the end of each of :data:`FAST_ENV_CALLS` calls in a row, the envs are faster
    than the policy and the smaller calls of the overlap only add calls (each has a fixed cost): the
    loop then acts for every env at once and waits for all of them, as lockstep does, until the envs
    of a round keep the loop waiting for half a call or longer again."""

    overlap: bool = True
    fast_calls: int = 0

    def after_call(self, all_answered: bool) -> None:
        self.fast_calls = self.fast_calls + 1 if all_answered else 0
        if self.fast_calls >= FAST_ENV_CALLS:
            self.overlap = False

    def after_round(self, waited_seconds: float, call_seconds: float) -> None:
        if waited_seconds >= call_seconds / 2:
            self.overlap, self.fast_calls = True, 0


def play_episodes_async(policy: ActingPolicy, env: GroupedTextVecEnv, obs: np.ndarray, infos: list[dict[str, Any]],
                        *, deterministic: bool, on_step: Callable[[RolloutStep], bool | None],
                        stream_seed: int, cohorts: int) -> bool:
    """:func:`play_episodes` with env steps overlapped with the policy's work (see the module docstring).

    The unit is a worker process (all its active envs step together). The policy acts for the
    envs of ready workers, at most ``1 / cohorts`` of the active envs per call so that the others
    step while it acts (with envs as slow as the policy, a round takes ``max(policy, env + policy
    / cohorts)`` instead of ``policy + env``), sends each worker its actions, and acts again for
    workers that answered in the meantime; when no worker is ready it waits for the first
    answer (or a worker's watchdog timeout: it is restarted and its episodes truncated, as in
    lockstep). Each worker's answer is one :class:`RolloutStep`, recorded as it arrives. Envs
    faster than the policy have nothing to overlap: the loop then plays rounds of one call for
    every env, as lockstep does (:class:`_Pacing`), and overlaps again once they slow down.
    """
    obs, infos = obs.copy(), list(infos)  # each env's latest, updated as its worker answers
    histories: list[list[Turn]] = [[] for _ in range(env.num_envs)]
    hosted = env.worker_envs
    active = env.active
    cap = max(1, -(-int(active.sum()) // cohorts))
    ready: deque[int] = deque(w for w, envs in enumerate(hosted) if active[envs].any())
    in_flight: dict[int, _InFlight] = {}
    pacing = _Pacing()
    round_waited, round_call = 0.0, 0.0  # without overlap: the round's wait for its envs, its call's seconds
    stopped = False
    while in_flight or (ready and not stopped):  # once stopped, only the steps in flight are drained
        if ready and not stopped and (pacing.overlap or not in_flight):
            limit = cap if pacing.overlap else env.num_envs
            workers, envs = [ready.popleft()], []
            envs += [i for i in hosted[workers[0]] if active[i]]
            while ready and len(envs) + int(active[hosted[ready[0]]].sum()) <= limit:
                workers.append(ready.popleft())
                envs += [i for i in hosted[workers[-1]] if active[i]]
            stepping = set(in_flight)  # the workers that step while the policy acts
            start = time.perf_counter()
            with th.no_grad():
                samples = policy.act([obs[i] for i in envs], [infos[i] for i in envs], [histories[i] for i in envs],
                                     deterministic=deterministic,
                                     sample_seeds=sample_seeds(stream_seed, envs, [len(histories[i]) for i in envs]))
            round_call = time.perf_counter() - start
            round_waited = 0.0
            if pacing.overlap and stepping:
                pacing.after_call(stepping <= set(env.step_workers_ready(timeout=0)))
            seconds = round_call / len(envs)
            by_env = dict(zip(envs, samples))
            for w in workers:
                mine = [i for i in hosted[w] if active[i]]
                env.step_worker_send(w, {i: by_env[i].text for i in mine})
                in_flight[w] = _InFlight(mine, [by_env[i] for i in mine], [infos[i] for i in mine],
                                         seconds * len(mine))
            continue  # act for any other ready worker before waiting: its envs then step beside these
        waiting = time.perf_counter()
        answered = env.step_workers_ready()
        round_waited += time.perf_counter() - waiting
        for w in answered:
            flight = in_flight.pop(w)
            stepped, rewards, dones, new_infos = env.step_worker_recv(w)
            new_obs = env.observations
            step_infos = list(infos)  # the infos each env acted in (read for the stepped envs only)
            for i, info in zip(flight.envs, flight.infos):
                step_infos[i] = info
            for i, sample in zip(flight.envs, flight.samples):
                histories[i].append(Turn(str(obs[i]), policy.history_text(sample), sample))
                obs[i], infos[i] = new_obs[i], new_infos[i]
            active = env.active
            step = RolloutStep(np.array(flight.envs), flight.samples, step_infos, rewards, dones, new_infos,
                               flight.policy_seconds)
            if not stopped and on_step(step) is False:
                stopped = True  # drain the steps in flight, so the vec env is left consistent
            if not stopped and active[hosted[w]].any():
                ready.append(w)
        if not pacing.overlap and not in_flight:  # a round of one call ended: have the envs slowed down?
            pacing.after_round(round_waited, round_call)
    return not stopped


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
