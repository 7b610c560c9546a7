"""The report of a real short run, opened in headless Chromium (Debian's ``chromium``, driven by
Playwright with the system browser; CI installs both: .ci/run).

Checked in the browser, against the credit functions run here on the same kept batches: no console
error; for every kept iteration and task group, the states and transitions drawn are the group's
graph (``build_task_graph``); clicking a trajectory highlights exactly its path; the advantages the
table shows are ``compute_credit``'s, bit for bit; a kept point of the learning curve opens its
iteration; a state's panel shows its key and observations; a 1,500-state group is drawn 300 states at
a time; the screenshot is not blank.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from milegpo.credit import CREDIT_METHODS, build_task_graph, compute_credit, make_credit_config
from milegpo.inspect import kept_iterations, load_kept, write_report
from milegpo.inspect.graphview import trajectory_rows

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's root: the benchmarks package
from benchmarks.speed.inspect_report import big_run  # noqa: E402  the benchmark's large run: N distinct states

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[dev]')"
    if not shutil.which(CHROMIUM):
        return f"{CHROMIUM} is not installed (apt-get install chromium)"
    return None


if _missing() is not None:
    if os.environ.get("MILEGPO_CI"):
        raise RuntimeError(f"the browser tests cannot run in CI: {_missing()}")
    pytestmark = pytest.mark.skip(reason=str(_missing()))

#: a short run that succeeds sometimes: a warm start from House's scripted expert, then two iterations
RUN_CONFIG = {
    "env": {"n_tasks": 2, "group_size": 6, "kwargs": {"max_episode_steps": 15}},
    "eval": {"splits": ["eval_id"], "n_tasks": 2, "copies": 1, "freq": 1},
    "run": {"total_timesteps": 300, "checkpoint_freq": 100, "keep_batch_every": 1,
            "warm_start": {"episodes": 64, "epochs": 6, "epsilon": 0.1}},
}


@pytest.fixture(scope="module")
def short_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("inspect")
    (folder / "config.json").write_text(json.dumps(RUN_CONFIG))
    subprocess.run([sys.executable, "-m", "milegpo", "train", "--preset", "cpu-demo", "--config",
                    str(folder / "config.json"), "--run-dir", str(folder / "run"), "--no-progress-bar"],
                   check=True, stdout=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    return folder / "run"


@pytest.fixture(scope="module")
def report(short_run: Path) -> Path:
    return write_report(short_run)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class Page:
    """A browser page on a report, with every console error and page error it raised."""

    def __init__(self, browser: Any, path: Path):
        self.page = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.errors: list[str] = []
        self.page.on("console", lambda message: self.errors.append(message.text) if message.type == "error" else None)
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        started = time.perf_counter()
        self.page.goto(path.resolve().as_uri())
        self.page.wait_for_selector("body[data-ready=true]", timeout=30_000)
        self.seconds = time.perf_counter() - started

    def js(self, expression: str, argument: Any = None) -> Any:
        return self.page.evaluate(expression, argument)

    def drawn(self) -> tuple[list[str], list[str]]:
        return (self.js("() => milegpoReport.cy.nodes().map((n) => n.id())"),
                self.js("() => milegpoReport.cy.edges().map((e) => e.id())"))

    def highlighted(self) -> list[str]:
        return self.js("() => milegpoReport.cy.$('.hl').map((e) => e.id())")


@pytest.fixture
def page(browser: Any, report: Path) -> Iterator[Page]:
    opened = Page(browser, report)
    yield opened
    opened.page.close()
    assert opened.errors == [], opened.errors


def run_configs(kept: Any) -> dict[str, Any]:
    """Each method's config as the report must use it: the run's own (from the batch) for its method."""
    method = kept.meta["method"]
    return {m: make_credit_config(m, **kept.meta["credit_config"]) if m == method else None for m in CREDIT_METHODS}


def test_every_group_is_its_graph_and_every_trajectory_its_path_and_credit(short_run: Path, page: Page):
    kept = {i: load_kept(i, path) for i, path in kept_iterations(short_run).items()}
    assert list(kept) == [1, 2] and any(k.batch.success.any() for k in kept.values())
    for iteration, batch_file in kept.items():
        page.page.click(f"#kept-list button[data-iteration='{iteration}']")
        assert page.js("() => milegpoReport.iteration") == iteration
        batch = batch_file.batch
        graph = build_task_graph(batch)
        configs = run_configs(batch_file)
        advantages = {m: compute_credit(m, batch, configs[m]).advantages for m in CREDIT_METHODS}
        rows_of = {int(batch.traj_ids[rows[0]]): rows for rows in trajectory_rows(batch)}
        for q, task in enumerate(graph.task_values.tolist()):
            page.page.select_option("#group-select", str(q))
            nodes, edges = page.drawn()
            assert sorted(nodes) == sorted(f"n{v}" for v in np.flatnonzero(graph.node_task == q))
            assert sorted(edges) == sorted(f"e{e}" for e in np.flatnonzero(graph.edge_task == q))
            trajectories = np.flatnonzero(graph.traj_task == q).tolist()
            assert page.js("() => [...document.querySelectorAll('#trajectories .traj')].map((t) => "
                           "Number(t.dataset.trajectory))") == trajectories
            for traj in trajectories:
                rows = rows_of[traj]
                page.page.click(f"#trajectories .traj[data-trajectory='{traj}']")
                path = {f"n{v}" for v in graph.row_src[rows]} | {f"n{graph.row_dst[rows[-1]]}"} \
                    | {f"e{e}" for e in graph.row_edge[rows]}
                assert sorted(page.highlighted()) == sorted(path), (iteration, task, traj)
                shown = page.js("() => [...document.querySelectorAll('#advantage-table td[data-method]')].map("
                                "(td) => [td.dataset.method, Number(td.closest('tr').dataset.step), td.dataset.value])")
                assert len(shown) == len(rows) * len(CREDIT_METHODS)
                for method, step, value in shown:  # the cell holds the number as JavaScript prints it
                    assert float(value) == advantages[method][rows[step]], (method, step)
    page.page.click("#clear")
    assert page.highlighted() == []


def test_clicking_a_kept_point_of_the_curve_opens_its_iteration(page: Page):
    assert page.js("() => milegpoReport.iteration") == 2  # the last kept iteration opens first
    box = page.page.locator("#curve .u-over").bounding_box()
    x = page.js("() => milegpoReport.curve.valToPos(1, 'x')")
    y = page.js("() => milegpoReport.curve.valToPos(milegpoReport.curve.data[1][1] ?? 0, 'y')")
    page.page.mouse.click(box["x"] + x, box["y"] + y)
    assert page.js("() => milegpoReport.iteration") == 1
    assert page.page.inner_text("#iteration-title") == "Iteration 1"
    # and the curve has the run's splits: training and eval_id
    assert page.js("() => milegpoReport.curve.series.map((s) => s.label)")[1:3] == ["train success", "held-out eval_id"]


def test_a_state_click_shows_its_key_and_the_observations_behind_it(short_run: Path, page: Page):
    kept = load_kept(2, kept_iterations(short_run)[2])
    graph = build_task_graph(kept.batch)
    task_index = int(page.js("() => document.querySelector('#group-select').value"))
    start = int(np.flatnonzero((graph.node_task == task_index) & graph.is_start)[0])
    box = page.page.locator("#graph").bounding_box()
    position = page.js("(id) => milegpoReport.cy.getElementById(id).renderedPosition()", f"n{start}")
    page.page.mouse.click(box["x"] + position["x"], box["y"] + position["y"])
    panel = page.page.inner_text("#panel")
    assert str(graph.node_key[start]) in panel
    texts = kept.meta["observations"]["texts"]
    rows = np.flatnonzero(graph.row_src == start)
    seen = {texts[i] for i in np.asarray(kept.meta["observations"]["state"])[rows]}
    assert all(text in panel for text in seen)
    # House prints the task only at reset: a start state visited again shows a second text
    assert ("different observations share this key" in panel) == (len(seen) > 1)


def test_the_screenshot_is_written_and_not_blank(page: Page, tmp_path: Path):
    from PIL import Image

    page.page.click("#trajectories .traj.success >> nth=0")
    shot = tmp_path / "report.png"
    page.page.screenshot(path=str(shot), full_page=True)
    box = page.page.locator("#graph").bounding_box()
    with Image.open(shot) as image:
        graph = image.convert("RGB").crop((int(box["x"]), int(box["y"]), int(box["x"] + box["width"]),
                                           int(box["y"] + box["height"])))
        pixels = np.asarray(graph).reshape(-1, 3)
    assert (pixels < 240).any(axis=1).mean() > 0.01  # more than the white background
    assert len(np.unique(pixels, axis=0)) > 50  # states, transitions, labels in several colours


def test_a_group_of_1500_states_is_drawn_300_at_a_time(browser: Any, tmp_path: Path):
    run = big_run(tmp_path / "big", 1560)
    opened = Page(browser, write_report(run))
    try:
        total = opened.js("() => milegpoReport.group.nodes.length")
        assert total == 1562  # 1,560 visited states, the start and the goal
        assert len(opened.drawn()[0]) == 300
        assert opened.page.inner_text("#graph-count").startswith("300 of 1562 states")
        opened.page.click("#show-more")
        assert len(opened.drawn()[0]) == 600
        last = opened.js("() => milegpoReport.group.trajectories.at(-1).nodes")
        opened.page.click("#trajectories .traj >> nth=-1")  # its path is drawn whole, beyond the cap
        assert set(last) <= set(opened.drawn()[0]) and set(last) <= set(opened.highlighted())
        assert opened.errors == []
    finally:
        opened.page.close()
