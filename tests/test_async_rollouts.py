"""``algo.rollout=async``: envs step in their workers while the policy acts for others, and the run
records what lockstep records (both sampling each env from its own stream). A worker killed during an
async rollout: tests/test_hostile_envs.py, with lockstep's."""

from __future__ import annotations

import csv
import logging
import threading
import time
from pathlib import Path

import hostile_envs  # noqa: F401  registers hostile/Counting-v0
import numpy as np
import pytest
from stable_baselines3.common.logger import configure

from milegpo import MileGPO, make_vec_env
from milegpo.algos.rollout import FAST_ENV_CALLS, RolloutStep, _Pacing, play_episodes_async
from milegpo.config import AlgoConfig
from milegpo.contracts import ActingPolicy

TIMING = ("time/", "update_s", "_per_s")


def train(model_path: str, tmp_path: Path, rollout: str, n_workers: int = 4, mode: str = "choose"
          ) -> list[dict[str, str]]:
    env = make_vec_env("milegpo/House-v0", n_tasks=2, group_size=4, seed=0, subprocess=True, n_workers=n_workers,
                       env_kwargs={"max_episode_steps": 10})
    model = MileGPO("LLMPolicy", env, seed=0, learning_rate=3e-3, kl_coef=0.0, rollout=rollout,
                    per_env_sampling=True, policy_kwargs={"model": model_path, "mode": mode, "max_new_tokens": 8,
                                                          "lora": {"r": 4, "alpha": 8}})
    folder = tmp_path / f"{rollout}-{mode}"
    model.set_logger(configure(str(folder), ["csv"]))
    try:
        model.learn(160)
    finally:
        env.close()
    return list(csv.DictReader(open(folder / "progress.csv")))


@pytest.mark.parametrize("mode", ["choose", "generate"])
def test_async_records_what_lockstep_records(model_path: str, tmp_path: Path, mode: str) -> None:
    """Each env sampling from its own stream, async records lockstep's actions, episodes and credit; in
    generate mode too (the HF sampler draws each reply from its env's own stream)."""
    lockstep = train(model_path, tmp_path, "lockstep", mode=mode)
    overlapped = train(model_path, tmp_path, "async", mode=mode)
    assert len(lockstep) == len(overlapped) >= 2
    for want, got in zip(lockstep, overlapped):
        keys = [k for k in want if not any(t in k for t in TIMING) and want[k]]
        assert keys and set(keys) <= set(got)
        exact = [k for k in keys if k.startswith(("rollout/", "credit/"))]
        assert {k: got[k] for k in exact} == {k: want[k] for k in exact}  # same actions, episodes and credit
        # the update reads the behaviour log-probs, scored in other batches: float noise only
        assert np.allclose([float(got[k]) for k in keys], [float(want[k]) for k in keys], rtol=1e-4, atol=1e-6)


