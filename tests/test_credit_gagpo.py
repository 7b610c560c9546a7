"""GAGPO on a group whose every intermediate is worked out by hand below, and its limits.

Rows of ``StepBatch.from_trajectories`` are in trajectory order, then step order.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from milegpo.config import AlgoConfig
from milegpo.credit import CREDIT_METHODS, GAGPOConfig, StepBatch, compute_credit, make_credit_config


# One task, four rollouts, one success; state a is a branching state (reached by three
# trajectories, left towards b once and towards c twice), x is shared by two.
#   traj 0 (success): s0 -> a -> b -> G        rewards 0, 0, 10
#   traj 1 (failure): s0 -> a -> c -> D        rewards 0, 0, 0
#   traj 2 (failure): s0 -> x -> a -> c -> E   rewards 0, 0, 0, 0
#   traj 3 (failure): s0 -> x -> y             rewards 0, 0
def four_rollouts() -> StepBatch:
    return StepBatch.from_trajectories([["s0", "a", "b", "G"], ["s0", "a", "c", "D"], ["s0", "x", "a", "c", "E"],
                                        ["s0", "x", "y"]], success=[True, False, False, False])


def gagpo(batch: StepBatch, **overrides):
    return compute_credit("gagpo", batch, {"gamma": 0.5, "gae_lambda": 0.5, "epsilon": 0.0, **overrides})


def test_hand_worked_group_every_intermediate():
    res = gagpo(four_rollouts())
    c = res.components
    # gamma = 0.5. Returns R_t: traj 0 [2.5, 5, 10], every failure 0.
    assert c["step_return"] == pytest.approx([2.5, 5, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0], abs=1e-12)
    # Value proxy = mean return of the steps taken from the state:
    #   V(s0) = (2.5 + 0 + 0 + 0) / 4 = 5/8;  V(a) = (5 + 0 + 0) / 3 = 5/3;  V(b) = 10 (alone);
    #   V(c) = (0 + 0) / 2 = 0;  V(x) = (0 + 0) / 2 = 0;  final states G, D, E, y: no bootstrap.
    v_s0, v_a, v_b = 5 / 8, 5 / 3, 10.0
    assert c["value"] == pytest.approx([v_s0, v_a, v_b, v_s0, v_a, 0, v_s0, 0, v_a, 0, v_s0, 0], abs=1e-12)
    # TD errors delta_t = r_t + 0.5 V(s_{t+1}) - V(s_t):
    #   traj 0: 0 + 5/6 - 5/8 = 5/24;   0 + 5 - 5/3 = 10/3;   10 + 0 - 10 = 0
    #   traj 1: 5/24;                   0 + 0 - 5/3 = -5/3;   0
    #   traj 2: 0 + 0 - 5/8 = -5/8;     0 + 5/6 - 0 = 5/6;    0 + 0 - 5/3 = -5/3;   0
    #   traj 3: -5/8;                   0 - 0 = 0
    deltas = [5 / 24, 10 / 3, 0, 5 / 24, -5 / 3, 0, -5 / 8, 5 / 6, -5 / 3, 0, -5 / 8, 0]
    assert c["td_error"] == pytest.approx(deltas, abs=1e-12)
    # GAE, gamma * lambda = 1/4, summed backwards within each trajectory:
    #   traj 0: A2 = 0;  A1 = 10/3;  A0 = 5/24 + 10/12 = 25/24
    #   traj 1: A2 = 0;  A1 = -5/3;  A0 = 5/24 - 5/12 = -5/24
    #   traj 2: A3 = 0;  A2 = -5/3;  A1 = 5/6 - 5/12 = 5/12;  A0 = -5/8 + 5/48 = -25/48
    #   traj 3: A1 = 0;  A0 = -5/8
    gae = np.array([25 / 24, 10 / 3, 0, -5 / 24, -5 / 3, 0, -25 / 48, 5 / 12, -5 / 3, 0, -5 / 8, 0])
    assert c["gae"] == pytest.approx(gae, abs=1e-12)
    # Normalised within the task: in 48ths the GAE values are 50, 160, 0, -10, -80, 0, -25, 20, -80, 0, -30, 0;
    # sum 5 -> mean 5/576. Squares sum to 42925/48^2, so the sum of squared deviations is
    # (42925 - 12 (5/12)^2) / 48^2 = 515075/27648 and the unbiased variance 515075/304128.
    mean, std = 5 / 576, math.sqrt(515075 / 304128)
    assert res.advantages == pytest.approx((gae - mean) / std, abs=1e-12)
    assert np.array_equal(res.advantages, c["A_step"])  # no episode term by default


def test_the_branching_state_ranks_its_actions_by_what_followed():
    adv = gagpo(four_rollouts()).advantages
    # from a: towards b (the success) > towards c (twice a failure), whatever came before a
    assert adv[1] > 0 > adv[4] and adv[4] == pytest.approx(adv[8], abs=1e-12)


def test_lambda_zero_is_the_one_step_td_error():
    res = gagpo(four_rollouts(), gae_lambda=0.0)
    assert np.array_equal(res.components["gae"], res.components["td_error"])


def test_lambda_one_is_the_return_minus_the_state_value():
    res = gagpo(four_rollouts(), gae_lambda=1.0)
    c = res.components
    assert c["gae"] == pytest.approx(c["step_return"] - c["value"], abs=1e-12)


def test_no_shared_state_leaves_credit_on_the_start_step_only():
    # only s0 is shared: every later step is alone, so V(s_t) = R_t and delta_t = 0 there
    batch = StepBatch.from_trajectories([["s0", "a", "b", "c"], ["s0", "d", "e"], ["s0", "f", "g", "h", "i"]],
                                        success=[True, False, True])
    res = gagpo(batch, norm_scope="none")
    first = batch.step_idx == 0
    assert np.all(res.advantages[~first] == 0.0)
    # R_0 = 0.25 * 10, 0, 0.125 * 10 -> minus their mean 1.25
    assert res.advantages[first] == pytest.approx([1.25, -1.25, 0.0], abs=1e-12)


def test_one_step_episodes_are_grpo():
    batch = StepBatch.from_trajectories([["s0", "w"], ["s0", "l"], ["s0", "w2"], ["s0", "l2"]],
                                        success=[True, False, True, False], rewards=[[10], [0], [7], [1]])
    assert compute_credit("gagpo", batch).advantages == pytest.approx(compute_credit("grpo", batch).advantages,
                                                                      abs=1e-12)


def test_ablations_norm_scope_and_episode_broadcast():
    batch = StepBatch.concat([four_rollouts(), four_rollouts()], task_offsets=[0, 1])
    raw = gagpo(batch, norm_scope="none")
    assert np.array_equal(raw.advantages, raw.components["gae"])
    # two identical tasks: per-task and batch-wide normalisation differ only by the std's n - 1
    task, whole = gagpo(batch).advantages, gagpo(batch, norm_scope="batch").advantages
    assert whole == pytest.approx(task * math.sqrt(23 / 22), abs=1e-12)
    broadcast = gagpo(batch, w_episode=0.5)
    assert broadcast.advantages == pytest.approx(task + 0.5 * broadcast.components["episode"], abs=1e-12)


def test_upstream_exact_keeps_the_penalty_on_its_own_step():
    # traj 1's second action is invalid (-1, the state does not change)
    batch = StepBatch.from_trajectories([["s0", "a", "b"], ["s0", "a", "a"]], success=[True, False],
                                        rewards=[[0, 10], [0, -1]], valid=[[True, True], [True, False]])
    ours = gagpo(batch, norm_scope="none")
    exact = gagpo(batch, norm_scope="none", upstream_exact=True)
    # ours: R = [5, 10], [-0.5, -1]; V(s0) = 2.25, V(a) = 4.5; deltas [0, 5.5], [0, -5.5]: the penalty
    # is discounted into the earlier step's GAE (gamma * lambda = 1/4)
    assert ours.components["gae"] == pytest.approx([0.25 * 5.5, 5.5, -0.25 * 5.5, -5.5], abs=1e-12)
    # upstream: env rewards only (R = [5, 10], [0, 0]; V(s0) = 2.5, V(a) = 5; deltas [0, 5], [0, -5]),
    # then -1 on the invalid step alone
    assert exact.components["gae"] == pytest.approx([0.25 * 5, 5, -0.25 * 5, -5 - 1], abs=1e-12)


def test_config_is_checked_and_registered():
    assert "gagpo" in CREDIT_METHODS
    assert make_credit_config("gagpo") == GAGPOConfig(gamma=0.95, gae_lambda=0.95, norm_scope="task", w_episode=0.0)
    for bad in ({"gae_lambda": 1.5}, {"gamma": -0.1}, {"norm_scope": "trajectory"}, {"w_episode": -1.0}):
        with pytest.raises(ValueError):
            make_credit_config("gagpo", **bad)
    assert AlgoConfig(method="gagpo", credit_kwargs={"gae_lambda": 0.0}).method == "gagpo"


STATES = st.lists(st.sampled_from("abcd"), min_size=1, max_size=6)


@st.composite
def groups(draw):
    """Up to two tasks of 1-4 trajectories from a shared start, random rewards on the last step."""
    states, success, task_ids, rewards = [], [], [], []
    for q in range(draw(st.integers(1, 2))):
        for _ in range(draw(st.integers(1, 4))):
            keys = ["s0", *draw(STATES)]
            ok = draw(st.booleans())
            states.append(keys)
            success.append(ok)
            task_ids.append(q)
            rewards.append([draw(st.sampled_from([0.0, -0.1]))] * (len(keys) - 2) + [10.0 if ok else 0.0])
    return StepBatch.from_trajectories(states, success, task_ids=task_ids, rewards=rewards)


@settings(max_examples=30, deadline=None)
@given(groups(), st.sampled_from([0.5, 0.95, 1.0]))
def test_lambda_one_unnormalised_is_gigpos_mean_norm_step_term(batch, gamma):
    res = compute_credit("gagpo", batch, {"gamma": gamma, "gae_lambda": 1.0, "norm_scope": "none"})
    gigpo = compute_credit("gigpo", batch, {"gamma": gamma, "norm": "mean_norm", "w_episode": 0.0})
    np.testing.assert_allclose(res.advantages, gigpo.advantages, atol=1e-9)


@settings(max_examples=30, deadline=None)
@given(groups(), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_gae_satisfies_its_backward_recursion(batch, gamma, lam):
    res = compute_credit("gagpo", batch, {"gamma": gamma, "gae_lambda": lam, "norm_scope": "none"})
    gae, delta = res.components["gae"], res.components["td_error"]
    for i in range(batch.num_trajectories):
        rows = np.flatnonzero(batch.traj_ids == i)
        following = np.r_[gae[rows[1:]], 0.0]
        np.testing.assert_allclose(gae[rows], delta[rows] + gamma * lam * following, atol=1e-9)
