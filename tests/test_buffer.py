"""TextRolloutBuffer: StepBatch assembly, env errors, minibatch coverage, advantage alignment."""

from __future__ import annotations

import numpy as np
import pytest

from milegpo.algos.buffer import TextRolloutBuffer, split_by_tokens, step_tokens
from milegpo.policies import ActionSample


def sample(text: str, prompt_len: int = 4, candidates: int = 0) -> ActionSample:
    """A choose-mode sample (candidates > 0) or a generate-mode one."""
    action = list(range(len(text.split())))
    cands = [action] * candidates if candidates else None
    return ActionSample(text=text, prompt_ids=list(range(prompt_len)), action_ids=action, candidate_ids=cands,
                        chosen=0 if candidates else None,
                        old_logprobs=np.zeros(1 if candidates else len(action), np.float32), parsed=True)


def info(key: str, won: bool = False, valid: bool = True, score: float = 0.0, **extra) -> dict:
    return {"state_key": key, "won": won, "valid_action": valid, "score": score, **extra}


def play(buffer: TextRolloutBuffer, env: int, keys: list[str], rewards: list[float], won: bool = False,
         valid: list[bool] | None = None) -> None:
    """Env ``env`` walks keys[0] -> keys[1] -> ... with the given rewards."""
    valid = valid or [True] * len(rewards)
    for t, reward in enumerate(rewards):
        done = t == len(rewards) - 1
        buffer.add(env, sample(f"a{env}{t}"), keys[t], reward, done,
                   info(keys[t + 1], won=won and done, valid=valid[t], score=1.0 if (won and done) else 0.0))


@pytest.fixture
def filled() -> TextRolloutBuffer:
    """2 groups x 2 envs with episode lengths 3, 1, 2, 4; envs 0 and 3 win."""
    buffer = TextRolloutBuffer(4, [0, 0, 1, 1])
    buffer.reset(task_seeds=[11, 42])
    play(buffer, 0, ["s", "x", "y", "goal"], [0.0, 0.0, 10.0], won=True)
    play(buffer, 1, ["s", "z"], [-0.1], valid=[False])
    play(buffer, 2, ["u", "v", "w"], [0.0, 0.0])
    play(buffer, 3, ["u", "v", "v", "w", "g2"], [0.0, -0.1, 0.0, 10.0], won=True, valid=[True, False, True, True])
    return buffer


def test_step_batch_rows_follow_trajectories(filled: TextRolloutBuffer) -> None:
    assert filled.full
    batch = filled.step_batch()
    assert batch.num_steps == 10 and batch.num_trajectories == 4
    np.testing.assert_array_equal(batch.traj_ids, [0, 0, 0, 1, 2, 2, 3, 3, 3, 3])
    np.testing.assert_array_equal(batch.task_ids, [0, 0, 0, 0, 1, 1, 1, 1, 1, 1])
    np.testing.assert_array_equal(batch.step_idx, [0, 1, 2, 0, 0, 1, 0, 1, 2, 3])
    np.testing.assert_array_equal(batch.dones, [0, 0, 1, 1, 0, 1, 0, 0, 0, 1])
    assert list(batch.state_keys[:3]) == ["s", "x", "y"] and list(batch.next_state_keys[:3]) == ["x", "y", "goal"]
    assert list(batch.actions[6:]) == ["a30", "a31", "a32", "a33"]
    np.testing.assert_allclose(batch.outcomes, [10.0, -0.1, 0.0, 9.9])
    np.testing.assert_array_equal(batch.success, [True, False, False, True])
    np.testing.assert_array_equal(batch.valid, [1, 1, 1, 0, 1, 1, 1, 0, 1, 1])
    assert [t.task_seed for t in filled.trajectories] == [11, 11, 42, 42]


def test_stats(filled: TextRolloutBuffer) -> None:
    stats = filled.stats()
    assert stats["success_rate"] == 0.5 and stats["steps"] == 10 and stats["env_errors"] == 0
    assert stats["ep_len_mean"] == pytest.approx(2.5)
    assert stats["invalid_action_rate"] == pytest.approx(0.2)
    assert stats["ep_rew_mean"] == pytest.approx((10.0 - 0.1 + 0.0 + 9.9) / 4)
    assert stats["score_mean"] == pytest.approx(0.5)


