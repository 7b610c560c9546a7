"""milegpo credit inside verl / verl-agent, on real ``verl.DataProto`` batches in verl-agent's
step-level layout (verl 0.9.1, installed in CI; see the README for the install line)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

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


def text_anchor(state: str) -> str:
    return f"Observation: {state}"


def verl_agent_batch(episodes=EPISODES, inactive_rows: int = 0, anchor_of=text_anchor,
                     collated: bool = False) -> DataProto:
    """The rows verl-agent's rollout loop gathers: env by env, each trajectory's steps in order,
    reply lengths varying; ``inactive_rows`` padding rows with active_masks False at the end.
    ``anchor_of`` makes each state's anchor observation; ``collated``: the anchor column as
    verl-agent's collate_fn builds it (``np.array(anchors, dtype=object)``, one axis per array axis
    when the anchors are arrays of one shape), else one object per row."""
    uid, traj, anchor, rewards, valid, lengths = [], [], [], [], [], []
    for i, (task, states, rews, oks) in enumerate(episodes):
        for t, (state, reward, ok) in enumerate(zip(states, rews, oks)):
            uid.append(f"task-{task}")
            traj.append(f"traj-{i}")
            anchor.append(anchor_of(state))
            rewards.append(float(reward))
            valid.append(ok)
            lengths.append(1 + (3 * i + t) % RESPONSE_LENGTH)
    active = [True] * len(uid) + [False] * inactive_rows
    for _ in range(inactive_rows):
        uid.append("task-A"), traj.append("padding"), anchor.append(anchor_of("x")), rewards.append(0.0)
        valid.append(True), lengths.append(3)
    mask = torch.zeros(len(uid), RESPONSE_LENGTH)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    anchors = np.empty(len(anchor), dtype=object)
    for row, value in enumerate(anchor):
        anchors[row] = value
    non_tensors = {"uid": np.array(uid, dtype=object), "traj_uid": np.array(traj, dtype=object),
                   "anchor_obs": np.array(anchor, dtype=object) if collated else anchors,
                   "rewards": np.array(rewards, dtype=np.float32),
                   "is_action_valid": np.array(valid), "active_masks": np.array(active)}
    prompts = torch.ones(len(uid), 4, dtype=torch.long)
    tensors = {"prompts": prompts, "responses": torch.ones(len(uid), RESPONSE_LENGTH, dtype=torch.long),
               "attention_mask": torch.cat([torch.ones_like(prompts), mask.long()], dim=1), "response_mask": mask,
               "token_level_scores": torch.zeros_like(mask), "token_level_rewards": torch.zeros_like(mask)}
    data = DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)
    milegpo_verl.add_step_index(data)  # what install() writes while verl-agent gathers the rollout
    return data


def our_batch(episodes=EPISODES) -> StepBatch:
    """The same episodes as milegpo's own trainer records them (rewards, and so outcomes, include the penalty)."""
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
    return StepBatch.from_trajectories(states, success, task_ids=task_ids, rewards=rewards, valid=valid)


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
        "use_invalid_action_penalty": True, "invalid_action_penalty_coef": PENALTY}},
        "reward_model": {"enable": False, "reward_manager": "episode", "launch_reward_fn_async": False},
        "custom_reward_function": {"path": None, "name": "compute_score"}})


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


@pytest.mark.parametrize("method", ["gigpo", "g2po"])
@pytest.mark.parametrize("mode", ["mean_norm", "mean_std_norm"])
def test_reordered_and_duplicated_rows_under_upstream_exact(method: str, mode: str) -> None:
    # the two methods whose upstream_exact is their reference's whole arithmetic, on Sokoban-shaped rewards (the env
    # pays on invalid steps too): verl-agent's balancing and row copies give each row its step's in-order value
    for seed in range(3):
        config = {"upstream_exact": True, "norm": mode}
        data = verl_agent_batch(reward_shaped_episodes("sokoban", seed))
        want = row_values(milegpo_verl.compute_step_advantage(data, method, config)[0], data.batch["response_mask"])
        shuffled, source = balanced_and_padded(verl_agent_batch(reward_shaped_episodes("sokoban", seed)),
                                               world_size=4, seed=seed)
        got = row_values(milegpo_verl.compute_step_advantage(shuffled, method, config)[0],
                         shuffled.batch["response_mask"])
        assert np.abs(got - want[source]).max() <= 1e-6 and np.abs(want).max() > 0


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


