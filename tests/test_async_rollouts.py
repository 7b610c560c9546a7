"""``algo.rollout=async``: envs step in their workers while the policy acts for others, and the run
records what lockstep records (both sampling each env from its own stream)."""

from __future__ import annotations

import csv
import logging
import os
import signal
from pathlib import Path

import cloudpickle
import hostile_envs
import numpy as np
import pytest
from stable_baselines3.common.logger import configure

from milegpo import MileGPO, make_vec_env
from milegpo.config import AlgoConfig

cloudpickle.register_pickle_by_value(hostile_envs)  # env worker processes get the classes by value

TIMING = ("time/", "update_s", "_per_s")


def train(model_path: str, tmp_path: Path, rollout: str, n_workers: int = 4) -> list[dict[str, str]]:
    env = make_vec_env("milegpo/House-v0", n_tasks=2, group_size=4, seed=0, subprocess=True, n_workers=n_workers,
                       env_kwargs={"max_episode_steps": 10})
    model = MileGPO("LLMPolicy", env, seed=0, learning_rate=3e-3, kl_coef=0.0, rollout=rollout,
                    per_env_sampling=True, policy_kwargs={"model": model_path, "mode": "choose",
                                                          "lora": {"r": 4, "alpha": 8}})
    folder = tmp_path / rollout
    model.set_logger(configure(str(folder), ["csv"]))
    try:
        model.learn(160)
    finally:
        env.close()
    return list(csv.DictReader(open(folder / "progress.csv")))


def test_async_records_what_lockstep_records(model_path: str, tmp_path: Path) -> None:
    lockstep, overlapped = train(model_path, tmp_path, "lockstep"), train(model_path, tmp_path, "async")
    assert len(lockstep) == len(overlapped) >= 2
    for want, got in zip(lockstep, overlapped):
        keys = [k for k in want if not any(t in k for t in TIMING) and want[k]]
        assert keys and set(keys) <= set(got)
        exact = [k for k in keys if k.startswith(("rollout/", "credit/"))]
        assert {k: got[k] for k in exact} == {k: want[k] for k in exact}  # same actions, episodes and credit
        # the update reads the behaviour log-probs, scored in other batches: float noise only
        assert np.allclose([float(got[k]) for k in keys], [float(want[k]) for k in keys], rtol=1e-4, atol=1e-6)


def test_a_worker_killed_mid_async_rollout_is_restarted_and_training_goes_on(model_path: str) -> None:
    env = make_vec_env("hostile/Counting-v0", n_tasks=2, group_size=2, seed=0, subprocess=True, n_workers=2,
                       timeout=30)
    model = MileGPO("LLMPolicy", env, learning_rate=1e-3, seed=0, rollout="async",
                    policy_kwargs={"model": model_path, "mode": "choose", "lora": {"r": 4, "alpha": 8}})
    killed = []

    def kill_a_worker(locals_, globals_):  # SIGKILL worker 0 while the other worker's step is in flight
        if not killed and model.num_timesteps >= 4:
            killed.append(env._workers[0].process.pid)
            os.kill(killed[0], signal.SIGKILL)
        return True

    try:
        model.learn(200, callback=kill_a_worker)
        assert killed and env._workers[0].process.pid != killed[0] and env._workers[0].process.is_alive()
        assert any("env-worker-0" in kind for kind in env.errors.counts)
        assert model.num_timesteps >= 200 and model._n_updates >= 2
    finally:
        env.close()


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
