"""Ground-truth distances to the goal for the credit-quality benchmark.

For each env a *tracker* follows one episode and returns ``d*(s)``, the number of
steps an optimal agent still needs to win from the current state (``None``: it
cannot win any more). The credit benchmark scores each method's advantages against
the true progress of a step, ``d*(s_t) - d*(s_{t+1})``.

* **House** - the env's own BFS solver (exact).
* **TWX coin** - the map is explored once per task (replaying from the start, every
  door opened), then ``d*`` = the cheapest way to the coin's room (a move costs 1,
  a closed door 1 more to open) + 1 to take the coin. Door states are tracked from
  the actions and from each room's description (exact for the coin game, whose only
  state is the agent's room, the doors and the coin).
* **WebShop** - progress through the purchase funnel: search with the best
  candidate query, page to a product that scores 1.0 once the goal options it
  offers are chosen, open it, choose them, buy (the score is upstream's reward
  function, so every product that would win counts, not only the goal's asin).
* **ALFWorld** - the length of alfworld's fast-downward plan from the current state
  (``expert_type="planner"``).
"""

from __future__ import annotations

import heapq
import itertools
import re
from typing import Any

from milegpo.envs import make_env

OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}
_ROOM = re.compile(r"You are in the ([^.]+)\.")
_EXIT = re.compile(r"[^.]*to the (north|south|east|west)[^.]*\.", re.I)

#: name -> (env id, env kwargs) of the credit benchmark's envs (the learning benchmark's settings).
ENVS: dict[str, tuple[str, dict[str, Any]]] = {
    "house": ("milegpo/House-v0", {"max_episode_steps": 30}),
    "coin": ("milegpo/TWX-coin-v0", {"numLocations": 5, "includeDoors": True, "numDistractorItems": 0,
                                     "max_episode_steps": 30}),
    "webshop": ("milegpo/WebShop-v0", {"success_reward": 10.0, "max_episode_steps": 15}),
    "alfworld": ("milegpo/ALFWorld-v0", {"size": "small", "task_types": [1, 2], "max_episode_steps": 30,
                                         "expert_type": "planner"}),
}


class Tracker:
    """Follows one task's episodes: ``observe`` after each reset/step, then ``distance`` = d*(s)."""

    def __init__(self, env, seed: int):
        self.env = env

    def observe(self, action: str | None, info: dict) -> None:
        """Update what the tracker must remember (most envs expose their whole state: nothing)."""

    def distance(self, info: dict) -> int | None:
        raise NotImplementedError


class HouseTracker(Tracker):
    def distance(self, info: dict) -> int | None:
        if info.get("won"):
            return 0
        plan = self.env.solve()
        return None if plan is None else len(plan)


class CoinTracker(Tracker):
    """The coin game's map (explored once per task) and its door states along an episode."""

    def __init__(self, env, seed: int):
        super().__init__(env, seed)
        self.seed = seed
        self.exits: dict[str, dict[str, tuple[str, bool]]] = {}  # room -> direction -> (room, has door)
        self.coin_room: str | None = None
        self._explore()
        self.open: set[tuple[str, str]] = set()  # (room, direction) of open doors, both sides

    def _replay(self, actions: list[str]) -> tuple[str, dict]:
        obs, info = self.env.reset(seed=self.seed)
        for action in actions:
            obs, _, _, _, info = self.env.step(action)
        return obs, info

    def _explore(self) -> None:
        queue = [[]]
        while queue:
            path = queue.pop(0)
            _, info = self._replay(path + ["look around"])
            room = self._room()
            if room in self.exits:
                continue
            self.exits[room] = {}
            commands = info["admissible_commands"]
            if "take coin" in commands:
                self.coin_room = room
            for direction in OPPOSITE:
                if f"move {direction}" not in commands:
                    continue
                has_door = f"open door to {direction}" in commands or f"close door to {direction}" in commands
                steps = path + ([f"open door to {direction}"] if has_door else []) + [f"move {direction}"]
                self._replay(steps + ["look around"])
                neighbour = self._room()
                self.exits[room][direction] = (neighbour, has_door)
                queue.append(steps)
        self.env.reset(seed=self.seed)

    def _room(self) -> str:
        match = _ROOM.search(self.env.state_key())
        return match.group(1) if match else "?"

    def _set_door(self, room: str, direction: str, is_open: bool) -> None:
        neighbour, has_door = self.exits.get(room, {}).get(direction, (None, False))
        if not has_door:
            return
        for side in ((room, direction), (neighbour, OPPOSITE[direction])):
            (self.open.add if is_open else self.open.discard)(side)

    def observe(self, action: str | None, info: dict) -> None:
        """Update the door states after ``action`` (None at reset) from the action and the room's text.

        A reset starts a new episode: the doors the previous episodes of the task opened are forgotten
        (the tracker then knows what a fresh one would)."""
        if action is None:
            self.open.clear()
        room = self._room()
        for sentence in _EXIT.finditer(self.env.state_key()):
            text = sentence.group(0).lower()
            if "door" in text:
                self._set_door(room, sentence.group(1).lower(), "open" in text and "closed" not in text)

    def distance(self, info: dict) -> int | None:
        if info.get("won"):
            return 0
        if self.coin_room is None:
            return None
        start = self._room()
        best = {start: 0}
        heap = [(0, start)]
        while heap:
            cost, room = heapq.heappop(heap)
            if room == self.coin_room:
                return cost + 1  # take coin
            if cost > best.get(room, cost):
                continue
            for direction, (neighbour, has_door) in self.exits.get(room, {}).items():
                step = 1 + (has_door and (room, direction) not in self.open)
                if cost + step < best.get(neighbour, 1 << 30):
                    best[neighbour] = cost + step
                    heapq.heappush(heap, (cost + step, neighbour))
        return None


