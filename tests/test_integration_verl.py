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
    pytest.importorskip("verl", reason="pip install --no-deps verl==0.9.1 torchdata==0.11.0 && pip install -e '.[verl]'")
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
    return DataProto.from_dict(tensors={"response_mask": mask, "token_level_rewards": torch.zeros_like(mask)},
                               non_tensors=non_tensors)


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


def test_install_routes_verl_agents_trainer_and_keeps_every_other_estimator() -> None:
    ray_trainer = pytest.importorskip("verl.trainer.ppo.ray_trainer")
    original = ray_trainer.compute_advantage
    try:
        milegpo_verl.install({"milegpo": {"preset": "webshop"}}, invalid_action_penalty=PENALTY)
        milegpo_verl.install({"milegpo": {"preset": "webshop"}}, invalid_action_penalty=PENALTY)  # no double wrap
        assert ray_trainer.compute_advantage.__milegpo_fallback__ is original
        data = ray_trainer.compute_advantage(verl_agent_batch(), "milegpo")
        want = compute_credit("milegpo", our_batch(), {"preset": "webshop"}).advantages
        assert row_values(data.batch["advantages"], data.batch["response_mask"]) == pytest.approx(want, abs=1e-6)
        assert data.meta_info["milegpo_credit"]["credit/num_trajectories"] == len(EPISODES)
        # verl's own GRPO is untouched: same answer as the original function
        mine, theirs = verl_agent_batch(), verl_agent_batch()
        for batch in (mine, theirs):
            batch.batch["token_level_rewards"][:, 0] = torch.arange(len(batch), dtype=torch.float32) % 3
        ray_trainer.compute_advantage(mine, "grpo")
        original(theirs, "grpo")
        assert torch.equal(mine.batch["advantages"], theirs.batch["advantages"])
        with pytest.raises(ValueError, match="no milegpo estimator named"):
            milegpo_verl.install({"milegpo-typo": {}})
    finally:
        ray_trainer.compute_advantage = original


def test_the_integration_imports_no_trainer_stack() -> None:
    # a verl-agent environment has its own torch/transformers: importing the adapter pulls in neither
    code = ("import sys, milegpo.integrations.verl; "
            "print(sorted(m for m in ('torch', 'transformers', 'peft', 'stable_baselines3', 'verl') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
