"""milegpo credit inside verl / verl-agent, on real ``verl.DataProto`` batches in verl-agent's
step-level layout (verl 0.9.1, installed in CI; see the README for the install line)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from milegpo.credit import CREDIT_METHODS, StepBatch, compute_credit
from milegpo.integrations import verl as milegpo_verl

if os.environ.get("MILEGPO_CI"):
    import verl  # noqa: F401  CI installs verl: a missing package is a failure there
else:
    pytest.importorskip("verl",
                        reason="pip install --no-deps verl==0.9.1 torchdata==0.11.0 && pip install -e '.[verl]'")
from omegaconf import DictConfig, OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402

# Two tasks; trajectories of different lengths, an invalid action (state unchanged), a revisit.
#   task A: success s0 -> a -> b (won at the 3rd step), failures s0 -> c -> c(invalid) -> d -> e -> c and s0 -> a -> d
#   task B: success t0 -> u (won), failure t0 -> v -> v -> w
EPISODES = [
    ("A", ["s0", "a", "b"], [0, 0, 10], [True, True, True]),
    ("A", ["s0", "c", "c", "d", "e", "c"], [0, 0, 0, 0, 0, 0], [True, False, True, True, True, True]),
    ("A", ["s0", "a", "d"], [0, 0, 0], [True, True, True]),
    ("B", ["t0", "u"], [0, 10], [True, True]),
    ("B", ["t0", "v", "v", "w"], [0, 0, 0, 0], [True, True, True, True]),
]
PENALTY = 0.1
RESPONSE_LENGTH = 7


def verl_agent_batch(episodes=EPISODES, inactive_rows: int = 0) -> DataProto:
    """The rows verl-agent's rollout loop gathers: env by env, each trajectory's steps in order,
    reply lengths varying; ``inactive_rows`` padding rows with active_masks False at the end."""
    uid, traj, anchor, rewards, valid, lengths = [], [], [], [], [], []
    for i, (task, states, rews, oks) in enumerate(episodes):
        for t, (state, reward, ok) in enumerate(zip(states, rews, oks)):
            uid.append(f"task-{task}")
            traj.append(f"traj-{i}")
            anchor.append(f"Observation: {state}")
            rewards.append(float(reward))
            valid.append(ok)
            lengths.append(1 + (3 * i + t) % RESPONSE_LENGTH)
    active = [True] * len(uid) + [False] * inactive_rows
    for _ in range(inactive_rows):
        uid.append("task-A"), traj.append("padding"), anchor.append("x"), rewards.append(0.0), valid.append(True)
        lengths.append(3)
    mask = torch.zeros(len(uid), RESPONSE_LENGTH)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    non_tensors = {"uid": np.array(uid, dtype=object), "traj_uid": np.array(traj, dtype=object),
                   "anchor_obs": np.array(anchor, dtype=object), "rewards": np.array(rewards, dtype=np.float32),
                   "is_action_valid": np.array(valid), "active_masks": np.array(active)}
    prompts = torch.ones(len(uid), 4, dtype=torch.long)
    tensors = {"prompts": prompts, "responses": torch.ones(len(uid), RESPONSE_LENGTH, dtype=torch.long),
               "attention_mask": torch.cat([torch.ones_like(prompts), mask.long()], dim=1), "response_mask": mask,
               "token_level_scores": torch.zeros_like(mask), "token_level_rewards": torch.zeros_like(mask)}
    data = DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)
    milegpo_verl.add_step_index(data)  # what install() writes while verl-agent gathers the rollout
    return data


def our_batch(episodes=EPISODES) -> StepBatch:
    """The same episodes as milegpo's own trainer records them (rewards include the penalty)."""
    tasks = sorted({task for task, *_ in episodes})
    states, success, task_ids, rewards, valid = [], [], [], [], []
    for task, keys, rews, oks in episodes:
        won = sum(rews) >= 10
        end = [] if won else [f"end-{len(states)}"]
        states.append([f"Observation: {k}" for k in keys] + (["goal"] if won else end))
        success.append(won)
        task_ids.append(tasks.index(task))
        rewards.append([r - PENALTY * (not ok) for r, ok in zip(rews, oks)])
        valid.append(oks)
    return StepBatch.from_trajectories(states, success, task_ids=task_ids, rewards=rewards, valid=valid,
                                       outcomes=[float(sum(r)) for _, _, r, _ in episodes])


