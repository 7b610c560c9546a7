"""Load a WebShop catalog (products, prices, goals) from upstream's JSON files.

Reads the layout that upstream's ``setup.sh`` download produces (and that
:mod:`milegpo.envs.webshop.generate_data` writes for the bundled set):
``items_shuffle.json`` (or ``items_shuffle_1000.json``), ``items_ins_v2.json``
(or ``items_ins_v2_1000.json``) and ``items_human_ins.json``.

The product fields are derived as upstream's loader does: title = ``name``,
description = ``full_description``, bullet points = ``small_description``,
``pricing`` parsed from ``"$a"`` / ``"$a - $b"`` (missing: $100.0), option
names and values lower-cased with ``/`` written as `` | ``, attributes from
``items_ins_v2`` (missing: ``["DUMMY_ATTR"]``), query lower-cased, products with
an asin of ``"nan"`` or longer than 10 characters and duplicate asins skipped.

Goals follow upstream's ``get_human_goals`` / ``get_synthetic_goals``: one goal
per human instruction with attributes (or, synthetic, one per product and
option combination), a price ceiling drawn from the next price steps above the
product's price, and the goal list shuffled with seed 233. Upstream draws the
range prices and the ceilings from the unseeded global ``random``; here one
``random.Random(seed)`` draws them, so the goal list is reproducible.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

#: Price ceilings upstream offers in instructions: 10, 20, ..., 990 dollars.
PRICE_STEPS = [10.0 * i for i in range(1, 100)]
#: Upstream's "no price limit" ceiling.
NO_PRICE_LIMIT = 1_000_000.0
#: Upstream's shuffle seed for the goal list.
GOAL_SHUFFLE_SEED = 233

PRODUCT_FILES = ("items_shuffle.json", "items_shuffle_1000.json")
ATTRIBUTE_FILES = ("items_ins_v2.json", "items_ins_v2_1000.json")
HUMAN_FILE = "items_human_ins.json"


@dataclass
class Product:
    """One product as the site shows it (upstream's loaded product dict, typed)."""

    asin: str
    title: str
    category: str
    query: str
    product_category: str
    description: str
    bullet_points: list[str]
    price_tag: str
    pricing: list[float]
    options: dict[str, list[str]]
    attributes: list[str]
    rating: str = "N.A."

    @property
    def search_text(self) -> str:
        """The document upstream indexes: title, description, first bullet, options."""
        options = ", and ".join(f"{name}: {', '.join(values)}" for name, values in self.options.items())
        first_bullet = self.bullet_points[0] if self.bullet_points else ""
        return " ".join([self.title, self.description, first_bullet, options]).lower()


@dataclass
class Goal:
    """One shopping instruction and what the reward compares the purchase with."""

    asin: str
    category: str
    query: str
    name: str
    product_category: str
    instruction_text: str
    attributes: list[str]
    price_upper: float
    goal_options: list[str]
    weight: float = 1.0


@dataclass
class Catalog:
    """Products by asin, their sampled prices, and the shuffled goal list."""

    products: list[Product]
    prices: dict[str, float]
    goals: list[Goal]
    by_asin: dict[str, Product] = field(init=False)

    def __post_init__(self) -> None:
        self.by_asin = {p.asin: p for p in self.products}


def _first_existing(data_dir: Path, names: tuple[str, ...]) -> Path:
    for name in names:
        if (data_dir / name).is_file():
            return data_dir / name
    raise FileNotFoundError(
        f"WebShop data directory {data_dir} has none of {', '.join(names)}. Point data_dir (or the "
        "WEBSHOP_DATA environment variable) at upstream's data folder (setup.sh download) or leave it "
        "unset to use the bundled catalog."
    )


def _parse_pricing(pricing: str | None) -> tuple[list[float], str]:
    if not pricing:
        return [100.0], "$100.0"
    values = [float(Decimal(re.sub(r"[^\d.]", "", part))) for part in pricing.split("$")[1:]]
    if len(values) == 1:
        return values, f"${values[0]}"
    return values[:2], f"${values[0]} to ${values[1]}"


def _parse_product(raw: dict, attributes: dict) -> Product:
    options: dict[str, list[str]] = {}
    for name, contents in (raw.get("customization_options") or {}).items():
        if contents is None:
            continue
        options[name.lower()] = [c["value"].strip().replace("/", " | ").lower() for c in contents]
    bullets = raw.get("small_description")
    pricing, price_tag = _parse_pricing(raw.get("pricing"))
    asin = raw["asin"]
    return Product(
        asin=asin,
        title=raw["name"],
        category=raw["category"],
        query=raw["query"].lower().strip(),
        product_category=raw["product_category"],
        description=raw.get("full_description") or "",
        bullet_points=bullets if isinstance(bullets, list) else [bullets or ""],
        price_tag=price_tag,
        pricing=pricing,
        options=options,
        attributes=attributes.get(asin, {}).get("attributes", ["DUMMY_ATTR"]),
    )


def _price_ceiling(rng: random.Random, price: float) -> tuple[float, str]:
    steps = [p for p in PRICE_STEPS if p > price][:4]
    if len(steps) < 2:
        return NO_PRICE_LIMIT, ""
    upper = max(rng.sample(steps, 2))
    return upper, f", and price lower than {upper:.2f} dollars"


def _human_goals(products: list[Product], human: dict, prices: dict[str, float], rng: random.Random) -> list[Goal]:
    goals = []
    for product in products:
        for ins in human.get(product.asin, []):
            if not ins["instruction_attributes"]:
                continue  # upstream skips instructions without attributes
            upper, price_text = _price_ceiling(rng, prices[product.asin])
            goals.append(Goal(
                asin=product.asin, category=product.category, query=product.query, name=product.title,
                product_category=product.product_category,
                instruction_text=ins["instruction"].strip(".") + price_text,
                attributes=list(ins["instruction_attributes"]), price_upper=upper,
                goal_options=list(ins["instruction_options"]),
            ))
    return goals


def _synthetic_goals(products: list[Product], attributes: dict, prices: dict[str, float],
                     rng: random.Random) -> list[Goal]:
    goals = []
    attr_counts: dict[str, int] = {}
    for product in products:
        ins = attributes.get(product.asin, {})
        if not ins.get("instruction"):
            continue
        upper, price_text = _price_ceiling(rng, prices[product.asin])
        names = sorted(product.options)
        for combination in itertools.product(*(product.options[n] for n in names)):
            option_text = ", and ".join(f"{n}: {v}" for n, v in zip(names, combination))
            option_text = f" with {option_text}" if option_text else ""
            goals.append(Goal(
                asin=product.asin, category=product.category, query=product.query, name=product.title,
                product_category=product.product_category,
                instruction_text=f"{ins['instruction']}{option_text}{price_text}",
                attributes=list(ins["instruction_attributes"]), price_upper=upper, goal_options=list(combination),
            ))
            for a in ins["instruction_attributes"]:
                attr_counts[a] = attr_counts.get(a, 0) + 1
    for goal in goals:  # upstream's sampling weight: rare attributes weigh more
        goal.weight = sum(1.0 / attr_counts[a] for a in goal.attributes) / len(goal.attributes)
    return goals


def load_catalog(data_dir: str | Path, human_goals: bool = True, num_products: int | None = None,
                 seed: int = GOAL_SHUFFLE_SEED) -> Catalog:
    """Load products and goals from ``data_dir`` (upstream's file layout).

    :param human_goals: goals from ``items_human_ins.json`` (upstream's and the
        papers' setting) instead of the synthetic ones from ``items_ins_v2``.
    :param num_products: keep only the first N products of the (shuffled) file.
    :param seed: seeds the price draws and the goal shuffle.
    """
    data_dir = Path(data_dir)
    with open(_first_existing(data_dir, PRODUCT_FILES), encoding="utf-8") as f:
        raw_products = json.load(f)
    with open(_first_existing(data_dir, ATTRIBUTE_FILES), encoding="utf-8") as f:
        attributes = json.load(f)
    human = {}
    if human_goals:
        with open(_first_existing(data_dir, (HUMAN_FILE,)), encoding="utf-8") as f:
            human = json.load(f)
    if num_products is not None:
        raw_products = raw_products[:num_products]
    products, seen = [], set()
    for raw in raw_products:
        asin = raw.get("asin")
        if not asin or asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        products.append(_parse_product(raw, attributes))
    if not products:
        raise ValueError(f"no usable products in {data_dir}")

    rng = random.Random(seed)
    prices = {p.asin: (p.pricing[0] if len(p.pricing) == 1 else rng.uniform(*p.pricing[:2])) for p in products}
    goals = (_human_goals(products, human, prices, rng) if human_goals
             else _synthetic_goals(products, attributes, prices, rng))
    if not goals:
        raise ValueError(f"no goals with attributes in {data_dir} ({'human' if human_goals else 'synthetic'} goals)")
    random.Random(seed).shuffle(goals)
    return Catalog(products=products, prices=prices, goals=goals)
