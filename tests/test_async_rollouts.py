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
from milegpo.algos.rollout import RolloutStep, play_episodes_async
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


def test_async_needs_per_env_sampling() -> None:
    with pytest.raises(ValueError, match="algo.rollout=async samples per env"):
        AlgoConfig(rollout="async", per_env_sampling=False)
    assert AlgoConfig(rollout="async").samples_per_env and not AlgoConfig().samples_per_env


class SlowPolicy:
    """A real policy that takes ``seconds`` more per call (a slower model): the workers it sent
    actions to answer while it acts for the next batch."""

    def __init__(self, policy: ActingPolicy, seconds: float) -> None:
        self.policy, self.seconds = policy, seconds
        self.temperature = policy.temperature

    def act(self, *args, **kwargs):
        time.sleep(self.seconds)
        return self.policy.act(*args, **kwargs)

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
            stream_seed=0)), daemon=True)
        player.start()
        player.join(60)
        assert not player.is_alive(), "the stopped async rollout never returned"
    finally:
        if not player.is_alive():
            env.close()
    assert result == [False]
    assert answers == [1, 1]  # recorded up to the stop; the two steps in flight were received, not recorded
    assert env.step_workers_ready(timeout=0) == []  # nothing left in flight: the vec env can reset
