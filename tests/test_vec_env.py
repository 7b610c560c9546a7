"""GroupedTextVecEnv: groups, seeds, disabled autoreset, SB3 API, subprocess workers, crash recovery."""

from __future__ import annotations

import os
import sys

import cloudpickle
import numpy as np
import pytest

from milegpo.envs import GroupedTextVecEnv, TextEnv, UnknownEnvError, make_vec_env, register_env

# Spawned workers get the test env classes by value: they need not import this module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class CounterEnv(TextEnv):
    """Task ``seed``: move a counter from ``seed % 10`` to ``seed % 10 + 2``.

    ``"raise"`` makes the env raise; ``"exit"`` kills the process hosting it.
    """

    num_tasks = 50

    def __init__(self, max_episode_steps: int = 4, **kwargs):
        super().__init__(max_episode_steps=max_episode_steps, **kwargs)
        self.value = self.goal = 0
        self.greeting = "hi"

    def _reset(self, seed, options):
        if seed == 99:
            raise ValueError("no such task")
        task = (seed or 0) % self.num_tasks
        self.value, self.goal = task % 10, task % 10 + 2
        return self._text(), {"task": f"reach {self.goal}"}

    def _step(self, action):
        if action == "raise":
            raise RuntimeError("boom")
        if action == "exit":
            os._exit(3)
        self.value += 1 if action == "inc" else -1
        won = self.value == self.goal
        return self._text(), 10.0 if won else 0.0, won, {"won": won}

    def _text(self):
        return f"counter at {self.value}"

    def admissible_commands(self):
        return ["dec", "exit", "inc", "raise"]

    def shout(self, word, times=1):
        return (word.upper() + "!") * times


def make_counter(**kwargs):
    return CounterEnv(**kwargs)


@pytest.fixture
def venv():
    env = make_vec_env(CounterEnv, n_tasks=3, group_size=4, seed=1)
    yield env
    env.close()


def test_layout_and_group_reset(venv):
    assert venv.num_envs == 12 and venv.n_tasks == 3 and venv.group_size == 4
    assert venv.group_ids.dtype == np.int64 and list(venv.group_ids) == [0] * 4 + [1] * 4 + [2] * 4
    obs = venv.reset()
    assert obs.dtype == object and obs.shape == (12,) and all(isinstance(o, str) for o in obs)
    assert len(venv.task_seeds) == 3 and len(set(venv.task_seeds.tolist())) == 3
    assert all(0 <= s < CounterEnv.num_tasks for s in venv.task_seeds)
    for g in range(3):
        group = venv.group_ids == g
        assert len(set(obs[group])) == 1
        tasks = {info["task"] for info, member in zip(venv.reset_infos, group) if member}
        assert tasks == {f"reach {venv.task_seeds[g] % 10 + 2}"}
    assert venv.active.all()
    assert isinstance(venv.observation_space.sample(), str) and venv.action_space.contains("go to countertop 1")


def test_seeding_is_reproducible(venv):
    first = [venv.reset().tolist(), venv.task_seeds.tolist()]
    second = [venv.reset().tolist(), venv.task_seeds.tolist()]
    assert first[1] != second[1]  # new tasks each reset
    venv.seed(1)
    assert [venv.reset().tolist(), venv.task_seeds.tolist()] == first


def test_reset_groups_explicit_seeds_and_short_list(venv):
    obs = venv.reset_groups([7, 13])
    assert venv.task_seeds.tolist() == [7, 13, -1]
    assert list(obs[:4]) == ["counter at 7"] * 4 and list(obs[4:8]) == ["counter at 3"] * 4
    assert list(obs[8:]) == [""] * 4 and not venv.active[8:].any() and venv.reset_infos[8]["inactive"]
    with pytest.raises(ValueError, match="4 task seeds for 3 groups"):
        venv.reset_groups([1, 2, 3, 4])


