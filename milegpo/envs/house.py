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
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from milegpo.envs.core import TextEnv

# ------------------------------------------------------------------ vocabulary
ROOMS = ("hall", "kitchen", "library", "bedroom", "bathroom", "cellar", "attic", "garden",
         "study", "pantry", "garage", "nursery", "gallery", "chapel", "workshop", "laundry")
COLORS = ("red", "blue", "green", "yellow", "white")
MATERIALS = ("gold", "silver", "ruby", "jade", "crystal")
ITEMS = ("crown", "coin", "ring", "cup", "statue")
CONTAINERS = ("chest", "box", "cupboard", "trunk", "crate", "basket")
JUNK = ("old boot", "rusty spoon", "broken lamp", "torn map", "empty bottle")
TASK_TYPES = ("find", "put", "exit")
#: Treasures (material, item) held out for ``eval_ood``: unseen combinations of seen words.
OOD_TREASURES = frozenset((m, i) for k, m in enumerate(MATERIALS) for j, i in enumerate(ITEMS) if (k + j) % 5 == 0)

PIT = "pit"
PIT_DEPTH = 3  # climbs needed to leave the pit
_NUMBERS = {1: "one", 2: "two", 3: "three"}  # climbs left, as the pit's text says them
MAX_OPTIMAL_STEPS = 20  # every generated task is solvable in at most this many steps
MIN_OPTIMAL_STEPS = 6
DEFAULT_HORIZON = 30

TRAP_PROB = 0.3  # chance that a layout has a heavy-door trap room
ROTTEN_PROB = 0.4  # chance that its first loop edge is a rotten floor


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

#: Every fixed text fragment the env prints (for :meth:`HouseEnv.vocabulary`).
_TEXT_FRAGMENTS = (
    "you are in the . you see a an and nothing . exits : none . you carry nothing .",
    "the through a locked door through an open door through a heavy door across a rotten floor",
    "outside through the front door",
    "the holds . the heavy door is shut behind you and will not open .",
    "you are in a deep pit . a rope hangs down from the rotten floor above , one climb two climbs three climbs up .",
    "closed open",
    "find the . put the in the . bring the out of the house .",
    "go take open unlock with put in climb rope look go outside",
    "you take the . you open the . you unlock the door . you put the in the .",
    "the key does not fit the door .",
    "the heavy door slams shut behind you !",
    "the rotten floor breaks and you fall into a deep pit !",
    "you climb up the rope . you climb out of the pit .",
    "you will not leave without the .",
    "you found the ! you put the in the . well done ! you leave the house with the . well done !",
    "key",
)

_WORD = re.compile(r"[a-z]+")


def words(text: str) -> list[str]:
    """The words of a House text (lower-case letter runs), as counted by :meth:`HouseEnv.vocabulary`."""
    return _WORD.findall(text.lower())


# --------------------------------------------------------------------- layout
@dataclass(frozen=True)
class Edge:
    """A connection between rooms ``a`` and ``b``.

    ``kind``: ``"open"`` passage, ``"door"`` (locked until unlocked with the
    key of ``color``), ``"heavy"`` (one-way from ``a`` into the trap room ``b``)
    or ``"rotten"`` (crossing it, either way, drops you into the pit).
    """

    a: str
    b: str
    kind: str = "open"
    color: str = ""


@dataclass(frozen=True)
class Layout:
    """One task: the house and the goal. ``places`` maps each object to its initial place.

    A place is a room name, ``"inventory"`` or ``"in <container>"``.
    """

    rooms: tuple[str, ...]  # rooms[0] is the start room (with the front door)
    edges: tuple[Edge, ...]
    places: tuple[tuple[str, str], ...]  # (object, place)
    containers: tuple[tuple[str, str], ...]  # (container, room)
    closed: frozenset[str]  # containers closed at the start
    treasure: str
    task_type: str
    target: str = ""  # target container of a "put" task

    @property
    def start(self) -> str:
        return self.rooms[0]

    @property
    def task(self) -> str:
        if self.task_type == "find":
            return f"find the {self.treasure}."
        if self.task_type == "put":
            return f"put the {self.treasure} in the {self.target}."
        return f"bring the {self.treasure} out of the house."

    def signature(self) -> tuple:
        """A hashable identity of the task (used to check that splits are disjoint)."""
        return (self.rooms, self.edges, self.places, self.containers, self.treasure, self.task_type, self.target)


