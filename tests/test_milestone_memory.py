"""MileGPO's milestone memory (milegpo.credit.memory): its limits equal MileGPO, hand-built groups
worked on paper, its bounds, checkpoints and data-parallel ranks."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from milegpo.credit import MileGPOConfig, MilestoneMemory, StepBatch, compute_credit, remembered_credit
from milegpo.credit.memory import milegpo_with_memory

sys.path.insert(0, str(Path(__file__).parent))
import memory_worker  # noqa: E402
from memory_worker import random_batch  # noqa: E402

WORKER = str(Path(__file__).parent / "memory_worker.py")


def milegpo_config(**memory) -> MileGPOConfig:
    return MileGPOConfig(**memory)


def test_memory_is_off_by_default_and_compute_credit_refuses_it_without_the_memory() -> None:
    assert MileGPOConfig().memory_half_life == 0
    batch = random_batch(0)
    with pytest.raises(ValueError, match="remembered_credit"):
        compute_credit("milegpo", batch, {"memory_half_life": 4.0})
    with pytest.raises(ValueError, match="memory_max_states"):
        MileGPOConfig(memory_max_states=0)


@pytest.mark.parametrize("half_life", [0.0, 1e-9])
def test_half_life_to_zero_is_milegpo_bit_for_bit_over_iterations(half_life: float) -> None:
    config, memory = milegpo_config(memory_half_life=half_life), MilestoneMemory()
    for iteration in range(4):
        batch = random_batch(iteration)
        result, memory = milegpo_with_memory(batch, config, memory)
        reference = compute_credit("milegpo", batch, MileGPOConfig())
        np.testing.assert_array_equal(result.advantages, reference.advantages)
        for name, values in reference.components.items():
            np.testing.assert_array_equal(result.components[name], values)
        assert result.diagnostics["memory_evidence_share"] == 0.0
    assert memory.iteration == 4 and memory.recurrence_rate == 0.0 and not memory.tasks  # all forgotten


def test_first_iteration_with_memory_is_milegpo_bit_for_bit() -> None:
    batch = random_batch(3)
    result, memory = milegpo_with_memory(batch, milegpo_config(memory_half_life=8.0), MilestoneMemory())
    reference = compute_credit("milegpo", batch, MileGPOConfig())
    np.testing.assert_array_equal(result.advantages, reference.advantages)
    assert reference.diagnostics["milestones"] == result.diagnostics["milestones"]
    assert len(memory.tasks) == 4 and memory.tasks_recurred == 0


def test_graphgpo_term_and_normalisation_stay_the_groups_own() -> None:
    memory = MilestoneMemory()
    config = milegpo_config(memory_half_life=float("inf"))
    for seed in range(3):
        batch = random_batch(seed)
        result, memory = milegpo_with_memory(batch, config, memory)
    reference = compute_credit("milegpo", batch, MileGPOConfig())
    np.testing.assert_array_equal(result.components["r_G"], reference.components["r_G"])
    np.testing.assert_array_equal(result.components["A_G"], reference.components["A_G"])
    np.testing.assert_array_equal(result.components["episode"], reference.components["episode"])
    assert not np.array_equal(result.advantages, reference.advantages)  # the shaping read the memory
    assert 0 < result.diagnostics["memory_evidence_share"] < 1


# Hand-built groups of one task. Iteration A: a success through x (s0 -> x -> goal) and a failure that
# loops in w. Iteration B: the success goes through y; two failures pass x and end in z.
GROUP_A = (([["s0", "x", "end"], ["s0", "w", "w"]]), [True, False])
GROUP_B = (([["s0", "y", "end"], ["s0", "x", "z"], ["s0", "x", "z"]]), [True, False, False])


def group(trajectories, success, task: int = 7) -> StepBatch:
    return StepBatch.from_trajectories(trajectories, success=success, task_ids=[task] * len(success))


def listed(result, kind: str) -> dict[str, dict]:
    return {entry["state"]: entry for entry in result.diagnostics[kind]}


def test_the_trap_of_one_group_is_a_milestone_of_the_task_with_memory() -> None:
    """On paper, iteration B alone: x is visited by 2 failures and no success, a trap. With A remembered
    (h = inf): the task has 5 trajectories, 2 successes (p_q = 0.4); x has 3 visits, 1 success: a
    milestone, lift max(1/3 - 0.4, 0) = 0, coverage 1/2; y: 1 visit, 1 success, lift 0.6, coverage 1/2;
    z (2 failures, no success) stays a trap, score w_f * ((1 - 0) - (1 - 0.4)) = 0.4 (no revisit)."""
    alone = compute_credit("milegpo", group(*GROUP_B), MileGPOConfig(diagnostics_top_k=10))
    assert "x" in listed(alone, "traps") and "x" not in listed(alone, "milestones")

    config = milegpo_config(memory_half_life=float("inf"), diagnostics_top_k=10)
    _, memory = milegpo_with_memory(group(*GROUP_A), config, MilestoneMemory())
    result, after = milegpo_with_memory(group(*GROUP_B), config, memory)
    milestones = listed(result, "milestones")
    assert list(listed(result, "traps")) == ["z"] and listed(result, "traps")["z"]["score"] == pytest.approx(0.4)
    assert milestones["x"]["n_success"] == 1.0 and milestones["x"]["n_visits"] == 3.0
    assert milestones["x"]["lift"] == 0.0 and milestones["x"]["coverage"] == 0.5
    assert milestones["y"]["lift"] == pytest.approx(0.6) and milestones["y"]["coverage"] == 0.5
    assert result.diagnostics["memory_evidence_share"] == pytest.approx(2 / 5)
    assert result.diagnostics["memory_recurring_frac"] == 1.0
    remembered = after.tasks[7].counts
    nodes = dict(zip(remembered.node_keys, remembered.node_counts.tolist()))
    assert nodes["x"] == [3.0, 1.0, 0.0] and nodes["w"] == [1.0, 0.0, 1.0] and nodes["s0"] == [5.0, 2.0, 0.0]
    assert (remembered.n_traj, remembered.n_succ) == (5.0, 2.0)


@pytest.mark.parametrize(("half_life", "remembers_x"), [(1.0, False), (2.0, True)])
def test_a_sighting_two_iterations_old_decays_by_its_half_life(half_life: float, remembers_x: bool) -> None:
    """A's one success through x, two iterations old: weight 2^(-2/h) = 0.25 at h = 1 (below 1/2:
    forgotten, B is credited as MileGPO credits it alone) and 0.5 at h = 2 (kept: x is a milestone)."""
    config = milegpo_config(memory_half_life=half_life, diagnostics_top_k=10)
    _, memory = milegpo_with_memory(group(*GROUP_A), config, MilestoneMemory())
    _, memory = milegpo_with_memory(group(*GROUP_A, task=8), config, memory)  # another task in between
    result, _ = milegpo_with_memory(group(*GROUP_B), config, memory)
    alone = compute_credit("milegpo", group(*GROUP_B), MileGPOConfig(diagnostics_top_k=10))
    if remembers_x:
        assert listed(result, "milestones")["x"]["n_success"] == 0.5
        assert "x" not in listed(result, "traps")
    else:
        np.testing.assert_array_equal(result.advantages, alone.advantages)


def test_caps_keep_the_most_visited_states_and_the_most_recent_tasks() -> None:
    config = milegpo_config(memory_half_life=float("inf"), memory_max_states=2, memory_max_tasks=2)
    memory = MilestoneMemory()
    for seed, tasks in enumerate([[0, 1], [2], [1, 3]]):
        _, memory = milegpo_with_memory(random_batch(seed, task_ids=tasks), config, memory)
    assert sorted(memory.tasks) == [1, 3]  # seen last; 0 and 2 dropped
    assert memory.recurrence_rate == 0.0  # task 1 came back after the cap had dropped it (kept: 2, then 0)
    for entry in memory.tasks.values():
        counts = entry.counts
        assert len(counts.node_keys) <= 2 and len(counts.edge_keys) <= 2
        assert counts.node_keys[0] == "s0"  # every trajectory visits the start
    # ties in the last-seen iteration drop the larger keys
    _, memory = milegpo_with_memory(random_batch(9, task_ids=[5, 4, 6]), config, memory)
    assert sorted(memory.tasks) == [4, 5]


def test_a_task_whose_trajectories_all_decayed_is_dropped() -> None:
    """Group A's 2 trajectories at h = 1 weigh 2 * 2^(-a): 1 after one iteration, 0.5 after two (kept),
    0.25 after three (below 1/2: the task is dropped, its recurrence no longer counts)."""
    config = milegpo_config(memory_half_life=1.0)
    _, memory = milegpo_with_memory(group(*GROUP_A, task=7), config, MilestoneMemory())
    _, memory = milegpo_with_memory(group(*GROUP_A, task=8), config, memory)
    assert 7 in memory.tasks  # two iterations old at the next read: 0.5 left
    _, memory = milegpo_with_memory(group(*GROUP_A, task=9), config, memory)
    assert 7 not in memory.tasks and sorted(memory.tasks) == [8, 9]
    result, _ = milegpo_with_memory(group(*GROUP_B, task=7), config, memory)
    assert result.diagnostics["memory_recurring_frac"] == 0.0


def test_task_keys_name_tasks_across_renumbered_groups_and_must_cover_the_batch() -> None:
    config = milegpo_config(memory_half_life=float("inf"))
    _, memory = milegpo_with_memory(group(*GROUP_A, task=0), config, MilestoneMemory(), task_keys={0: 1234})
    result, _ = milegpo_with_memory(group(*GROUP_B, task=3), config, memory, task_keys={3: 1234})
    assert result.diagnostics["memory_recurring_frac"] == 1.0
    with pytest.raises(ValueError, match=r"no key for the batch's task ids \[3\]"):
        remembered_credit(group(*GROUP_B, task=3), config, memory, task_keys={0: 1234})


def test_memory_round_trips_through_json_exactly() -> None:
    config = milegpo_config(memory_half_life=3.0)
    memory = MilestoneMemory()
    for seed in range(3):
        _, memory = milegpo_with_memory(random_batch(seed), config, memory)
    loaded = MilestoneMemory.from_dict(json.loads(json.dumps(memory.to_dict())))
    assert loaded.to_dict() == memory.to_dict()
    batch = random_batch(5)
    a, next_a = milegpo_with_memory(batch, config, memory)
    b, next_b = milegpo_with_memory(batch, config, loaded)
    np.testing.assert_array_equal(a.advantages, b.advantages)
    assert next_a.to_dict() == next_b.to_dict()
    with pytest.raises(ValueError, match="damaged"):
        MilestoneMemory.from_dict({"iteration": 1, "tasks": [{"task": 1}]})


def test_ranks_crediting_their_own_groups_agree_with_one_process() -> None:
    """Two ranks, each with two groups (task ids 0, 1 on each; keys = their task seeds), read the same
    memory and advance it by both ranks' counts in rank order: the memory and the advantages are
    those of one process with the four groups (the ranks' batches merged as the trainer merges them)."""
    config = milegpo_config(memory_half_life=2.0)
    one, ranks = MilestoneMemory(), MilestoneMemory()
    for iteration, draw in enumerate(memory_worker.SEEDS):
        parts = [memory_worker.rank_batch(iteration, rank) for rank in range(2)]
        whole = StepBatch.concat(parts, task_offsets=[0, 2])
        result, one = milegpo_with_memory(whole, config, one, task_keys=dict(enumerate(draw)))
        observed, advantages = [], []
        for rank, part in enumerate(parts):
            credit, counts = remembered_credit(part, config, ranks, task_keys=memory_worker.rank_keys(draw, rank))
            observed += counts
            advantages.append(credit.advantages)
        ranks = ranks.advance(observed, config)
        np.testing.assert_array_equal(np.concatenate(advantages), result.advantages)
        assert ranks.to_dict() == one.to_dict()


def test_the_memory_diagnostics_reach_the_credit_log() -> None:
    config = milegpo_config(memory_half_life=4.0)
    _, memory = milegpo_with_memory(random_batch(0), config, MilestoneMemory())
    result, _ = milegpo_with_memory(random_batch(1), config, memory)
    logged = result.log_values()
    for name in ("memory_evidence_share", "memory_recurring_frac", "memory_recurrence_rate", "memory_tasks",
                 "memory_bytes"):
        assert f"credit/{name}" in logged
    assert logged["credit/memory_recurrence_rate"] == 0.5 and logged["credit/memory_bytes"] > 0


def test_a_resumed_training_run_gives_the_same_advantages_and_memory(model_path: str, tmp_path: Path) -> None:
    from milegpo.algos import MileGPO
    from milegpo.envs.house import HouseEnv
    from milegpo.envs.vec_env import make_vec_env

    def house():  # two tasks, both drawn every iteration: every task recurs
        return make_vec_env(HouseEnv, n_tasks=2, group_size=3, seed=0,
                            env_kwargs={"num_tasks": 2, "max_episode_steps": 6})

    model = MileGPO("LLMPolicy", house(), learning_rate=1e-2, seed=0, credit_kwargs={"memory_half_life": 2.0},
                    policy_kwargs={"model": model_path, "mode": "choose", "history_length": 0,
                                   "prompt_template": "{observation}", "temperature": 5.0})
    model.learn(total_timesteps=1)
    model.learn(total_timesteps=1, reset_num_timesteps=False)
    assert model.last_rollout_log["credit/memory_recurring_frac"] == 1.0
    assert model.last_rollout_log["credit/memory_evidence_share"] > 0
    model.save(tmp_path / "ckpt")
    loaded = MileGPO.load(tmp_path / "ckpt", env=house())
    assert loaded.rollout_state.credit_memory is not None
    assert loaded.rollout_state.credit_memory.to_dict() == model.rollout_state.credit_memory.to_dict()
    model.learn(total_timesteps=1, reset_num_timesteps=False)
    loaded.learn(total_timesteps=1, reset_num_timesteps=False)
    np.testing.assert_array_equal(model.rollout_buffer.advantages, loaded.rollout_buffer.advantages)
    assert loaded.rollout_state.credit_memory.to_dict() == model.rollout_state.credit_memory.to_dict()
    assert dataclasses.asdict(model.rollout_state)["credit_memory"] is not None


@pytest.mark.slow
def test_two_gloo_ranks_hold_the_memory_one_process_holds(tmp_path: Path) -> None:
    """Under torchrun (gloo), each rank credits its own groups through the trainer's function
    (milegpo.algos.iteration.remembered_global_credit); both ranks' memories and rank 0's logged credit
    equal one process's."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "--master_port", str(28500 + os.getpid() % 1000), WORKER, str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    one = json.loads((tmp_path / "one.json").read_text())
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert ranks[0] == one and ranks[1] == {"memory": one["memory"], "logged": None}


# --- review fixes: the task a group played, settings the memory was built under, shared guards, the
# forgetting boundary, plots and settings of a run with the memory


def house(n_tasks: int = 2, num_tasks: int = 2):
    from milegpo.envs.house import HouseEnv
    from milegpo.envs.vec_env import make_vec_env

    return make_vec_env(HouseEnv, n_tasks=n_tasks, group_size=3, seed=0,
                        env_kwargs={"num_tasks": num_tasks, "max_episode_steps": 6})


def trainer(model_path: str, env, **credit):
    from milegpo.algos import MileGPO

    return MileGPO("LLMPolicy", env, learning_rate=1e-2, seed=0, credit_kwargs=credit,
                   policy_kwargs={"model": model_path, "mode": "choose", "history_length": 0,
                                  "prompt_template": "{observation}", "temperature": 5.0})


def test_a_draw_larger_than_the_split_keys_the_memory_on_the_task_played(model_path: str) -> None:
    """Three groups over House's two tasks: the vec env draws any seeds (the draw does not fit the split)
    and seed s plays task s % 2; the memory keys on that task, so it holds 2 tasks and both recur."""
    model = trainer(model_path, house(n_tasks=3, num_tasks=2), memory_half_life=float("inf"))
    model.learn(total_timesteps=1)
    assert max(model.env.task_seeds) >= 2  # seeds beyond the split: the key is not the seed
    model.learn(total_timesteps=1, reset_num_timesteps=False)
    assert sorted(model.rollout_state.credit_memory.tasks) == [0, 1]
    assert model.last_rollout_log["credit/memory_recurring_frac"] == 1.0
    assert model.last_rollout_log["credit/memory_evidence_share"] > 0


@pytest.fixture
def saved_memory_run(model_path: str, tmp_path: Path) -> Path:
    """A checkpoint of two iterations with the memory at h = 2 on House's two tasks."""
    model = trainer(model_path, house(), memory_half_life=2.0)
    model.learn(total_timesteps=1)
    model.learn(total_timesteps=1, reset_num_timesteps=False)
    assert model.rollout_state.credit_memory.scope["memory_half_life"] == 2.0
    assert model.rollout_state.credit_memory.scope["env.num_tasks"] == 2
    model.save(tmp_path / "ckpt")
    return tmp_path / "ckpt"


def memory_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "milestone memory" in r.getMessage()]


