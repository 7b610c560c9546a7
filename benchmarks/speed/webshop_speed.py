"""Speed and reward sanity of ``milegpo/WebShop-v0`` on the bundled (or ``--data-dir``) catalog.

Measures: catalog load + BM25 index build, BM25 search latency, ``reset`` time,
env steps/s of a random agent (uniform over ``admissible_commands``) and of an
oracle agent (searches the instruction, opens the goal product, picks the goal
options, buys), and the mean purchase score of correct and wrong purchases.

    python -m benchmarks.speed.webshop_speed [--data-dir DIR] [--episodes 200]
"""

from __future__ import annotations

import random

import numpy as np

from benchmarks import harness
from milegpo.envs.webshop import ProductSearch, WebShopEnv, purchase_score


def oracle_actions(env: WebShopEnv) -> list[str] | None:
    """The clicks that buy the goal product with the goal options, after the first search."""
    goal = env.goal
    product = env.catalog.by_asin[goal.asin]
    results = env.results
    if goal.asin not in results:
        return None
    actions = ["click[next >]"] * (results.index(goal.asin) // 10) + [f"click[{goal.asin.lower()}]"]
    for value in goal.goal_options:
        if any(value in values for values in product.options.values()):
            actions.append(f"click[{value}]")
    return actions + ["click[buy now]"]


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--episodes", type=int, default=200)
    args = parser.parse_args()

    print(f"1-min load at start: {harness.load_1min():.2f}")
    with harness.Stopwatch() as clock:
        env = WebShopEnv(split="all", data_dir=args.data_dir)
    build_s = clock.wall_s
    catalog, search = env.catalog, env.search_engine
    print(f"catalog: {len(catalog.products)} products, {len(catalog.goals)} goals; load + BM25 build {build_s:.3f} s")
    with harness.Stopwatch() as clock:
        ProductSearch([p.asin for p in catalog.products], [p.search_text for p in catalog.products])
    print(f"BM25 index build alone: {clock.wall_s:.3f} s")

    queries = [g.instruction_text for g in catalog.goals[:200]]
    with harness.Stopwatch() as clock:
        hits = [search.search(q) for q in queries]
    print(f"search latency: {clock.wall_s / len(queries) * 1e3:.2f} ms/query")
    top1 = np.mean([h[:1] == [g.asin] for h, g in zip(hits, catalog.goals)])
    top10 = np.mean([g.asin in h[:10] for h, g in zip(hits, catalog.goals)])
    own_title = np.mean([search.search(p.title)[:1] == [p.asin] for p in catalog.products])
    print(f"goal product ranked 1st for its instruction: {top1:.2f}, in top 10: {top10:.2f}; "
          f"product 1st for its own title: {own_title:.2f}")

    with harness.Stopwatch() as clock:
        for s in range(args.episodes):
            env.reset(seed=s)
    print(f"reset: {clock.wall_s / args.episodes * 1e3:.3f} ms")

    rng = random.Random(0)
    steps, scores = 0, []
    with harness.Stopwatch() as clock:
        for s in range(args.episodes):
            _, info = env.reset(seed=s)
            done = False
            while not done:
                _, _, term, trunc, info = env.step(rng.choice(info["admissible_commands"]))
                steps += 1
                done = term or trunc
            scores.append(info["score"] if term else 0.0)
    print(f"random agent: {steps / clock.wall_s:.0f} steps/s, mean score {np.mean(scores):.3f}")

    steps, scores = 0, []
    with harness.Stopwatch() as clock:
        for s in range(args.episodes):
            _, info = env.reset(seed=s)
            _, _, _, _, info = env.step(info["admissible_commands"][0])
            steps += 1
            actions = oracle_actions(env) or ["click[back to search]"]
            for a in actions:
                _, _, term, trunc, info = env.step(a)
                steps += 1
                if term or trunc:
                    break
            scores.append(info["score"] if term else 0.0)
    print(f"oracle agent: {steps / clock.wall_s:.0f} steps/s, mean score {np.mean(scores):.3f}, "
          f"won {np.mean([s == 1.0 for s in scores]):.3f}")

    # purchase scores of correct vs wrong buys, straight from the reward function
    correct, wrong_option, same_type, other_type = [], [], [], []
    by_query: dict[str, list] = {}
    for p in catalog.products:
        by_query.setdefault(p.query, []).append(p)
    for goal in catalog.goals:
        product = catalog.by_asin[goal.asin]
        price = catalog.prices[goal.asin]
        chosen = {n: v for n, vs in product.options.items() for v in vs if v in goal.goal_options}
        correct.append(purchase_score(product, goal, price, chosen)[0])
        if chosen:
            name = next(iter(chosen))
            others = [v for v in product.options[name] if v != chosen[name]]
            wrong_option.append(purchase_score(product, goal, price, {**chosen, name: others[0]})[0])
        sibling = rng.choice([p for p in by_query[goal.query] if p.asin != goal.asin])
        same_type.append(purchase_score(sibling, goal, catalog.prices[sibling.asin], {})[0])
        stranger = rng.choice([p for p in catalog.products if p.query != goal.query])
        other_type.append(purchase_score(stranger, goal, catalog.prices[stranger.asin], {})[0])
    print(f"score: correct buy {np.mean(correct):.3f} (min {min(correct):.3f}); one wrong option "
          f"{np.mean(wrong_option):.3f}; same-type other product, no options {np.mean(same_type):.3f}; "
          f"other type {np.mean(other_type):.3f}")


if __name__ == "__main__":
    main()