@dataclass(frozen=True)
class State:
    """The true state of a House episode (hashable; what :meth:`HouseEnv.state_key` prints)."""

    location: str
    places: tuple[tuple[str, str], ...]  # sorted (object, place)
    unlocked: frozenset[int] = frozenset()  # indices of unlocked door edges
    opened: frozenset[str] = frozenset()  # containers opened so far
    pit_origin: str = ""
    pit_level: int = 0
    won: bool = False

    def place(self, obj: str) -> str:
        return dict(self.places)[obj]

    def holding(self) -> list[str]:
        return sorted(obj for obj, place in self.places if place == "inventory")

    def moved(self, obj: str, place: str) -> State:
        return replace(self, places=tuple(sorted((o, place if o == obj else p) for o, p in self.places)))

    def key(self) -> str:
        objects = ",".join(f"{obj}@{place}" for obj, place in self.places)
        pit = f"|pit={self.pit_origin}:{self.pit_level}" if self.location == PIT else ""
        return (f"at={self.location}{pit}|objects={objects}|unlocked={','.join(map(str, sorted(self.unlocked)))}"
                f"|opened={','.join(sorted(self.opened))}|won={int(self.won)}")


def initial_state(layout: Layout) -> State:
    return State(location=layout.start, places=tuple(sorted(layout.places)))


# ------------------------------------------------------------------- dynamics
def _article(noun: str) -> str:
    return "an" if noun[0] in "aeiou" else "a"


def _listing(phrases: list[str]) -> str:
    if not phrases:
        return "nothing"
    return phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + " and " + phrases[-1]


def _exits(layout: Layout, state: State) -> list[tuple[str, str, int]]:
    """``(room, kind, edge index)`` of each exit of the current room, sorted by room."""
    here, exits = state.location, []
    for index, edge in enumerate(layout.edges):
        if here not in (edge.a, edge.b) or (edge.kind == "heavy" and here == edge.b):
            continue
        exits.append((edge.b if here == edge.a else edge.a, edge.kind, index))
    return sorted(exits)


def _containers_here(layout: Layout, room: str) -> list[str]:
    return sorted(c for c, r in layout.containers if r == room)


def _visible(layout: Layout, state: State) -> list[str]:
    """Objects that can be taken here: on the floor or in an open container."""
    open_here = {f"in {c}" for c in _containers_here(layout, state.location) if c not in _closed(layout, state)}
    return sorted(obj for obj, place in state.places if place == state.location or place in open_here)


def _closed(layout: Layout, state: State) -> frozenset[str]:
    return layout.closed - state.opened


def _is_trap(layout: Layout, room: str) -> bool:
    return any(e.kind == "heavy" and e.b == room for e in layout.edges)


def describe(layout: Layout, state: State) -> str:
    """The room description: location, visible things, exits, inventory."""
    carry = _listing([f"{_article(o)} {o}" for o in state.holding()])
    if state.location == PIT:
        climbs = PIT_DEPTH - state.pit_level
        return (f"you are in a deep pit. a rope hangs down from the rotten floor above, {_NUMBERS[climbs]} "
                f"{'climb' if climbs == 1 else 'climbs'} up. you carry {carry}.")
    closed = _closed(layout, state)
    things = [f"{_article(o)} {o}" for o, p in state.places if p == state.location]
    contents = []
    for c in _containers_here(layout, state.location):
        things.append(f"{'a closed' if c in closed else 'an open'} {c}")
        inside = sorted(o for o, p in state.places if p == f"in {c}")
        if c not in closed and inside:
            contents.append(f" the {c} holds {_listing([f'{_article(o)} {o}' for o in inside])}.")
    exits = []
    for room, kind, index in _exits(layout, state):
        edge = layout.edges[index]
        if kind == "door":
            exits.append(f"the {room} through {'an open' if index in state.unlocked else 'a locked'} {edge.color} door")
        elif kind == "heavy":
            exits.append(f"the {room} through a heavy door")
        elif kind == "rotten":
            exits.append(f"the {room} across a rotten floor")
        else:
            exits.append(f"the {room}")
    if state.location == layout.start and layout.task_type == "exit":
        exits.append("outside through the front door")
    if _is_trap(layout, state.location):
        exit_text = "the heavy door is shut behind you and will not open."
    else:
        exit_text = f"exits: {', '.join(exits) if exits else 'none'}."
    return (f"you are in the {state.location}. you see {_listing(sorted(things))}.{''.join(contents)} "
            f"{exit_text} you carry {carry}.")


