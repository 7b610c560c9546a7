"""``upstream_exact=True``: verl-agent's episode statistics and invalid-action penalty, by hand.

One task, two trajectories (penalty 0.1, success reward 10, GiGPO gamma 0.95):
    T0 success  s0 -b-> z -(invalid)-> z -e-> won       rewards 0, -0.1, 10
    T1 failure  s0 -c-> x -d-> y                         rewards 0, 0
"""

from __future__ import annotations

import statistics

import pytest

from milegpo.credit import StepBatch, compute_credit

STATES = [["s0", "z", "z", "G"], ["s0", "x", "y"]]
ACTIONS = [["b", "a", "e"], ["c", "d"]]
REWARDS = [[0.0, -0.1, 10.0], [0.0, 0.0]]
VALID = [[True, False, True], [True, True]]


def batch() -> StepBatch:
    return StepBatch.from_trajectories(STATES, [True, False], actions=ACTIONS, rewards=REWARDS, valid=VALID)


def normalized(values: list[float]) -> list[float]:
    mean, std = statistics.mean(values), statistics.stdev(values)
    return [(v - mean) / (std + 1e-6) for v in values]


def test_gigpo_step_returns_ours_vs_upstream():
    ours = compute_credit("gigpo", batch()).components["step_return"]
    upstream = compute_credit("gigpo", batch(), {"upstream_exact": True}).components["step_return"]
    # ours: the penalty is a reward, discounted into row 0; upstream: it hits its own row only.
    assert list(ours) == pytest.approx([0.95 * -0.1 + 0.95**2 * 10, -0.1 + 0.95 * 10, 10, 0, 0])
    assert list(upstream) == pytest.approx([0.95**2 * 10, 0.95 * 10 - 0.1, 10, 0, 0])


@pytest.mark.parametrize("method", ["grpo", "gigpo", "graphgpo", "milegpo"])
def test_episode_term_ours_vs_upstream(method):
    ours = compute_credit(method, batch()).components["episode"]
    upstream = compute_credit(method, batch(), {"upstream_exact": True}).components["episode"]
    # ours: Z per trajectory (9.9, 0), each trajectory counted once.
    z = normalized([9.9, 0.0])
    assert list(ours) == pytest.approx([z[0]] * 3 + [z[1]] * 2, rel=1e-6)
    # upstream: each row's score (env return 10 or 0, minus that row's penalty) over the task's 5 rows.
    assert list(upstream) == pytest.approx(normalized([10, 9.9, 10, 0, 0]), rel=1e-6)


@pytest.mark.parametrize("method", ["graphgpo", "milegpo"])
def test_graph_step_return_loses_the_penalty_upstream(method):
    ours = compute_credit(method, batch()).components["r_G"]
    upstream = compute_credit(method, batch(), {"upstream_exact": True}).components["r_G"]
    assert list(upstream - ours) == pytest.approx([0, -0.1, 0, 0, 0])
