"""The House's world model: its words, layouts, states, text and rules, and the BFS solver.

Pure functions on frozen dataclasses (:class:`Layout` is a task, :class:`State` where the
agent is and what it changed): :func:`describe` prints a state, :func:`admissible` lists its
commands, :func:`transition` applies one, :func:`plan` / :func:`solve` search for the
shortest way to a goal. :mod:`milegpo.envs.house` draws the layouts of each split and wraps
this model as the ``milegpo/House-v0`` text env.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property

# ------------------------------------------------------------------ vocabulary
ROOMS = ("hall", "kitchen", "library", "bedroom", "bathroom", "cellar", "attic", "garden",
         "study", "pantry", "garage", "nursery", "gallery", "chapel", "workshop", "laundry")
COLORS = ("red", "blue", "green", "yellow", "white")
MATERIALS = ("gold", "silver", "ruby", "jade", "crystal")
ITEMS = ("crown", "coin", "ring", "cup", "statue")
CONTAINERS = ("chest", "box", "cupboard", "trunk", "crate", "basket")
JUNK = ("old boot", "rusty spoon", "broken lamp", "torn map", "empty bottle")
TASK_TYPES = ("find", "put", "exit")

PIT = "pit"
PIT_DEPTH = 3  # climbs needed to leave the pit
_NUMBERS = {1: "one", 2: "two", 3: "three"}  # climbs left, as the pit's text says them
DEFAULT_HORIZON = 30



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

    # What depends on the layout alone, computed on first use and kept on the (immutable) layout: every
    # step, description and search node of an episode asks for them, and they never change in it.
    @cached_property
    def exit_table(self) -> dict[str, tuple[tuple[str, str, int], ...]]:
        """Each room's exits ``(room, kind, edge index)``, sorted by room: both ends of an edge, except that
        a heavy door only leads into its trap room (a door's lock state is the :class:`State`'s, not here)."""
        table: dict[str, list[tuple[str, str, int]]] = {}
        for index, edge in enumerate(self.edges):
            table.setdefault(edge.a, []).append((edge.b, edge.kind, index))
            if edge.kind != "heavy" and edge.b != edge.a:
                table.setdefault(edge.b, []).append((edge.a, edge.kind, index))
        return {room: tuple(sorted(exits)) for room, exits in table.items()}

    @cached_property
    def containers_by_room(self) -> dict[str, tuple[str, ...]]:
        """Each room's containers, sorted."""
        table: dict[str, list[str]] = {}
        for container, room in self.containers:
            table.setdefault(room, []).append(container)
        return {room: tuple(sorted(names)) for room, names in table.items()}

    @cached_property
    def trap_rooms(self) -> frozenset[str]:
        """The rooms behind a heavy door (an absorbing dead end)."""
        return frozenset(e.b for e in self.edges if e.kind == "heavy")


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

    # ``places`` is sorted by object and names each object once (:func:`initial_state` sorts them, :meth:`moved`
    # keeps the order): the methods below read and keep that order instead of sorting again at every step.
    def place(self, obj: str) -> str:
        for name, where in self.places:
            if name == obj:
                return where
        raise KeyError(obj)

    def holding(self) -> list[str]:
        """The carried objects, sorted."""
        return [obj for obj, place in self.places if place == "inventory"]

    def moved(self, obj: str, place: str) -> State:
        """This state with ``obj`` at ``place`` (the same state when it is no object of the task)."""
        for index, (name, _) in enumerate(self.places):
            if name == obj:
                return replace(self, places=(*self.places[:index], (obj, place), *self.places[index + 1:]))
        return self

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


def _exits(layout: Layout, state: State) -> tuple[tuple[str, str, int], ...]:
    """``(room, kind, edge index)`` of each exit of the current room, sorted by room (none from the pit)."""
    return layout.exit_table.get(state.location, ())


def _containers_here(layout: Layout, room: str) -> tuple[str, ...]:
    return layout.containers_by_room.get(room, ())


def _visible(layout: Layout, state: State) -> list[str]:
    """Objects that can be taken here: on the floor or in an open container."""
    open_here = {f"in {c}" for c in _containers_here(layout, state.location) if c not in _closed(layout, state)}
    return sorted(obj for obj, place in state.places if place == state.location or place in open_here)


def _closed(layout: Layout, state: State) -> frozenset[str]:
    return layout.closed - state.opened


def _is_trap(layout: Layout, room: str) -> bool:
    return room in layout.trap_rooms


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
                while (link := parents[nxt]) is not None:
                    nxt, cmd = link
                    path.append(cmd)
                return path[::-1]
            frontier.append((nxt, depth + 1))
    return None


def solve(layout: Layout, state: State | None = None) -> list[str] | None:
    """An optimal (shortest) winning command list from ``state`` (default: the start)."""
    return plan(layout, initial_state(layout) if state is None else state, lambda s: s.won)
