"""``milegpo.g2po`` with ``upstream_exact`` against the G2PO authors' own functions.

The reference is ``g2po/core_g2po.py`` of a checkout of https://github.com/Nala-YN/G2PO (commit b8ffaf5), loaded
from outside this repository (nothing of it is copied here). With ``G2PO_CHECKOUT`` set to a checkout, e.g.
``git clone https://github.com/Nala-YN/G2PO /tmp/G2PO && G2PO_CHECKOUT=/tmp/G2PO pytest
tests/test_credit_g2po_reference.py``, the tests run the reference live. Without it (CI has no network) they
compare with the reference's outputs on these same batches recorded from that checkout in
``tests/data/g2po_reference.npz`` (every reference call below: its advantages, group scores and next-group
links, keyed by the batch's content and the call's settings); ``G2PO_CHECKOUT=... python
tests/test_credit_g2po_reference.py --record`` writes it again. The file imports ``verl``'s ``DataProto``
(installed with ``pip install --no-deps verl==0.9.1``).

The batches are laid out as the authors' trainer (verl-agent's) lays them out: rows gathered env by
env, each trajectory's steps in order, non-tensor columns as object arrays (its ``collate_fn``), the
episode reward a float32 running sum of the env rewards (its rollout loop), on every row and on the
last reply token of ``token_level_scores`` minus the trainer's invalid-action penalty
(``EpisodeRewardManager``, ``apply_invalid_action_penalty``). The reference runs as its trainer calls it:
``compute_group_aggregation_values`` on the in-order batch, then ``compute_g2po_outcome_advantage``.

The reference sums the score gains and the episode scores in float32 torch tensors. Where values tie
(two identical trajectories, one-step failures of equal reward) the float32 mean can be off by a
rounding step, and its ``mean_std_norm`` divides that residue by ``std + 1e-6``: the answer then moves by
up to about 1 with the summation order. milegpo gives such ties exactly 0. So the reference is run twice:
as it is, and with torch's default dtype float64 (the same functions, its float32 rounding out of the
way). milegpo must equal the float64 run on every row, and the float32 run on every row where that run
is within float32 precision of the float64 one; the tie batches show the rows where it is not.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import warnings
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from milegpo.integrations import verl as milegpo_verl

if os.environ.get("MILEGPO_CI"):
    import verl  # noqa: F401  CI installs verl: a missing package is a failure there
else:
    pytest.importorskip("verl", reason="pip install --no-deps verl==0.9.1 torchdata==0.11.0")
from verl import DataProto  # noqa: E402

CHECKOUT = os.environ.get("G2PO_CHECKOUT")
RECORDED = Path(__file__).parent / "data" / "g2po_reference.npz"
#: the reference's outputs recorded from a checkout (``--record``), or being recorded
_recorded: dict[str, np.ndarray] = {}


def load_reference() -> ModuleType | None:
    """The reference module of ``G2PO_CHECKOUT``; None without one (the recorded outputs are used)."""
    if not CHECKOUT:
        return None
    path = Path(CHECKOUT) / "g2po" / "core_g2po.py"
    if not path.is_file():
        raise FileNotFoundError(f"G2PO_CHECKOUT={CHECKOUT!r} holds no g2po/core_g2po.py")
    spec = importlib.util.spec_from_file_location("g2po_reference_core_g2po", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REFERENCE = load_reference()
if REFERENCE is None:
    with np.load(RECORDED, allow_pickle=False) as stored:
        _recorded.update(stored)


def _case_key(data: DataProto, mode: str, step_w: float, float64: bool) -> str:
    """A reference call's key: the batch's columns the reference reads, and the call's settings."""
    digest = hashlib.sha256()
    for name in ("uid", "traj_uid", "anchor_obs", "is_action_valid", "episode_rewards"):
        digest.update("\x1f".join(map(str, data.non_tensor_batch[name])).encode())
    for name in ("token_level_rewards", "response_mask"):
        digest.update(data.batch[name].numpy().tobytes())
    return f"{digest.hexdigest()[:24]}-{mode}-{step_w}-{int(float64)}"
RESPONSE_LENGTH = 5

Episode = tuple[str, list[str], list[float], list[bool]]  # task, states s_0..s_{L-1}, env rewards, valid