def row_values(advantages: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    """The one value per row the token-level tensor carries (checked constant over the reply)."""
    values = advantages[:, 0].numpy()
    assert torch.equal(advantages, advantages[:, :1] * mask)
    return values


@pytest.mark.parametrize("method", CREDIT_METHODS)
def test_the_adapter_gives_our_credit_on_the_same_episodes(method: str) -> None:
    data = verl_agent_batch()
    advantages, returns, credit = milegpo_verl.compute_step_advantage(data, method, invalid_action_penalty=PENALTY)
    assert advantages.shape == returns.shape == data.batch["response_mask"].shape
    assert torch.equal(advantages, returns)
    want = compute_credit(method, our_batch()).advantages
    assert row_values(advantages, data.batch["response_mask"]) == pytest.approx(want, rel=1e-6, abs=1e-6)
    assert np.abs(want).max() > 0  # the comparison is not between zeros


def test_presets_and_overrides_reach_the_credit_config() -> None:
    data = verl_agent_batch()
    mile, _, _ = milegpo_verl.compute_step_advantage(data, "milegpo", {"eta": 0.0})
    graph, _, _ = milegpo_verl.compute_step_advantage(data, "graphgpo")
    assert torch.allclose(mile, graph, atol=1e-6)  # eta = 0: MileGPO is GraphGPO
    webshop, _, credit = milegpo_verl.compute_step_advantage(data, "milegpo", {"preset": "webshop"})
    assert not torch.allclose(webshop, graph) and credit.diagnostics["method"] == "milegpo"


def test_more_turns_do_not_weigh_more_in_the_episode_term() -> None:
    # a 2-step success and an 8-step failure of one task: GRPO gives +-1/sqrt(2) on every row of each,
    # whatever their lengths; verl-agent's row statistics (upstream_exact) let the long failure pull the mean
    episodes = [("A", ["s0", "a"], [0, 10], [True, True]), ("A", ["s0"] + ["b"] * 7, [0] * 8, [True] * 8)]
    data = verl_agent_batch(episodes)
    ours = row_values(milegpo_verl.compute_step_advantage(data, "grpo")[0], data.batch["response_mask"])
    assert ours == pytest.approx([2 ** -0.5] * 2 + [-(2 ** -0.5)] * 8, rel=1e-5)
    rows = row_values(milegpo_verl.compute_step_advantage(data, "grpo", {"upstream_exact": True})[0],
                      data.batch["response_mask"])
    # row scores [10, 10, 0 x 8]: mean 2, unbiased std 4.216 -> +1.897 and -0.474
    assert rows == pytest.approx([8 / np.std([10, 10] + [0] * 8, ddof=1)] * 2
                                 + [-2 / np.std([10, 10] + [0] * 8, ddof=1)] * 8, rel=1e-5)


def test_inactive_rows_get_zero_and_are_left_out_of_the_groups() -> None:
    data = verl_agent_batch(inactive_rows=3)
    advantages, _, _ = milegpo_verl.compute_step_advantage(data, "milegpo")
    n = len(data) - 3
    assert torch.all(advantages[n:] == 0)
    want = compute_credit("milegpo", our_batch()).advantages
    assert row_values(advantages[:n], data.batch["response_mask"][:n]) == pytest.approx(want, rel=1e-6, abs=1e-6)


def test_missing_columns_say_what_is_needed() -> None:
    data = verl_agent_batch()
    data.non_tensor_batch.pop("anchor_obs")
    with pytest.raises(KeyError, match="anchor_obs.*step-level columns"):
        milegpo_verl.compute_step_advantage(data, "gigpo")


def trainer_config(estimator: str = "milegpo", milegpo: dict | None = None, **algorithm) -> DictConfig:
    """The parts of verl-agent's ppo_trainer.yaml the estimator reads, at verl-agent's defaults."""
    algo = {"adv_estimator": estimator, "gamma": 1.0, "lam": 1.0, "norm_adv_by_std_in_grpo": True,
            "use_kl_in_reward": False,
            "gigpo": {"step_advantage_w": 1.0, "mode": "mean_norm", "enable_similarity": False,
                      "similarity_thresh": 0.95}, **algorithm}
    if milegpo is not None:
        algo["milegpo"] = milegpo
    return OmegaConf.create({"algorithm": algo, "actor_rollout_ref": {"actor": {
        "use_invalid_action_penalty": True, "invalid_action_penalty_coef": PENALTY}}})


def advantages_under(config, data=None) -> np.ndarray:
    settings = milegpo_verl.settings_from_config(config)
    data = verl_agent_batch() if data is None else data
    advantages, _, _ = milegpo_verl.compute_step_advantage(
        data, settings.method, settings.credit, success=settings.success,
        invalid_action_penalty=settings.invalid_action_penalty)
    return row_values(advantages, data.batch["response_mask"])


def balanced_and_padded(data: DataProto, world_size: int, seed: int) -> tuple[DataProto, np.ndarray]:
    """What verl-agent's fit() does before compute_advantage: adjust_batch's copy mode (DataProto.select_idxs
    of random rows, concatenated, up to a multiple of the divisor) then _balance_batch (verl's seqlen-balanced
    partitions, DataProto.reorder). Returns the batch and, per row, the original row it holds."""
    from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions

    rng = np.random.default_rng(seed)
    extra_rows = (-len(data)) % world_size + world_size * (seed % 2)
    copies = rng.choice(len(data), extra_rows, replace=False)
    padded = DataProto.concat([data, data.select_idxs(copies)])
    source = np.concatenate([np.arange(len(data)), copies])
    lengths = padded.batch["response_mask"].sum(-1).int().tolist()
    order = [j for part in get_seqlen_balanced_partitions(lengths, k_partitions=world_size, equal_size=True)
             for j in part]
    padded.reorder(torch.tensor(order))
    return padded, source[order]


@pytest.mark.parametrize("method", CREDIT_METHODS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reordered_and_duplicated_rows_get_their_steps_advantage(method: str, seed: int) -> None:
    data = verl_agent_batch()
    want = row_values(milegpo_verl.compute_step_advantage(data, method)[0], data.batch["response_mask"])
    shuffled, source = balanced_and_padded(verl_agent_batch(), world_size=4, seed=seed)
    assert not np.array_equal(source[: len(data)], np.arange(len(data)))  # the order really changed
    got = row_values(milegpo_verl.compute_step_advantage(shuffled, method)[0], shuffled.batch["response_mask"])
    assert np.abs(got - want[source]).max() <= 1e-6
    assert np.abs(want).max() > 0


def test_a_batch_without_the_step_column_is_refused_with_the_cause() -> None:
    data = verl_agent_batch()
    data.non_tensor_batch.pop(milegpo_verl.STEP_COLUMN)
    with pytest.raises(KeyError, match="milegpo_step.*balance_batch.*main_ppo"):
        milegpo_verl.compute_step_advantage(data, "milegpo")


def test_missing_steps_and_inconsistent_copies_are_refused() -> None:
    data = verl_agent_batch()
    dropped = data.select_idxs(np.delete(np.arange(len(data)), 1))  # adjust_batch's "delete" mode
    with pytest.raises(ValueError, match="traj-0.*steps \\[0, 2\\].*missing"):
        milegpo_verl.compute_step_advantage(dropped, "milegpo")
    data.non_tensor_batch[milegpo_verl.STEP_COLUMN][4] = 0  # a step index written after a reorder
    with pytest.raises(ValueError, match="both step 0 of trajectory 'traj-1'"):
        milegpo_verl.compute_step_advantage(data, "milegpo")


def test_a_non_finite_reward_is_refused() -> None:
    data = verl_agent_batch()
    data.non_tensor_batch["rewards"][3] = np.nan
    with pytest.raises(ValueError, match="nan at row 3.*non-finite"):
        milegpo_verl.compute_step_advantage(data, "grpo")


def test_collector_rows_are_annotated_in_rollout_order() -> None:
    # verl-agent's total_batch_list: per env its step dicts, inactive steps after the episode ended
    lists = [[{"active_masks": True}, {"active_masks": True}, {"active_masks": False}],
             [{"active_masks": True}, {"active_masks": False}, {"active_masks": False}]]
    milegpo_verl.annotate_rollout(lists, {"success_rate": np.array([1.0, 0.0])})
    assert [r.get("milegpo_step") for r in lists[0]] == [0, 1, None]
    assert [r.get("milegpo_won") for r in lists[0] + lists[1]] == [True, True, None, False, None, None]


def test_success_comes_from_the_envs_won_when_the_batch_has_it() -> None:
    # verl-agent's search env pays 1.0 for a correct answer: the reward rule (>= 10) sees no success, won does
    episodes = [("A", ["q", "x"], [0, 1.0], [True, True]), ("A", ["q", "y"], [0, 0.0], [True, True])]

    def success(data, **rule):
        return milegpo_verl.step_batch_from_verl(data, success=milegpo_verl.SuccessRule(**rule))[0].success.tolist()

    data = verl_agent_batch(episodes)
    assert success(data) == [False, False]
    assert success(data, success_reward=1.0) == [True, False]
    with pytest.raises(KeyError, match="milegpo_won"):
        success(data, source="won")
    data.non_tensor_batch[milegpo_verl.WON_COLUMN] = np.array([True, True, False, False])
    assert success(data) == success(data, source="won") == [True, False]
    assert success(data, source="reward") == [False, False]
    # and the credit follows: the successful trajectory's steps now lead to the goal
    by_rule = advantages_under(trainer_config("graphgpo"), verl_agent_batch(episodes))
    by_won = advantages_under(trainer_config("graphgpo"), data)
    assert by_won[0] > by_rule[0] + 0.5  # the first step from the shared state "q" now separates


def test_verl_agents_keys_change_the_result() -> None:
    base = advantages_under(trainer_config("milegpo.gigpo"))
    assert not np.allclose(base, advantages_under(trainer_config("milegpo.gigpo", gamma=0.5)))
    no_step = trainer_config("milegpo.gigpo", gigpo={"step_advantage_w": 0.0, "mode": "mean_norm",
                                                     "enable_similarity": False})
    assert not np.allclose(base, advantages_under(no_step))
    assert not np.allclose(base, advantages_under(trainer_config("milegpo.gigpo", gigpo={"mode": "mean_std_norm"})))
    grpo_std, grpo_mean = (advantages_under(trainer_config("milegpo.grpo", norm_adv_by_std_in_grpo=flag))
                           for flag in (True, False))
    assert not np.allclose(grpo_std, grpo_mean)
    hgpo = advantages_under(trainer_config("hgpo"))
    assert not np.allclose(hgpo, advantages_under(trainer_config("hgpo", gamma=0.5)))
    penalty_off = trainer_config("milegpo.gigpo")  # the penalty is a step reward: GiGPO's step returns see it
    penalty_off.actor_rollout_ref.actor.use_invalid_action_penalty = False
    assert milegpo_verl.settings_from_config(penalty_off).invalid_action_penalty == 0.0
    assert not np.allclose(base, advantages_under(penalty_off))


def test_milegpo_keys_reach_the_credit_config() -> None:
    settings = milegpo_verl.settings_from_config(trainer_config("milegpo", {"preset": "webshop", "eta": 0.5}))
    assert settings.method == "milegpo" and settings.credit.eta == 0.5 and settings.credit.rho == 0.5
    eta0 = advantages_under(trainer_config("milegpo", {"eta": 0.0}))
    assert np.allclose(eta0, advantages_under(trainer_config("graphgpo")), atol=1e-6)


@pytest.mark.parametrize("config, message", [
    (trainer_config("milegpo", {"etaa": 0.5}), "algorithm.milegpo for 'milegpo'.*etaa"),
    (trainer_config("milegpo", {"success": "maybe"}), "success source"),
    (trainer_config("milegpo.gigpo", {"gamma": 0.9}, gamma=0.95), "algorithm.milegpo.gamma.*algorithm.gamma"),
    (trainer_config("milegpo", use_kl_in_reward=True), "use_kl_in_reward"),
    (trainer_config("milegpo", gigpo={"enable_similarity": True}), "enable_similarity"),
    (trainer_config("gigpo"), "not a milegpo estimator"),
])
def test_keys_that_cannot_be_honoured_are_refused(config, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        milegpo_verl.settings_from_config(config)


@pytest.fixture
def installed_trainer_module():
    """verl 0.9.1's real ray_trainer module with milegpo installed; restored afterwards."""
    ray_trainer = pytest.importorskip("verl.trainer.ppo.ray_trainer")
    saved = (ray_trainer.compute_advantage, ray_trainer.RayPPOTrainer.__init__, ray_trainer.compute_data_metrics)
    milegpo_verl.install(ray_trainer)
    milegpo_verl.install(ray_trainer)  # idempotent: no double wrap
    yield ray_trainer, saved
    ray_trainer.compute_advantage, ray_trainer.RayPPOTrainer.__init__, ray_trainer.compute_data_metrics = saved


def test_install_routes_the_trainer_and_keeps_every_other_estimator(installed_trainer_module) -> None:
    ray_trainer, (original, _, _) = installed_trainer_module
    assert ray_trainer.compute_advantage.__milegpo_original__ is original
    milegpo_verl.configure(milegpo_verl.settings_from_config(trainer_config("milegpo", {"preset": "webshop"})),
                           "milegpo")
    shuffled, source = balanced_and_padded(verl_agent_batch(), world_size=4, seed=5)
    data = ray_trainer.compute_advantage(shuffled, "milegpo", gamma=1.0, lam=1.0)
    want = compute_credit("milegpo", our_batch(), {"preset": "webshop"}).advantages
    assert row_values(data.batch["advantages"], data.batch["response_mask"]) == pytest.approx(want[source], abs=1e-6)
    metrics = ray_trainer.compute_data_metrics(batch=data, use_critic=False)
    assert metrics["credit/num_trajectories"] == len(EPISODES) and "credit/ties_broken" in metrics
    # verl's own GRPO is untouched: same answer as the original function
    mine, theirs = verl_agent_batch(), verl_agent_batch()
    for batch in (mine, theirs):
        batch.batch["token_level_rewards"][:, 0] = torch.arange(len(batch), dtype=torch.float32) % 3
    ray_trainer.compute_advantage(mine, "grpo")
    original(theirs, "grpo")
    assert torch.equal(mine.batch["advantages"], theirs.batch["advantages"])


def test_the_trainer_constructor_reads_the_settings_and_passes_the_estimator_check(installed_trainer_module) -> None:
    # verl-agent's RayPPOTrainer.__init__ accepts only a fixed list of estimator names; the installed
    # constructor shows it a critic-free one and restores the user's name afterwards
    ray_trainer, _ = installed_trainer_module
    seen = []

    class Checked(ray_trainer.RayPPOTrainer):
        def __init__(self, config):
            seen.append(config.algorithm.adv_estimator)
            if config.algorithm.adv_estimator not in ("grpo", "gae", "gigpo"):
                raise NotImplementedError

    milegpo_verl.install(ray_trainer, collector=None)
    from milegpo.integrations.verl.install import _patched_trainer_init, _swap

    _swap(Checked, "__init__", _patched_trainer_init)
    config = trainer_config("milegpo", {"eta": 0.7})
    Checked(config)
    assert seen == ["grpo"] and config.algorithm.adv_estimator == "milegpo"
    data = ray_trainer.compute_advantage(verl_agent_batch(), "milegpo")
    assert data.meta_info["milegpo_credit"]["credit/num_steps"] == len(verl_agent_batch())
    with pytest.raises(ValueError, match="etaa"):
        Checked(trainer_config("milegpo", {"etaa": 1}))


def test_the_estimator_is_installed_inside_ray_workers() -> None:
    # verl-agent builds its trainer inside a Ray actor (TaskRunner): the setup hook that main_ppo registers
    # in the runtime env installs the estimator there, with no call in the actor's code
    ray = pytest.importorskip("ray")
    from milegpo.integrations.verl.main_ppo import HOOK_OVERRIDE

    hook = HOOK_OVERRIDE.split("=", 1)[1]
    ray.init(num_cpus=1, include_dashboard=False, runtime_env={"worker_process_setup_hook": hook},
             log_to_driver=False)
    try:
        @ray.remote
        class TaskRunner:
            def run(self, data):
                import verl.trainer.ppo.ray_trainer as ray_trainer

                from milegpo.integrations.verl import configure, settings_from_config

                assert hasattr(ray_trainer.compute_advantage, "__milegpo_original__")
                assert hasattr(ray_trainer.RayPPOTrainer.__init__, "__milegpo_original__")
                configure(settings_from_config({"algorithm": {"adv_estimator": "milegpo"}}), "milegpo")
                return ray_trainer.compute_advantage(data, "milegpo").batch["advantages"]

        advantages = ray.get(TaskRunner.remote().run.remote(verl_agent_batch()), timeout=300)
    finally:
        ray.shutdown()
    want = compute_credit("milegpo", our_batch()).advantages
    assert row_values(advantages, verl_agent_batch().batch["response_mask"]) == pytest.approx(want, abs=1e-6)


def test_the_integration_imports_no_trainer_stack() -> None:
    # a verl-agent environment has its own torch/transformers: importing the adapter pulls in neither
    code = ("import sys, milegpo.integrations.verl; "
            "print(sorted(m for m in ('torch', 'transformers', 'peft', 'stable_baselines3', 'verl') if m in "
            "sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_batch_of_only_inactive_rows_gets_zero_advantages() -> None:
    data = verl_agent_batch(inactive_rows=2)
    data.non_tensor_batch["active_masks"][:] = False
    advantages, _, credit = milegpo_verl.compute_step_advantage(data, "milegpo")
    assert torch.all(advantages == 0) and credit.diagnostics["num_steps"] == 0
