"""``algo.max_staleness=1``: the next rollout is played during the update, by the weights one update behind.

What is asserted: the policy lag is logged (0 for the first iteration, 1 after); the buffer an
update trains on records the version of the weights that sampled it, and its old log-probs (the
ratio's denominator) are those weights' log-probs, not those of the weights being updated; a run
resumed from a checkpoint saved while a rollout was in flight ends with the uninterrupted run's
weights and log rows; settings it cannot serve are refused in one line. With staleness 0 (the
default) every rollout is trained by the weights that sampled it and the log has today's columns
(the seeded House parity run against the trainer before this setting existed was identical: 49
non-timing columns and the final weights).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.logger import configure

from milegpo.algos import GRPO, CheckpointCallback, IterationCallback, MileGPO
from milegpo.algos.loss import pad_right
from milegpo.envs.house import HouseEnv
from milegpo.envs.vec_env import make_vec_env

HORIZON = 6
TIMING = ("time/", "update_s", "_per_s")


def house() -> object:
    return make_vec_env(HouseEnv, n_tasks=1, group_size=2, seed=0,
                        env_kwargs={"split": "train", "max_episode_steps": HORIZON})


def make(cls, model_path: str, **settings):
    settings = {"max_staleness": 1, **settings}
    return cls("LLMPolicy", house(), seed=0, learning_rate=3e-2, **settings,
               policy_kwargs={"model": model_path, "mode": "choose", "history_length": 0,
                              "prompt_template": "{observation}", "temperature": 5.0})


def trainable(model) -> list[th.Tensor]:
    return [p.detach().clone() for p in model.policy.trainable_parameters()]


class WeightVersions(IterationCallback):
    """The trainable weights after every update, by version (the updates applied)."""

    def __init__(self, initial: list[th.Tensor]):
        super().__init__(1)
        self.versions = {0: initial}

    def _on_iteration(self) -> None:
        self.versions[self.algorithm.iterations] = trainable(self.model)


def logprobs_under(model, weights: list[th.Tensor]) -> tuple[np.ndarray, np.ndarray]:
    """The log-probs of the last trained buffer's actions under ``weights``, and the mask of real units."""
    for p, w in zip(model.policy.trainable_parameters(), weights):
        p.data.copy_(w)
    model.policy.set_training_mode(False)
    with th.no_grad():
        logp, mask, _ = model.policy.evaluate_actions(model.rollout_buffer.samples)
    return logp.cpu().numpy(), mask.cpu().numpy()


def test_staleness_1_logs_the_lag_and_trains_on_the_behaviour_logprobs(model_path: str, tmp_path: Path) -> None:
    model = make(MileGPO, model_path)
    model.set_logger(configure(str(tmp_path), ["csv"]))
    versions = WeightVersions(trainable(model))
    model.learn(total_timesteps=3 * 2 * HORIZON, callback=versions)  # >= 3 iterations of <= 12 steps
    rows = list(csv.DictReader(open(tmp_path / "progress.csv")))
    assert len(rows) == model.iterations >= 3
    assert [float(r["rollout/policy_lag"]) for r in rows] == [0.0] + [1.0] * (len(rows) - 1)

    buffer = model.rollout_buffer  # the last update's: sampled by the weights one update before its own
    behaviour, updated = buffer.policy_version, buffer.policy_version + 1
    assert behaviour == model.iterations - 2
    old = pad_right([np.asarray(s.old_logprobs, dtype=np.float32) for s in buffer.samples], 1, th.device("cpu"))
    old = old.numpy()
    at_sampling, mask = logprobs_under(model, versions.versions[behaviour])
    at_update, _ = logprobs_under(model, versions.versions[updated])
    assert mask.all()  # choose mode: one unit per step
    np.testing.assert_allclose(old, at_sampling, rtol=1e-5, atol=1e-6)
    assert np.abs(old - at_update).max() > 1e-3  # the update's weights had moved: the ratio is not 1


def test_staleness_0_trains_every_rollout_on_the_weights_that_sampled_it(model_path: str, tmp_path: Path) -> None:
    model = make(MileGPO, model_path, max_staleness=0)
    model.set_logger(configure(str(tmp_path), ["csv"]))
    versions = WeightVersions(trainable(model))
    model.learn(total_timesteps=2 * 2 * HORIZON, callback=versions)
    rows = list(csv.DictReader(open(tmp_path / "progress.csv")))
    assert len(rows) == model.iterations >= 2 and "rollout/policy_lag" not in rows[0]  # today's columns
    assert model.rollout_buffer.policy_version == model.iterations - 1  # sampled by the weights it updated
    old = np.array([s.old_logprobs[0] for s in model.rollout_buffer.samples])
    at_update, _ = logprobs_under(model, versions.versions[model.iterations - 1])
    np.testing.assert_allclose(old, at_update[:, 0], rtol=1e-5, atol=1e-6)


def test_a_run_resumed_while_a_rollout_was_in_flight_ends_as_the_uninterrupted_one(model_path: str,
                                                                                    tmp_path: Path) -> None:
    total = 4 * 2 * HORIZON
    reference = make(GRPO, model_path)
    reference.set_logger(configure(str(tmp_path / "reference"), ["csv"]))
    reference.learn(total, callback=CheckpointCallback(1, tmp_path / "ckpts", keep_last=None))
    saved = sorted((tmp_path / "ckpts").iterdir(), key=lambda p: int(p.name.split("_")[1]))
    # every checkpoint but the last was saved while the next rollout was playing: it keeps that rollout's weights
    assert [(p / "behaviour_adapter").is_dir() for p in saved] == [True] * (len(saved) - 1) + [False]

    resumed = GRPO.load(saved[0], env=house())  # as after a kill -9 right after the first checkpoint
    resumed.set_logger(configure(str(tmp_path / "resumed"), ["csv"]))
    resumed.learn(total - resumed.num_timesteps, reset_num_timesteps=False)
    assert resumed.num_timesteps == reference.num_timesteps and resumed.iterations == reference.iterations
    assert all(th.equal(a, b) for a, b in zip(trainable(resumed), trainable(reference)))
    want = list(csv.DictReader(open(tmp_path / "reference" / "progress.csv")))[1:]
    got = list(csv.DictReader(open(tmp_path / "resumed" / "progress.csv")))
    assert len(got) == len(want) >= 2
    for w, g in zip(want, got):
        assert {k: v for k, v in g.items() if not any(t in k for t in TIMING)} == \
            {k: v for k, v in w.items() if not any(t in k for t in TIMING)}


def test_settings_staleness_cannot_serve_are_refused(model_path: str) -> None:
    with pytest.raises(ValueError, match="algo.max_staleness=1 .* policy.sampler.backend=hf"):
        MileGPO("LLMPolicy", house(), max_staleness=1, policy_kwargs={
            "model": model_path, "mode": "generate", "sampler": {"backend": "vllm"}})
