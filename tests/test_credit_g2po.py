"""G2PO credit (milegpo.credit.g2po): a group worked by hand, upstream_exact by hand, and the edge cases
(a lone step, ties, truncation, success that is not a reward of 10, invalid actions)."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from milegpo.credit import CREDIT_METHODS, G2POConfig, StepBatch, compute_credit, make_credit_config

G = 0.95

# One task, four rollouts (gamma 0.95, success sentinel 10, failure sentinel 0, invalid penalty 0.1, mean_norm).
# The state x branches: to y (T0, T3), to z (T1), and T2 is cut right after stepping from x.
#   T0 success  s0 -> x -> y -> WIN                 rewards 0, 0, 10     Z0 = 10
#   T1 failure  s0 -> x -> z -(invalid)-> z         rewards 0, 0, -0.1   Z1 = -0.1
#   T2 failure  s0 -> w -> x -> (cut at the limit)  rewards 0, 0, 0      Z2 = 0
#   T3 failure  s0 -> x -> y -> (fails)             rewards 0, 0, 0      Z3 = 0
STATES = [["s0", "x", "y", "WIN"], ["s0", "x", "z", "z"], ["s0", "w", "x", "y"], ["s0", "x", "y", "v"]]
SUCCESS = [True, False, False, False]
REWARDS = [[0.0, 0.0, 10.0], [0.0, 0.0, -0.1], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
VALID = [[True] * 3, [True, True, False], [True] * 3, [True] * 3]


def hand_batch(rewards=REWARDS, success=SUCCESS) -> StepBatch:
    return StepBatch.from_trajectories(STATES, success, rewards=rewards, valid=VALID)


def test_a_group_worked_by_hand() -> None:
    # Every trajectory has L = 3 steps, so step t weighs gamma ** (3 - t): 0.857375, 0.9025, 0.95.
    # Group scores (the mean over the group's steps of gamma ** (L - t) * Z):
    #   S(s0) = 0.857375 * (10 - 0.1 + 0 + 0) / 4                  = 2.122003125   (T0.0, T1.0, T2.0, T3.0)
    #   S(x)  = (0.9025 * 10 + 0.9025 * -0.1 + 0.95 * 0 + 0.9025 * 0) / 4 = 2.2336875 (T0.1, T1.1, T2.2, T3.1)
    #   S(y)  = (0.95 * 10 + 0.95 * 0) / 2                         = 4.75          (T0.2, T3.2)
    #   S(z)  = 0.95 * -0.1                                        = -0.095        (T1.2)
    #   S(w)  = 0.9025 * 0                                         = 0             (T2.1)
    s0, x, y, z, w = G**3 * 9.9 / 4, G**2 * 9.9 / 4, 4.75, -0.095, 0.0
    assert (s0, x) == pytest.approx((2.122003125, 2.2336875), abs=1e-15)
    # Next-group links: each step points to the group of its trajectory's next step; a last step to the
    # success sentinel (10: T0) or the failure sentinel (0: T1, T2 cut at the limit, T3):
    #   T0: s0 -> x, x -> y, y -> success      next scores 2.2336875, 4.75, 10
    #   T1: s0 -> x, x -> z, z -> failure                  2.2336875, -0.095, 0
    #   T2: s0 -> w, w -> x, x -> failure                  0, 2.2336875, 0
    #   T3: s0 -> x, x -> y, y -> failure                  2.2336875, 4.75, 0
    own = [s0, x, y, s0, x, z, s0, w, x, s0, x, y]
    nxt = [x, y, 10, x, z, 0, w, x, 0, x, y, 0]
    # Term 1, the next group's score (minus 0.1 on the invalid step T1.2) centred among the steps of one state:
    #   s0: 2.2336875 x3 and 0: mean 1.675265625 -> T0.0, T1.0, T3.0 +0.558421875, T2.0 -1.675265625
    #   x: 4.75, -0.095, 0, 4.75: mean 2.35125 -> T0.1 +2.39875, T1.1 -2.44625, T2.2 -2.35125, T3.1 +2.39875
    #   y: 10, 0: mean 5 -> T0.2 +5, T3.2 -5;   z (T1.2, its -0.1 included) and w: groups of one -> 0
    a_next = [0.558421875, 2.39875, 5, 0.558421875, -2.44625, 0, -1.675265625, 0, -2.35125, 0.558421875, 2.39875, -5]
    # Term 2, the score gain S(next) - S(own), centred over the task's 12 steps:
    #   T0: 0.111684375, 2.5163125, 5.25   T1: 0.111684375, -2.3286875, 0.095
    #   T2: -2.122003125, 2.2336875, -2.2336875   T3: 0.111684375, 2.5163125, -4.75
    #   each trajectory's gains add up to its sentinel minus S(s0), so the mean is (10 - 4 * 2.122003125) / 12
    gains = [n - o for n, o in zip(nxt, own)]
    gain_mean = (10 - 4 * s0) / 12
    assert gain_mean == pytest.approx(0.125998958333333, abs=1e-14)
    a_gain = [g - gain_mean for g in gains]
    # Episode term (ours: once per trajectory): Z = 10, -0.1, 0, 0, mean 2.475 -> 7.525, -2.575, -2.475, -2.475
    episode = [7.525] * 3 + [-2.575] * 3 + [-2.475] * 6
    result = compute_credit("g2po", hand_batch())
    parts = result.components
    assert parts["group_score"] == pytest.approx(own, abs=1e-12)
    assert parts["next_score"] == pytest.approx(nxt, abs=1e-12)
    assert parts["A_next"] == pytest.approx(a_next, abs=1e-12)
    assert parts["A_gain"] == pytest.approx(a_gain, abs=1e-12)
    assert parts["episode"] == pytest.approx(episode, abs=1e-12)
    # A = episode + 1 * (term 1 + term 2); e.g. T0.2: 7.525 + 5 + (5.25 - 0.125998958333) = 17.649001041667
    want = [e + n + g for e, n, g in zip(episode, a_next, a_gain)]
    assert result.advantages == pytest.approx(want, abs=1e-12)
    assert result.advantages[2] == pytest.approx(17.649001041667, abs=1e-12)
    assert result.diagnostics["method"] == "g2po" and result.diagnostics["num_step_groups"] == 5


def normalized(values: list[float], eps: float = 1e-6) -> list[float]:
    mean, std = statistics.mean(values), statistics.stdev(values)
    return [(v - mean) / (std + eps) for v in values]


def test_mean_std_norm_divides_each_of_the_three_terms() -> None:
    result = compute_credit("g2po", hand_batch(), {"norm": "mean_std_norm"})
    a = G**2 * 9.9 / 4  # S(x)
    # s0's next scores a, a, 0, a: mean 0.75 a, unbiased std 0.5 a -> 0.25 a / (0.5 a + eps) ~ 0.5 and -1.5
    s0_rows = [0, 3, 6, 9]
    assert result.components["A_next"][s0_rows] == pytest.approx(
        [0.25 * a / (0.5 * a + 1e-6)] * 2 + [-0.75 * a / (0.5 * a + 1e-6), 0.25 * a / (0.5 * a + 1e-6)], abs=1e-12)
    assert result.components["A_next"][[2, 11]] == pytest.approx([5 / (50**0.5 + 1e-6), -5 / (50**0.5 + 1e-6)],
                                                                   abs=1e-12)
    gains = result.components["next_score"] - result.components["group_score"]
    assert result.components["A_gain"] == pytest.approx(normalized(list(gains)), abs=1e-12)
    z = normalized([10, -0.1, 0, 0])
    assert result.components["episode"] == pytest.approx([z[0]] * 3 + [z[1]] * 3 + [z[2]] * 6, abs=1e-12)


def test_upstream_exact_by_hand() -> None:
    # The reference scores groups with the env's episode reward (the -0.1 of T1's invalid step is the trainer's
    # penalty, not the env's: T1's env reward is 0), so S(s0) = 0.857375 * 10 / 4, S(x) = 0.9025 * 10 / 4,
    # S(z) = 0; its group scores multiply in float32 (gamma ** (L - t) * a float32 episode reward).
    result = compute_credit("g2po", hand_batch(), {"upstream_exact": True})
    s0, x = G**3 * 10 / 4, G**2 * 10 / 4
    own = [s0, x, 4.75, s0, x, 0, s0, 0, x, s0, x, 4.75]
    assert result.components["group_score"] == pytest.approx(own, abs=1e-6)
    # its episode term: each row's env episode reward minus that row's penalty, centred over the task's 12 rows:
    # 10 x3, then 0, 0, -0.1, then 0 x6; mean 29.9 / 12
    rows = [10.0] * 3 + [0.0, 0.0, -0.1] + [0.0] * 6
    assert result.components["episode"] == pytest.approx([r - 29.9 / 12 for r in rows], abs=1e-12)
    # the same-state term keeps the reference's fixed 0.1 on invalid steps; z is still a group of one
    assert result.components["next_score"] == pytest.approx([x, 4.75, 10, x, 0, 0, 0, x, 0, x, 4.75, 0], abs=1e-6)


def test_success_is_the_envs_won_not_a_reward_of_exactly_ten() -> None:
    # a Sokoban-like success: the env paid 10.6 in all (-0.1 per step, +1 for a box, +10 for the solve)
    rewards = [[-0.1, 0.9, 9.8], *REWARDS[1:]]
    ours = compute_credit("g2po", hand_batch(rewards))
    assert ours.components["next_score"][2] == 10.0  # T0's last step points to the success sentinel
    reference = compute_credit("g2po", hand_batch(rewards), {"upstream_exact": True})
    assert reference.components["next_score"][2] == 0.0  # the reference's test `episode reward == 10` fails
    by_score = compute_credit("g2po", hand_batch(rewards, [False] * 4), {"success_threshold": 10.0})
    assert by_score.components["next_score"][2] == 10.0


def test_a_trajectory_cut_at_the_step_limit_points_to_failure() -> None:
    # T2 stopped in state y, a group with a score of its own (4.75): its last step still points to failure
    result = compute_credit("g2po", hand_batch())
    assert result.components["next_score"][8] == 0.0
    assert hand_batch().next_state_keys[8] == "y"


def test_a_lone_step_gets_zero() -> None:
    # a task with one trajectory of one step: no group, no peer, no task mean to compare with (the reference
    # gives it its raw episode reward, and NaN for its score gain under mean_std_norm)
    lone = StepBatch.from_trajectories([["s0", "WIN"], ["t0", "a", "b"], ["t0", "c"]], [True, False, True],
                                       task_ids=[0, 1, 1])
    for config in ({}, {"norm": "mean_std_norm"}, {"upstream_exact": True}, {"upstream_exact": True,
                                                                             "norm": "mean_std_norm"}):
        result = compute_credit("g2po", lone, config)
        assert result.advantages[0] == 0.0 and np.all(np.isfinite(result.advantages))
        assert np.abs(result.advantages[1:]).max() > 0


def test_ties_give_exactly_zero() -> None:
    # identical one-step Sokoban-like failures (and successes): every term ties, the score gains included
    # (0 - 0.95 * -0.1 = 0.095 each). The reference sums the gains and episode scores in float32, whose mean of three
    # 0.095 is off by a rounding step; its mean_std_norm divides that residue by std + 1e-6.
    batch = StepBatch.from_trajectories([["s0", "a"]] * 3 + [["t0", "b"]] * 2, [False] * 3 + [True] * 2,
                                        rewards=[[-0.1]] * 3 + [[9.9]] * 2, task_ids=[0, 0, 0, 1, 1])
    for config in ({"norm": "mean_std_norm"}, {"norm": "mean_std_norm", "upstream_exact": True}):
        result = compute_credit("g2po", batch, config)
        gains = result.components["next_score"] - result.components["group_score"]
        assert gains[:3] == pytest.approx([0.095] * 3, abs=1e-7)
        assert np.all(result.advantages == 0.0)


def test_the_invalid_step_penalty_is_the_methods_own() -> None:
    # two steps from s0 lead to the same state, one of them invalid: only the method's invalid_penalty separates
    # them in term 1 (+-p/2 in mean_norm), whatever the trainer's penalty in the rewards
    states = [["s0", "a", "WIN"], ["s0", "a", "b"]]
    for trainer_penalty in (0.0, 0.1, 0.5):
        batch = StepBatch.from_trajectories(states, [True, False], valid=[[True, True], [False, True]],
                                            rewards=[[0.0, 10.0], [-trainer_penalty, 0.0]])
        for p in (0.0, 0.1, 1.0):
            a_next = compute_credit("g2po", batch, {"invalid_penalty": p}).components["A_next"]
            assert a_next[[0, 2]] == pytest.approx([p / 2, -p / 2], abs=1e-12)


def test_rows_in_any_order() -> None:
    # the rows of the hand batch shuffled: the same credit per step
    batch = hand_batch()
    perm = np.random.default_rng(0).permutation(batch.num_steps)
    fields = ("task_ids", "traj_ids", "step_idx", "state_keys", "next_state_keys", "actions", "rewards", "valid",
              "dones")
    shuffled = StepBatch(**{k: getattr(batch, k)[perm] for k in fields}, outcomes=batch.outcomes,
                         success=batch.success)
    for config in ({}, {"upstream_exact": True, "norm": "mean_std_norm"}):
        assert compute_credit("g2po", shuffled, config).advantages == pytest.approx(
            compute_credit("g2po", batch, config).advantages[perm], abs=1e-12)


def test_config_defaults_and_checks() -> None:
    config = make_credit_config("g2po")
    assert isinstance(config, G2POConfig) and "g2po" in CREDIT_METHODS
    assert (config.norm, config.gamma, config.success_reward, config.failure_reward, config.invalid_penalty,
            config.w_step, config.w_episode, config.epsilon) == ("mean_norm", 0.95, 10.0, 0.0, 0.1, 1.0, 1.0, 1e-6)
    with pytest.raises(ValueError, match="gamma must be in"):
        G2POConfig(gamma=1.5)
    with pytest.raises(ValueError, match="invalid_penalty must be in"):
        G2POConfig(invalid_penalty=-0.1)
    with pytest.raises(ValueError, match="success_reward must be finite"):
        G2POConfig(success_reward=float("inf"))
    with pytest.raises(ValueError, match="norm must be one of"):
        G2POConfig(norm="std")
    with pytest.raises(ValueError, match="valid fields"):
        make_credit_config("g2po", step_advantage_w=1.0)


def test_the_algorithm_and_the_cli_setting() -> None:
    import milegpo
    from milegpo.algos import ALGORITHMS
    from milegpo.config import AlgoConfig
    from milegpo.config.run import resolve_config

    assert ALGORITHMS["g2po"] is milegpo.G2PO and milegpo.G2PO.credit_method == "g2po"
    assert isinstance(AlgoConfig(method="g2po").credit_config(), G2POConfig)
    config = resolve_config(overrides=["algo.method=g2po", "algo.credit_kwargs={norm: mean_std_norm}"])
    assert config.algo.method == "g2po" and config.algo.credit_config().norm == "mean_std_norm"
