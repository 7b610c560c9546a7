"""WebShop (Yao et al., 2022) as a milegpo text env: ``milegpo/WebShop-v0``.

The agent reads a shopping instruction ("i need a sulfate free shampoo in
lavender scent, and price lower than 30.00 dollars"), searches a catalog,
opens products, picks options and buys; the purchase is scored in [0, 1]
against the instruction. This is our own implementation of upstream's text
environment (princeton-nlp/WebShop ``web_agent_text_env.py``): upstream needs
Java + pyserini + a Lucene index, spaCy and a large download, and the PyPI
``webshop`` package is broken. It follows upstream's behaviour:

Page flow (upstream's templates, buttons lower-cased as upstream's clickables)
    search page --``search[query]``--> results (10 per page, ``Next >`` always,
    ``< Prev`` from page 2, ``Back to Search``; up to 50 BM25 hits) --``click[<asin>]``-->
    item page (option values, title, price, rating, ``Description`` /
    ``Features`` / ``Reviews`` [/ ``Attributes`` with ``show_attrs``], ``Buy Now``,
    ``< Prev`` back to the results, ``Back to Search``) --``click[buy now]``--> done.
    Clicking an option value selects it for its option group; a sub page's
    ``< Prev`` returns to the item page with the options kept; ``< Prev`` from an
    item page returns to the results and clears the options; ``Back to Search``
    clears everything but the goal.
Observations
    ``observation_mode="text"``: the page's visible text pieces joined by
    ``" [SEP] "`` (e.g. ``"WebShop [SEP] Instruction: [SEP] ... [SEP] Search"``);
    ``"text_rich"``: one piece per line, ``[button] X [button_]``, chosen options
    and visited products as ``[clicked button] X [clicked button_]``, "You have
    clicked X." lines first.
Reward
    upstream's ``get_reward`` (:mod:`milegpo.envs.webshop.reward`), given once,
    at the purchase; ``info["score"]`` is the raw score, ``won`` is score == 1.0
    (``success_reward=10`` gives the papers' 10-if-won reward instead).
    Invalid actions get ``-invalid_action_penalty`` (milegpo's convention;
    upstream ignores them with reward 0).
Goals and splits
    upstream's goal lists (human instructions by default), shuffled with seed
    233; ``split="eval"`` is the first ``num_eval_goals`` goals and ``"train"`` the
    rest, as the papers' eval goals 0-499 / train 500+. With the full data
    (>= 5,000 goals) ``num_eval_goals`` defaults to 500; with smaller sets
    (the bundled one) to a fifth of the goals. ``reset(seed=s)`` plays goal
    ``s % num_tasks`` of the split.
Data
    bundled: a generated catalog of 400 products (5 categories x 4 types) and
    their instructions in upstream's JSON layouts (see :mod:`.generate_data`);
    ``data_dir=...`` or ``$WEBSHOP_DATA``: a folder with upstream's files
    (``items_shuffle.json``/``items_shuffle_1000.json``,
    ``items_ins_v2.json``/``items_ins_v2_1000.json``, ``items_human_ins.json``).

Deviations from upstream, all deliberate:

* Search: ``bm25s`` set up as Anserini (k1 0.9, b 0.4, Lucene's stop words, Porter
  stemming, single-character tokens kept) instead of pyserini/Lucene BM25 (same
  documents; tokenisation differs at dots and possessives, see :mod:`.search`).
  Upstream's special queries ``<r>``/``<a>``/``<c>``/``<q>`` (random, by attribute,
  category or query) are not offered.
* Title score of ``r_type``: stop-word-filtered title words instead of spaCy
  NOUN/PROPN tokens unless ``spacy_model`` is given (see :mod:`.reward`).
* Synthetic goals keep their options as a list of values; upstream passes the
  ``dict.items()`` pairs to the option matcher.
* Prices of products with a price range and the instruction price ceilings are
  drawn from a seeded generator (upstream: the unseeded global ``random``).
* ``search[...]`` is valid only on the search page (the only page with a search
  bar; upstream's text env would also run it elsewhere). Actions are parsed as
  ``search[...]``/``click[...]`` with the argument between the first ``[`` and the
  last ``]``, lower-cased as upstream.
* Pages are rendered straight to their text pieces (no HTML/BeautifulSoup);
  the done page shows the thank-you line and the score, not upstream's hidden
  debugging fields and MTurk code. No reviews are shown and the rating is
  ``N.A.``, as upstream (its review loading is disabled).
* ``admissible_commands()`` lists, on the search page, two candidate searches
  built from the instruction (its text without the price clause, and its
  content words), so a policy that chooses among commands can act; any other
  non-empty ``search[...]`` is valid there too.
* Only the ``text`` and ``text_rich`` observation modes (no ``html``/``url``), and
  no ``num_prev_obs``/``num_prev_actions`` history in the observation: the
  policy builds its own history.
* ``state_key()`` is the page identity (kind | query | page number | asin |
  chosen options), not the page text.
"""

from milegpo.envs.webshop.catalog import Catalog, Goal, Product, load_catalog
from milegpo.envs.webshop.env import Page, WebShopEnv, parse_action
from milegpo.envs.webshop.reward import purchase_score
from milegpo.envs.webshop.search import ProductSearch

__all__ = ["Catalog", "Goal", "Page", "Product", "ProductSearch", "WebShopEnv", "load_catalog", "parse_action",
           "purchase_score"]