def admissible(layout: Layout, state: State) -> list[str]:
    """The sorted commands valid in ``state``."""
    if state.won:
        return []
    if state.location == PIT:
        return ["climb rope", "look"]
    commands = ["look"] if _is_trap(layout, state.location) else []
    held = state.holding()
    for room, kind, index in _exits(layout, state):
        edge = layout.edges[index]
        if kind == "door" and index not in state.unlocked:
            commands += [f"unlock {edge.color} door with {k}" for k in held if k.endswith(" key")]
        else:
            commands.append(f"go {room}")
    if state.location == layout.start and layout.task_type == "exit":
        commands.append("go outside")
    commands += [f"take {o}" for o in _visible(layout, state)]
    for c in _containers_here(layout, state.location):
        if c in _closed(layout, state):
            commands.append(f"open {c}")
        else:
            commands += [f"put {o} in {c}" for o in held]
    return sorted(set(commands))


def transition(layout: Layout, state: State, command: str) -> tuple[State, str]:
    """Apply an admissible ``command``: ``(next state, feedback text)``; sets ``won``."""
    verb, _, rest = command.partition(" ")
    if verb == "look":
        return state, ""
    if verb == "climb":
        if state.pit_level + 1 >= PIT_DEPTH:
            return replace(state, location=state.pit_origin, pit_origin="", pit_level=0), "you climb out of the pit."
        return replace(state, pit_level=state.pit_level + 1), "you climb up the rope."
    if verb == "go":
        if rest == "outside":
            if state.place(layout.treasure) != "inventory":
                return state, f"you will not leave without the {layout.treasure}."
            return replace(state, won=True), f"you leave the house with the {layout.treasure}. well done!"
        room, kind, _ = next(e for e in _exits(layout, state) if e[0] == rest)
        if kind == "rotten":
            return (replace(state, location=PIT, pit_origin=state.location, pit_level=0),
                    "the rotten floor breaks and you fall into a deep pit!")
        feedback = "the heavy door slams shut behind you!" if kind == "heavy" else ""
        return replace(state, location=room), feedback
    if verb == "take":
        state = state.moved(rest, "inventory")
        if rest == layout.treasure and layout.task_type == "find":
            return replace(state, won=True), f"you found the {rest}!"
        return state, f"you take the {rest}."
    if verb == "open":
        return replace(state, opened=state.opened | {rest}), f"you open the {rest}."
    if verb == "unlock":
        color, _, key = rest.partition(" door with ")
        index = next(i for r, kind, i in _exits(layout, state) if kind == "door" and layout.edges[i].color == color)
        if key != f"{color} key":
            return state, f"the {key} does not fit the {color} door."
        return replace(state, unlocked=state.unlocked | {index}), f"you unlock the {color} door."
    if verb == "put":
        obj, _, container = rest.partition(" in ")
        state = state.moved(obj, f"in {container}")
        if obj == layout.treasure and container == layout.target and layout.task_type == "put":
            return replace(state, won=True), f"you put the {obj} in the {container}. well done!"
        return state, f"you put the {obj} in the {container}."
    raise ValueError(f"not a House command: {command!r}")


# --------------------------------------------------------------------- solver
def _useful(layout: Layout, command: str) -> bool:
    """Commands an optimal plan may need (drops, junk and no-ops never help)."""
    verb, _, rest = command.partition(" ")
    if verb == "look":
        return False
    if verb == "take":
        return rest.endswith(" key") or rest == layout.treasure
    if verb == "put":
        return rest == f"{layout.treasure} in {layout.target}"
    return True