def test_autoreset_disabled(venv):
    venv.reset_groups([0, 1, 2])  # goals 2, 3, 4 from values 0, 1, 2
    actions = ["inc"] * 4 + ["dec"] * 4 + ["nonsense"] * 4
    obs, rewards, dones, infos = venv.step(actions)
    assert not dones.any() and rewards[8:].tolist() == [-0.1] * 4 and not infos[8]["valid_action"]
    obs, rewards, dones, infos = venv.step(actions)
    assert dones[:4].all() and rewards[:4].tolist() == [10.0] * 4 and not dones[4:].any()
    assert infos[0]["terminated"] and not infos[0]["TimeLimit.truncated"] and infos[0]["won"]
    assert infos[0]["terminal_observation"] == obs[0] == "counter at 2"
    assert venv.active.tolist() == [False] * 4 + [True] * 8
    obs, rewards, dones, infos = venv.step(["dec"] * 12)  # group 0 is done: a no-op
    assert list(obs[:4]) == ["counter at 2"] * 4 and rewards[:4].tolist() == [0.0] * 4 and dones[:4].all()
    assert infos[0]["inactive"] and not infos[4].get("inactive", False)
    obs, rewards, dones, infos = venv.step(["dec"] * 12)  # step 4 = horizon: groups 1, 2 truncated
    assert dones.all() and infos[4]["TimeLimit.truncated"] and not infos[4]["terminated"]
    assert not venv.active.any()
    venv.reset()
    assert venv.active.all()


def test_sb3_attribute_api(venv):
    venv.reset()
    assert venv.get_attr("greeting") == ["hi"] * 12
    venv.set_attr("greeting", "yo", indices=[1, 2])
    assert venv.get_attr("greeting", indices=[0, 1, 2]) == ["hi", "yo", "yo"]
    assert venv.env_method("shout", "a", indices=3) == ["A!"]
    assert venv.env_method("shout", "b", times=2, indices=[0, 5]) == ["B!B!", "B!B!"]
    assert venv.has_attr("num_tasks") and not venv.has_attr("no_such_attribute")
    assert venv.env_is_wrapped(TextEnv) == [False] * 12
    obs = venv.reset()
    assert venv.render("ansi").tolist() == obs.tolist()
    with pytest.raises(ValueError, match="expected 12 actions"):
        venv.step(["inc"])


def test_env_exception_in_process_truncates_only_that_env(venv):
    venv.reset_groups([0, 1, 2])
    actions = ["inc"] * 12
    actions[5] = "raise"
    obs, rewards, dones, infos = venv.step(actions)
    assert dones.tolist() == [i == 5 for i in range(12)]
    assert "RuntimeError: boom" in infos[5]["env_error"] and infos[5]["TimeLimit.truncated"]
    assert not infos[5]["terminated"] and rewards[5] == 0.0 and obs[5] == "counter at 1"
    assert not venv.active[5] and venv.active.sum() == 11
    obs, _, dones, infos = venv.step(["inc"] * 12)
    assert infos[5]["inactive"] and obs[4] == obs[6] == "counter at 3"
    obs = venv.reset_groups([0, 1, 2])  # the broken env is rebuilt
    assert venv.active.all() and obs[5] == "counter at 1"


def test_env_exception_in_reset_leaves_only_that_group_inactive(venv):
    obs = venv.reset_groups([1, 99, 2])
    assert venv.active.tolist() == [True] * 4 + [False] * 4 + [True] * 4
    assert all("ValueError: no such task" in info["env_error"] for info in venv.reset_infos[4:8])
    assert list(obs[4:8]) == [""] * 4
    _, rewards, dones, infos = venv.step(["inc"] * 12)
    assert dones[4:8].all() and infos[4]["inactive"] and rewards[4] == 0.0 and not dones[:4].any()
    venv.reset_groups([1, 2, 3])
    assert venv.active.all()


def test_unknown_env_id_lists_ids():
    with pytest.raises(UnknownEnvError, match="milegpo/House-v0"):
        make_vec_env("milegpo/NoSuchEnv-v0")


def test_factory_must_return_a_text_env():
    with pytest.raises(TypeError, match="not a milegpo.envs.TextEnv"):
        GroupedTextVecEnv(lambda: object(), n_tasks=1, group_size=2)


def _rollout(venv, steps=4):
    """Deterministic action script; returns everything observed."""
    trace = [venv.reset_groups([3, 8]).tolist()]
    rng = np.random.default_rng(0)
    for _ in range(steps):
        actions = rng.choice(["inc", "dec", "x"], size=venv.num_envs).tolist()
        obs, rewards, dones, infos = venv.step(actions)
        trace.append((obs.tolist(), rewards.tolist(), dones.tolist(), [i.get("state_key") for i in infos]))
    return trace