def verl_agent_batch(episodes: list[Episode], penalty: float) -> DataProto:
    """The step rows of ``episodes`` as the authors' verl-agent trainer holds them at advantage time."""
    uid, traj, anchor, rewards, valid, episode_reward = [], [], [], [], [], []
    for i, (task, states, rews, oks) in enumerate(episodes):
        total = np.float32(0.0)
        for reward in rews:  # the rollout loop's float32 running sum
            total = np.float32(total + np.float32(reward))
        for state, reward, ok in zip(states, rews, oks):
            uid.append(f"task-{task}"), traj.append(f"traj-{i}"), anchor.append(f"Observation: {state}")
            rewards.append(np.float32(reward)), valid.append(bool(ok)), episode_reward.append(total)
    n = len(uid)
    lengths = [1 + (3 * row) % RESPONSE_LENGTH for row in range(n)]
    mask = torch.zeros(n, RESPONSE_LENGTH)
    scores = torch.zeros(n, RESPONSE_LENGTH)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
        scores[row, length - 1] = float(episode_reward[row]) - penalty * (not valid[row])

    def column(values: list) -> np.ndarray:
        array = np.empty(len(values), dtype=object)
        array[:] = values
        return array

    non_tensors = {"uid": column(uid), "traj_uid": column(traj), "anchor_obs": column(anchor),
                   "rewards": np.array(rewards, dtype=np.float32), "is_action_valid": column(valid),
                   "active_masks": column([True] * n), "episode_rewards": column(episode_reward)}
    prompts = torch.ones(n, 3, dtype=torch.long)
    tensors = {"prompts": prompts, "responses": torch.ones(n, RESPONSE_LENGTH, dtype=torch.long),
               "attention_mask": torch.cat([torch.ones_like(prompts), mask.long()], dim=1), "response_mask": mask,
               "token_level_scores": scores, "token_level_rewards": scores.clone()}
    data = DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)
    milegpo_verl.add_step_index(data)
    return data


def reference(data: DataProto, mode: str, step_w: float, float64: bool = False) -> dict[str, np.ndarray]:
    """The reference's advantage per row (and its group scores and links), as its trainer calls it: run live
    from ``G2PO_CHECKOUT`` (and kept, for ``--record``), else read from the recorded outputs."""
    key = _case_key(data, mode, step_w, float64)
    fields = ("advantages", "group_score", "group", "next_group")
    if REFERENCE is None:
        return {name: _recorded[f"{key}/{name}"] for name in fields}
    result = _run_reference(data, mode, step_w, float64)
    _recorded.update({f"{key}/{name}": np.asarray(result[name]) for name in fields})
    return result


def _run_reference(data: DataProto, mode: str, step_w: float, float64: bool) -> dict[str, np.ndarray]:
    assert REFERENCE is not None
    saved = torch.get_default_dtype()
    if float64:
        torch.set_default_dtype(torch.float64)
    try:
        step_rewards, group_idx, next_group_idx = REFERENCE.compute_group_aggregation_values(batch=data)
        mask = data.batch["response_mask"]
        rewards = data.batch["token_level_rewards"]
        advantages, _ = REFERENCE.compute_g2po_outcome_advantage(
            token_level_rewards=rewards.double() if float64 else rewards, step_rewards=step_rewards,
            response_mask=mask.double() if float64 else mask, index=data.non_tensor_batch["uid"],
            traj_index=data.non_tensor_batch["traj_uid"], group_idx=group_idx, next_group_idx=next_group_idx,
            is_action_valid=data.non_tensor_batch["is_action_valid"], step_advantage_w=step_w, mode=mode)
    finally:
        torch.set_default_dtype(saved)
    return {"advantages": advantages[:, 0].double().numpy(), "group_score": np.asarray(step_rewards, dtype=float),
            "group": np.asarray(group_idx), "next_group": np.asarray(next_group_idx)}


def ours(data: DataProto, mode: str, step_w: float, penalty: float):
    advantages, _, credit = milegpo_verl.compute_step_advantage(
        data, "g2po", {"upstream_exact": True, "norm": mode, "w_step": step_w}, invalid_action_penalty=penalty)
    return advantages[:, 0].double().numpy(), credit


def random_episodes(shape: str, seed: int) -> list[Episode]:
    """Four tasks over a small state space (states recur), 20 % invalid actions, with rewards of one shape:

    * alfworld: 10 on the last step of a success, else 0;
    * sokoban: -0.1 every step (an invalid one included), +1 for a box pushed on target, +10 when solved (a
      solve rarely sums to exactly 10, so the reference's success test mostly fails on it);
    * truncated: alfworld rewards, failures run to the step limit (8) looping over few states;
    * k1: alfworld rewards, two of the tasks rolled out once (K = 1, two steps or more).
    """
    rng = np.random.default_rng(seed)
    episodes: list[Episode] = []
    for q, task in enumerate("ABCD"):
        k = 1 if shape == "k1" and q < 2 else int(rng.integers(2, 6))
        for _ in range(k):
            won = bool(rng.random() < 0.4)
            length = 8 if shape == "truncated" and not won else int(rng.integers(2, 9))
            states = [f"{task}0"] + [f"{task}{rng.integers(1, 3 if shape == 'truncated' else 4)}"
                                     for _ in range(length - 1)]
            valid = (rng.random(length) > 0.2).tolist()
            rewards = np.zeros(length)
            if shape == "sokoban":
                rewards += -0.1 + (rng.random(length) < 0.2) * 1.0
            rewards[-1] += 10.0 * won
            episodes.append((task, states, rewards.tolist(), valid))
    return episodes


