"""Deterministic generator of ALFWorld games in the real data set's file format.

The ALFWorld download (``alfworld-download``) is not always reachable, so this
module writes a small task set that the real engine loads exactly like the
full data set: one folder per game,

``<split>/<task_type>-<Object>-None-<Parent>-<scene_num>/trial_<...>/``
    ``game.tw-pddl``    JSON: ``pddl_domain`` (alfworld's ``alfred.pddl``),
                        ``grammar`` (alfworld's ``alfred.twl2`` with the goal
                        text filled in), ``pddl_problem``, ``solvable: true``
    ``traj_data.json``  ``task_type``, ``pddl_params``, ``scene``,
                        ``turk_annotations`` (what alfworld's loader and its
                        hand-coded expert read)

Rooms, receptacles and objects are drawn from ALFRED's vocabulary
(:mod:`alfworld.gen.constants`: receptacle types, which objects each receptacle
may hold, which objects are cleanable/heatable/coolable/toggleable); goals and
goal texts come from :mod:`alfworld.gen.goal_library`. Entity ids follow
ALFRED's mangled ``Type|x|y|z`` form, so alfworld's demangler names them
``cabinet 1``, ``sinkbasin 1``, ... as in the real games.

Splits (ours, mirroring ALFWorld's ``train`` / ``valid_seen`` / ``valid_unseen``):

``train``     scene layouts from :data:`SEEN_SCENES`, target objects not in
              :data:`OOD_TARGETS`.
``eval_id``   the same scene layouts and target objects as ``train``, but other
              games (object placements, goals): the "valid_seen" analogue.
``eval_ood``  unseen scene layouts (:data:`UNSEEN_SCENES`) and only target
              objects from :data:`OOD_TARGETS`: unseen object/room combinations.

Every game is solvable by construction (the needed appliance exists, the target
object exists outside the goal receptacle, ``canContain`` holds); the tests play
one game of every task type to success with the engine's planner.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

#: Bump when the generated games change: the cache folder is keyed by it.
GENERATOR_VERSION = "2"

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)

#: Games per task type in each split of the default task set.
DEFAULT_GAMES_PER_TYPE = {"train": 24, "eval_id": 6, "eval_ood": 6}

#: Receptacle types of each room and how many of each (min, max), ALFRED-like.
ROOM_RECEPTACLES: dict[str, dict[str, tuple[int, int]]] = {
    "Kitchen": {"Cabinet": (3, 6), "CounterTop": (1, 3), "Drawer": (1, 3), "Fridge": (1, 1),
                "Microwave": (1, 1), "SinkBasin": (1, 1), "StoveBurner": (2, 4), "GarbageCan": (1, 1),
                "CoffeeMachine": (1, 1), "Toaster": (1, 1), "Shelf": (0, 2), "DiningTable": (0, 1)},
    "Bathroom": {"Cabinet": (1, 4), "CounterTop": (1, 1), "Drawer": (0, 2), "SinkBasin": (1, 2),
                 "BathtubBasin": (0, 1), "Toilet": (1, 1), "ToiletPaperHanger": (1, 1), "TowelHolder": (1, 1),
                 "HandTowelHolder": (0, 1), "GarbageCan": (1, 1), "Shelf": (0, 2)},
    "Bedroom": {"Bed": (1, 1), "Desk": (0, 1), "Drawer": (2, 5), "Dresser": (1, 1), "Shelf": (1, 4),
                "SideTable": (1, 2), "GarbageCan": (1, 1), "LaundryHamper": (0, 1), "Safe": (0, 1)},
    "LivingRoom": {"Sofa": (1, 1), "ArmChair": (0, 2), "CoffeeTable": (1, 1), "SideTable": (1, 2),
                   "Drawer": (1, 4), "Shelf": (1, 3), "TVStand": (1, 1), "GarbageCan": (1, 1),
                   "Cabinet": (0, 3), "DiningTable": (0, 1), "Ottoman": (0, 1)},
}

#: Receptacles of the ``"small"`` task set: one of each, four or five per room (every
#: task type stays possible: the tool receptacles and a parent for every target remain).
SMALL_ROOM_RECEPTACLES: dict[str, dict[str, tuple[int, int]]] = {
    "Kitchen": {"Cabinet": (1, 1), "CounterTop": (1, 1), "Fridge": (1, 1), "Microwave": (1, 1), "SinkBasin": (1, 1)},
    "Bathroom": {"Cabinet": (1, 1), "CounterTop": (1, 1), "SinkBasin": (1, 1), "Toilet": (1, 1)},
    "Bedroom": {"Bed": (1, 1), "Drawer": (1, 1), "Dresser": (1, 1), "SideTable": (1, 1)},
    "LivingRoom": {"Sofa": (1, 1), "CoffeeTable": (1, 1), "SideTable": (1, 1), "Shelf": (1, 1)},
}

class SizeSpec(TypedDict):
    """A task-set size: receptacles per room, target instances (pick_two: +1) and distractor types."""

    receptacles: dict[str, dict[str, tuple[int, int]]]
    targets: tuple[int, int]
    distractor_types: tuple[int, int]


#: Task-set sizes: receptacles per room, target instances (pick_two: +1) and distractor types.
SIZES: dict[str, SizeSpec] = {
    "standard": {"receptacles": ROOM_RECEPTACLES, "targets": (1, 2), "distractor_types": (6, 12)},
    "small": {"receptacles": SMALL_ROOM_RECEPTACLES, "targets": (1, 1), "distractor_types": (0, 2)},
}

#: Movable objects that appear in each room (targets and distractors).
ROOM_OBJECTS: dict[str, tuple[str, ...]] = {
    "Kitchen": ("Apple", "Bowl", "Bread", "ButterKnife", "Cup", "DishSponge", "Egg", "Fork", "Kettle", "Knife",
                "Ladle", "Lettuce", "Mug", "Pan", "PepperShaker", "Plate", "Pot", "Potato", "SaltShaker",
                "SoapBottle", "Spatula", "Spoon", "Tomato", "WineBottle"),
    "Bathroom": ("Candle", "Cloth", "DishSponge", "HandTowel", "SoapBar", "SoapBottle", "SprayBottle",
                 "ToiletPaper", "Towel", "TissueBox"),
    "Bedroom": ("AlarmClock", "BaseballBat", "BasketBall", "Book", "Bowl", "CD", "CellPhone", "CreditCard",
                "KeyChain", "Laptop", "Mug", "Pen", "Pencil", "Pillow", "TennisRacket", "Watch"),
    "LivingRoom": ("Book", "Bowl", "Box", "CreditCard", "KeyChain", "Laptop", "Newspaper", "Pillow", "Plate",
                   "RemoteControl", "Statue", "TissueBox", "Vase", "Watch", "WateringCan"),
}

#: Rooms each task type is generated in (ALFRED's ``GOALS_VALID``).
TASK_ROOMS: dict[str, tuple[str, ...]] = {
    "pick_and_place_simple": ("Kitchen", "LivingRoom", "Bathroom", "Bedroom"),
    "pick_two_obj_and_place": ("Kitchen", "LivingRoom", "Bathroom", "Bedroom"),
    "look_at_obj_in_light": ("LivingRoom", "Bedroom"),
    "pick_clean_then_place_in_recep": ("Kitchen", "Bathroom"),
    "pick_heat_then_place_in_recep": ("Kitchen",),
    "pick_cool_then_place_in_recep": ("Kitchen",),
}

#: Target objects reserved for ``eval_ood`` (never a target in train / eval_id).
OOD_TARGETS = frozenset({"Potato", "Cup", "Spatula", "Cloth", "Pencil", "KeyChain", "Vase", "SoapBar", "Watch"})

#: ALFRED scene numbers (per room type) whose layouts train / eval_id use, and the unseen ones for eval_ood.
SEEN_SCENES = {"Kitchen": range(7, 31), "LivingRoom": range(207, 231), "Bedroom": range(307, 331),
               "Bathroom": range(407, 431)}
UNSEEN_SCENES = {"Kitchen": range(1, 7), "LivingRoom": range(201, 207), "Bedroom": range(301, 307),
                 "Bathroom": range(401, 407)}

#: The tool receptacle of each state-changing task, and the property the object needs.
TASK_TOOL = {"pick_clean_then_place_in_recep": ("SinkBasin", "Cleanable"),
             "pick_heat_then_place_in_recep": ("Microwave", "Heatable"),
             "pick_cool_then_place_in_recep": ("Fridge", "Coolable")}

LAMPS = ("DeskLamp", "FloorLamp")
#: Receptacles a lamp may stand on (look_at_obj_in_light needs the lamp in a receptacle).
LAMP_STANDS = ("SideTable", "Desk", "Dresser", "CoffeeTable")

_SPLIT_SEEDS = {"train": 1_000, "eval_id": 2_000, "eval_ood": 3_000}


@dataclass
class _Entity:
    id: str
    type: str


def _mangle_number(value: float) -> str:
    text = f"{value:+06.2f}"
    return text.replace("+", "_plus_").replace("-", "_minus_").replace(".", "_dot_")


def _entity_id(type_name: str, rng: random.Random, suffix: str = "") -> str:
    coords = "_bar_".join(_mangle_number(rng.uniform(-3.0, 3.0)) for _ in range(3))
    return f"{type_name}_bar_{coords}{suffix}"


def _location_id(index: int, rng: random.Random) -> str:
    parts = [rng.randint(-9, 9), rng.randint(-9, 9), index, rng.choice((-30, 0, 15, 30, 45, 60))]
    return "loc_bar_" + "_bar_".join(str(p).replace("-", "_minus_") for p in parts)


def _constants():
    import alfworld.gen.constants as constants  # imported lazily: alfworld is an optional dependency

    return constants


class _SceneBuilder:
    """Builds one room (receptacles at locations, objects in receptacles) and its PDDL problem."""

    def __init__(self, room: str, scene_num: int, rng: random.Random,
                 receptacles: dict[str, dict[str, tuple[int, int]]] = ROOM_RECEPTACLES):
        self.c = _constants()
        self.room = room
        self.scene_num = scene_num
        self.rng = rng
        # The layout (which receptacles, where) depends on the scene number only, like an ALFRED floor plan.
        layout_rng = random.Random(f"layout-{scene_num}")
        self._ids: set[str] = set()
        self.receptacles: list[_Entity] = []
        for rtype, (low, high) in receptacles[room].items():
            for _ in range(layout_rng.randint(low, high)):
                if rtype in ("SinkBasin", "BathtubBasin"):  # ALFRED names basins "Sink|x|y|z|SinkBasin"
                    rid = self._new_id(rtype.replace("Basin", ""), layout_rng, suffix=f"_bar_{rtype}")
                else:
                    rid = self._new_id(rtype, layout_rng)
                self.receptacles.append(_Entity(rid, rtype))
        self.locations = {r.id: _location_id(i, layout_rng) for i, r in enumerate(self.receptacles)}
        self.start_location = _location_id(len(self.receptacles), layout_rng)
        self.objects: list[tuple[_Entity, _Entity]] = []  # (object, receptacle it is in)

    def _new_id(self, type_name: str, rng: random.Random, suffix: str = "") -> str:
        while (eid := _entity_id(type_name, rng, suffix)) in self._ids:
            pass
        self._ids.add(eid)
        return eid

    def receptacles_of(self, rtype: str) -> list[_Entity]:
        return [r for r in self.receptacles if r.type == rtype]

    def holders(self, otype: str, exclude: tuple[str, ...] = ()) -> list[_Entity]:
        """Receptacles that may hold an object of type ``otype`` (ALFRED's VAL_RECEPTACLE_OBJECTS)."""
        allowed = self.c.VAL_RECEPTACLE_OBJECTS
        return [r for r in self.receptacles if otype in allowed.get(r.type, ()) and r.type not in exclude]

    def place(self, otype: str, exclude: tuple[str, ...] = ()) -> None:
        holders = self.holders(otype, exclude)
        if not holders:
            raise ValueError(f"no receptacle in a {self.room} can hold a {otype}")
        self.objects.append((_Entity(self._new_id(otype, self.rng), otype), self.rng.choice(holders)))

    def place_lamp(self) -> str:
        stands = [r for r in self.receptacles if r.type in LAMP_STANDS]
        lamp = self.rng.choice(LAMPS)
        self.objects.append((_Entity(self._new_id(lamp, self.rng), lamp), self.rng.choice(stands)))
        return lamp

    def problem(self, name: str, goal_pddl: str) -> str:
        c = self.c
        action_objects = c.VAL_ACTION_OBJECTS
        # As in ALFRED's problems: static receptacle types are rtypes, everything else (incl. bowls) otypes.
        rtypes = sorted(set(c.RECEPTACLES) - c.MOVABLE_RECEPTACLES_SET)
        otypes = sorted(set(c.OBJECTS) - set(rtypes))
        lines = [f"(define (problem {name})", "(:domain alfred)", "(:objects", "        agent1 - agent"]
        lines += [f"        {t}Type - otype" for t in otypes]
        lines += [f"        {t}Type - rtype" for t in rtypes]
        lines += [f"        {o.id} - object" for o, _ in self.objects]
        lines += [f"        {r.id} - receptacle" for r in self.receptacles]
        lines += [f"        {loc} - location" for loc in [*self.locations.values(), self.start_location]]
        lines += ["        )", "(:init"]
        facts: list[str] = []
        for r in self.receptacles:
            facts.append(f"(receptacleType {r.id} {r.type}Type)")
            facts.append(f"(receptacleAtLocation {r.id} {self.locations[r.id]})")
            if r.type in c.OPENABLE_CLASS_SET:
                facts.append(f"(openable {r.id})")
        present_otypes = sorted({o.type for o, _ in self.objects})
        for rtype in sorted({r.type for r in self.receptacles}):
            for otype in present_otypes:
                if otype in c.VAL_RECEPTACLE_OBJECTS.get(rtype, ()):
                    facts.append(f"(canContain {rtype}Type {otype}Type)")
        for o, r in self.objects:
            facts.append(f"(objectType {o.id} {o.type}Type)")
            facts.append(f"(inReceptacle {o.id} {r.id})")
            facts.append(f"(objectAtLocation {o.id} {self.locations[r.id]})")
            if o.type in LAMPS:
                facts.append(f"(toggleable {o.id})")
                continue
            facts.append(f"(pickupable {o.id})")
            for prop, predicate in (("Cleanable", "cleanable"), ("Heatable", "heatable"),
                                    ("Coolable", "coolable"), ("Sliceable", "sliceable")):
                if o.type in action_objects[prop]:
                    facts.append(f"({predicate} {o.id})")
            if o.type in c.MOVABLE_RECEPTACLES_SET:
                facts.append(f"(isReceptacleObject {o.id})")
        facts.append(f"(atLocation agent1 {self.start_location})")
        lines += [f"        {f}" for f in facts]
        lines += ["        )", "", goal_pddl]
        return "\n".join(lines) + "\n"


def _targets(task_type: str, room: str, ood: bool,
             receptacles: dict[str, dict[str, tuple[int, int]]] = ROOM_RECEPTACLES) -> list[tuple[str, str]]:
    """(object, parent receptacle type) pairs possible for a task in a room, split by OOD_TARGETS."""
    c = _constants()
    parents = sorted(receptacles[room])
    pairs = []
    for otype in ROOM_OBJECTS[room]:
        if (otype in OOD_TARGETS) != ood:
            continue
        if task_type in TASK_TOOL:
            tool, prop = TASK_TOOL[task_type]
            if otype not in c.VAL_ACTION_OBJECTS[prop] or tool not in receptacles[room]:
                continue
        for parent in parents:
            if task_type in TASK_TOOL and parent == TASK_TOOL[task_type][0]:
                continue
            if otype in c.VAL_RECEPTACLE_OBJECTS.get(parent, ()):
                pairs.append((otype, parent))
    return pairs


def _generate_game(task_type: str, split: str, index: int, size: str = "standard") -> tuple[str, dict, dict]:
    """One game: returns (folder name, game.tw-pddl data, traj_data)."""
    import alfworld.gen.goal_library as glib
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

    ood = split == "eval_ood"
    spec = SIZES[size]
    seed_text = f"{_SPLIT_SEEDS[split]}-{task_type}-{index}"
    rng = random.Random(seed_text if size == "standard" else f"{size}-{seed_text}")
    for _attempt in range(100):
        room = rng.choice(TASK_ROOMS[task_type])
        scene_num = rng.choice(list((UNSEEN_SCENES if ood else SEEN_SCENES)[room]))
        scene = _SceneBuilder(room, scene_num, rng, spec["receptacles"])
        if task_type == "look_at_obj_in_light":
            if not any(r.type in LAMP_STANDS for r in scene.receptacles):
                continue
            candidates = [o for o in ROOM_OBJECTS[room] if (o in OOD_TARGETS) == ood and scene.holders(o)]
            if not candidates:
                continue
            obj, parent = rng.choice(candidates), ""
        else:
            pairs = [(o, p) for o, p in _targets(task_type, room, ood, spec["receptacles"])
                     if scene.receptacles_of(p) and scene.holders(o, exclude=(p,))]
            if task_type in TASK_TOOL:
                pairs = [(o, p) for o, p in pairs if scene.receptacles_of(TASK_TOOL[task_type][0])]
            if not pairs:
                continue
            obj, parent = rng.choice(pairs)
        break
    else:  # pragma: no cover - the vocabulary above always admits a game
        raise RuntimeError(f"could not generate a {task_type} game for split {split!r}")

    toggle = ""
    if task_type == "look_at_obj_in_light":
        toggle = scene.place_lamp()
    # Target instances, never already in the goal receptacle type (the goal must not hold at the start).
    n_targets = rng.randint(*spec["targets"]) + (task_type == "pick_two_obj_and_place")
    for _ in range(n_targets):
        scene.place(obj, exclude=(parent,) if parent else ())
    distractors = [o for o in ROOM_OBJECTS[room] if o != obj and scene.holders(o, exclude=(parent,) if parent else ())]
    for otype in rng.sample(distractors, k=min(len(distractors), rng.randint(*spec["distractor_types"]))):
        for _ in range(rng.randint(1, 2)):
            scene.place(otype, exclude=(parent,) if parent else ())

    trial = f"trial_G{_SPLIT_SEEDS[split] // 1000}{index:05d}"
    goal = glib.gdict[task_type]["pddl"].replace("#", "-").format(obj=obj, recep=parent, toggle=toggle, mrecep="")
    problem = scene.problem(f"plan_{trial}", goal)
    template = rng.choice(glib.gdict[task_type]["templates"])
    task_desc = template.format(obj=obj.lower(), recep=parent.lower(), toggle=toggle.lower(), mrecep="")
    grammar = Path(ALFRED_TWL2_PATH).read_text().replace("UNKNOWN GOAL", task_desc)
    game = {"pddl_domain": Path(ALFRED_PDDL_PATH).read_text(), "grammar": grammar,
            "pddl_problem": problem, "solvable": True}
    traj = {
        "task_type": task_type,
        "task_id": trial,
        "pddl_params": {"object_target": obj, "parent_target": parent, "toggle_target": toggle,
                        "mrecep_target": "", "object_sliced": False},
        "scene": {"floor_plan": f"FloorPlan{scene_num}", "scene_num": scene_num, "room_type": room},
        "turk_annotations": {"anns": [{"task_desc": task_desc + ".", "high_descs": []}]},
        "milegpo": {"generator_version": GENERATOR_VERSION, "split": split, "index": index, "size": size},
    }
    folder = f"{task_type}-{obj}-None-{parent or toggle}-{scene_num}"
    return f"{folder}/{trial}", game, traj


def generate_task_set(root: str | os.PathLike, games_per_type: dict[str, int] | None = None,
                      size: str = "standard") -> Path:
    """Write the task set under ``root/<split>/...`` (overwrites files of the same name).

    ``size``: ``"standard"`` (ALFRED-like rooms: 10-20 receptacles, 6-12 distractor types) or
    ``"small"`` (4-5 receptacles, 0-2 distractor types, one target instance): short plans
    that an untrained agent sometimes completes, for learning curves on a CPU.
    """
    if size not in SIZES:
        raise ValueError(f"unknown ALFWorld task-set size {size!r}; use one of {sorted(SIZES)}")
    root = Path(root)
    games_per_type = dict(DEFAULT_GAMES_PER_TYPE if games_per_type is None else games_per_type)
    for split, count in games_per_type.items():
        if split not in _SPLIT_SEEDS:
            raise ValueError(f"unknown split {split!r}; expected one of {sorted(_SPLIT_SEEDS)}")
        for task_type in TASK_TYPES:
            for index in range(count):
                rel, game, traj = _generate_game(task_type, split, index, size)
                folder = root / split / rel
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "game.tw-pddl").write_text(json.dumps(game))
                (folder / "traj_data.json").write_text(json.dumps(traj, indent=1))
    return root