def test_async_with_envs_in_this_process_plays_lockstep_and_says_so(model_path: str,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    env = make_vec_env("hostile/Counting-v0", n_tasks=1, group_size=2, seed=0)
    model = MileGPO("LLMPolicy", env, learning_rate=1e-3, seed=0, rollout="async",
                    policy_kwargs={"model": model_path, "mode": "choose", "lora": {"r": 4, "alpha": 8}})
    with caplog.at_level(logging.WARNING, logger="milegpo.algos.iteration"):
        model.learn(40)
    said = [r.getMessage() for r in caplog.records if "algo.rollout=async" in r.getMessage()]
    assert len(said) == 1 and "in this process" in said[0] and "playing in lockstep" in said[0]
    assert model.num_timesteps >= 40


def test_async_cohorts_is_at_least_one() -> None:
    with pytest.raises(ValueError, match="algo.async_cohorts"):
        AlgoConfig(rollout="async", async_cohorts=0)


def test_async_cohorts_sets_how_many_envs_a_call_acts_for(model_path: str) -> None:
    """``algo.async_cohorts=4`` in the trainer: each policy call of the async rollout acts for at most a
    quarter of the 8 envs (two cohorts, the default, act for four), envs slower than the policy."""
    env = make_vec_env("hostile/SlowStep-v0", n_tasks=1, group_size=8, seed=0, subprocess=True, n_workers=8)
    model = MileGPO("LLMPolicy", env, seed=0, rollout="async", async_cohorts=4,
                    policy_kwargs={"model": model_path, "mode": "choose"})
    calls: list[int] = []
    act = model.policy.act

    def counted(observations, *args, **kwargs):
        calls.append(len(observations))
        return act(observations, *args, **kwargs)

    model.policy.act = counted  # type: ignore[method-assign]
    try:
        model.learn(8)
    finally:
        env.close()
    assert calls[:4] == [2, 2, 2, 2]  # all 8 ready at the reset: four calls of a quarter each
    assert max(calls) == 2


def test_async_needs_per_env_sampling() -> None:
    with pytest.raises(ValueError, match="algo.rollout=async samples per env"):
        AlgoConfig(rollout="async", per_env_sampling=False)
    assert AlgoConfig(rollout="async").samples_per_env and not AlgoConfig().samples_per_env


class SlowPolicy:
    """A real policy that takes ``seconds`` more per call (a slower model): the workers it sent
    actions to answer while it acts for the next batch. ``calls``: how many envs each call acted for."""

    def __init__(self, policy: ActingPolicy, seconds: float) -> None:
        self.policy, self.seconds = policy, seconds
        self.temperature = policy.temperature
        self.calls: list[int] = []

    def act(self, observations, *args, **kwargs):
        self.calls.append(len(observations))
        time.sleep(self.seconds)
        return self.policy.act(observations, *args, **kwargs)

    def set_training_mode(self, mode: bool) -> None:
        self.policy.set_training_mode(mode)

    def history_text(self, sample) -> str:
        return self.policy.history_text(sample)

    def seeded_sampling(self, seed: int):
        return self.policy.seeded_sampling(seed)


def test_async_rollout_stopped_by_a_step_ends_after_draining_the_steps_in_flight(model_path: str) -> None:
    """A callback that stops training during an async rollout: the loop stops acting, receives the steps
    in flight (without recording them) and returns False, even with a worker that answered just before
    the stop still waiting to act (it looped forever on it before)."""
    env = make_vec_env("milegpo/House-v0", n_tasks=1, group_size=4, seed=0, subprocess=True, n_workers=4)
    model = MileGPO("LLMPolicy", env, seed=0, rollout="async", policy_kwargs={"model": model_path, "mode": "choose"})
    answers: list[int] = []

    def on_step(step: RolloutStep) -> bool:
        answers.append(len(step.active))
        return len(answers) < 2  # the second answer of the first batch of answers stops the rollout

    result: list[bool] = []
    try:
        obs = env.reset()
        # two batches of two workers; the second batch's act gives the first's workers time to answer
        player = threading.Thread(target=lambda: result.append(play_episodes_async(
            SlowPolicy(model.policy, 0.3), env, obs, env.reset_infos, deterministic=False, on_step=on_step,
            stream_seed=0, cohorts=2)), daemon=True)
        player.start()
        player.join(60)
        assert not player.is_alive(), "the stopped async rollout never returned"
    finally:
        if not player.is_alive():
            env.close()
    assert result == [False]
    assert answers == [1, 1]  # recorded up to the stop; the two steps in flight were received, not recorded
    assert env.step_workers_ready(timeout=0) == []  # nothing left in flight: the vec env can reset


def async_rollout_calls(model_path: str, env_id: str, policy_seconds: float) -> tuple[list[int], int]:
    """One async rollout of 8 envs in 8 workers, two cohorts (at most 4 envs per call while the others
    step): the envs each policy call acted for, and the rounds (the most steps any env played)."""
    env = make_vec_env(env_id, n_tasks=1, group_size=8, seed=0, subprocess=True, n_workers=8)
    model = MileGPO("LLMPolicy", env, seed=0, rollout="async", policy_kwargs={"model": model_path, "mode": "choose"})
    policy = SlowPolicy(model.policy, policy_seconds)
    steps = np.zeros(8, dtype=int)

    def on_step(step: RolloutStep) -> None:
        steps[step.active] += 1

    try:
        obs = env.reset()
        assert play_episodes_async(policy, env, obs, env.reset_infos, deterministic=False, on_step=on_step,
                                   stream_seed=0, cohorts=2)
    finally:
        env.close()
    return policy.calls, int(steps.max())


def test_async_with_envs_faster_than_the_policy_acts_for_every_env_at_once(model_path: str) -> None:
    """Envs that answer while the policy acts have nothing to overlap: after FAST_ENV_CALLS calls that saw
    every env in flight answer, the loop plays rounds of one call for all envs, as lockstep does (it made
    about two calls of half the envs per round before)."""
    calls, rounds = async_rollout_calls(model_path, "hostile/Counting-v0", policy_seconds=0.2)
    assert rounds >= 5
    assert calls[:2] == [4, 4]  # it starts overlapping: half the envs per call
    assert len(calls) <= rounds + FAST_ENV_CALLS
    assert max(calls[FAST_ENV_CALLS + 1:]) > 4  # then one call acts for more than a cohort


def test_async_with_envs_slower_than_the_policy_keeps_overlapping(model_path: str) -> None:
    calls, rounds = async_rollout_calls(model_path, "hostile/SlowStep-v0", policy_seconds=0.0)
    assert rounds >= 5
    assert max(calls) <= 4 and len(calls) >= 2 * rounds - 1  # half the envs per call, every round


def test_pacing_overlaps_again_when_the_envs_slow_down() -> None:
    pacing = _Pacing()
    for seen in (True, True, False, True, True):  # a call whose envs had not all answered resets the count
        pacing.after_call(all_answered=seen)
    assert pacing.overlap
    pacing.after_call(all_answered=True)
    assert not pacing.overlap
    pacing.after_round(waited_seconds=0.01, call_seconds=0.1)  # envs still much faster than a call
    assert not pacing.overlap
    pacing.after_round(waited_seconds=0.06, call_seconds=0.1)
    assert pacing.overlap and pacing.fast_calls == 0
