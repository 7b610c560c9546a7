"""The group-RL trainer on a real tiny LM and the real House env (CPU, a few seconds each)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch as th
from stable_baselines3.common.logger import configure

from milegpo.algos import (
    ALGORITHMS,
    GRPO,
    CheckpointCallback,
    CheckpointError,
    EvalCallback,
    GiGPO,
    MileGPO,
    evaluate,
    evaluate_policy,
    latest_checkpoint,
)
from milegpo.algos.update import optimizer_step
from milegpo.config import AlgoConfig
from milegpo.envs.house import HouseEnv
from milegpo.envs.vec_env import make_vec_env

HORIZON = 6


def house(n_tasks: int = 2, group_size: int = 2, split: str = "train", seed: int = 0):
    return make_vec_env(HouseEnv, n_tasks=n_tasks, group_size=group_size, seed=seed,
                        env_kwargs={"split": split, "max_episode_steps": HORIZON})


def policy_kwargs(path: str, **extra) -> dict:
    return {"model": path, "mode": "choose", "history_length": 0, "prompt_template": "{observation}",
            "temperature": 5.0, **extra}


def make(cls, path: str, env=None, **kwargs):
    kwargs = {"learning_rate": 1e-2, "seed": 0, **kwargs}
    return cls("LLMPolicy", env if env is not None else house(), policy_kwargs=policy_kwargs(path), **kwargs)


def params(model) -> dict[str, th.Tensor]:
    return {name: p.detach().clone() for name, p in model.policy.model.named_parameters()}


def test_learn_changes_only_lora_weights_and_logs_one_row_per_iteration(model_path: str, tmp_path: Path) -> None:
    model = make(MileGPO, model_path, batch_size=8)
    model.set_logger(configure(str(tmp_path), ["csv"]))
    before = params(model)
    model.learn(total_timesteps=2 * 2 * 2 * HORIZON)  # at most 2 iterations of 4 episodes of <= 6 steps
    after = params(model)
    lora = {n for n, p in model.policy.model.named_parameters() if p.requires_grad}
    assert lora and all("lora_" in n for n in lora)
    assert any(not th.equal(before[n], after[n]) for n in lora)
    assert all(th.equal(before[n], after[n]) for n in before if n not in lora)
    assert model._iterations >= 1 and model._n_updates >= model._iterations
    # timesteps are env steps of active envs: the buffer's steps of the last rollout are among them
    assert model.num_timesteps % 1 == 0 and model.rollout_buffer.num_steps <= model.num_timesteps

    rows = (tmp_path / "progress.csv").read_text().splitlines()
    header = rows[0].split(",")
    for key in ("rollout/success_rate", "rollout/ep_rew_mean", "rollout/ep_len_mean", "rollout/invalid_action_rate",
                "rollout/env_errors", "train/loss", "train/pg_loss", "train/entropy", "train/clip_fraction",
                "train/grad_norm", "train/skipped_steps", "time/rollout_tokens_per_s", "time/update_tokens_per_s",
                "time/env_steps_per_s", "credit/ties_broken", "credit/sign_flip_frac"):
        assert key in header, key
    assert len(rows) - 1 == model._iterations  # one row per iteration, dumped after its update
    first = dict(zip(header, rows[1].split(",")))
    assert first["train/loss"] != "" and first["rollout/success_rate"] != ""
    lines = (tmp_path / "credit_diagnostics.jsonl").read_text().splitlines()
    assert len(lines) == model._iterations
    row = json.loads(lines[0])
    assert row["method"] == "milegpo" and "milestones" in row["diagnostics"]


def test_timesteps_count_only_active_env_steps(model_path: str) -> None:
    model = make(GRPO, model_path)
    model.learn(total_timesteps=1)  # exactly one rollout
    lengths = [len(t.steps) for t in model.rollout_buffer.trajectories]
    assert model._iterations == 1 and model.num_timesteps == sum(lengths)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_plugs_into_the_same_trainer(model_path: str, name: str) -> None:
    cls = ALGORITHMS[name]
    model = make(cls, model_path, credit_preset="alfworld")
    assert model.credit_method == name
    model.learn(total_timesteps=1)
    advantages = model.rollout_buffer.advantages
    assert advantages is not None and len(advantages) == model.rollout_buffer.num_steps
    assert np.all(np.isfinite(advantages)) and model._n_updates == 1


def test_credit_kwargs_and_presets_reach_the_credit_config(model_path: str) -> None:
    model = make(MileGPO, model_path, credit_preset="webshop", credit_kwargs={"eta": 0.0})
    assert model.credit_config.eta == 0.0 and model.credit_config.theta_m == 0.5  # preset, then override
    with pytest.raises(ValueError, match="no field"):
        make(GiGPO, model_path, credit_kwargs={"no_such_field": 1})
    with pytest.raises(ValueError, match="credit_preset"):
        make(MileGPO, model_path, credit_preset="atari")


def test_wrong_env_and_non_plain_policy_kwargs_are_refused(model_path: str) -> None:
    with pytest.raises(TypeError, match="make_vec_env"):
        MileGPO("LLMPolicy", HouseEnv(), policy_kwargs=policy_kwargs(model_path))
    with pytest.raises(TypeError, match="make_vec_env"):
        MileGPO("LLMPolicy", "milegpo/House-v0", policy_kwargs=policy_kwargs(model_path))
    with pytest.raises(ValueError, match="policy.model must be a model name or path"):
        MileGPO("LLMPolicy", house(), policy_kwargs={**policy_kwargs(model_path), "model": object()})
    with pytest.raises(ValueError, match=r"unknown setting\(s\) policy.rollout_backend"):
        MileGPO("LLMPolicy", house(), policy_kwargs={**policy_kwargs(model_path), "rollout_backend": "vllm"})
    with pytest.raises(ValueError, match="GRPO assigns credit with 'grpo', but its config's method is 'milegpo'"):
        GRPO("LLMPolicy", house(), AlgoConfig(), policy_kwargs=policy_kwargs(model_path))


def test_non_finite_loss_skips_the_step(model_path: str, caplog: pytest.LogCaptureFixture) -> None:
    model = make(GRPO, model_path)
    model.learn(total_timesteps=1)
    before = params(model)
    state = {k: v.clone() for k, v in model.optimizer.state_dict()["state"][0].items()}
    model.rollout_buffer.advantages[0] = np.nan  # a NaN advantage makes the loss NaN
    with caplog.at_level(logging.WARNING, logger="milegpo.algos.base"):
        model.train()
    assert "optimizer step skipped" in caplog.text
    assert model._skipped_steps == 1 and model._n_updates == 1  # the first update happened, this one not
    after = params(model)
    assert all(th.equal(before[n], after[n]) for n in before)
    assert all(th.equal(v, model.optimizer.state_dict()["state"][0][k]) for k, v in state.items())


def test_gradient_accumulation_matches_one_pass(model_path: str) -> None:
    model = make(MileGPO, model_path, learning_rate=0.0, loss_agg="seq-mean-token-mean")
    model.learn(total_timesteps=1)
    (minibatch,) = model.rollout_buffer.get(np.random.default_rng(0))  # the whole rollout as one minibatch
    grads = []
    for budget in (10**9, 1):  # one forward pass, then one step per micro-batch
        model.micro_batch_tokens = budget
        ok, info = optimizer_step(model.policy, model.optimizer, minibatch, model.update_settings, model.world)
        assert ok
        grads.append([p.grad.clone() for p in model.policy.trainable_parameters()])
    for g1, g2 in zip(*grads):
        th.testing.assert_close(g1, g2, atol=1e-6, rtol=1e-4)


def test_kl_to_reference_is_zero_at_the_start(model_path: str) -> None:
    model = make(MileGPO, model_path, kl_coef=0.05, learning_rate=0.0)
    model.learn(total_timesteps=1)
    (minibatch,) = model.rollout_buffer.get(np.random.default_rng(0))
    ok, info = optimizer_step(model.policy, model.optimizer, minibatch, model.update_settings, model.world)
    assert ok and info["kl"] == pytest.approx(0.0, abs=1e-6)  # LoRA B starts at 0: policy == reference
    assert info["approx_kl"] == pytest.approx(0.0, abs=1e-6) and info["clip_fraction"] == 0.0


def test_save_load_gives_identical_logprobs_and_resumes_counters(model_path: str, tmp_path: Path) -> None:
    model = make(MileGPO, model_path, credit_preset="alfworld")
    model.learn(total_timesteps=1)
    model.learn(total_timesteps=1, reset_num_timesteps=False)
    samples = model.rollout_buffer.samples
    model.save(tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["adapter", "config.json", "optimizer.pt"]

    loaded = MileGPO.load(tmp_path / "ckpt", env=house())
    with th.no_grad():
        lp1, _, _ = model.policy.evaluate_actions(samples)
        lp2, _, _ = loaded.policy.evaluate_actions(samples)
    th.testing.assert_close(lp1, lp2, atol=1e-6, rtol=0)
    assert (loaded.num_timesteps, loaded._n_updates, loaded._iterations) == (
        model.num_timesteps, model._n_updates, model._iterations)
    assert loaded.config.credit_preset == "alfworld" and loaded.learning_rate == model.learning_rate
    assert loaded.config == model.config and loaded.policy_config == model.policy_config
    s1, s2 = model.optimizer.state_dict()["state"], loaded.optimizer.state_dict()["state"]
    assert s1.keys() == s2.keys() and all(th.equal(s1[k]["exp_avg"], s2[k]["exp_avg"]) for k in s1)

    # resuming continues from the saved step: same next tasks, counters go on
    steps = model.num_timesteps
    model.learn(total_timesteps=1, reset_num_timesteps=False)
    loaded.learn(total_timesteps=1, reset_num_timesteps=False)
    seeds = [[t.task_seed for t in m.rollout_buffer.trajectories] for m in (model, loaded)]
    assert seeds[0] == seeds[1]
    assert loaded.num_timesteps > steps and loaded._iterations == 3


def test_optimizer_settings_reach_training_and_survive_save_load(model_path: str, tmp_path: Path) -> None:
    kwargs = policy_kwargs(model_path, optimizer_class="torch.optim:SGD", optimizer_kwargs={"momentum": 0.5})
    model = GRPO("LLMPolicy", house(), learning_rate=1e-2, seed=0, policy_kwargs=kwargs)
    assert type(model.optimizer) is th.optim.SGD and model.optimizer is model.policy.optimizer
    assert model.optimizer.param_groups[0]["momentum"] == 0.5
    model.learn(24)
    assert any("momentum_buffer" in state for state in model.optimizer.state.values())  # it is the one stepping
    model.save(tmp_path / "ckpt")
    loaded = GRPO.load(tmp_path / "ckpt", house())
    assert type(loaded.optimizer) is th.optim.SGD and loaded.optimizer.param_groups[0]["momentum"] == 0.5
    default = make(GRPO, model_path, weight_decay=0.1)  # AdamW with the algorithm's weight decay
    assert type(default.optimizer) is th.optim.AdamW and default.optimizer.param_groups[0]["weight_decay"] == 0.1
    with pytest.raises(ValueError, match="names no torch optimizer"):
        GRPO("LLMPolicy", house(), policy_kwargs=policy_kwargs(model_path, optimizer_class="torch.optim:Nope"))


def test_save_is_atomic_and_overwrites(model_path: str, tmp_path: Path) -> None:
    model = make(GRPO, model_path)
    model.save(tmp_path / "ckpt")
    model.num_timesteps = 123
    model.save(tmp_path / "ckpt")
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["counters"]["num_timesteps"] == 123
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temporary directories left


def test_remove_stale_saves_deletes_unfinished_saves_and_puts_back_a_moved_aside_checkpoint(tmp_path: Path) -> None:
    from milegpo.algos.checkpoint import remove_stale_saves

    for name in ("checkpoint_8_steps", ".checkpoint_8_steps.old-0123abcd", ".checkpoint_12_steps.tmp-89abcdef",
                 ".final.old-aaaabbbb", ".final.tmp-ccccdddd", ".git", ".notes.tmp-keep"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "marker").write_text(name)
    (tmp_path / ".loose.tmp-00001111").write_text("a file, not a save folder")

    done = remove_stale_saves(tmp_path)
    # final/ had been moved aside and its replacement never arrived: it comes back
    assert (tmp_path / "final" / "marker").read_text() == ".final.old-aaaabbbb"
    assert (tmp_path / "checkpoint_8_steps" / "marker").read_text() == "checkpoint_8_steps"  # the new one stays
    assert sorted(p.name for p in tmp_path.iterdir()) == [".git", ".loose.tmp-00001111", ".notes.tmp-keep",
                                                          "checkpoint_8_steps", "final"]
    assert len(done) == 4 and any("put back final" in line for line in done)
    assert remove_stale_saves(tmp_path) == [] and remove_stale_saves(tmp_path / "missing") == []


def _tamper_config(path: Path, edit) -> None:
    config = json.loads((path / "config.json").read_text())
    edit(config)
    (path / "config.json").write_text(json.dumps(config))


def test_corrupt_or_mismatching_checkpoints_are_refused(model_path: str, tmp_path: Path) -> None:
    import shutil

    model = make(MileGPO, model_path)
    good = tmp_path / "good"
    model.save(good)

    def copy(name: str) -> Path:
        target = tmp_path / name
        shutil.copytree(good, target)
        return target

    with pytest.raises(CheckpointError, match="no checkpoint directory"):
        MileGPO.load(tmp_path / "missing", env=house())
    broken = copy("no_optimizer")
    (broken / "optimizer.pt").unlink()
    with pytest.raises(CheckpointError, match="missing optimizer.pt"):
        MileGPO.load(broken, env=house())
    broken = copy("bad_json")
    (broken / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="corrupt config.json"):
        MileGPO.load(broken, env=house())
    broken = copy("bad_weights")  # truncated: reported as corrupt, not as a mismatch
    weights = broken / "adapter" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:64])
    with pytest.raises(CheckpointError, match="is corrupt: adapter/adapter_model.safetensors has 64 bytes"):
        MileGPO.load(broken, env=house())
    broken = copy("flipped_weights")  # same size, other bytes
    data = bytearray((good / "adapter" / "adapter_model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (broken / "adapter" / "adapter_model.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="is corrupt: .*SHA-256"):
        MileGPO.load(broken, env=house())
    broken = copy("bad_optimizer")
    (broken / "optimizer.pt").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="is corrupt: optimizer.pt"):
        MileGPO.load(broken, env=house())
    broken = copy("bad_optimizer_no_manifest")  # checkpoints of older versions have no manifest
    (broken / "optimizer.pt").write_bytes(b"garbage")
    _tamper_config(broken, lambda c: c.pop("files"))
    with pytest.raises(CheckpointError, match="optimizer state"):
        MileGPO.load(broken, env=house())
    broken = copy("other_rank")  # the policy is built with r=4, the adapter has r=16
    _tamper_config(broken, lambda c: c["policy"]["config"]["lora"].update(r=4))
    with pytest.raises(CheckpointError, match="does not fit"):
        MileGPO.load(broken, env=house())
    broken = copy("other_base")
    _tamper_config(broken, lambda c: c["base_model"].update(hidden_size=4096))
    with pytest.raises(CheckpointError, match="base model"):
        MileGPO.load(broken, env=house())
    with pytest.raises(CheckpointError, match="saved by MileGPO"):
        GRPO.load(good, env=house())
    # the good one still loads, also without an env (prediction only), and can be given one later
    loaded = MileGPO.load(good)
    assert loaded.env is None
    with pytest.raises(ValueError, match="no env"):
        loaded.learn(1)
    loaded.set_env(house(n_tasks=1, group_size=3))
    loaded.learn(1)
    assert loaded.rollout_buffer.num_steps > 0


def test_checkpoint_callback_keeps_the_last_and_a_killed_run_resumes(model_path: str, tmp_path: Path) -> None:
    model = make(GRPO, model_path)
    folder = tmp_path / "ckpts"
    model.learn(total_timesteps=3 * 24, callback=CheckpointCallback(1, folder, keep_last=1))
    kept = [p.name for p in folder.iterdir()]
    assert kept == [f"checkpoint_{model.num_timesteps}_steps"]
    last = latest_checkpoint(folder)
    resumed = GRPO.load(last, env=house())
    assert resumed.num_timesteps == model.num_timesteps and resumed._iterations == model._iterations


def test_evaluate_on_held_out_tasks(model_path: str) -> None:
    model = make(MileGPO, model_path)
    env = house(n_tasks=2, group_size=1, split="eval_id")
    result = evaluate(model, env, n_episodes=3)
    assert result["n_episodes"] == 3 and [t["task_seed"] for t in result["per_task"]] == [0, 1, 2]
    assert 0.0 <= result["success_rate"] <= 1.0 and 1 <= result["mean_length"] <= HORIZON
    again = evaluate(model.policy, env, task_seeds=[0, 1, 2])  # greedy on a deterministic env: the same
    assert again["per_task"] == result["per_task"]
    mean, std = evaluate_policy(model, env, n_eval_episodes=2)
    assert np.isfinite(mean) and std >= 0
    with pytest.raises(ValueError, match="exactly one"):
        evaluate(model, env)


def test_eval_callback_writes_the_learning_curve(model_path: str, tmp_path: Path) -> None:
    model = make(GRPO, model_path)
    model.set_logger(configure(str(tmp_path), ["csv"]))
    callback = EvalCallback(house(n_tasks=2, group_size=1, split="eval_id"), eval_freq=1, n_eval_tasks=2,
                            deterministic=False, temperature=0.4)
    model.learn(total_timesteps=2 * 24, callback=callback, progress_bar=True)
    rows = [json.loads(line) for line in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == list(range(0, model._iterations + 1))  # 0: the untrained policy
    assert rows[0]["num_timesteps"] == 0
    assert all(r["n_episodes"] == 2 and len(r["per_task"]) == 2 for r in rows)
    assert model.policy.temperature == 5.0  # the evaluation temperature was only borrowed


class CrashingHouse(HouseEnv):
    """House whose engine raises at the 3rd step of even tasks (fault injection), with a message that
    changes on every call (as one naming a request id or a time would)."""

    calls = 0

    def _step(self, action: str):
        if self.task_index % 2 == 0 and self._elapsed_steps == 3:
            CrashingHouse.calls += 1
            raise RuntimeError(f"engine crashed (request {CrashingHouse.calls})")
        return super()._step(action)


def test_env_errors_truncate_episodes_and_training_goes_on(model_path: str, tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    env = make_vec_env(CrashingHouse, n_tasks=2, group_size=2, seed=0, env_kwargs={"max_episode_steps": HORIZON})
    env.errors.path = tmp_path / "env_errors.log"
    model = make(MileGPO, model_path, env=env)
    model.set_logger(configure(str(tmp_path), ["csv"]))
    with caplog.at_level("WARNING", logger="milegpo.envs.vec_env"):
        model.learn(total_timesteps=1)
    # one console line for the one kind of error (its type and raising line, whatever its message says); its
    # traceback in the file at the 1st, 10th, 100th... occurrence
    warned = [r.getMessage() for r in caplog.records if "engine crashed" in r.getMessage()]
    assert len(warned) == 1 and "Traceback" not in warned[0] and str(env.errors.path) in warned[0]
    [kind] = env.errors.counts
    assert kind.startswith("RuntimeError in step() at test_algos.py:") and env.errors.counts[kind] >= 2
    assert env.errors.path.read_text().count("Traceback (most recent call last)") == 1  # total 2..9: the 1st
    seeds = [t.task_seed for t in model.rollout_buffer.trajectories]
    crashed = [t for t in model.rollout_buffer.trajectories if t.task_seed % 2 == 0]
    assert crashed, f"no even task drawn: {seeds}"
    assert all(t.env_error and len(t.steps) == 2 and t.steps[-1].done for t in crashed)
    header, row = (tmp_path / "progress.csv").read_text().splitlines()[:2]
    assert float(dict(zip(header.split(","), row.split(",")))["rollout/env_errors"]) == len(crashed)
    assert model._n_updates == 1


def test_a_users_iteration_callback_runs_after_every_update_and_at_the_last(model_path: str) -> None:
    from milegpo.algos import IterationCallback

    class Record(IterationCallback):
        def __init__(self):
            super().__init__(freq=2)
            self.seen: list[tuple[int, int]] = []

        def _on_iteration(self) -> None:
            self.seen.append((self.model.iterations, self.model.num_timesteps))

    model = make(MileGPO, model_path, batch_size=8)
    record = Record()
    model.learn(total_timesteps=3 * 16, callback=[record])  # 3 iterations of 16 steps or so: 2, then the last
    iterations = [i for i, _ in record.seen]
    assert iterations[0] == 2 and iterations[-1] == model.iterations and record.seen[-1][1] == model.num_timesteps
    assert model.timestep_budget == 3 * 16