def plan(layout: Layout, state: State, goal: Callable[[State], bool], useful_only: bool = True,
         max_depth: int = 60) -> list[str] | None:
    """Shortest command list from ``state`` to a state satisfying ``goal`` (BFS), or None.

    With ``useful_only`` the search skips commands that never help reach a win
    (drops, junk, no-ops) - exact for :func:`solve`, much faster.
    """
    if goal(state):
        return []
    parents: dict[State, tuple[State, str] | None] = {state: None}
    frontier = deque([(state, 0)])
    while frontier:
        current, depth = frontier.popleft()
        if depth >= max_depth:
            continue
        for command in admissible(layout, current):
            if useful_only and not _useful(layout, command):
                continue
            nxt, _ = transition(layout, current, command)
            if nxt in parents:
                continue
            parents[nxt] = (current, command)
            if goal(nxt):
                path = []
                while parents[nxt] is not None:
                    nxt, cmd = parents[nxt]
                    path.append(cmd)
                return path[::-1]
            frontier.append((nxt, depth + 1))
    return None


def solve(layout: Layout, state: State | None = None) -> list[str] | None:
    """An optimal (shortest) winning command list from ``state`` (default: the start)."""
    return plan(layout, initial_state(layout) if state is None else state, lambda s: s.won)


# ----------------------------------------------------------------- generator
def generate_layout(split: str, index: int) -> Layout:
    """The task ``index`` of ``split``: deterministic, solvable within :data:`MAX_OPTIMAL_STEPS`."""
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
        near = parent[treasure_room] if rng.random() < 0.5 else rng.choice([r for r in names if r not in (treasure_room, trap)])
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


# ------------------------------------------------------------------------ env
class HouseEnv(TextEnv):
    """The House text env (see the module docstring).

    :param split: ``"train"``, ``"eval_id"`` or ``"eval_ood"``.
    :param num_tasks: size of the split's task list (default 1000 / 50 / 50);
        seed ``s`` selects task ``s % num_tasks``.
    :param max_episode_steps: horizon (default 30; every task is solvable in
        at most :data:`MAX_OPTIMAL_STEPS`).
    :param invalid_action_penalty: see :class:`TextEnv`.
    """

    def __init__(self, split: str = "train", num_tasks: int | None = None, max_episode_steps: int = DEFAULT_HORIZON,
                 invalid_action_penalty: float = 0.1, render_mode: str | None = None):
        super().__init__(invalid_action_penalty=invalid_action_penalty, max_episode_steps=max_episode_steps,
                         render_mode=render_mode)
        if split not in SPLITS:
            raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
        self.split = split
        self.num_tasks = SPLITS[split].num_tasks if num_tasks is None else int(num_tasks)
        if self.num_tasks < 1:
            raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
        self.task_index = 0
        self.layout = generate_layout(split, 0)
        self.state = initial_state(self.layout)
        self._cache: dict[int, Layout] = {0: self.layout}

    @staticmethod
    def vocabulary() -> list[str]:
        """Every word the env can print (observations, tasks, commands), sorted."""
        texts = [*_TEXT_FRAGMENTS, *ROOMS, *COLORS, *MATERIALS, *ITEMS, *CONTAINERS, *JUNK, PIT]
        return sorted({w for text in texts for w in words(text)})

    def _reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        index = int(self.np_random.integers(self.num_tasks)) if seed is None else seed % self.num_tasks
        if index not in self._cache:
            if len(self._cache) > 256:
                self._cache.clear()
            self._cache[index] = generate_layout(self.split, index)
        self.task_index, self.layout = index, self._cache[index]
        self.state = initial_state(self.layout)
        observation = f"{self.layout.task} {describe(self.layout, self.state)}"
        return observation, {"task": self.layout.task, "task_index": index, "split": self.split}

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        self.state, feedback = transition(self.layout, self.state, action)
        observation = feedback if self.state.won else f"{feedback} {describe(self.layout, self.state)}".lstrip()
        return observation, 10.0 if self.state.won else 0.0, self.state.won, {"won": self.state.won}

    def admissible_commands(self) -> list[str]:
        return admissible(self.layout, self.state)

    def state_key(self) -> str:
        """The true state (not the text): location, pit progress, objects, doors, containers."""
        return self.state.key()

    def solve(self) -> list[str] | None:
        """An optimal winning command list from the current state (BFS), or None if none exists."""
        return solve(self.layout, self.state)

    def expert_action(self) -> str | None:
        """The first command of an optimal plan (BFS), or None when the task cannot be won any more."""
        plan = self.solve()
        return plan[0] if plan else None