def test_advantages_are_aligned_to_their_rows(filled: TextRolloutBuffer) -> None:
    result = filled.compute_credit("grpo", {"norm": "mean_norm"})
    batch = filled.batch
    assert result.advantages.shape == (10,)
    for task in (0, 1):
        trajs = np.unique(batch.traj_ids[batch.task_ids == task])
        mean = batch.outcomes[trajs].mean()
        for row in np.flatnonzero(batch.task_ids == task):
            assert filled.advantages[row] == pytest.approx(batch.outcomes[batch.traj_ids[row]] - mean)
    # the samples of the rows are the ones recorded for those steps
    assert [s.text for s in filled.samples] == list(batch.actions)


def test_env_error_truncates_and_keeps_the_trajectory() -> None:
    buffer = TextRolloutBuffer(3, [0, 0, 0])
    buffer.reset([5])
    buffer.add_reset_error(0, "RuntimeError: engine failed to load")
    buffer.add(1, sample("go"), "a", 0.0, False, info("b"))
    buffer.add(1, sample("go"), "b", 0.0, False, info("c"))
    buffer.add(1, sample("go"), "c", 0.0, True, info("c", env_error="RuntimeError: boom"))
    play(buffer, 2, ["a", "goal"], [10.0], won=True)
    assert buffer.full
    batch = buffer.step_batch()
    # env 0 has no step: left out, trajectories renumbered; env 1's failed step dropped, previous one done
    np.testing.assert_array_equal(batch.traj_ids, [0, 0, 1])
    np.testing.assert_array_equal(batch.dones, [False, True, True])
    assert list(batch.next_state_keys) == ["b", "c", "goal"]
    np.testing.assert_array_equal(batch.success, [False, True])
    assert buffer.stats()["env_errors"] == 2
    with pytest.raises(RuntimeError, match="already finished"):
        buffer.add(1, sample("go"), "c", 0.0, False, info("d"))


def test_unfinished_rollout_is_refused() -> None:
    buffer = TextRolloutBuffer(2, [0, 0])
    buffer.add(0, sample("go"), "a", 0.0, True, info("b"))
    with pytest.raises(RuntimeError, match="not finished"):
        buffer.step_batch()


@pytest.mark.parametrize("batch_size", [None, 1, 3, 4, 100])
def test_minibatches_cover_every_row_once(filled: TextRolloutBuffer, batch_size: int | None) -> None:
    filled.compute_credit("grpo")
    minibatches = list(filled.get(np.random.default_rng(0), batch_size=batch_size))
    batches = [m.rows for m in minibatches]
    rows = np.concatenate(batches)
    for m in minibatches:  # typed samples aligned with their rows, the counts of the whole minibatch
        assert m.samples == [filled.samples[r] for r in m.rows]
        assert np.array_equal(m.advantages, filled.advantages[m.rows])
        assert m.n_seqs == len(m.rows) and m.n_units == sum(len(s.old_logprobs) for s in m.samples)
    assert sorted(rows.tolist()) == list(range(10))
    assert all(len(b) <= (batch_size or 10) for b in batches)
    assert len(batches) == -(-10 // (batch_size or 10))
    assert rows.tolist() != list(range(10))  # shuffled (this seed)


def test_token_budget_minibatches(filled: TextRolloutBuffer) -> None:
    filled.compute_credit("grpo")
    tokens = filled.row_tokens()
    assert tokens.tolist() == [5] * 10  # prompt 4 + one action word
    batches = [m.rows for m in filled.get(np.random.default_rng(1), mini_batch_tokens=12)]
    assert sorted(np.concatenate(batches).tolist()) == list(range(10))
    assert all(tokens[b].sum() <= 12 for b in batches) and [len(b) for b in batches] == [2, 2, 2, 2, 2]
    with pytest.raises(ValueError, match="not both"):
        next(filled.get(np.random.default_rng(0), batch_size=2, mini_batch_tokens=10))


def test_split_by_tokens_keeps_order_and_isolates_large_rows() -> None:
    tokens = np.array([3, 3, 10, 1, 1, 1])
    chunks = split_by_tokens(np.arange(6), tokens, budget=6)
    assert [c.tolist() for c in chunks] == [[0, 1], [2], [3, 4, 5]]
    with pytest.raises(ValueError):
        split_by_tokens(np.arange(6), tokens, budget=0)


def test_step_tokens_counts_candidates_in_choose_mode() -> None:
    assert step_tokens(sample("go to the kitchen", prompt_len=7)) == 7 + 4
    assert step_tokens(sample("go to", prompt_len=7, candidates=3)) == 7 + 3 * 2
