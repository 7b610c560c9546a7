"""Properties every credit function must have, on random batches (hypothesis)."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from milegpo.credit import CREDIT_METHODS, MileGPOConfig, StepBatch, compute_credit

TRAJ = st.lists(st.sampled_from("abcdef"), min_size=1, max_size=7)


@st.composite
def tasks(draw, n_tasks: int = 2):
    """Per task a list of (states, success, reward) trajectories, from a shared start state."""
    out = []
    for _ in range(n_tasks):
        k = draw(st.integers(1, 5))
        out.append([(["start", *draw(TRAJ)], draw(st.booleans()), draw(st.sampled_from([0.0, -0.1, 0.5])))
                    for _ in range(k)])
    return out


def to_batch(task_list) -> StepBatch:
    states, success, task_ids, rewards = [], [], [], []
    for q, trajs in enumerate(task_list):
        for keys, ok, r in trajs:
            states.append(keys)
            success.append(ok)
            task_ids.append(q)
            rewards.append([r] * (len(keys) - 2) + [10.0 if ok else 0.0])
    return StepBatch.from_trajectories(states, success, task_ids=task_ids, rewards=rewards)


def per_trajectory(batch: StepBatch, adv: np.ndarray) -> list[np.ndarray]:
    return [adv[batch.traj_ids == i] for i in range(batch.num_trajectories)]


METHOD_CONFIGS = [(m, None) for m in CREDIT_METHODS] + [("milegpo", MileGPOConfig.preset("webshop")),
                                                       ("hgpo", {"base_group": True}),
                                                         ("milegpo", {"norm": "mean_norm", "rcs": False})]


@settings(max_examples=40, deadline=None)
@given(tasks(), st.sampled_from(METHOD_CONFIGS))
def test_finite_and_json_diagnostics(task_list, method_config):
    method, config = method_config
    res = compute_credit(method, to_batch(task_list), config)
    assert np.all(np.isfinite(res.advantages))
    assert all(np.all(np.isfinite(v)) for v in res.components.values())
    json.dumps(res.diagnostics)


@settings(max_examples=40, deadline=None)
@given(tasks(), st.sampled_from(METHOD_CONFIGS), st.randoms(use_true_random=False))
def test_permuting_trajectories_within_a_task_permutes_advantages(task_list, method_config, rnd):
    method, config = method_config
    perms = [rnd.sample(range(len(t)), len(t)) for t in task_list]
    permuted = [[t[j] for j in p] for t, p in zip(task_list, perms)]
    base = per_trajectory(b := to_batch(task_list), compute_credit(method, b, config).advantages)
    moved = per_trajectory(b2 := to_batch(permuted), compute_credit(method, b2, config).advantages)
    offsets = np.cumsum([0] + [len(t) for t in task_list])
    for q, p in enumerate(perms):
        for new_pos, old_pos in enumerate(p):
            np.testing.assert_allclose(moved[offsets[q] + new_pos], base[offsets[q] + old_pos], rtol=1e-9, atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(tasks(n_tasks=1), tasks(n_tasks=1), st.sampled_from(METHOD_CONFIGS))
def test_tasks_do_not_leak_into_each_other(first, other, method_config):
    # The same state names in another task must not change the first task's credit.
    method, config = method_config
    alone = compute_credit(method, to_batch(first), config).advantages
    batch = to_batch(first + other)
    together = compute_credit(method, batch, config).advantages
    np.testing.assert_allclose(together[batch.task_ids == 0], alone, rtol=1e-12, atol=1e-12)
