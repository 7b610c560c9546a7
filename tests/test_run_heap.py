"""The run's heap is frozen for the cycle collector while it trains and evaluates, and given back after."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from milegpo.algos.base import GroupRLAlgorithm
from milegpo.cli import main
from milegpo.run.heap import frozen_heap


class Node:
    """An object that can sit in a reference cycle and be watched through a weak reference."""

    other: Any = None


def cycle() -> weakref.ref[Node]:
    """A two-object reference cycle nobody else refers to: only the cycle collector frees it."""
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture
def unfrozen() -> Iterator[None]:
    assert gc.get_freeze_count() == 0, "the test process froze objects before this test"
    yield
    gc.unfreeze()  # a failed test leaves nothing frozen behind it


def test_objects_alive_at_entry_are_frozen_and_given_back(unfrozen: None) -> None:
    garbage = cycle()
    held = Node()
    held.other = held
    watched = weakref.ref(held)
    with frozen_heap() as froze:
        assert froze and gc.get_freeze_count() > 0
        assert garbage() is None  # garbage at entry was collected, not frozen
        del held  # a cycle among the frozen objects: kept while frozen
        gc.collect()
        assert watched() is not None
        young = cycle()
        gc.collect()  # objects created inside are collected as before
        assert young() is None
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert watched() is None  # given back: the cycle frozen inside is collected after the block


def test_a_freeze_made_elsewhere_is_left_alone(unfrozen: None) -> None:
    gc.freeze()
    count = gc.get_freeze_count()  # frozen objects that die meanwhile (other threads of a long suite) leave it
    with frozen_heap() as froze:
        assert not froze and 0 < gc.get_freeze_count() <= count  # nothing frozen again
    assert 0 < gc.get_freeze_count() <= count  # not unfrozen by the block


def test_an_error_inside_gives_the_heap_back(unfrozen: None) -> None:
    with pytest.raises(RuntimeError, match="inside"), frozen_heap():
        raise RuntimeError("inside")
    assert gc.get_freeze_count() == 0


def test_train_learns_and_evaluates_on_a_frozen_heap(tmp_path: Path, unfrozen: None,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``milegpo train`` runs its iterations and its final evaluation with the heap frozen, and gives it back."""
    frozen_in: dict[str, int] = {}
    learn, evaluate = GroupRLAlgorithm.learn, GroupRLAlgorithm.evaluate

    def watched_learn(self: GroupRLAlgorithm, *args: Any, **kwargs: Any) -> Any:
        frozen_in["learn"] = gc.get_freeze_count()
        return learn(self, *args, **kwargs)

    def watched_evaluate(self: GroupRLAlgorithm, *args: Any, **kwargs: Any) -> Any:
        frozen_in["final evaluation"] = gc.get_freeze_count()
        return evaluate(self, *args, **kwargs)

    monkeypatch.setattr(GroupRLAlgorithm, "learn", watched_learn)
    monkeypatch.setattr(GroupRLAlgorithm, "evaluate", watched_evaluate)
    assert main(["train", "run.total_timesteps=40", "--run-dir", str(tmp_path / "run"), "env.n_tasks=1",
                 "env.group_size=2", "eval.n_tasks=2", "--no-progress-bar", "env.kwargs={max_episode_steps: 8}"]) == 0
    assert frozen_in["learn"] > 0 and frozen_in["final evaluation"] > 0
    assert gc.get_freeze_count() == 0
