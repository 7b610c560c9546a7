"""GRPO, GiGPO and GraphGPO on small groups whose answers are worked out by hand below.

Conventions: Norm = (x - mean) / (unbiased std + 1e-6) for "mean_std_norm", x - mean for
"mean_norm"; a group of size 1 gets 0. Rows of ``StepBatch.from_trajectories`` are in
trajectory order, then step order.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from milegpo.credit import (
    CREDIT_METHODS,
    GiGPOConfig,
    GRPOConfig,
    MileGPOConfig,
    StepBatch,
    build_task_graph,
    compute_credit,
    credit_of_trajectory,
    make_credit_config,
)

R2 = 1 / math.sqrt(2)  # 0.70711


def approx(values, rel=1e-5, abs=1e-6):
    return pytest.approx(list(values), rel=rel, abs=abs)


# Task 0, two trajectories; x is visited twice by trajectory 0 (an invalid action x -> x).
#   traj 0 (success): s0 -> x -> x -> y, rewards 0, 0, 10        Z = 10
#   traj 1 (failure): s0 -> x -> z -> w, rewards 0, 0, 0         Z = 0
def two_trajectories() -> StepBatch:
    return StepBatch.from_trajectories([["s0", "x", "x", "y"], ["s0", "x", "z", "w"]], success=[True, False])


# ---------------------------------------------------------------- GRPO

def test_grpo_hand_example_both_norm_modes():
    # Z = [10, 0, 0, 0]: mean 2.5, unbiased std sqrt((7.5^2 + 3 * 2.5^2) / 3) = 5
    # -> A = 7.5 / 5 = 1.5 and -2.5 / 5 = -0.5; mean_norm: 7.5 and -2.5.
    batch = StepBatch.from_trajectories([["s", "a", "b"], ["s", "c"], ["s", "c"], ["s", "d", "d", "d"]],
                                        success=[True, False, False, False])
    res = compute_credit("grpo", batch)
    assert res.advantages == approx([1.5, 1.5, -0.5, -0.5, -0.5, -0.5, -0.5])
    res = compute_credit("grpo", batch, {"norm": "mean_norm"})
    assert res.advantages == approx([7.5, 7.5, -2.5, -2.5, -2.5, -2.5, -2.5])


def test_grpo_equal_outcomes_and_group_of_one_give_zero():
    # task 0: both fail (equal Z) -> 0; task 1: a single trajectory -> 0; task 2: [10, 0] -> +-1/sqrt(2).
    batch = StepBatch.from_trajectories([["s", "a"], ["s", "b"], ["t", "u"], ["r", "g"], ["r", "h"]],
                                        success=[False, False, True, True, False], task_ids=[0, 0, 1, 2, 2])
    for norm in ("mean_std_norm", "mean_norm"):
        adv = compute_credit("grpo", batch, {"norm": norm}).advantages
        assert np.all(adv[:3] == 0.0)
    assert compute_credit("grpo", batch).advantages[3:] == approx([R2, -R2])


def test_grpo_statistics_once_per_trajectory_not_per_step():
    # A 1-step success and a 9-step failure: per trajectory Z = [10, 0] -> +-1/sqrt(2)
    # (over step rows the mean would be 1.0 and the values different).
    batch = StepBatch.from_trajectories([["s", "g"], ["s"] + ["a"] * 9], success=[True, False])
    adv = compute_credit("grpo", batch).advantages
    assert adv == approx([R2] + [-R2] * 9)


# ---------------------------------------------------------------- GiGPO

def test_gigpo_hand_example():
    # gamma = 0.5: R(traj 0) = [2.5, 5, 10], R(traj 1) = [0, 0, 0].
    # Step groups: s0 = {2.5, 0}: mean 1.25, std 1.25*sqrt(2) -> +-1/sqrt(2)
    #              x  = {5, 10, 0} (x twice in traj 0): mean 5, std 5 -> 0, +1, -1
    #              z  = {0} singleton -> 0
    # Episode: Z = [10, 0] -> +-1/sqrt(2).
    batch = two_trajectories()
    res = compute_credit("gigpo", batch, GiGPOConfig(gamma=0.5))
    assert res.components["step_return"] == approx([2.5, 5, 10, 0, 0, 0])
    assert res.components["A_step"] == approx([R2, 0, 1, -R2, -1, 0])
    assert res.advantages == approx([2 * R2, R2, 1 + R2, -2 * R2, -1 - R2, -R2])
    # mean_norm: s0 +-1.25, x 0/+5/-5, episode +-5.
    res = compute_credit("gigpo", batch, {"gamma": 0.5, "norm": "mean_norm"})
    assert res.advantages == approx([6.25, 5, 10, -6.25, -10, -5])


def test_gigpo_weights_and_invalid_penalty_in_returns():
    # An invalid action (penalty -0.1, state unchanged) is an ordinary row; its penalty is
    # discounted into the earlier return: gamma = 0.5, rewards [0, -0.1, 10] -> R = [2.45, 4.9, 10].
    batch = StepBatch.from_trajectories([["s0", "x", "x", "y"], ["s0", "x", "z", "w"]], success=[True, False],
                                        rewards=[[0, -0.1, 10], [0, 0, 0]], valid=[[True, False, True]] * 2)
    res = compute_credit("gigpo", batch, {"gamma": 0.5, "w_step": 0.0, "w_episode": 2.0})
    assert res.components["step_return"] == approx([2.45, 4.9, 10, 0, 0, 0])
    # w_step = 0: only 2 * episode term; Z = [9.9, 0] -> +-1/sqrt(2).
    assert res.advantages == approx([2 * R2] * 3 + [-2 * R2] * 3)


def test_gigpo_equal_outcomes_zero():
    batch = StepBatch.from_trajectories([["s", "a", "b"], ["s", "a", "b"]], success=[False, False])
    assert np.all(compute_credit("gigpo", batch).advantages == 0.0)


# ---------------------------------------------------------------- GraphGPO

def test_graph_distances_hand_example():
    # traj 0 ends in success: its last step x -> y is redirected to g.
    # edges s0->x, x->x, x->g, x->z, z->w; d: g 0, x 1, s0 2, z and w unreachable -> 2 + 1 = 3.
    graph = build_task_graph(two_trajectories())
    d = {k: graph.dist_to_goal[i] for i, k in enumerate(graph.node_key)}
    assert d == {"s0": 2, "x": 1, "<goal>": 0, "z": 3, "w": 3}
    assert "y" not in d
    assert graph.num_edges == 5


def test_graphgpo_hand_example_both_norm_modes():
    # r^G = 10 * 0.2^d(s_{t+1}): traj 0 [x: 2, x: 2, g: 10], traj 1 [x: 2, z: 0.08, w: 0.08].
    # s0 group {2, 2}: tie -> 0.  x group {2, 10, 0.08}: mean 4.026667, dev [-2.026667, 5.973333, -3.946667],
    # unbiased var 27.682133, std 5.261381 -> [-0.385197, 1.135317, -0.750120].  z group singleton -> 0.
    # Episode +-1/sqrt(2).
    batch = two_trajectories()
    res = compute_credit("graphgpo", batch)
    assert res.components["r_G"] == approx([2, 2, 10, 2, 0.08, 0.08])
    assert res.components["A_G"] == approx([0, -0.385197, 1.135317, 0, -0.750120, 0])
    assert res.advantages == approx([R2, R2 - 0.385197, R2 + 1.135317, -R2, -R2 - 0.750120, -R2])
    res = compute_credit("graphgpo", batch, {"norm": "mean_norm", "w_episode": 0.5})
    assert res.advantages == approx([2.5, 2.5 - 2.026667, 2.5 + 5.973333, -2.5, -2.5 - 3.946667, -2.5])


def test_graphgpo_all_failures_and_singletons_give_zero():
    # No success: no goal, every node gets d = 1, r^G constant -> step term 0; Z equal -> episode 0.
    batch = StepBatch.from_trajectories([["s", "a", "b"], ["s", "c", "c"], ["s", "a"]], success=[False] * 3)
    res = compute_credit("graphgpo", batch)
    assert np.all(res.components["d_next"] == 1.0)
    assert np.all(res.advantages == 0.0)
    # A group of size 1: one successful trajectory alone in its task -> everything 0.
    single = StepBatch.from_trajectories([["s", "a", "b"]], success=[True])
    assert np.all(compute_credit("graphgpo", single).advantages == 0.0)


def test_success_threshold_for_continuous_outcomes():
    # WebShop-like scores; success flags all False. Default: no goal. Threshold 1.0: the first one succeeds.
    batch = StepBatch.from_trajectories([["s", "a", "b"], ["s", "c", "d"]], success=[False, False],
                                        rewards=[[0, 1.0], [0, 0.4]])
    assert compute_credit("graphgpo", batch).diagnostics["tasks_with_goal"] == 0
    res = compute_credit("graphgpo", batch, {"success_threshold": 1.0})
    assert res.diagnostics["tasks_with_goal"] == 1
    # d: g 0, a 1, s 2, c / d unreachable -> 3: r^G = [2, 10, 0.08, 0.08].
    assert res.components["r_G"] == approx([2, 10, 0.08, 0.08])


# ---------------------------------------------------------------- API

def test_api_errors_and_configs():
    batch = two_trajectories()
    with pytest.raises(ValueError, match="grpo.*gigpo.*graphgpo.*milegpo"):
        compute_credit("ppo", batch)
    with pytest.raises(ValueError, match="valid fields.*gamma"):
        make_credit_config("gigpo", gama=0.9)
    with pytest.raises(TypeError, match="GiGPOConfig"):
        compute_credit("gigpo", batch, GRPOConfig())
    with pytest.raises(ValueError, match="norm must be one of"):
        GRPOConfig(norm="std")
    with pytest.raises(ValueError, match="presets"):
        MileGPOConfig.preset("minecraft")
    web = make_credit_config("milegpo", preset="webshop", eta=0.5)
    assert (web.theta_m, web.rho, web.eta, web.kappa_bc) == (0.5, 0.5, 0.5, 1)
    alf = MileGPOConfig.preset("alfworld")
    assert (alf.theta_m, alf.rho, alf.eta, alf.kappa_bc) == (1.1, 0.0, 0.2, 0)
    assert CREDIT_METHODS == ("grpo", "rloo", "gigpo", "hgpo", "graphgpo", "milegpo", "gagpo", "g2po")


def test_credit_of_trajectory_and_json_diagnostics():
    batch = two_trajectories()
    per = credit_of_trajectory(batch, 1)
    assert set(per) == set(CREDIT_METHODS)
    for method in CREDIT_METHODS:
        res = compute_credit(method, batch)
        assert np.array_equal(per[method], res.advantages[3:])
        json.dumps(res.diagnostics)
        assert all(len(v) == batch.num_steps for v in res.components.values())


def test_rows_in_any_order():
    # Shuffling the rows of the batch shuffles the advantages the same way.
    batch = two_trajectories()
    perm = np.array([4, 0, 5, 2, 1, 3])
    shuffled = StepBatch(**{k: getattr(batch, k)[perm] for k in ("task_ids", "traj_ids", "step_idx", "state_keys",
                                                               "next_state_keys", "actions", "rewards", "valid",
                                                               "dones")},
                         outcomes=batch.outcomes, success=batch.success)
    for method in CREDIT_METHODS:
        np.testing.assert_allclose(compute_credit(method, shuffled).advantages,
                                   compute_credit(method, batch).advantages[perm], atol=1e-12)


def test_sign_flip_fraction():
    # GraphGPO example with w_step = 2, w_episode = 0.1: row 1 gets 2 * (-0.385197) + 0.070711 < 0 while its
    # episode term is positive; every other row keeps the episode sign -> 1 / 6.
    res = compute_credit("graphgpo", two_trajectories(), {"w_step": 2.0, "w_episode": 0.1})
    assert res.diagnostics["sign_flip_frac"] == pytest.approx(1 / 6)
    assert compute_credit("grpo", two_trajectories()).diagnostics["sign_flip_frac"] == 0.0


def test_bad_batches_are_rejected():
    batch = two_trajectories()
    fields = {k: getattr(batch, k).copy() for k in ("task_ids", "traj_ids", "step_idx", "state_keys",
                                                    "next_state_keys", "actions", "rewards", "valid", "dones")}
    two_tasks = dict(fields, task_ids=np.array([0, 0, 1, 1, 1, 1]))
    with pytest.raises(ValueError, match="trajectory 0 has rows in more than one task"):
        compute_credit("grpo", StepBatch(**two_tasks, outcomes=batch.outcomes, success=batch.success))
    repeated = dict(fields, step_idx=np.array([0, 1, 1, 0, 1, 2]))
    with pytest.raises(ValueError, match="two rows for trajectory 0 step 1"):
        compute_credit("gigpo", StepBatch(**repeated, outcomes=batch.outcomes, success=batch.success))
    with pytest.raises(ValueError, match="at least two states"):
        StepBatch.from_trajectories([["s"]], success=[False])


def test_concat_keeps_tasks_apart_and_trajectory_ids_unique():
    first = StepBatch.from_trajectories([["s", "a", "b"], ["s", "c"]], success=[True, False])
    second = StepBatch.from_trajectories([["s", "a"], ["s", "d", "e"]], success=[False, True])
    both = StepBatch.concat([first, second], task_offsets=[0, 1])
    assert both.num_steps == 6 and both.num_trajectories == 4
    assert both.traj_ids.tolist() == [0, 0, 1, 2, 3, 3] and both.task_ids.tolist() == [0, 0, 0, 1, 1, 1]
    for method in CREDIT_METHODS:  # credit is per task: the same as each batch alone
        alone = np.concatenate([compute_credit(method, b).advantages for b in (first, second)])
        assert compute_credit(method, both).advantages == approx(alone)
    same_task = StepBatch.concat([first, second])  # no offsets: one task of four trajectories
    assert set(same_task.task_ids.tolist()) == {0}