def test_subprocess_matches_in_process_and_recovers_from_crashes():
    register_env("test/Counter-v0", CounterEnv, max_episode_steps=4)  # registered only in this process
    local = make_vec_env("test/Counter-v0", n_tasks=2, group_size=3)
    remote = make_vec_env("test/Counter-v0", n_tasks=2, group_size=3, subprocess=True, n_workers=2, timeout=30)
    try:
        assert _rollout(local) == _rollout(remote)
        assert remote.get_attr("greeting", indices=[0, 5]) == ["hi", "hi"]
        assert remote.env_method("shout", "z", indices=[4]) == ["Z!"]
        with pytest.raises(AttributeError):
            remote.get_attr("no_such_attribute")

        remote.reset_groups([3, 8])
        actions = ["inc"] * 6
        actions[4] = "raise"  # an env raises inside worker 1
        obs, _, dones, infos = remote.step(actions)
        assert dones.tolist() == [False] * 4 + [True, False]
        assert "RuntimeError: boom" in infos[4]["env_error"]

        actions[0], actions[5] = "exit", "dec"  # worker 0 (envs 0-2) dies
        obs, _, dones, infos = remote.step(actions)
        assert dones.tolist() == [True, True, True, True, True, False]
        for i in range(3):
            assert "died" in infos[i]["env_error"] and "restarted" in infos[i]["env_error"]
            assert infos[i]["TimeLimit.truncated"] and not infos[i]["terminated"]
        assert infos[4]["inactive"] and obs[5] == "counter at 8"
        assert remote.active.tolist() == [False] * 5 + [True]

        obs = remote.reset_groups([3, 8])  # restarted worker and rebuilt env work again
        assert remote.active.all() and obs.tolist() == ["counter at 3"] * 3 + ["counter at 8"] * 3
        obs, _, dones, _ = remote.step(["inc"] * 6)
        assert obs.tolist() == ["counter at 4"] * 3 + ["counter at 9"] * 3
    finally:
        local.close()
        remote.close()


def test_subprocess_worker_timeout_is_reported():
    remote = make_vec_env(HangingEnv, n_tasks=1, group_size=2, subprocess=True, n_workers=1, timeout=2)
    try:
        remote.reset()
        _, _, dones, infos = remote.step(["hang", "inc"])
        assert dones.all() and all("no answer within 2 s" in info["env_error"] for info in infos)
        remote.reset()
        assert remote.active.all()
    finally:
        remote.close()


class HangingEnv(CounterEnv):
    def _step(self, action):
        if action == "hang":
            import time

            time.sleep(60)
        return super()._step(action)

    def admissible_commands(self):
        return [*super().admissible_commands(), "hang"]


def test_subprocess_house_equals_in_process():
    def trace(venv):
        rng = np.random.default_rng(3)
        out = [venv.reset().tolist(), venv.task_seeds.tolist()]
        infos = venv.reset_infos
        for _ in range(12):
            actions = [str(rng.choice(i["admissible_commands"])) if i.get("admissible_commands") else "" for i in infos]
            obs, rewards, dones, infos = venv.step(actions)
            out.append((obs.tolist(), rewards.tolist(), dones.tolist(), [i.get("state_key") for i in infos]))
        return out

    local = make_vec_env("milegpo/House-v0", n_tasks=2, group_size=2, seed=5)
    remote = make_vec_env("milegpo/House-v0", n_tasks=2, group_size=2, seed=5, subprocess=True, n_workers=2,
                          start_method="spawn")
    try:
        assert trace(local) == trace(remote)
    finally:
        local.close()
        remote.close()


def test_shards_draw_disjoint_slices_of_the_one_process_draw():
    from milegpo.envs import make_vec_env

    whole = make_vec_env("milegpo/House-v0", n_tasks=6, group_size=2, seed=5)
    shards = [make_vec_env("milegpo/House-v0", n_tasks=3, group_size=2, seed=5, shard=(rank, 2)) for rank in (0, 1)]
    for iteration in range(3):
        for env in (whole, *shards):
            env.seed(100 + iteration)
            env.reset()
        assert np.concatenate([s.task_seeds for s in shards]).tolist() == whole.task_seeds.tolist()
        assert not set(shards[0].task_seeds) & set(shards[1].task_seeds)
    for env in (whole, *shards):
        env.close()
    with pytest.raises(ValueError, match="shard"):
        make_vec_env("milegpo/House-v0", shard=(2, 2))
