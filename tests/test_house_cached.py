"""House's cached work gives what recomputing gives: the process-wide task cache (each task drawn and solved
once), the per-layout exit / container / trap tables, and the commands of a state computed once per state."""

from __future__ import annotations

import numpy as np
import pytest

from milegpo.envs import house
from milegpo.envs.house import SPLITS, HouseEnv, generate_layout, initial_state, solve, transition
from milegpo.envs.house_world import Layout, State, _containers_here, _exits, _is_trap, admissible, describe


# The tables' reference: how the world model found exits, containers and traps by scanning the layout
# at every call, before the tables.
def _scanned_exits(layout: Layout, state: State) -> list[tuple[str, str, int]]:
    here, exits = state.location, []
    for index, edge in enumerate(layout.edges):
        if here not in (edge.a, edge.b) or (edge.kind == "heavy" and here == edge.b):
            continue
        exits.append((edge.b if here == edge.a else edge.a, edge.kind, index))
    return sorted(exits)


def _scanned_containers(layout: Layout, room: str) -> list[str]:
    return sorted(c for c, r in layout.containers if r == room)


def _scanned_trap(layout: Layout, room: str) -> bool:
    return any(e.kind == "heavy" and e.b == room for e in layout.edges)


# How a state found and moved its objects before reading the order of ``places`` (re-sorting at every step).
def _sorted_moved(state: State, obj: str, place: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((o, place if o == obj else p) for o, p in state.places))


def _sorted_holding(state: State) -> list[str]:
    return sorted(obj for obj, place in state.places if place == "inventory")


@pytest.mark.parametrize("split", sorted(SPLITS))
def test_a_cached_task_and_its_plan_equal_a_fresh_draw_and_solve(split):
    fresh_draw = generate_layout.__wrapped__  # the generator itself, no cache
    for index in range(0, SPLITS[split].num_tasks, 3 if split == "train" else 1):
        cached = generate_layout(split, index)
        fresh = fresh_draw(split, index)
        assert cached == fresh and cached.task == fresh.task
        assert solve(cached) == solve(fresh)
        assert generate_layout(split, index) is cached  # drawn (and solved) once per process


def test_envs_of_a_process_share_each_task_and_episodes_are_unchanged():
    a, b = HouseEnv(), HouseEnv()
    for seed in (5, 905, 17):
        obs_a, info_a = a.reset(seed=seed)
        obs_b, info_b = b.reset(seed=seed)
        assert a.layout is b.layout and (obs_a, info_a) == (obs_b, info_b)
        assert obs_a == f"{a.layout.task} {describe(a.layout, initial_state(a.layout))}"
    with pytest.raises(ValueError, match="split must be one of"):
        generate_layout("test", 0)


def _walk_states(split: str, index: int, rng: np.random.Generator, steps: int = 40) -> list[tuple[Layout, State]]:
    """The states of a random walk (traps, pits, doors and containers included) and of the solver's path."""
    layout = generate_layout(split, index)
    seen = []
    for commands in (solve(layout), None):
        state = initial_state(layout)
        seen.append((layout, state))
        for k in range(len(commands) if commands is not None else steps):
            options = admissible(layout, state)
            if not options:
                break
            command = commands[k] if commands is not None else str(rng.choice(options))
            state, _ = transition(layout, state, command)
            seen.append((layout, state))
    return seen


def test_the_layout_tables_and_the_state_methods_equal_scanning_and_sorting_at_every_state():
    rng = np.random.default_rng(0)
    pits = traps = 0
    for split in sorted(SPLITS):
        for index in range(0, SPLITS[split].num_tasks, 7 if split == "train" else 2):
            for layout, state in _walk_states(split, index, rng):
                assert list(_exits(layout, state)) == _scanned_exits(layout, state)
                for room in (*layout.rooms, house.PIT):
                    assert list(_containers_here(layout, room)) == _scanned_containers(layout, room)
                    assert _is_trap(layout, room) == _scanned_trap(layout, room)
                assert state.holding() == _sorted_holding(state)
                for obj, where in state.places:
                    assert state.place(obj) == where
                    for place in ("inventory", layout.start, f"in {layout.containers[0][0]}"):
                        assert state.moved(obj, place).places == _sorted_moved(state, obj, place)
                assert state.moved("no such thing", "inventory") == state
                pits += state.location == house.PIT
                traps += _scanned_trap(layout, state.location)
    assert pits and traps  # the walks reached the pit and a trap room


def test_the_tables_stay_out_of_a_layouts_identity():
    layout = generate_layout("eval_ood", 3)
    before = (layout.signature(), hash(layout), repr(layout))
    assert layout.exit_table and layout.trap_rooms is not None and layout.containers_by_room
    assert (layout.signature(), hash(layout), repr(layout)) == before
    assert layout == generate_layout.__wrapped__("eval_ood", 3)


def test_a_states_commands_are_computed_once_and_always_current(monkeypatch):
    calls = []

    def counted(layout: Layout, state: State) -> list[str]:
        calls.append(state)
        return admissible(layout, state)

    monkeypatch.setattr(house, "admissible", counted)
    env = HouseEnv()
    rng = np.random.default_rng(1)
    for seed in range(4):
        _, info = env.reset(seed=seed)
        for _ in range(12):
            assert info["admissible_commands"] == admissible(env.layout, env.state)
            command = str(rng.choice(info["admissible_commands"]))
            *_, terminated, truncated, info = env.step(command)  # checks the action, then lists the next state's
            if terminated or truncated:
                break
    assert len(calls) == len({id(s) for s in calls})  # one computation per state object, not one per ask
    env.reset(seed=0)
    commands = env.admissible_commands()
    commands.append("go nowhere")  # a caller's copy: the env's own list is untouched
    assert "go nowhere" not in env.admissible_commands()
    env.state = State(location=house.PIT, places=env.state.places, pit_origin=env.layout.start)
    assert env.admissible_commands() == ["climb rope", "look"]  # a state set from outside is seen