def test_the_g2po_forks_keys_configure_milegpo_g2po_only() -> None:
    # the G2PO authors' verl-agent fork has algorithm.g2po.mode and step_advantage_w (mean_norm, 1.0): they set
    # milegpo.g2po's norm and w_step, and are refused off their default for any other estimator
    settings = milegpo_verl.settings_from_config(
        trainer_config("milegpo.g2po", g2po={"mode": "mean_std_norm", "step_advantage_w": 0.5}))
    assert (settings.method, settings.credit.norm, settings.credit.w_step) == ("g2po", "mean_std_norm", 0.5)
    base = advantages_under(trainer_config("milegpo.g2po", g2po={"mode": "mean_norm", "step_advantage_w": 1.0}))
    assert np.array_equal(base, advantages_under(trainer_config("milegpo.g2po")))  # the fork's defaults are ours
    assert not np.allclose(base, advantages_under(trainer_config("milegpo.g2po", g2po={"mode": "mean_std_norm"})))
    assert not np.allclose(base, advantages_under(trainer_config("milegpo.g2po", g2po={"step_advantage_w": 0.0})))
    with pytest.raises(ValueError, match="algorithm.g2po.mode='mean_std_norm' has no effect on 'milegpo'"):
        milegpo_verl.settings_from_config(trainer_config("milegpo", g2po={"mode": "mean_std_norm"}))
    with pytest.raises(ValueError, match="algorithm.g2po.step_advantage_w must be in"):
        milegpo_verl.settings_from_config(trainer_config("milegpo.g2po", g2po={"step_advantage_w": -1.0}))
    with pytest.raises(ValueError, match="set it in one place"):
        milegpo_verl.settings_from_config(trainer_config("milegpo.g2po", {"norm": "mean_norm"},
                                                         g2po={"mode": "mean_norm"}))
    # verl-agent's GiGPO keys do not reach G2PO (its own keys do): set off their default, they are refused
    with pytest.raises(ValueError, match="algorithm.gigpo.mode='mean_std_norm' has no effect on 'milegpo.g2po'"):
        milegpo_verl.settings_from_config(trainer_config("milegpo.g2po", gigpo={"mode": "mean_std_norm"}))


def test_milegpo_keys_reach_the_credit_config() -> None:
    settings = milegpo_verl.settings_from_config(trainer_config("milegpo", {"preset": "webshop", "eta": 0.5}))
    assert settings.method == "milegpo" and settings.credit.eta == 0.5 and settings.credit.rho == 0.5
    eta0 = advantages_under(trainer_config("milegpo", {"eta": 0.0}))
    assert np.allclose(eta0, advantages_under(trainer_config("graphgpo")), atol=1e-6)