def tied_episodes(seed: int) -> list[Episode]:
    """Ties everywhere: a task of identical trajectories, one of seven one-step failures of equal reward (the
    reference's float32 mean of seven equal gains is off by a rounding step for these rewards), one whose rollouts
    all succeed along one path, and a task of random ALFWorld-like rollouts beside them."""
    rng = np.random.default_rng(seed)
    k = int(rng.integers(3, 6))
    path = (["A0", "A1", "A2", "A1"], [-0.1, -0.1, 0.9, -0.1], [True, False, True, True])
    episodes: list[Episode] = [("A", *path) for _ in range(k)]
    reward = [-0.1, -0.3, 0.6, 1.3][seed % 4]
    episodes += [("B", ["B0"], [reward], [True]) for _ in range(7)]
    episodes += [("C", ["C0", "C1"], [0.0, 10.0], [True, True]) for _ in range(3)]
    episodes += [e for e in random_episodes("alfworld", seed) if e[0] == "D"]
    return episodes


SETTINGS = [(0.1, 1.0), (0.0, 0.5), (0.5, 1.0)]  # (the trainer's invalid-action penalty, step_advantage_w)


def check(data: DataProto, mode: str, penalty: float, step_w: float) -> tuple[float, int]:
    """Assert milegpo equals the reference (see the module docstring); return the largest gap to the float32
    run on the rows compared and how many rows the reference's float32 rounding moved."""
    ref32 = reference(data, mode, step_w)
    ref64 = reference(data, mode, step_w, float64=True)
    got, credit = ours(data, mode, step_w, penalty)
    assert np.abs(got - ref64["advantages"]).max() <= 1e-5
    settled = np.abs(ref32["advantages"] - ref64["advantages"]) <= 1e-5
    gap = float(np.abs(got - ref32["advantages"])[settled].max())
    assert gap <= 1e-5
    # the intermediates: group scores, and each row's next group (or sentinel) by its score
    assert credit.components["group_score"] == pytest.approx(ref32["group_score"], abs=1e-6)
    score_of = {(u, g): s for u, g, s in zip(data.non_tensor_batch["uid"], ref32["group"], ref32["group_score"])}
    next_scores = [10.0 if g == -1 else 0.0 if g == -2 else score_of[(u, g)]
                   for u, g in zip(data.non_tensor_batch["uid"], ref32["next_group"])]
    assert credit.components["next_score"] == pytest.approx(next_scores, abs=1e-6)
    assert np.abs(got).max() > 0.05
    return gap, int((~settled).sum())


@pytest.mark.parametrize("mode", ["mean_norm", "mean_std_norm"])
@pytest.mark.parametrize("shape", ["alfworld", "sokoban", "truncated", "k1"])
def test_upstream_exact_g2po_is_the_references(shape: str, mode: str) -> None:
    for seed in range(6):
        for penalty, step_w in SETTINGS:
            check(verl_agent_batch(random_episodes(shape, seed), penalty), mode, penalty, step_w)


@pytest.mark.parametrize("mode", ["mean_norm", "mean_std_norm"])
def test_ties_are_exact_where_the_reference_rounds(mode: str) -> None:
    moved = 0
    for seed in range(4):
        for penalty, step_w in SETTINGS:
            moved += check(verl_agent_batch(tied_episodes(seed), penalty), mode, penalty, step_w)[1]
    # under mean_std_norm the reference's float32 residue moves some tied rows by more than float32 precision
    assert (moved > 0) == (mode == "mean_std_norm")


def test_a_lone_step_is_where_the_reference_keeps_the_raw_reward() -> None:
    # a task rolled out once for a single step: the reference's episode term falls back to mean 0, std 1 (the raw
    # episode reward) and its score gain is the std of one value under mean_std_norm (NaN); milegpo gives 0
    episodes: list[Episode] = [("A", ["A0"], [10.0], [True]), ("B", ["B0", "B1"], [0.0, 10.0], [True, True]),
                               ("B", ["B0", "B2"], [0.0, 0.0], [True, True])]
    data = verl_agent_batch(episodes, 0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # live: torch.std of the lone row's one score gain
        assert reference(data, "mean_norm", 1.0)["advantages"][0] == 10.0
        assert np.isnan(reference(data, "mean_std_norm", 1.0)["advantages"][0])
    for mode in ("mean_norm", "mean_std_norm"):
        got, _ = ours(data, mode, 1.0, 0.1)
        assert got[0] == 0.0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the same torch.std warning
            want = reference(data, mode, 1.0)["advantages"]
        assert np.abs(got[1:] - want[1:]).max() <= 1e-5



def record() -> None:
    """Run every test above against the live reference and write what it answered to :data:`RECORDED`."""
    assert REFERENCE is not None, "set G2PO_CHECKOUT to a checkout of https://github.com/Nala-YN/G2PO"
    for mode in ("mean_norm", "mean_std_norm"):
        for shape in ("alfworld", "sokoban", "truncated", "k1"):
            test_upstream_exact_g2po_is_the_references(shape, mode)
        test_ties_are_exact_where_the_reference_rounds(mode)
    test_a_lone_step_is_where_the_reference_keeps_the_raw_reward()
    RECORDED.parent.mkdir(exist_ok=True)
    np.savez_compressed(RECORDED, **_recorded)
    print(f"recorded {len(_recorded)} arrays of the reference to {RECORDED}")


if __name__ == "__main__":  # G2PO_CHECKOUT=PATH python tests/test_credit_g2po_reference.py --record
    record()
