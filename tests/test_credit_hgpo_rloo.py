"""HGPO and RLOO on small groups whose answers are worked out by hand below.

Rows of ``StepBatch.from_trajectories`` are in trajectory order, then step order.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from milegpo.credit import HGPOConfig, RLOOConfig, StepBatch, compute_credit
from milegpo.credit.graph import build_task_graph
from milegpo.credit.hgpo import history_groups


def approx(values, rel=1e-5, abs=1e-6):
    return pytest.approx(list(values), rel=rel, abs=abs)


# One task, three trajectories; state a is reached after (s0, a) by trajectories 0 and 1,
# after (x, a) by trajectory 2.
#   traj 0 (success): s0 -> a -> b -> g   rewards 0, 0, 10
#   traj 1 (failure): s0 -> a -> c -> d   rewards 0, 0, 0
#   traj 2 (failure): s0 -> x -> a -> y   rewards 0, 0, 0
# gamma 0.5: returns R = [2.5, 5, 10], [0, 0, 0], [0, 0, 0].
def three_histories() -> StepBatch:
    return StepBatch.from_trajectories([["s0", "a", "b", "g"], ["s0", "a", "c", "d"], ["s0", "x", "a", "y"]],
                                       success=[True, False, False])


def hgpo(batch: StepBatch, **overrides) -> np.ndarray:
    config = {"gamma": 0.5, "history_length": 1, "norm": "mean_norm", **overrides}
    return compute_credit("hgpo", batch, config).advantages


def test_history_groups_by_the_last_k_states():
    batch = three_histories()
    graph = build_task_graph(batch)
    k1, k2 = history_groups(batch, graph, 1), history_groups(batch, graph, 2)
    # k = 1: s0 (rows 0, 3, 6); a (rows 1, 4, 8); b, c, x each alone
    assert k1[0] == k1[3] == k1[6] and k1[1] == k1[4] == k1[8] and len(set(k1.tolist())) == 5
    # k = 2: no group for the first steps; (s0, a) shared by rows 1 and 4; (x, a) of row 8 is alone
    assert list(k2[[0, 3, 6]]) == [-1, -1, -1] and k2[1] == k2[4] and k2[8] not in (k2[1], k2[7])


def test_hgpo_hand_example_length_weighted_levels():
    # level 1, mean_norm: s0 group [2.5, 0, 0] -> 1.6667, -0.8333, -0.8333; a group [5, 0, 0] -> 3.3333, -1.6667 x2
    # level 2: (s0, a) group [5, 0] -> +-2.5; every other history alone (left out)
    # weights (k + 1)^1: level 1 -> 2, level 2 -> 3
    adv = hgpo(three_histories())
    t0 = [5 / 3, (2 * 10 / 3 + 3 * 2.5) / 5, 0.0]  # the last step of traj 0 (state b) shares nothing
    t1 = [-5 / 6, (2 * -5 / 3 + 3 * -2.5) / 5, 0.0]
    t2 = [-5 / 6, 0.0, -5 / 3]  # state a after (x, a): level 1 only
    assert adv == approx(t0 + t1 + t2)
    # the same state a, different credit for a different history: -2.1667 vs -1.6667
    assert adv[4] == pytest.approx(-13 / 6, rel=1e-5) and adv[8] == pytest.approx(-5 / 3, rel=1e-5)


def test_hgpo_alpha_zero_weighs_levels_alike_and_base_group_adds_the_episode():
    adv = hgpo(three_histories(), length_weight_alpha=0.0)
    assert adv[1] == pytest.approx((10 / 3 + 2.5) / 2, rel=1e-5)
    assert adv[4] == pytest.approx((-5 / 3 - 2.5) / 2, rel=1e-5)
    # base group: Norm_q(Z) = [6.6667, -3.3333, -3.3333] as level k = 0, weight 1
    adv = hgpo(three_histories(), base_group=True)
    assert adv[0] == pytest.approx((20 / 3 + 2 * 5 / 3) / 3, rel=1e-5)
    assert adv[2] == pytest.approx(20 / 3, rel=1e-5)  # only the base group is left for this step


def test_hgpo_uses_the_population_std():
    # s0 group [2.5, 0, 0]: population std 1.1785 -> 1.6667 / 1.1785 = sqrt(2) (unbiased: 1.1547)
    adv = hgpo(three_histories(), norm="mean_std_norm")
    assert adv[0] == pytest.approx(math.sqrt(2), rel=1e-5) and adv[3] == pytest.approx(-1 / math.sqrt(2), rel=1e-5)


def test_hgpo_with_no_history_is_gigpos_step_term():
    batch = three_histories()
    gigpo = compute_credit("gigpo", batch, {"gamma": 0.5, "norm": "mean_norm", "w_episode": 0.0}).advantages
    assert hgpo(batch, history_length=0) == approx(gigpo)


def test_hgpo_config_is_checked():
    for bad in ({"history_length": -1}, {"history_length": 1.5}, {"length_weight_alpha": -1.0}, {"gamma": 2.0}):
        with pytest.raises(ValueError):
            HGPOConfig(**bad)


def test_rloo_leave_one_out_hand_example():
    # Z = [10, 0, 0, 0]: traj 0 gets 10 - 0 = 10, the others 0 - 10/3
    batch = StepBatch.from_trajectories([["s", "a", "b"], ["s", "c"], ["s", "c"], ["s", "d", "d"]],
                                        success=[True, False, False, False])
    assert compute_credit("rloo", batch).advantages == approx([10, 10, -10 / 3, -10 / 3, -10 / 3, -10 / 3])


def test_rloo_group_of_one_and_upstream_row_statistics():
    single = StepBatch.from_trajectories([["s", "a"]], success=[True])
    assert compute_credit("rloo", single).advantages == approx([0.0])
    # rows' scores [10, 10, 0] (traj 0 has two steps): n = 3, row 0: 10 - (10 + 0) / 2 = 5, row 2: 0 - 10
    batch = StepBatch.from_trajectories([["s", "a", "b"], ["s", "c"]], success=[True, False])
    assert compute_credit("rloo", batch, {"upstream_exact": True}).advantages == approx([5, 5, -10])
    assert compute_credit("rloo", batch).advantages == approx([10, 10, -10])  # ours: once per trajectory


def test_rloo_refuses_a_std_normalisation():
    with pytest.raises(ValueError, match="mean_norm"):
        RLOOConfig(norm="mean_std_norm")