@pytest.mark.parametrize("config, message", [
    (trainer_config("milegpo", {"etaa": 0.5}), "algorithm.milegpo for 'milegpo'.*etaa"),
    (trainer_config("milegpo", {"success": "maybe"}), "^algorithm.milegpo.success must be 'auto', 'won' or 'reward'"),
    (trainer_config("milegpo.gigpo", {"gamma": 0.9}, gamma=0.95), "algorithm.milegpo.gamma.*algorithm.gamma"),
    (trainer_config("milegpo", use_kl_in_reward=True), "use_kl_in_reward"),
    (trainer_config("milegpo", gigpo={"enable_similarity": True}), "enable_similarity"),
    (trainer_config("gigpo"), "not a milegpo estimator"),
    (trainer_config("milegpo", {"eta": "abc"}), "algorithm.milegpo.eta must be a number, got 'abc'"),
    (trainer_config("milegpo", {"upstream_exact": "yes"}), "algorithm.milegpo.upstream_exact must be true or false"),
    (trainer_config("milegpo", {"success_reward": "ten"}), "algorithm.milegpo.success_reward must be a number"),
    (trainer_config("milegpo.gigpo", gamma="high"), "algorithm.gamma must be a number, got 'high'"),
    (trainer_config("milegpo.gigpo", gigpo={"step_advantage_w": "x"}), "algorithm.gigpo.step_advantage_w must be"),
    (trainer_config("milegpo", {"memory_half_life": 2.0}), "algorithm.milegpo.memory_half_life=2.0 .*not available"),
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


# ---- anchors keyed by content -------------------------------------------------------------------------------

def image_anchor(state: str) -> np.ndarray:
    """A float image per state (3 x 4 x 4), as vector and image env managers give their anchor."""
    seed = sum(map(ord, state))
    return np.random.default_rng(seed).random((3, 4, 4), dtype=np.float32)


ANCHOR_KINDS = {
    "float32 image": (image_anchor, False),
    "float32 image, collated": (image_anchor, True),
    "uint8 image": (lambda s: (image_anchor(s) * 255).astype(np.uint8), False),
    "torch tensor": (lambda s: torch.from_numpy(image_anchor(s)), False),
    # what verl-agent's rollout loop makes of a torch anchor: torch_to_numpy(x, is_object=True), a float object array
    "torch as object array": (lambda s: image_anchor(s).astype(object), False),
    "bytes": (lambda s: s.encode(), False),
    "list": (lambda s: [s, len(s)], False),
    "dict": (lambda s: {"room": s, "inventory": ("key",)}, False),
}


@pytest.mark.parametrize("kind", ANCHOR_KINDS)
@pytest.mark.parametrize("method", CREDIT_METHODS)
def test_anchors_of_every_kind_group_as_the_text_ones(method: str, kind: str) -> None:
    # every state is one array (or value) per state: the credit must be the text anchors' credit, step groups included
    anchor_of, collated = ANCHOR_KINDS[kind]
    text = verl_agent_batch()
    other = verl_agent_batch(anchor_of=anchor_of, collated=collated)
    want, _, want_credit = milegpo_verl.compute_step_advantage(text, method)
    got, _, credit = milegpo_verl.compute_step_advantage(other, method)
    assert torch.equal(got, want)
    assert credit.diagnostics.get("num_step_groups") == want_credit.diagnostics.get("num_step_groups")


def upstream_hashable(x):
    """verl-agent's gigpo/core_gigpo.py ``to_hashable``, as read (the key its build_step_group groups by)."""
    if isinstance(x, (int, float, str, bool)):
        return x
    if isinstance(x, (np.integer, np.floating)):
        return x.item()
    if isinstance(x, np.ndarray):
        return tuple(x.flatten())
    if isinstance(x, (list, tuple)):
        return tuple(upstream_hashable(e) for e in x)
    if isinstance(x, dict):
        return tuple(sorted((k, upstream_hashable(v)) for k, v in x.items()))
    raise TypeError(f"Unsupported type: {type(x)}")


def partition(keys) -> list[list[int]]:
    groups: dict = {}
    for row, key in enumerate(keys):
        groups.setdefault(key, []).append(row)
    return sorted(groups.values())


def test_anchor_keys_group_rows_as_verl_agent_does() -> None:
    image = image_anchor("s")
    values = [
        image, image.copy(), image.astype(np.float64), image.astype(object), image.reshape(-1), image + 1,
        np.zeros(4), -np.zeros(4), np.zeros(4, dtype=np.uint8), np.zeros(4, dtype=bool), np.ones(4),
        np.array([1.5, 2.5]), np.array([1.5, 2.5], dtype=object),
        np.array(["a", "b"]), np.array(["a", "b"], dtype=object),
        "s", np.str_("s"), 3, 3.0, np.int64(3), True, [1, "a"], ("a", [1, 2]), ["a", [1, 2]],
        {"a": 1, "b": np.array([1.0])}, {"b": np.array([1.0]), "a": 1},
    ]
    assert partition(milegpo_verl.anchor_key(v, row) for row, v in enumerate(values)) == \
        partition(upstream_hashable(v) for v in values)
    # kinds verl-agent's grouping refuses but an env may hand over: keyed by content too
    tensor = torch.from_numpy(image)
    key = milegpo_verl.anchor_key
    assert key(tensor, 0) == key(image, 1) != key(tensor + 1, 2)
    assert milegpo_verl.anchor_key(b"\x00\x01", 0) == milegpo_verl.anchor_key(bytes([0, 1]), 1)
    # NaN equals nothing (verl-agent: each such step is a group of its own), not even an identical array
    nan = np.array([np.nan, 1.0])
    assert milegpo_verl.anchor_key(nan, 0) != milegpo_verl.anchor_key(nan.copy(), 1)


@pytest.mark.parametrize("bad, message", [
    (None, "non_tensor_batch\\['anchor_obs'\\] at row 4 is \\(or holds\\) None"),
    (["a", None], "non_tensor_batch\\['anchor_obs'\\] at row 4 is \\(or holds\\) None"),
    ({1, 2}, "non_tensor_batch\\['anchor_obs'\\] at row 4 is \\(or holds\\) a set"),
    (object(), "at row 4 is \\(or holds\\) a object, which compares by identity"),
])
def test_a_none_or_identity_anchor_is_refused_naming_row_and_column(bad, message: str) -> None:
    data = verl_agent_batch()
    data.non_tensor_batch["anchor_obs"][4] = bad
    with pytest.raises(ValueError, match=message):
        milegpo_verl.compute_step_advantage(data, "gigpo")


def test_copies_of_a_nan_anchored_step_are_still_one_step() -> None:
    data = verl_agent_batch(anchor_of=image_anchor)
    data.non_tensor_batch["anchor_obs"][4] = np.array([np.nan, 1.0])
    shuffled, source = balanced_and_padded(data, world_size=4, seed=1)
    want = row_values(milegpo_verl.compute_step_advantage(data, "gigpo")[0], data.batch["response_mask"])
    got = row_values(milegpo_verl.compute_step_advantage(shuffled, "gigpo")[0], shuffled.batch["response_mask"])
    assert np.abs(got - want[source]).max() <= 1e-6


# ---- upstream_exact GiGPO against verl-agent's arithmetic ----------------------------------------------------

def verl_agent_gigpo_reference(data: DataProto, gamma: float, penalty: float, mode: str, step_w: float,
                               epsilon: float = 1e-6) -> np.ndarray:
    """verl-agent's GiGPO advantage per row of an in-order, copy-free step batch, in float32 as its trainer
    computes it (gigpo/core_gigpo.py and ray_trainer.py's apply_invalid_action_penalty, read and restated):

    * step reward of a row: the discounted env-reward-to-go of its trajectory (compute_step_discounted_returns),
      then minus the penalty if that row's action was invalid;
    * episode score of a row: its trajectory's env-reward total (episode_rewards), minus that row's penalty;
    * episode term: the score minus the mean over all rows of the task (divided by the unbiased std + eps in
      mean_std_norm); step term: the same over the rows of the task sharing the anchor (to_hashable) key;
    * advantage: episode term + step_advantage_w * step term.
    """
    columns = data.non_tensor_batch
    uid, traj, anchors = columns["uid"], columns["traj_uid"], columns["anchor_obs"]
    rewards = columns["rewards"].astype(np.float32)
    penalties = np.where(columns["is_action_valid"], 0.0, penalty).astype(np.float32)
    returns = np.zeros(len(uid), dtype=np.float32)
    scores = np.zeros(len(uid), dtype=np.float32)
    for t in np.unique(traj):
        rows = np.flatnonzero(traj == t)
        running = np.float32(0.0)
        for row in rows[::-1]:
            running = rewards[row] + np.float32(gamma) * running
            returns[row] = running
        scores[rows] = np.sum(rewards[rows], dtype=np.float32)
    returns, scores = returns - penalties, scores - penalties

    def centred(values: np.ndarray, keys: list) -> np.ndarray:
        out = np.zeros_like(values)
        for rows in partition(keys):
            group = values[rows]
            spread = np.float32(group.std(ddof=1)) if len(rows) > 1 else np.float32(1.0)
            out[rows] = group - group.mean(dtype=np.float32)
            if mode == "mean_std_norm":
                out[rows] /= spread + np.float32(epsilon)
        return out

    episode = centred(scores, list(uid))
    step = centred(returns, [(u, upstream_hashable(a)) for u, a in zip(uid, anchors)])
    return episode + np.float32(step_w) * step


def reward_shaped_episodes(shape: str, seed: int) -> list:
    """Three tasks of four trajectories each over a small state space (so anchor states repeat), 20 % invalid
    actions, with rewards of one of verl-agent's env shapes:

    * sokoban: -0.1 every step, an invalid one included, +1 for a box pushed on target, +10 when solved;
    * shaped: a positive progress reward on most steps;
    * negative: sparse negative rewards only (a trap, a timeout cost);
    * sparse: 10 at the last step of a success, else 0 (ALFWorld, WebShop).
    """
    rng = np.random.default_rng(seed)
    episodes = []
    for task in "ABC":
        for _ in range(4):
            length = int(rng.integers(2, 8))
            states = [f"{task}0"] + [f"{task}{rng.integers(1, 4)}" for _ in range(length - 1)]
            valid = (rng.random(length) > 0.2).tolist()
            won = bool(rng.random() < 0.4)
            if shape == "sokoban":
                rewards = -0.1 + (rng.random(length) < 0.2) * 1.0
                rewards[-1] += 10.0 * won
            elif shape == "shaped":
                rewards = rng.random(length) * (rng.random(length) < 0.8)
            elif shape == "negative":
                rewards = -rng.random(length) * (rng.random(length) < 0.3)
            else:
                rewards = np.zeros(length)
                rewards[-1] = 10.0 * won
            episodes.append((task, states, rewards.tolist(), valid))
    return episodes


@pytest.mark.parametrize("shape", ["sokoban", "shaped", "negative", "sparse"])
@pytest.mark.parametrize("mode", ["mean_norm", "mean_std_norm"])
def test_upstream_exact_gigpo_is_verl_agents_for_every_reward_shape(shape: str, mode: str) -> None:
    for seed, (gamma, penalty, step_w) in enumerate([(0.95, 0.1, 1.0), (1.0, 0.0, 0.5), (0.9, 0.5, 1.0)]):
        data = verl_agent_batch(reward_shaped_episodes(shape, seed), anchor_of=image_anchor)
        config = trainer_config("milegpo.gigpo", {"upstream_exact": True}, gamma=gamma,
                                gigpo={"step_advantage_w": step_w, "mode": mode, "enable_similarity": False})
        config.actor_rollout_ref.actor.invalid_action_penalty_coef = penalty
        got = advantages_under(config, data)
        want = verl_agent_gigpo_reference(data, gamma, penalty, mode, step_w)
        gap = float(np.abs(got - want).max())
        assert gap <= 1e-5, (shape, mode, seed, gap)
        assert np.abs(want).max() > 0.05


def test_other_methods_refuse_upstream_exact_when_an_invalid_step_earns_a_reward() -> None:
    data = verl_agent_batch(reward_shaped_episodes("sokoban", 0))
    with pytest.raises(ValueError, match="upstream_exact=True for 'grpo'.*invalid action that earned an env reward"):
        milegpo_verl.compute_step_advantage(data, "grpo", {"upstream_exact": True})
    milegpo_verl.compute_step_advantage(data, "grpo")  # the default mode takes such rewards: they add up


# ---- verl-agent's penalty keys: honoured by every method --------------------------------------------------------

def with_penalty(config: DictConfig, use: bool, coef: float = PENALTY) -> DictConfig:
    config = config.copy()
    config.actor_rollout_ref.actor.use_invalid_action_penalty = use
    config.actor_rollout_ref.actor.invalid_action_penalty_coef = coef
    return config


@pytest.mark.parametrize("method", CREDIT_METHODS)
@pytest.mark.parametrize("upstream_exact", [False, True])
def test_the_penalty_keys_change_every_methods_credit(method: str, upstream_exact: bool) -> None:
    # the penalty is a reward of the invalid step: it lowers the trajectory's outcome (every method's episode
    # term) and, for the methods that read step rewards, that step's reward; upstream_exact: verl-agent's rows
    config = trainer_config(f"milegpo.{method}", {"upstream_exact": upstream_exact})
    off = advantages_under(with_penalty(config, use=False))
    on = advantages_under(with_penalty(config, use=True))
    assert not np.allclose(on, off)
    assert not np.allclose(on, advantages_under(with_penalty(config, use=True, coef=1.0)))
    assert np.array_equal(off, advantages_under(with_penalty(config, use=True, coef=0.0)))


@pytest.mark.parametrize("estimator, key, value", [
    ("milegpo", "gamma", 0.95), ("graphgpo", "gigpo", {"mode": "mean_std_norm"}),
    ("milegpo.grpo", "gigpo", {"step_advantage_w": 0.5}), ("hgpo", "norm_adv_by_std_in_grpo", False),
])
def test_verl_agent_keys_a_method_does_not_read_are_refused_off_their_default(estimator: str, key: str, value) -> None:
    with pytest.raises(ValueError, match=f"has no effect on '{estimator}'"):
        milegpo_verl.settings_from_config(trainer_config(estimator, **{key: value}))
    milegpo_verl.settings_from_config(trainer_config(estimator))  # verl-agent's defaults pass


def test_a_negative_penalty_is_refused() -> None:
    with pytest.raises(ValueError, match="invalid_action_penalty_coef must be a finite number >= 0"):
        milegpo_verl.settings_from_config(with_penalty(trainer_config("milegpo"), use=True, coef=-0.1))


# ---- scores in token_level_scores (reward model, custom reward function): refused ----------------------------

def with_keys(config: DictConfig, *overrides: str) -> DictConfig:
    """``config`` with hydra-style ``key=value`` overrides applied, as a command line sets them."""
    return OmegaConf.merge(config, OmegaConf.from_dotlist(list(overrides)))


def test_a_score_in_token_level_rewards_does_not_reach_milegpos_credit() -> None:
    # why a reward model is refused: verl-agent's estimators read token_level_rewards, where its reward managers put a
    # reply's score; milegpo's read the env rewards. A +2 bonus on 2 of the 4 trajectories of a task (a success and a
    # failure) moves verl-agent's GiGPO, GRPO and RLOO by up to 1.09, 0.24 and 1.2 on this batch (run by hand with
    # verl-agent's own functions, gamma 0.95) and ours not at all
    episodes = [("A", ["s0", "a", "b"], [0, 0, 10], [True] * 3),
                ("A", ["s0", "c", "d"], [0, 0, 0], [True, False, True]),
                ("A", ["s0", "a", "d"], [0, 0, 0], [True] * 3), ("A", ["s0", "b"], [0, 10], [True] * 2)]
    plain, bonus = verl_agent_batch(episodes), verl_agent_batch(episodes)
    last = bonus.batch["response_mask"].sum(-1).long() - 1
    rows = torch.as_tensor(np.isin(bonus.non_tensor_batch["traj_uid"], ["traj-0", "traj-1"]))
    for column in ("token_level_scores", "token_level_rewards"):
        bonus.batch[column][rows, last[rows]] += 2.0
    for method in CREDIT_METHODS:
        for upstream_exact in (False, True):
            config = {"upstream_exact": upstream_exact}
            assert torch.equal(milegpo_verl.compute_step_advantage(plain, method, config)[0],
                               milegpo_verl.compute_step_advantage(bonus, method, config)[0])


@pytest.mark.parametrize("overrides, key", [
    (["reward_model.enable=True"], "reward_model.enable"),
    (["reward_model.reward_manager=naive"], "reward_model.reward_manager"),
    (["custom_reward_function.path=/tmp/my_reward.py"], "custom_reward_function.path"),
])
@pytest.mark.parametrize("estimator", ["milegpo", "milegpo.gigpo", "milegpo.grpo"])
def test_a_reward_model_or_custom_reward_function_is_refused_at_construction(
        installed_trainer_module, overrides: list[str], key: str, estimator: str) -> None:
    ray_trainer, _ = installed_trainer_module
    trainer = checked_trainer(ray_trainer, milegpo_only=True)
    for mile in ({}, {"upstream_exact": True}):
        config = with_keys(trainer_config(estimator, mile), *overrides)
        refusal = f"^{key}=.*token_level_scores.*milegpo's step credit does not.*drop {key}$"
        with pytest.raises(ValueError, match=refusal):
            trainer(config)
    assert trainer(trainer_config(estimator)).shown == "grpo"  # verl-agent's defaults (no reward model) pass


# ---- every message names the key the user set --------------------------------------------------------------

@pytest.mark.parametrize("config, message", [
    (trainer_config("milegpo.gigpo", gigpo={"mode": "bogus"}), "algorithm.gigpo.mode must be one of .*'bogus'"),
    (trainer_config("milegpo.gigpo", gigpo={"step_advantage_w": -1}),
     "algorithm.gigpo.step_advantage_w must be in \\[0.0, inf\\], got -1"),
    (trainer_config("milegpo.gigpo", gamma=1.5), "algorithm.gamma must be in \\[0.0, 1.0\\], got 1.5"),
    (trainer_config("hgpo", gamma=1.5), "algorithm.gamma must be in \\[0.0, 1.0\\], got 1.5"),
    (trainer_config("milegpo", {"success": "maybe"}),
     "algorithm.milegpo.success must be 'auto', 'won' or 'reward', got 'maybe'"),
    (trainer_config("milegpo", {"success_reward": float("inf")}), "algorithm.milegpo.success_reward must be finite"),
    (trainer_config("milegpo", gamma=0.95),
     "algorithm.gamma=0.95 has no effect on 'milegpo' \\(only 'hgpo', 'milegpo.gigpo', 'milegpo.hgpo' read it\\)"),
])
def test_messages_name_the_key_that_was_set(config, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}") as refused:
        milegpo_verl.settings_from_config(config)
    assert "\n" not in str(refused.value)  # one refusal: one line


# ---- every refusal in one message ---------------------------------------------------------------------------

#: the algorithm and penalty lines of verl-agent's examples/gigpo_trainer/run_alfworld.sh (mode="mean_std_norm")
RUN_ALFWORLD_LINES = [
    "actor_rollout_ref.actor.use_invalid_action_penalty=True",
    "actor_rollout_ref.actor.invalid_action_penalty_coef=0.1",
    "algorithm.use_kl_in_reward=False", "algorithm.gamma=0.95", "algorithm.gigpo.step_advantage_w=1.0",
    "algorithm.gigpo.mode=mean_std_norm",
]


def test_a_converted_run_script_meets_every_refusal_at_once() -> None:
    config = with_keys(trainer_config("milegpo", {"preset": "alfworld"}), *RUN_ALFWORLD_LINES)
    with pytest.raises(ValueError) as refused:
        milegpo_verl.settings_from_config(config)
    lines = str(refused.value).splitlines()
    assert lines[0] == ("2 settings cannot be used with algorithm.adv_estimator='milegpo'; change or drop each:")
    assert lines[1].startswith("  - algorithm.gamma=0.95 has no effect on 'milegpo'")
    assert lines[2].startswith("  - algorithm.gigpo.mode='mean_std_norm' has no effect on 'milegpo'")
    assert len(lines) == 3
    # with those two lines dropped the script's settings pass; for milegpo.gigpo all of them are honoured
    kept = [line for line in RUN_ALFWORLD_LINES if not line.startswith(("algorithm.gamma", "algorithm.gigpo.mode"))]
    milegpo_verl.settings_from_config(with_keys(trainer_config("milegpo", {"preset": "alfworld"}), *kept))
    gigpo = milegpo_verl.settings_from_config(with_keys(trainer_config("milegpo.gigpo"), *RUN_ALFWORLD_LINES))
    assert (gigpo.credit.gamma, gigpo.credit.norm, gigpo.invalid_action_penalty) == (0.95, "mean_std_norm", 0.1)


def test_refusals_of_every_kind_are_listed_together() -> None:
    config = with_keys(trainer_config("milegpo.gigpo", {"eta": 0.5, "success": "maybe", "gamma": 0.9}),
                       "algorithm.gamma=0.95", "algorithm.gigpo.mode=bogus", "algorithm.use_kl_in_reward=True",
                       "algorithm.gigpo.enable_similarity=True", "reward_model.enable=True",
                       "custom_reward_function.path=/tmp/my_reward.py",
                       "actor_rollout_ref.actor.invalid_action_penalty_coef=-1")
    with pytest.raises(ValueError) as refused:
        milegpo_verl.settings_from_config(config)
    message = str(refused.value)
    wanted = ["algorithm.use_kl_in_reward=True", "reward_model.enable=True", "custom_reward_function.path=",
              "algorithm.gigpo.enable_similarity=True", "algorithm.milegpo.success must be",
              "algorithm.gigpo.mode must be", "algorithm.milegpo.gamma is set, and verl-agent's algorithm.gamma",
              "algorithm.milegpo for 'milegpo.gigpo': GiGPOConfig has no field(s) ['eta']",
              "invalid_action_penalty_coef must be a finite number >= 0"]
    assert message.startswith(f"{len(wanted)} settings cannot be used with algorithm.adv_estimator='milegpo.gigpo'")
    assert len(message.splitlines()) == len(wanted) + 1
    for part in wanted:
        assert part in message, part


# ---- the estimator name: milegpo asked for, another one set ------------------------------------------------------

def checked_trainer(ray_trainer, milegpo_only: bool):
    """A subclass of verl's RayPPOTrainer whose own constructor only records the estimator it is shown,
    with milegpo's constructor patch installed over it."""
    from milegpo.integrations.verl.install import _patched_trainer_init, _swap

    class Checked(ray_trainer.RayPPOTrainer):
        def __init__(self, config):
            self.shown = config.algorithm.adv_estimator

    _swap(Checked, "__init__", lambda original: _patched_trainer_init(original, milegpo_only))
    return Checked


def test_milegpo_keys_under_another_estimator_stop_the_trainer(installed_trainer_module) -> None:
    ray_trainer, _ = installed_trainer_module
    trainer = checked_trainer(ray_trainer, milegpo_only=False)
    with pytest.raises(ValueError, match="adv_estimator='gigpo' is not a milegpo estimator, but "
                                         "algorithm.milegpo.preset='alfworld' is set"):
        trainer(trainer_config("gigpo", {"preset": "alfworld"}))
    assert trainer(trainer_config("gigpo")).shown == "gigpo"  # verl-agent's own run, untouched


def test_the_entry_point_accepts_only_milegpos_estimators(installed_trainer_module) -> None:
    from milegpo.integrations.verl.main_ppo import refuse_estimator_given_twice

    ray_trainer, _ = installed_trainer_module
    trainer = checked_trainer(ray_trainer, milegpo_only=True)
    with pytest.raises(ValueError, match="adv_estimator='gigpo' reached milegpo's entry point"):
        trainer(trainer_config("gigpo"))
    assert trainer(trainer_config("milegpo")).shown == "grpo"
    # the docs' line followed by a run_*.sh script's own: refused before anything starts, both values named
    with pytest.raises(SystemExit, match="given 2 times.*'milegpo', 'gigpo'"):
        refuse_estimator_given_twice(["algorithm.adv_estimator=milegpo", "data.x=1", "algorithm.adv_estimator=gigpo"])
    refuse_estimator_given_twice(["algorithm.adv_estimator=milegpo", "+algorithm.milegpo.eta=0.5", "--cfg", "job"])


# ---- the entry point: hydra flags, the user's setup hook, a light hook ------------------------------------------

def test_trailing_hydra_flags_pass_through_the_entry_point(tmp_path) -> None:
    # `--cfg job` after the overrides: verl-agent's main_ppo prints the config and exits 0; so must ours
    run = subprocess.run([sys.executable, "-m", "milegpo.integrations.verl.main_ppo", "algorithm.adv_estimator=milegpo",
                          "+algorithm.milegpo.eta=0.5", "--cfg", "job"], capture_output=True, text=True, cwd=tmp_path,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "adv_estimator: milegpo" in run.stdout and "eta: 0.5" in run.stdout


def test_the_users_setup_hook_is_kept() -> None:
    from milegpo.integrations.verl.hook import HOOK, USER_HOOK_ENV, setup_worker
    from milegpo.integrations.verl.main_ppo import runtime_env_with_hook

    theirs = runtime_env_with_hook({"worker_process_setup_hook": "my_project.setup", "env_vars": {"A": "1"}})
    assert theirs == {"worker_process_setup_hook": setup_worker,
                      "env_vars": {"A": "1", USER_HOOK_ENV: "my_project.setup"}}
    assert runtime_env_with_hook({"worker_process_setup_hook": HOOK}) == {"worker_process_setup_hook": setup_worker}
    with pytest.raises(TypeError, match="import path"):
        runtime_env_with_hook({"worker_process_setup_hook": print})


def test_the_setup_hook_is_light_and_the_task_runner_still_resolves_the_estimator() -> None:
    # a plain worker under the entry point's hook imports nothing of verl (nor milegpo) and starts about as fast as
    # one without it; the user's own hook (here gc.disable) runs too; a TaskRunner-shaped actor importing the
    # trainer gets it patched
    ray = pytest.importorskip("ray")
    from milegpo.integrations.verl.main_ppo import runtime_env_with_hook

    @ray.remote(num_cpus=0)
    class Plain:
        def report(self):
            import gc

            return sorted(m for m in sys.modules if m.startswith(("verl", "milegpo"))), gc.isenabled()

    @ray.remote(num_cpus=0)
    class TaskRunner:
        def run(self, data):
            import verl.trainer.ppo.ray_trainer as ray_trainer

            from milegpo.integrations.verl import configure, settings_from_config

            assert hasattr(ray_trainer.RayPPOTrainer.__init__, "__milegpo_original__")
            configure(settings_from_config({"algorithm": {"adv_estimator": "milegpo"}}), "milegpo")
            return ray_trainer.compute_advantage(data, "milegpo").batch["advantages"]

    def start_times(runtime_env: dict) -> tuple[list[float], list]:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, runtime_env=runtime_env,
                 _system_config={"enable_worker_prestart": False})
        times, reports = [], []
        try:
            for _ in range(3):
                start = time.perf_counter()
                actor = Plain.remote()
                reports.append(ray.get(actor.report.remote(), timeout=120))
                times.append(time.perf_counter() - start)
                ray.kill(actor)
            if "worker_process_setup_hook" in runtime_env:
                reports.append(ray.get(TaskRunner.remote().run.remote(verl_agent_batch()), timeout=300))
        finally:
            ray.shutdown()
        return times, reports

    # both under the runtime env verl-agent's main_ppo always sets (its env_vars): any non-empty runtime env costs
    # a Ray worker ~0.25 s more to start, hook or not (benchmarks/results/verl_setup_hook.md)
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    verl_env = dict(get_ppo_ray_runtime_env())
    plain, _ = start_times(verl_env)
    hooked, reports = start_times(runtime_env_with_hook({**verl_env, "worker_process_setup_hook": "gc.disable"}))
    assert all(report == ([], False) for report in reports[:-1])
    want = compute_credit("milegpo", our_batch()).advantages
    assert row_values(reports[-1], verl_agent_batch().batch["response_mask"]) == pytest.approx(want, abs=1e-6)
    assert np.median(hooked) <= 1.5 * np.median(plain), (hooked, plain)
