"""Supervised warm start: the envs' scripted experts, noisy demonstrations, behaviour cloning, train()."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from milegpo.algos.warm_start import (
    behaviour_clone,
    collect_demonstrations,
)
from milegpo.cli import main
from milegpo.config import WarmStartConfig
from milegpo.config.run import TrainConfig, resolve_config
from milegpo.envs import make_env
from milegpo.envs.core import TextEnv, TextSpace
from milegpo.policies import LLMPolicy
from milegpo.policies.parsing import parse_action


def make_policy(path: str, **kwargs) -> LLMPolicy:
    torch.manual_seed(0)
    return LLMPolicy(TextSpace(), TextSpace(), lambda _: 1e-3, model=path, **kwargs)


def play_expert(env: TextEnv, seed: int) -> bool:
    observation, info = env.reset(seed=seed)
    done = False
    while not done:
        action = env.expert_action()
        assert action is not None and action in info["admissible_commands"]
        observation, _, terminated, truncated, info = env.step(action)
        done = terminated or truncated
    return bool(info.get("won"))


@pytest.mark.parametrize("env_id, kwargs", [
    ("milegpo/House-v0", {}),
    ("milegpo/WebShop-v0", {"max_episode_steps": 15}),
    ("milegpo/ALFWorld-v0", {"size": "small", "task_types": [1, 2], "max_episode_steps": 30,
                             "expert_type": "handcoded"}),
])
def test_every_built_in_expert_wins_its_training_tasks(env_id: str, kwargs: dict) -> None:
    env = make_env(env_id, split="train", **kwargs)
    try:
        assert all(play_expert(env, seed) for seed in range(4))
    finally:
        env.close()


def test_alfworld_expert_needs_an_expert_type_and_envs_without_one_say_so() -> None:
    env = make_env("milegpo/ALFWorld-v0", size="small", task_types=[1], max_episode_steps=5)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="expert_type='handcoded'"):
        env.expert_action()
    env.close()

    class NoExpert(TextEnv):
        pass

    with pytest.raises(NotImplementedError, match="NoExpert has no scripted expert"):
        NoExpert().expert_action()


def test_demonstrations_record_the_taken_commands_with_epsilon_noise(model_path: str) -> None:
    policy = make_policy(model_path, mode="choose")
    env = make_env("milegpo/House-v0", split="train")
    clean, clean_stats = collect_demonstrations(policy, env, episodes=3, epsilon=0.0)
    assert clean_stats["success_rate"] == 1.0 and clean_stats["random_fraction"] == 0.0
    # the expert's optimal plans: the samples are exactly those commands, in order
    expected = []
    for seed in range(3):
        env.reset(seed=seed)
        plan = env.solve()
        expected += plan
    assert [s.text for s in clean] == expected
    for sample in clean:
        assert sample.action_ids == sample.candidate_ids[sample.chosen]
    noisy, noisy_stats = collect_demonstrations(policy, env, episodes=3, epsilon=1.0, seed=1)
    assert noisy_stats["random_fraction"] == 1.0
    again, _ = collect_demonstrations(policy, env, episodes=3, epsilon=1.0, seed=1)
    assert [s.text for s in again] == [s.text for s in noisy]  # the noise follows the seed


def test_demonstration_refuses_a_command_that_is_not_admissible(model_path: str) -> None:
    policy = make_policy(model_path, mode="choose")
    with pytest.raises(ValueError, match="not among the state's admissible commands"):
        policy.demonstration("You are in the hall.", {"task": "t", "admissible_commands": ["look"]}, [], "fly")


def test_behaviour_cloning_makes_the_expert_likely_and_the_policy_win(model_path: str) -> None:
    policy = make_policy(model_path, mode="choose")
    env = make_env("milegpo/House-v0", split="train")
    samples, _ = collect_demonstrations(policy, env, episodes=4, epsilon=0.0)
    with torch.no_grad():
        before = policy.evaluate_actions(samples)[0].exp().mean().item()
    fit = behaviour_clone(policy, samples, epochs=30, learning_rate=1e-2, batch_size=16)
    with torch.no_grad():
        after = policy.evaluate_actions(samples)[0].exp().mean().item()
    assert fit[-1]["nll"] < fit[0]["nll"]
    assert after > 0.9 > before
    # greedy, the cloned policy now replays the expert on a demonstrated task
    observation, info = env.reset(seed=0)
    history, done = [], False
    while not done:
        action = policy.act([observation], [info], [history], deterministic=True)[0].text
        history.append((observation, action))
        observation, _, terminated, truncated, info = env.step(action)
        done = terminated or truncated
    assert info["won"]


def test_generate_mode_demonstrations_are_replies_the_parser_reads_back(model_path: str) -> None:
    policy = make_policy(model_path, mode="generate", max_new_tokens=16)
    env = make_env("milegpo/House-v0", split="train")
    samples, _ = collect_demonstrations(policy, env, episodes=2, epsilon=0.0)
    for sample in samples:
        assert parse_action(sample.raw_text) == (sample.text, True)
        assert sample.action_ids[-1] == policy.tokenizer.eos_token_id
        assert len(sample.old_logprobs) == len(sample.action_ids)
    fit = behaviour_clone(policy, samples, epochs=3, learning_rate=1e-2, batch_size=8)
    assert fit[-1]["nll"] < fit[0]["nll"]


@pytest.mark.parametrize("mode", ["choose", "generate"])
def test_micro_batched_cloning_takes_the_same_steps(model_path: str, mode: str) -> None:
    """Cut into micro-batches (each sample alone here), a minibatch gives the same gradient steps."""
    env = make_env("milegpo/House-v0", split="train")
    weights, fits = [], []
    for micro_batch_tokens in (None, 1):
        policy = make_policy(model_path, mode=mode, max_new_tokens=16)
        samples, _ = collect_demonstrations(policy, env, episodes=2, epsilon=0.5)
        fits.append(behaviour_clone(policy, samples, epochs=2, learning_rate=1e-2, batch_size=8,
                                    micro_batch_tokens=micro_batch_tokens))
        weights.append([p.detach().clone() for p in policy.trainable_parameters()])
    assert all(torch.allclose(x, y, atol=1e-5) for x, y in zip(*weights))
    for one_pass, micro in zip(*fits):
        assert micro == pytest.approx(one_pass, rel=1e-4)


def test_warm_start_config_checks_its_keys() -> None:
    with pytest.raises(ValueError, match=r"unknown setting\(s\) run.warm_start.episode; valid"):
        TrainConfig.from_dict({"run": {"warm_start": {"episode": 3}}})
    with pytest.raises(ValueError, match="epsilon must be a number in"):
        TrainConfig.from_dict({"run": {"warm_start": {"epsilon": 2}}})
    assert WarmStartConfig(episodes=2).epsilon == 0.3


def test_milegpo_train_warm_starts_before_rl(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert main(["train", "run.total_timesteps=16", "env.n_tasks=1", "env.group_size=2", "eval.n_tasks=2",
                 "--no-progress-bar", "--run-dir", str(run), "run.report_to=[]",
                 "run.warm_start={episodes: 2, epochs: 2, epsilon: 0.5}"]) == 0
    report = json.loads((run / "warm_start.json").read_text())
    assert report["config"]["episodes"] == 2 and report["config"]["seed"] == 0  # the run's seed
    assert len(report["epochs"]) == 2 and report["steps"] > 0
    assert np.isfinite(report["epochs"][-1]["nll"])
    assert json.loads((run / "config.json").read_text())["run"]["warm_start"]["epsilon"] == 0.5


def test_start_model_is_the_policy_a_warm_started_run_begins_with(tmp_path: Path) -> None:
    """Benchmarks sample from start_model; it must match what train() trains from (same seed, same weights)."""
    from milegpo.envs import make_vec_env
    from milegpo.run.train import prepare_model, start_model

    cold_config = resolve_config("cpu-demo", overrides=["env.n_tasks=1", "env.group_size=2", "run.seed=3",
                                                       "eval.splits=[]", "run.report_to=[]"])
    config = cold_config.replace(**{"run.warm_start": {"episodes": 2, "epochs": 2, "epsilon": 0.5}})
    weights = []
    for name in ("a", "b"):
        env = make_vec_env(config.env.id, n_tasks=1, group_size=2, seed=3, subprocess=False)
        try:
            model = start_model(config, env, prepare_model(config, tmp_path / name), run_dir=tmp_path / name)
        finally:
            env.close()
        weights.append([p.detach().clone() for p in model.policy.trainable_parameters()])
        assert json.loads((tmp_path / name / "warm_start.json").read_text())["config"]["seed"] == 3
    # reproducible from the config alone, up to fp rounding (repeats in one process differed by ~1e-6)
    assert all(torch.allclose(x, y, atol=1e-4) for x, y in zip(*weights))
    env = make_vec_env(config.env.id, n_tasks=1, group_size=2, seed=3, subprocess=False)
    try:
        cold = start_model(cold_config, env, prepare_model(config, tmp_path / "a"))
    finally:
        env.close()
    cold_weights = [p.detach() for p in cold.policy.trainable_parameters()]
    assert max(float((x - y).abs().max()) for x, y in zip(weights[0], cold_weights)) > 1e-3
