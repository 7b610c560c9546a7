"""The WebShop text environment (``milegpo/WebShop-v0``).

See the package docstring (:mod:`milegpo.envs.webshop`) for the page flow, the
observation formats and every deviation from upstream.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from milegpo.envs.core import TextEnv
from milegpo.envs.webshop.catalog import Catalog, Goal, load_catalog
from milegpo.envs.webshop.reward import STOP_WORDS, purchase_score
from milegpo.envs.webshop.search import ProductSearch

BUNDLED_DATA = Path(__file__).parent / "data"
#: Upstream's results per page (PRODUCT_WINDOW) and its eval goals (0-499).
RESULTS_PER_PAGE = 10
UPSTREAM_EVAL_GOALS = 500

BUY_NOW, NEXT_PAGE, PREV_PAGE, BACK_TO_SEARCH = "Buy Now", "Next >", "< Prev", "Back to Search"
SUB_PAGES = ("Description", "Features", "Reviews", "Attributes")
OBSERVATION_MODES = ("text", "text_rich")
SPLITS = ("train", "eval", "all")

_ACTION = re.compile(r"^(search|click)\[(.*)\]$", re.DOTALL)
_PRICE_CLAUSE = re.compile(r",? and price lower than [\d.]+ dollars$")
_QUERY_FILLER = frozenset({"looking", "need", "find", "want", "buy", "get", "like", "im", "i'm", "please"})


@dataclass(frozen=True)
class Page:
    """Where the agent is: what identifies a page, not its text."""

    kind: str  # "search" | "results" | "item" | one of SUB_PAGES (lower-case) | "done"
    keywords: tuple[str, ...] = ()
    page: int = 1
    asin: str | None = None
    options: tuple[tuple[str, str], ...] = ()  # chosen (option name, value), in choice order


@dataclass
class _Segment:
    """One visible text piece of a page; ``role`` drives the ``text_rich`` markup."""

    text: str
    role: str = "text"  # "text" | "button" | "option" | "product"
    selected: bool = False


@dataclass
class _Session:
    goal: Goal
    page: Page = field(default_factory=lambda: Page("search"))
    results: list[str] = field(default_factory=list)  # asins of the current search, best first
    visited: set[str] = field(default_factory=set)  # asins opened since the last search page


@functools.lru_cache(maxsize=4)
def _shared_engine(data_dir: str, human_goals: bool, num_products: int | None) -> tuple[Catalog, ProductSearch]:
    """Catalog and search index, built once per process and shared by all envs on the same data."""
    catalog = load_catalog(data_dir, human_goals=human_goals, num_products=num_products)
    search = ProductSearch([p.asin for p in catalog.products], [p.search_text for p in catalog.products])
    return catalog, search


def _rank(results: list[str], asin: str) -> int:
    """Where ``asin`` is in search ``results`` (len(results) + 1 when absent)."""
    return results.index(asin) if asin in results else len(results) + 1


def parse_action(action: str) -> tuple[str, str] | None:
    """``"search[q]"`` / ``"click[b]"`` -> (name, lower-cased argument); None if malformed."""
    match = _ACTION.match(action.strip())
    return None if match is None else (match.group(1), match.group(2).strip().lower())


class WebShopEnv(TextEnv):
    """WebShop: find and buy the product an instruction describes, on a text shopping site.

    :param split: ``"train"`` (goals from ``num_eval_goals`` on), ``"eval"`` (the
        first ``num_eval_goals`` goals) or ``"all"``.
    :param observation_mode: ``"text"`` (segments joined by ``" [SEP] "``) or ``"text_rich"``.
    :param data_dir: a folder with upstream's data files; default ``$WEBSHOP_DATA``,
        else the bundled catalog.
    :param human_goals: human instructions (upstream default in the papers) or synthetic ones.
    :param num_eval_goals: size of the eval split; default 500 (upstream) when the
        goal list has at least 5,000 goals, else a fifth of the goals.
    :param num_products: use only the first N products of the product file.
    :param show_attrs: show the item page's "Attributes" button, as upstream's option.
    :param spacy_model: use spaCy's nouns for the title score, as upstream (see :mod:`.reward`).
    :param success_reward: None: the reward of a purchase is its score (upstream);
        a number: the reward is that number for a purchase scoring 1.0 and 0
        otherwise (the GiGPO/verl-agent setup uses 10). ``info["score"]`` is
        always the raw score.
    :param max_episode_steps: horizon (15 in the papers' WebShop setup).
    :param invalid_action_penalty: reward subtracted for an invalid action.
    :param state_key: ``"env"`` (default: :meth:`state_key`, the page identity) or ``"observation"``
        (:meth:`anchor_observation`, the key of the paper's and verl-agent's code).
    """

    def __init__(
        self,
        split: str = "train",
        observation_mode: str = "text",
        data_dir: str | os.PathLike | None = None,
        human_goals: bool = True,
        num_eval_goals: int | None = None,
        num_products: int | None = None,
        show_attrs: bool = False,
        spacy_model: str | None = None,
        success_reward: float | None = None,
        max_episode_steps: int = 15,
        invalid_action_penalty: float = 0.1,
        render_mode: str | None = None,
        state_key: str = "env",
    ):
        super().__init__(invalid_action_penalty, max_episode_steps, render_mode, state_key=state_key)
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if observation_mode not in OBSERVATION_MODES:
            raise ValueError(f"observation_mode must be one of {OBSERVATION_MODES}, got {observation_mode!r}")
        data_dir = data_dir if data_dir is not None else os.environ.get("WEBSHOP_DATA") or BUNDLED_DATA
        self.data_dir = Path(data_dir).expanduser().resolve()
        if not self.data_dir.is_dir():
            raise FileNotFoundError(f"WebShop data_dir {self.data_dir} is not a directory")
        self.catalog, self.search_engine = _shared_engine(str(self.data_dir), bool(human_goals), num_products)
        goals = self.catalog.goals
        if num_eval_goals is None:
            num_eval_goals = UPSTREAM_EVAL_GOALS if len(goals) >= 10 * UPSTREAM_EVAL_GOALS else len(goals) // 5
        if not 0 <= num_eval_goals < len(goals):
            raise ValueError(f"num_eval_goals must be in [0, {len(goals)}), got {num_eval_goals}")
        self.num_eval_goals = num_eval_goals
        self.goals = {"eval": goals[:num_eval_goals], "train": goals[num_eval_goals:], "all": goals}[split]
        if not self.goals:
            raise ValueError(f"split {split!r} has no goals (num_eval_goals={num_eval_goals}, {len(goals)} goals)")
        self.split = split
        self.observation_mode = observation_mode
        self.show_attrs = show_attrs
        self.spacy_model = spacy_model
        self.success_reward = success_reward
        self._session: _Session | None = None
        self._score = 0.0

    @property
    def num_tasks(self) -> int:
        return len(self.goals)

    @property
    def goal(self) -> Goal:
        """The current episode's goal (what the reward compares with)."""
        return self._require_session().goal

    @property
    def page(self) -> Page:
        """The current page (what :meth:`state_key` encodes)."""
        return self._require_session().page

    @property
    def results(self) -> list[str]:
        """The asins the last search returned, best first (for scripted agents and analysis)."""
        return list(self._require_session().results)

    # ------------------------------------------------------------ TextEnv API
    def _reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        if seed is not None:
            index = seed % self.num_tasks
        else:  # upstream draws an unassigned session's goal by goal weight
            weights = np.array([g.weight for g in self.goals])
            index = int(self.np_random.choice(self.num_tasks, p=weights / weights.sum()))
        self._session = _Session(goal=self.goals[index])
        return self._render(), {"task": self._session.goal.instruction_text, "goal_index": index}

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        session = self._require_session()
        name, arg = parse_action(action)  # type: ignore[misc]  # is_valid_action checked it
        if name == "search":
            self._show_results(arg.split(" "), page=1)
            return self._render(), 0.0, False, {}
        page = session.page
        if arg == BUY_NOW.lower():
            return self._buy()
        if arg == BACK_TO_SEARCH.lower():
            session.page, session.results, session.visited = Page("search"), [], set()
        elif arg in (NEXT_PAGE.lower(), PREV_PAGE.lower()) and page.kind == "results":
            self._show_results(list(page.keywords), page.page + (1 if arg == NEXT_PAGE.lower() else -1))
        elif arg == PREV_PAGE.lower() and page.kind == "item":
            self._show_results(list(page.keywords), page.page)
        elif arg == PREV_PAGE.lower():  # from a sub page back to its item page
            session.page = replace(page, kind="item")
        elif arg in (s.lower() for s in SUB_PAGES):
            session.page = replace(page, kind=arg)
        elif page.kind == "results":  # a product link
            asin = arg.upper()
            session.visited.add(asin)
            session.page = replace(page, kind="item", asin=asin, options=())
        else:  # an option of the item page
            option_name = self._option_name(arg)
            chosen = dict(page.options)
            chosen[option_name] = arg
            session.page = replace(page, options=tuple(chosen.items()))
        return self._render(), 0.0, False, {}

    def is_valid_action(self, action: str) -> bool:
        """``search[q]`` (non-empty q) on the search page; ``click[b]`` for a button on the page."""
        parsed = parse_action(action)
        if parsed is None or self._session is None:
            return False
        name, arg = parsed
        if name == "search":
            return bool(arg) and self._session.page.kind == "search"
        return arg in self._clickables() and arg != "search"

    def admissible_commands(self) -> list[str] | None:
        """The page's clickables as ``click[...]``; on the search page, candidate searches.

        Any non-empty ``search[...]`` is valid on the search page; the listed
        candidates (the instruction without its price clause, and its content
        words) are what a policy that chooses among commands can send.
        """
        if self._session is None:
            return None
        if self._session.page.kind == "search":
            return [f"search[{q}]" for q in self._candidate_queries()]
        return [f"click[{c}]" for c in self._clickables() if c != "search"]

    def expert_action(self) -> str | None:
        """A scripted shopper: search with the candidate query that ranks the goal's product
        highest, page to it, open it, click each goal option it offers, buy. Where no query
        finds the goal's product it buys the top result (a structured, losing demonstration)."""
        session = self._require_session()
        page = session.page
        if page.kind == "done":
            return None
        if page.kind == "search":
            queries = self._candidate_queries()
            ranks = [_rank(self.search_engine.search(q), session.goal.asin) for q in queries]
            return f"search[{queries[ranks.index(min(ranks))]}]"
        target: str | None = session.goal.asin if session.goal.asin in session.results else (
            session.results[0] if session.results else None)
        if page.kind == "results":
            if target is None:
                return f"click[{BACK_TO_SEARCH.lower()}]"
            target_page = session.results.index(target) // RESULTS_PER_PAGE + 1
            if target_page == page.page:
                return f"click[{target.lower()}]"
            return f"click[{(NEXT_PAGE if target_page > page.page else PREV_PAGE).lower()}]"
        if page.kind != "item" or page.asin != target:
            return f"click[{PREV_PAGE.lower()}]"
        chosen = set(dict(page.options).values())
        assert page.asin is not None  # an item page
        product = self.catalog.by_asin[page.asin]
        for wanted in session.goal.goal_options:
            for values in product.options.values():
                match = next((v for v in values if v.lower() == wanted.lower()), None)
                if match is not None and match not in chosen:
                    return f"click[{match}]"
        return f"click[{BUY_NOW.lower()}]"

    def anchor_observation(self) -> str:
        """The page as verl-agent's WebShop env manager forms its anchor observation: the text after the
        instruction, each ``[SEP]`` part in single quotes (the whole text where the instruction is not
        shown, and in the non-text observation modes)."""
        parts = self._observation.split(" [SEP] ")
        instruction = self._session.goal.instruction_text if self._session is not None else None
        if self.observation_mode != "text" or instruction not in parts:
            return self._observation
        return " [SEP] ".join(f"'{part}'" for part in parts[parts.index(instruction) + 1:])

    def state_key(self) -> str:
        if self._session is None:
            return ""
        page = self._session.page
        if page.kind in ("search", "done"):
            return page.kind
        parts = [page.kind, " ".join(page.keywords), str(page.page)]
        if page.asin is not None:
            parts += [page.asin, ",".join(f"{n}={v}" for n, v in sorted(page.options))]
        return "|".join(parts)

    # ------------------------------------------------------------ page flow
    def _require_session(self) -> _Session:
        if self._session is None:
            raise RuntimeError("call reset() before using the env")
        return self._session

    def _show_results(self, keywords: list[str], page: int) -> None:
        session = self._require_session()
        query = " ".join(keywords)
        if tuple(keywords) != session.page.keywords or not session.results:
            session.results = self.search_engine.search(query)
        session.page = Page("results", keywords=tuple(keywords), page=page)

    def _option_name(self, value: str) -> str:
        product = self.catalog.by_asin[self._require_session().page.asin]  # type: ignore[index]
        name = ""
        for option_name, values in product.options.items():  # the last group with the value wins, as upstream
            if value in values:
                name = option_name
        return name

    def _buy(self) -> tuple[str, float, bool, dict[str, Any]]:
        session = self._require_session()
        page = session.page
        product = self.catalog.by_asin[page.asin]  # type: ignore[index]
        options = dict(page.options)
        score, reward_info = purchase_score(product, session.goal, self.catalog.prices[product.asin], options,
                                            spacy_model=self.spacy_model)
        session.page = replace(page, kind="done")
        self._score = score
        observation = self._render()
        won = score == 1.0
        info = {"won": won, "score": score, "reward_info": reward_info,
                "purchased": {"asin": product.asin, "options": options}}
        reward = score if self.success_reward is None else (self.success_reward if won else 0.0)
        return observation, reward, True, info

    # --------------------------------------------------------------- render
    def _clickables(self) -> list[str]:
        """Upstream's ``text_to_clickable`` keys: lower-cased buttons and asins, option values."""
        return [s.text.lower() if s.role != "option" else s.text for s in self._segments()
                if s.role in ("button", "product", "option")]

    def _candidate_queries(self) -> list[str]:
        text = _PRICE_CLAUSE.sub("", self._require_session().goal.instruction_text.lower()).strip()
        words = [w for w in re.findall(r"[a-z0-9.'-]+", text) if w not in STOP_WORDS and w not in _QUERY_FILLER]
        candidates = [text, " ".join(words)]
        return [q for i, q in enumerate(candidates) if q and q not in candidates[:i]]

    def _segments(self) -> list[_Segment]:
        session = self._require_session()
        page = session.page
        if page.kind == "done":
            return [_Segment("Thank you for shopping with us!"), _Segment("Your score (min 0.0, max 1.0)"),
                    _Segment(str(self._score))]
        head = [_Segment("Instruction:"), _Segment(session.goal.instruction_text)]
        if page.kind == "search":
            return [_Segment("WebShop"), *head, _Segment("Search", "button")]
        head.append(_Segment(BACK_TO_SEARCH, "button"))
        if page.kind == "results":
            segs = [*head, _Segment(f"Page {page.page} (Total results: {len(session.results)})")]
            if page.page > 1:
                segs.append(_Segment(PREV_PAGE, "button"))
            segs.append(_Segment(NEXT_PAGE, "button"))
            start = (page.page - 1) * RESULTS_PER_PAGE
            for asin in session.results[max(start, 0):max(start + RESULTS_PER_PAGE, 0)]:
                product = self.catalog.by_asin[asin]
                segs += [_Segment(asin, "product", asin in session.visited), _Segment(product.title),
                         _Segment(product.price_tag)]
            return segs
        product = self.catalog.by_asin[page.asin]  # type: ignore[index]
        segs = [*head, _Segment(PREV_PAGE, "button")]
        if page.kind == "item":
            chosen = set(dict(page.options).values())
            for option_name, values in product.options.items():
                segs.append(_Segment(option_name))
                segs += [_Segment(v, "option", v in chosen) for v in values]
            segs += [_Segment(product.title), _Segment(f"Price: {product.price_tag}"),
                     _Segment(f"Rating: {product.rating}")]
            buttons = SUB_PAGES if self.show_attrs else SUB_PAGES[:3]
            segs += [_Segment(b, "button") for b in buttons]
            segs.append(_Segment(BUY_NOW, "button"))
        elif page.kind == "description":
            segs.append(_Segment(product.description))
        elif page.kind == "features":
            segs += [_Segment(b) for b in product.bullet_points]
        elif page.kind == "attributes":
            segs += [_Segment(a) for a in product.attributes]
            segs += [_Segment(product.category), _Segment(product.query), _Segment(product.product_category)]
        return segs  # "reviews": upstream loads no reviews, the page lists none

    def _render(self) -> str:
        segments = [s for s in self._segments() if s.text.strip()]
        if self.observation_mode == "text":
            return " [SEP] ".join(s.text.strip() for s in segments)
        lines, clicked = [], []
        for s in segments:
            if s.role == "button":
                lines.append(f"[button] {s.text} [button_]")
            elif s.role == "option":
                mark = "clicked button" if s.selected else "button"
                lines.append(f"  [{mark}] {s.text} [{mark}_]")
                if s.selected:
                    clicked.append(f"You have clicked {s.text}.")
            elif s.role == "product":
                mark = "clicked button" if s.selected else "button"
                lines.append(f"\n[{mark}] {s.text} [{mark}_]")
            else:
                lines.append(s.text)
        return "".join(f"{c}\n" for c in reversed(clicked)) + "".join(f"{line}\n" for line in lines)