def test_a_run_resumed_with_the_memory_off_drops_it_in_one_line(saved_memory_run: Path, tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    from milegpo.algos import MileGPO

    with caplog.at_level("WARNING"):
        off = MileGPO.load(saved_memory_run, env=house(), credit_kwargs={"memory_half_life": 0.0})
        off.save(tmp_path / "off")  # saved again before any iteration: not carried either
        off.learn(total_timesteps=1, reset_num_timesteps=False)
    assert memory_warnings(caplog) == ["the milestone memory of 2 task(s) is dropped: the credit no longer uses it "
                                       "(memory_half_life is 0); turning it on again starts a fresh one"]
    assert off.rollout_state.credit_memory is None
    assert json.loads((tmp_path / "off" / "config.json").read_text())["credit_memory"] is None
    model = MileGPO("LLMPolicy", house(), learning_rate=1e-2, seed=0,  # a memory set by hand, then turned off
                    policy_kwargs={"model": off.policy_config.model, "mode": "choose"})
    model.rollout_state.credit_memory = MilestoneMemory(1)
    with caplog.at_level("WARNING"):
        model.learn(total_timesteps=1)
    assert model.rollout_state.credit_memory is None and len(memory_warnings(caplog)) == 2


@pytest.mark.parametrize(("change", "named"), [
    ({"credit_kwargs": {"memory_half_life": 4.0}}, "memory_half_life 2.0 -> 4.0"),
    ({"credit_kwargs": {"memory_half_life": 2.0, "memory_max_states": 8}}, "memory_max_states 1024 -> 8"),
    ({"env": "three tasks"}, "env.num_tasks 2 -> 3"),
])
def test_a_memory_built_under_other_settings_is_not_read(saved_memory_run: Path, change: dict, named: str,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """A resume with another half-life or cap, or on another env (set_env), starts a fresh memory and
    says so in one line naming what differs; the same settings read the saved one."""
    from milegpo.algos import MileGPO

    same = MileGPO.load(saved_memory_run, env=house())
    with caplog.at_level("WARNING"):
        same.learn(total_timesteps=1, reset_num_timesteps=False)
    assert memory_warnings(caplog) == [] and same.rollout_state.credit_memory.iteration == 3
    caplog.clear()
    credit = change.get("credit_kwargs")
    model = MileGPO.load(saved_memory_run, env=house(), **({"credit_kwargs": credit} if credit else {}))
    if "env" in change:
        model.set_env(house(num_tasks=3))
    with caplog.at_level("WARNING"):
        model.learn(total_timesteps=1, reset_num_timesteps=False)
    [warning] = memory_warnings(caplog)
    assert warning.startswith("starting a fresh milestone memory: the saved one (2 task(s)) was built under other "
                              "settings (") and named in warning
    assert model.rollout_state.credit_memory.iteration == 1  # fresh: this iteration's counts only
    assert model.last_rollout_log["credit/memory_evidence_share"] == 0.0


def test_a_memory_saved_without_its_settings_reads_back_with_none() -> None:
    saved = MilestoneMemory(2).to_dict()
    del saved["scope"]
    assert MilestoneMemory.from_dict(saved).scope == {}


def equal_outcomes() -> StepBatch:
    return group([["s0", "a", "b"], ["s0", "a", "c"], ["s0", "a", "b"]], [True, True, True], task=0)


def nan_reward() -> StepBatch:
    batch = group([["s0", "a", "b"], ["s0", "a", "c"]], [True, False], task=0)
    return dataclasses.replace(batch, rewards=np.where(np.arange(batch.num_steps) == 0, np.nan, batch.rewards))


@pytest.mark.parametrize(("batch", "settings"), [(equal_outcomes, {"epsilon": 0.0}), (nan_reward, {})])
def test_remembered_credit_refuses_what_compute_credit_refuses(batch, settings: dict) -> None:
    with np.errstate(invalid="ignore", divide="ignore"), pytest.raises(ValueError) as refused:
        compute_credit("milegpo", batch(), MileGPOConfig(**settings))
    with np.errstate(invalid="ignore", divide="ignore"), pytest.raises(ValueError) as remembered:
        remembered_credit(batch(), MileGPOConfig(memory_half_life=2.0, **settings), MilestoneMemory())
    assert str(remembered.value).split(" under ")[0] == str(refused.value).split(" under ")[0]


@pytest.mark.parametrize("half_life", [2.0, 5.0, 10.0])
def test_a_sighting_lasts_one_half_life_whether_or_not_the_task_came_back(half_life: float) -> None:
    """A's success through x, h iterations old: weight exactly 1/2 in one step; decayed in two steps (the
    task seen again in between without x) the product can round a hair below 1/2 (2^-0.2 * 2^-0.8 at
    h = 5 is 0.5 - 5.6e-17). Either way x is a milestone of B, not a trap."""
    config = milegpo_config(memory_half_life=half_life, diagnostics_top_k=10)
    again = ([["s0", "y", "end"], ["s0", "q", "q"]], [True, False])  # the task again, x not visited
    for seen_again in (False, True):
        _, memory = milegpo_with_memory(group(*GROUP_A, task=7), config, MilestoneMemory())
        between = group(*again, task=7) if seen_again else group(*GROUP_A, task=8)
        _, memory = milegpo_with_memory(between, config, memory)
        for _ in range(int(half_life) - 2):
            _, memory = milegpo_with_memory(group(*GROUP_A, task=9), config, memory)
        result, _ = milegpo_with_memory(group(*GROUP_B), config, memory)  # x's sighting is h iterations old
        assert listed(result, "milestones")["x"]["n_success"] == pytest.approx(0.5), seen_again
        assert "x" not in listed(result, "traps")


def strict_json(text: str) -> dict:
    def refuse(constant: str) -> None:
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_memory_settings_take_inf_as_text_refuse_nan_and_fractional_caps_and_stay_strict_json() -> None:
    from milegpo.config import AlgoConfig
    from milegpo.config.fields import from_dict, to_dict

    assert MileGPOConfig(memory_half_life="inf").memory_half_life == float("inf")  # a command line's inf
    assert MileGPOConfig(memory_half_life=3).memory_half_life == 3.0
    for bad in (float("nan"), ".nan", "abc", True):
        with pytest.raises(ValueError, match=r"^memory_half_life must be a number of iterations >= 0 \(0: off"):
            MileGPOConfig(memory_half_life=bad)
    for name in ("memory_max_states", "memory_max_tasks"):
        for bad in (2.5, True, 0, "8"):
            with pytest.raises(ValueError, match=rf"^{name} must be an integer >= 1, got {bad!r}$"):
                MileGPOConfig(**{name: bad})
    algo = AlgoConfig(method="milegpo", credit_kwargs={"memory_half_life": float("inf")})
    written = json.dumps(to_dict(algo))
    assert strict_json(written)["credit_kwargs"] == {"memory_half_life": "inf"}
    assert from_dict(AlgoConfig, json.loads(written)).credit_config().memory_half_life == float("inf")


def test_milegpo_train_with_the_memory_set_on_the_command_line(tmp_path: Path) -> None:
    """The docs' ``memory_half_life=inf`` on the command line: the run trains, writes strict JSON, and its
    trajectory_credit.png (recomputed from last_batch.npz, which lacks the memory) is skipped in one true
    line, not a failed-plot warning; a resume of the finished run has no plot to write."""
    (tmp_path / "config.json").write_text(json.dumps({
        "run": {"total_timesteps": 48, "checkpoint_freq": 2},
        "env": {"n_tasks": 2, "group_size": 2, "kwargs": {"max_episode_steps": 6, "num_tasks": 2}},
        "eval": {"freq": 100, "n_tasks": 1, "copies": 1}}))
    run = tmp_path / "run"
    command = [sys.executable, "-m", "milegpo", "train", "--preset", "cpu-demo", "--config",
               str(tmp_path / "config.json"), "--run-dir", str(run), "algo.credit_kwargs.memory_half_life=inf",
               "--no-progress-bar"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "plotting" not in result.stderr
    notes = [line for line in result.stderr.splitlines() if "trajectory_credit.png" in line]
    assert notes == [f"note: {run / 'trajectory_credit.png'} is not drawn: the run's MileGPO credit reads the "
                     "milestone memory of earlier iterations, which last_batch.npz does not keep "
                     "(credit_diagnostics.jsonl has the credit each iteration logged)"]
    assert (run / "learning_curve.png").exists() and not (run / "trajectory_credit.png").exists()
    assert strict_json((run / "config.json").read_text())["algo"]["credit_kwargs"] == {"memory_half_life": "inf"}
    saved = strict_json((run / "final" / "config.json").read_text())
    assert saved["credit_memory"]["scope"]["memory_half_life"] == "inf"
    resumed = subprocess.run([sys.executable, "-m", "milegpo", "train", "--resume", str(run), "--no-progress-bar"],
                             capture_output=True, text=True, env=env, timeout=300)
    assert resumed.returncode == 0 and "is finished" in resumed.stdout
    assert "Wrote the missing plot" not in resumed.stdout and "plotting" not in resumed.stderr