def default_cache_dir() -> Path:
    """``$MILEGPO_CACHE`` (default ``~/.cache/milegpo``)."""
    return Path(os.environ.get("MILEGPO_CACHE", Path.home() / ".cache" / "milegpo")).expanduser()


def ensure_task_set(cache_dir: str | os.PathLike | None = None, size: str = "standard") -> Path:
    """Return the folder of a generated task set (see :func:`generate_task_set`), generating it on first use.

    Generation writes into a temporary folder next to the target and renames it
    into place, so concurrent first uses (e.g. several env workers) never see a
    half-written task set: the first rename wins and the others discard theirs.
    """
    base = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if size not in SIZES:
        raise ValueError(f"unknown ALFWorld task-set size {size!r}; use one of {sorted(SIZES)}")
    name = f"generated-v{GENERATOR_VERSION}" if size == "standard" else f"generated-{size}-v{GENERATOR_VERSION}"
    target = base / "alfworld" / name
    if (target / "COMPLETE").exists():
        return target
    base_dir = target.parent
    base_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".generating-", dir=base_dir))
    try:
        generate_task_set(tmp, size=size)
        (tmp / "COMPLETE").write_text(f"milegpo ALFWorld task set, generator version {GENERATOR_VERSION}\n")
        try:
            os.rename(tmp, target)
        except OSError:  # another process renamed its complete copy first
            if not (target / "COMPLETE").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