class WebShopTracker(Tracker):
    """Remaining steps of the purchase funnel to a product that would score 1.0 (see the module doc)."""

    def __init__(self, env, seed: int):
        super().__init__(env, seed)
        self._clicks: dict[tuple[str, tuple], int | None] = {}  # (asin, chosen options) -> clicks

    def clicks_to_win(self, asin: str, chosen: tuple[tuple[str, str], ...] = ()) -> int | None:
        """The fewest option clicks after which buying ``asin`` scores 1.0, or None if no choice does.

        Upstream matches options loosely (a value close to a goal option counts), so every
        value of every option group is tried, fewest clicks first.
        """
        key = (asin, chosen)
        if key not in self._clicks:
            from milegpo.envs.webshop.reward import purchase_score

            session = self.env._require_session()
            product = self.env.catalog.by_asin[asin]
            price = self.env.catalog.prices[asin]
            every_value = {f"{name}#{i}": v for name, values in product.options.items() for i, v in enumerate(values)}
            self._clicks[key] = None
            if purchase_score(product, session.goal, price, every_value)[0] == 1.0:  # else no choice can win
                current = dict(chosen)
                groups = list(product.options)
                for size in range(len(groups) + 1):
                    for names in itertools.combinations(groups, size):
                        choices = itertools.product(*[[v for v in product.options[n] if v != current.get(n)]
                                                      for n in names])
                        if any(purchase_score(product, session.goal, price, {**current, **dict(zip(names, values))})[0]
                               == 1.0 for values in choices):
                            self._clicks[key] = size
                            break
                    if self._clicks[key] is not None:
                        break
        return self._clicks[key]

    def _from_results_list(self, results: list[str], page_no: int) -> int | None:
        """From page ``page_no`` of ``results``: page to a winning product, open it, choose, buy."""
        costs = [abs(i // 10 + 1 - page_no) + 1 + clicks + 1
                 for i, asin in enumerate(results) if (clicks := self.clicks_to_win(asin)) is not None]
        return min(costs) if costs else None

    def _from_search(self) -> int | None:
        costs = [1 + cost for query in self.env._candidate_queries()
                 if (cost := self._from_results_list(self.env.search_engine.search(query), 1)) is not None]
        return min(costs) if costs else None

    def distance(self, info: dict) -> int | None:
        session = self.env._require_session()
        page = session.page
        if page.kind == "done":
            return 0 if info.get("won") else None
        if page.kind == "search":
            return self._from_search()
        options = [] if (back := self._from_search()) is None else [1 + back]
        if page.kind == "results":
            options.append(self._from_results_list(session.results, page.page))
        else:
            on_item = 0 if page.kind == "item" else 1  # a sub page is one "< Prev" from its item page
            clicks = self.clicks_to_win(page.asin, tuple(sorted(page.options)))
            options.append(None if clicks is None else on_item + clicks + 1)
            if page.kind == "item":
                via_results = self._from_results_list(session.results, page.page)
                options.append(None if via_results is None else 1 + via_results)
        options = [o for o in options if o is not None]
        return min(options) if options else None


class ALFWorldTracker(Tracker):
    def distance(self, info: dict) -> int | None:
        if info.get("won"):
            return 0
        plan = info.get("expert_plan")
        return len(plan) if plan else None


TRACKERS: dict[str, type[Tracker]] = {"house": HouseTracker, "coin": CoinTracker,
                                                   "webshop": WebShopTracker, "alfworld": ALFWorldTracker}


#: Env kwargs that give an env its scripted expert (``expert_action``), where it needs any
#: (ALFWorld's planner is already on for its tracker).
EXPERT_KWARGS: dict[str, dict[str, Any]] = {"coin": {"gold_path": True}}


def make(name: str, split: str = "train", expert: bool = False):
    """The env of benchmark env ``name`` (its ``split``; with its scripted expert on when
    ``expert``) and its tracker factory."""
    env_id, kwargs = ENVS[name]
    return make_env(env_id, split=split, **kwargs, **(EXPERT_KWARGS.get(name, {}) if expert else {})), TRACKERS[name]
