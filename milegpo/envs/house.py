"""``milegpo/House-v0``: a procedurally generated key-door-treasure house in text.

A small, dependency-free, long-horizon benchmark with the structure that
milestone credit assignment is about. Each task is a house of 5-7 rooms
(7-8 in ``eval_ood``) connected as a random tree plus loop edges. The treasure
lies in a closed container behind a locked door; its key lies elsewhere (in
larger houses behind a second locked door). Sub-goals: find the key -> unlock
the door -> open the container -> take the treasure -> (put it in a target
container | carry it out of the front door), depending on the task type:

* ``find the <treasure>.``                     won when the treasure is taken;
* ``put the <treasure> in the <container>.``   won when it is put there;
* ``bring the <treasure> out of the house.``   won on ``go outside`` carrying it.

Traps and dead ends (each layout draws some of them):

* a *heavy door* to a leaf room that slams shut behind you: an absorbing dead
  end (only ``look`` and ``take`` remain) until the horizon;
* a *rotten floor* loop edge: crossing it drops you into a pit that takes three
  ``climb rope`` steps to leave, back in the room you came from;
* loops of empty rooms, junk objects, a key that fits no door, and no-op
  commands (trying a wrong key, leaving empty-handed).

Task types are drawn with weights find 1/2, put 1/4, bring-out 1/4.

Cues are in the text (``through a heavy door``, ``across a rotten floor``), so
a policy can learn to avoid the traps. Everything the agent needs is in one
observation: the room, what is visible, the exits with their door states, and
the inventory. Reward: 10 when the task is won, else 0 (minus the TextEnv
invalid-action penalty). All text is lower case from a small fixed vocabulary
(:meth:`HouseEnv.vocabulary`).

Splits (disjoint layout seeds): ``train`` (1000 tasks), ``eval_id`` (50, same
distribution), ``eval_ood`` (50: larger houses with two locks, and treasures
whose material/item combination never occurs in the other splits). Seed ``s``
selects task ``s % num_tasks``. Every task is solvable in at most
:data:`MAX_OPTIMAL_STEPS` steps (:func:`solve`, a BFS over the true state).

:meth:`HouseEnv.state_key` is the true state (location, pit progress, object
places, unlocked doors, opened containers), not the text: climbing a rope
twice prints the same text in two different states, as does a room revisited
after unlocking a door elsewhere.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

from milegpo.envs.core import TextEnv
from milegpo.envs.house_world import (  # noqa: F401 (the world model's names are public here too)
    _TEXT_FRAGMENTS,
    COLORS,
    CONTAINERS,
    DEFAULT_HORIZON,
    ITEMS,
    JUNK,
    MATERIALS,
    PIT,
    PIT_DEPTH,
    ROOMS,
    TASK_TYPES,
    Edge,
    Layout,
    State,
    admissible,
    describe,
    initial_state,
    plan,
    solve,
    transition,
    words,
)

MAX_OPTIMAL_STEPS = 20  # every generated task is solvable in at most this many steps
MIN_OPTIMAL_STEPS = 6
TRAP_PROB = 0.3  # chance that a layout has a heavy-door trap room
ROTTEN_PROB = 0.4  # chance that its first loop edge is a rotten floor
#: Treasures (material, item) held out for ``eval_ood``: unseen combinations of seen words.
OOD_TREASURES = frozenset((m, i) for k, m in enumerate(MATERIALS) for j, i in enumerate(ITEMS) if (k + j) % 5 == 0)


@dataclass(frozen=True)
class SplitSpec:
    """How the tasks of a split are drawn (layout seeds never overlap between splits)."""

    seed_offset: int
    num_tasks: int
    room_counts: tuple[int, ...]  # drawn uniformly
    two_lock_prob: float  # chance of a second lock in a house of >= 7 rooms
    ood_treasures: bool  # use only the held-out treasures


SPLITS = {
    "train": SplitSpec(0, 1000, (5, 5, 6, 6, 7), 0.5, False),
    "eval_id": SplitSpec(10_000_000, 50, (5, 5, 6, 6, 7), 0.5, False),
    "eval_ood": SplitSpec(20_000_000, 50, (7, 8), 1.0, True),
}


# ----------------------------------------------------------------- generator
@lru_cache(maxsize=4096)
def generate_layout(split: str, index: int) -> Layout:
    """The task ``index`` of ``split``: deterministic, solvable within :data:`MAX_OPTIMAL_STEPS`.

    A pure function of its two arguments (the splits' specs are constants), so the process keeps the
    last 4096 results, shared by every env of the process: drawing a task means a BFS solve of each
    drawn candidate, which cost a rollout about a quarter of its env time when each reset redid it. The
    layout is immutable, so sharing it is safe.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    offset = SPLITS[split].seed_offset
    for attempt in range(1000):
        rng = random.Random((offset + index) * 1000 + attempt)
        layout = _draw_layout(rng, split)
        if layout is None:
            continue
        path = solve(layout)
        if path is not None and MIN_OPTIMAL_STEPS <= len(path) <= MAX_OPTIMAL_STEPS:
            return layout
    raise RuntimeError(f"could not generate House task {index} of split {split!r}")  # pragma: no cover


def _draw_layout(rng: random.Random, split: str) -> Layout | None:
    spec = SPLITS[split]
    n_rooms = rng.choice(spec.room_counts)
    names = rng.sample(ROOMS, n_rooms)
    start = names[0]
    # A random tree (at most 3 tree exits per room), then loop edges.
    parent: dict[str, str] = {}
    for k, room in enumerate(names[1:], start=1):
        degree = {r: sum(1 for c, p in parent.items() if r in (c, p)) for r in names[:k]}
        parent[room] = rng.choice([r for r in names[:k] if degree[r] < 3] or names[:k])
    depth = {start: 0}
    for room in names[1:]:
        depth[room] = depth[parent[room]] + 1
    leaves = [r for r in names[1:] if r not in parent.values()]
    kinds: dict[str, tuple[str, str]] = {room: ("open", "") for room in names[1:]}  # tree edge into room
    colors = rng.sample(COLORS, len(COLORS))

    # The treasure room: a deepest leaf, behind a locked door.
    treasure_room = max(leaves, key=lambda r: (depth[r], rng.random()))
    kinds[treasure_room] = ("door", colors[0])
    others = [r for r in leaves if r != treasure_room]
    trap = None
    if others and rng.random() < TRAP_PROB:
        trap = rng.choice(others)
        kinds[trap] = ("heavy", "")
        others.remove(trap)
    locked = {treasure_room}
    n_locks = 2 if n_rooms >= 7 and rng.random() < spec.two_lock_prob else 1
    key_rooms = [r for r in names if r not in (treasure_room, trap)]
    places = {f"{colors[0]} key": rng.choice(key_rooms)}
    if n_locks == 2:
        if not others:
            return None
        second = rng.choice(others)
        kinds[second] = ("door", colors[1])
        locked.add(second)
        places[f"{colors[0]} key"] = second
        places[f"{colors[1]} key"] = rng.choice([r for r in key_rooms if r != second])

    edges = [Edge(parent[r], r, *kinds[r]) for r in names[1:]]
    free = [r for r in names if r not in locked and r != trap]
    n_loops = rng.choice((1, 1, 2))
    rotten_left = rng.random() < ROTTEN_PROB
    for _ in range(n_loops):
        pairs = [(a, b) for i, a in enumerate(free) for b in free[i + 1:]
                 if not any({a, b} == {e.a, e.b} for e in edges)]
        if not pairs:
            break
        a, b = rng.choice(pairs)
        kind = "rotten" if rotten_left else "open"
        rotten_left = False
        edges.append(Edge(a, b, kind))

    # Treasure in a closed container in its room; optional target container, junk, stray key.
    pool = [t for t in ((m, i) for m in MATERIALS for i in ITEMS) if (t in OOD_TREASURES) == spec.ood_treasures]
    treasure = " ".join(rng.choice(pool))
    containers = rng.sample(CONTAINERS, 2)
    places[treasure] = f"in {containers[0]}"
    container_rooms = [(containers[0], treasure_room)]
    task_type = rng.choice(TASK_TYPES + ("find",))
    target = ""
    if task_type == "put":
        target = containers[1]
        others = [r for r in names if r not in (treasure_room, trap)]
        near = parent[treasure_room] if rng.random() < 0.5 else rng.choice(others)
        container_rooms.append((target, near))
    for junk in rng.sample(JUNK, rng.choice((1, 2))):
        places[junk] = rng.choice(names)
    if rng.random() < 0.3:
        places[f"{colors[2]} key"] = rng.choice(names)
    return Layout(
        rooms=tuple(names),
        edges=tuple(edges),
        places=tuple(sorted(places.items())),
        containers=tuple(sorted(container_rooms)),
        closed=frozenset({containers[0]}),
        treasure=treasure,
        task_type=task_type,
        target=target,
    )


# ----------------------------------------------------------------- state texts
class StateTexts(NamedTuple):
    """What a House state shows and is called: its room description, its sorted commands, its key."""

    layout: Layout  # the layout they were computed in (held, so its id in the cache's key stays its own)
    description: str
    commands: tuple[str, ...]
    key: str


#: each state's texts by (id of its layout, state), shared by every env of the process (see :func:`state_texts`)
_STATE_TEXTS: dict[tuple[int, State], StateTexts] = {}
#: the most states whose texts are kept (about 1 kB each): the cache is emptied when it is full
STATE_TEXTS_MAX = 32768


def state_texts(layout: Layout, state: State) -> StateTexts:
    """``describe``, ``admissible`` and ``state.key()`` of ``state`` in ``layout``, computed once per process.

    An episode meets the same states again and again (the copies of a task, a policy going back and forth,
    every evaluation of the same tasks), and the three texts were computed at every step: about 20 µs a
    step, most of House's own time. They are pure functions of the (immutable) layout and state, so they
    are kept, keyed by the layout's id and the state: an entry holds its layout, so no other layout can
    take that id while the entry is there.
    """
    key = (id(layout), state)
    texts = _STATE_TEXTS.get(key)
    if texts is None:
        if len(_STATE_TEXTS) >= STATE_TEXTS_MAX:
            _STATE_TEXTS.clear()
        commands = tuple(admissible(layout, state))
        texts = _STATE_TEXTS[key] = StateTexts(layout, describe(layout, state), commands, state.key())
    return texts


# ------------------------------------------------------------------------ env
class HouseEnv(TextEnv):
    """The House text env (see the module docstring).

    :param split: ``"train"``, ``"eval_id"`` or ``"eval_ood"``.
    :param num_tasks: size of the split's task list (default 1000 / 50 / 50);
        seed ``s`` selects task ``s % num_tasks``.
    :param max_episode_steps: horizon (default 30; every task is solvable in
        at most :data:`MAX_OPTIMAL_STEPS`).
    :param invalid_action_penalty: see :class:`TextEnv`.
    :param state_key: ``"env"`` (default: :meth:`state_key`) or ``"observation"`` (the paper's key: the
        observation text exactly; see :class:`~milegpo.envs.core.TextEnv`).
    """

    def __init__(self, split: str = "train", num_tasks: int | None = None, max_episode_steps: int = DEFAULT_HORIZON,
                 invalid_action_penalty: float = 0.1, render_mode: str | None = None, state_key: str = "env"):
        super().__init__(invalid_action_penalty=invalid_action_penalty, max_episode_steps=max_episode_steps,
                         render_mode=render_mode, state_key=state_key)
        if split not in SPLITS:
            raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
        self.split = split
        self.num_tasks = SPLITS[split].num_tasks if num_tasks is None else int(num_tasks)
        if self.num_tasks < 1:
            raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
        self.task_index = 0
        self.layout = generate_layout(split, 0)
        self.state = initial_state(self.layout)
        # the texts of the last state asked about: a step checks its action against the commands of the state
        # that the previous step's info listed, then describes, lists and keys its new state
        self._texts_of: tuple[Layout, State, StateTexts] | None = None

    @staticmethod
    def vocabulary() -> list[str]:
        """Every word the env can print (observations, tasks, commands), sorted."""
        texts = [*_TEXT_FRAGMENTS, *ROOMS, *COLORS, *MATERIALS, *ITEMS, *CONTAINERS, *JUNK, PIT]
        return sorted({w for text in texts for w in words(text)})

    def _reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        index = int(self.np_random.integers(self.num_tasks)) if seed is None else seed % self.num_tasks
        self.task_index, self.layout = index, generate_layout(self.split, index)
        self.state = initial_state(self.layout)
        observation = f"{self.layout.task} {self._texts().description}"
        return observation, {"task": self.layout.task, "task_index": index, "split": self.split}

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        self.state, feedback = transition(self.layout, self.state, action)
        observation = feedback if self.state.won else f"{feedback} {self._texts().description}".lstrip()
        return observation, 10.0 if self.state.won else 0.0, self.state.won, {"won": self.state.won}

    def _texts(self) -> StateTexts:
        """The current state's texts (:func:`state_texts`), looked up once per state object."""
        kept = self._texts_of
        if kept is None or kept[0] is not self.layout or kept[1] is not self.state:
            kept = self._texts_of = (self.layout, self.state, state_texts(self.layout, self.state))
        return kept[2]

    def admissible_commands(self) -> list[str]:
        """The commands valid in the current state (a fresh list each call; computed once per state)."""
        return list(self._texts().commands)

    def state_key(self) -> str:
        """The true state (not the text): location, pit progress, objects, doors, containers."""
        return self._texts().key

    def solve(self) -> list[str] | None:
        """An optimal winning command list from the current state (BFS), or None if none exists."""
        return solve(self.layout, self.state)

    def expert_action(self) -> str | None:
        """The first command of an optimal plan (BFS), or None when the task cannot be won any more."""
        commands = self.solve()
        return commands[0] if commands else None
