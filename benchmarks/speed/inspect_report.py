"""How large ``milegpo inspect``'s report of the 24,000-step demo run is, how fast it opens in
headless Chromium, how large a kept batch is per 1,000 steps, and how a group of 1,000+ states draws.

    python -m benchmarks.speed.inspect_report [--run-dir RUN] [--screenshot docs/training/inspect-report.png]

``RUN`` is a finished run of ``milegpo train`` with no arguments (the cpu-demo preset: 24,000 env
steps, batches kept every 10 iterations and the last); without it the demo is trained first into a
temporary folder (about 2 minutes on 2 cores). The browser is Debian's ``chromium`` driven by
Playwright with the flags of the browser test. Opening is timed from navigation start to the report
drawn (its last kept iteration's first group laid out), as the page itself measures it
(``performance.now()``), over fresh pages of one browser. Writes
``benchmarks/results/inspect_report.{json,md}``.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import harness
from milegpo.credit import StepBatch
from milegpo.credit.batch import save_step_batch
from milegpo.inspect import kept_iterations, load_kept, write_report

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
OPENS = 7


def train_demo(folder: Path) -> tuple[Path, float]:
    """``milegpo train`` with no arguments (its run folder under ``folder``) and its wall time."""
    with harness.Stopwatch() as clock:
        subprocess.run([sys.executable, "-m", "milegpo", "train", "--no-progress-bar"], cwd=folder, check=True,
                       stdout=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
    [run] = list((folder / "runs").iterdir())
    return run, clock.wall_s


def kept_sizes(run: Path, scratch: Path) -> list[dict[str, Any]]:
    """Per kept batch: steps, bytes on disk, bytes per 1,000 steps, and the bytes of the same batch
    saved without the observations (what keeping the texts costs)."""
    rows = []
    for iteration, path in kept_iterations(run).items():
        kept = load_kept(iteration, path)
        bare = scratch / f"bare_{iteration}.npz"
        save_step_batch(kept.batch, bare, {k: v for k, v in kept.meta.items() if k != "observations"})
        size = path.stat().st_size
        rows.append({"iteration": iteration, "file": str(path.relative_to(run)), "steps": kept.batch.num_steps,
                     "bytes": size, "bytes_per_1000_steps": 1000 * size / kept.batch.num_steps,
                     "bytes_without_observations": bare.stat().st_size,
                     "distinct_observations": len(kept.meta.get("observations", {}).get("texts", []))})
    return rows


def big_run(folder: Path, states: int) -> Path:
    """A run folder whose one group visits ``states`` distinct states (40 trajectories, one success)."""
    per = states // 40
    paths = [[f"s{k}-{t}" if t else "start" for t in range(per + 1)] for k in range(40)]
    paths[0].append("won")
    batch = StepBatch.from_trajectories(paths, success=[k == 0 for k in range(40)])
    folder.mkdir()
    save_step_batch(batch, folder / "last_batch.npz", {"iteration": 1, "method": "milegpo"})
    return folder


def open_times(browser: Any, report: Path, opens: int) -> list[float]:
    """Seconds from navigation start to the report drawn, one fresh page each."""
    seconds = []
    for _ in range(opens):
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("console", lambda m, errors=errors: errors.append(m.text) if m.type == "error" else None)
        page.goto(report.resolve().as_uri())
        page.wait_for_selector("body[data-ready=true]", timeout=60_000)
        seconds.append(float(page.evaluate("() => Number(document.body.dataset.readyMs)")) / 1000)
        page.close()
        if errors:
            raise RuntimeError(f"the report logged console errors: {errors}")
    return seconds


def timed_js(page: Any, action: str) -> float:
    """Seconds the page takes to run ``action`` (a JavaScript statement), measured in the page."""
    script = f"() => {{ const t = performance.now(); {action}; return performance.now() - t; }}"
    return float(page.evaluate(script)) / 1000


def interactions(browser: Any, report: Path, kept: list[int]) -> dict[str, float]:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(report.resolve().as_uri())
    page.wait_for_selector("body[data-ready=true]")
    found = {f"open iteration {i}": timed_js(page, f"milegpoReport.openIteration({i})") for i in kept}
    first = "milegpoReport.group.trajectories[0].id"
    found["select a trajectory"] = timed_js(page, f"milegpoReport.selectTrajectory({first})")
    page.close()
    return found


def big_graph(browser: Any, folder: Path, states: int) -> dict[str, Any]:
    report = write_report(big_run(folder / f"big{states}", states))
    opened = open_times(browser, report, 3)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(report.resolve().as_uri())
    page.wait_for_selector("body[data-ready=true]")
    drawn = [page.evaluate("() => milegpoReport.cy.nodes().length")]
    more = []
    while drawn[-1] < states + 2:
        more.append(timed_js(page, "document.getElementById('show-more').click()"))
        drawn.append(page.evaluate("() => milegpoReport.cy.nodes().length"))
    page.close()
    return {"states": states + 2, "report_bytes": report.stat().st_size, "open_s": statistics.median(opened),
            "drawn_after_each_show_more": drawn, "show_more_s": more}


def screenshot(browser: Any, report: Path, out: Path) -> None:
    """The docs' picture: the last kept iteration's group with the most successes, its first successful
    trajectory selected and its most reliable milestone's panel open."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000}, device_scale_factor=1)
    page.goto(report.resolve().as_uri())
    page.wait_for_selector("body[data-ready=true]")
    groups = page.evaluate("() => [...document.querySelectorAll('#group-select option')].length")
    best = max(range(groups), key=lambda g: page.evaluate(
        "(g) => { milegpoReport.selectGroup(g); return milegpoReport.group.successes_total; }", g))
    page.select_option("#group-select", str(best))
    page.click("#trajectories .traj.success >> nth=0")
    milestone = page.evaluate("() => milegpoReport.group.nodes.filter((n) => n.milestone && "
                              "milegpoReport.cy.$('.hl').some((e) => e.id() === n.id))"
                              ".sort((a, b) => b.milestone.reliability - a.milestone.reliability)[0]?.id")
    if milestone:
        box = page.locator("#graph").bounding_box()
        position = page.evaluate("(id) => milegpoReport.cy.getElementById(id).renderedPosition()", milestone)
        page.mouse.click(box["x"] + position["x"], box["y"] + position["y"])
    page.screenshot(path=str(out), full_page=True)
    page.close()
    from PIL import Image

    with Image.open(out) as shot:  # 256 colours: a third of the size, the same to the eye
        shot.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)


def main() -> None:
    parser = harness.parser(__doc__, harness.RESULTS / "inspect_report",
                            "OUT: the results' path without its suffix (OUT.json, OUT.md)")
    parser.add_argument("--run-dir", type=Path, default=None, help="a finished demo run (default: train one)")
    parser.add_argument("--screenshot", type=Path, default=None, help="also write the docs' screenshot (PNG) here")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        run, train_s = (args.run_dir, None) if args.run_dir else train_demo(scratch)
        config = json.loads((run / "config.json").read_text())
        with harness.Stopwatch() as writing:
            report = write_report(run, scratch / "report.html")
        write_s = writing.wall_s
        report_bytes = report.stat().st_size
        kept = kept_sizes(run, scratch)
        with sync_playwright() as playwright:
            with harness.Stopwatch() as launching:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            launch_s = launching.wall_s
            opens = open_times(browser, report, OPENS)
            clicks = interactions(browser, report, [k["iteration"] for k in kept])
            big = [big_graph(browser, scratch, states) for states in (1_000, 5_000)]
            if args.screenshot is not None:
                screenshot(browser, report, args.screenshot)
            version = browser.version
            browser.close()
    steps = [k["steps"] for k in kept]
    result = {
        "meta": {"cpu": platform.machine(), "cores": os.cpu_count(), "load": list(os.getloadavg()),
                 "chromium": version, "run": run.name, "trained_here_s": train_s,
                 "total_timesteps": config["run"]["total_timesteps"],
                 "keep_batch_every": config["run"].get("keep_batch_every")},
        "report": {"bytes": report_bytes, "write_s": write_s, "browser_launch_s": launch_s,
                   "open_s": opens, "open_s_median": statistics.median(opens), "open_s_max": max(opens),
                   "interactions_s": clicks},
        "kept_batches": kept,
        "kept_bytes_per_1000_steps": 1000 * sum(k["bytes"] for k in kept) / sum(steps),
        "large_groups": big,
    }
    harness.write_results(args.out, result, markdown(result), indent=1)
    print(markdown(result))


def markdown(result: dict[str, Any]) -> str:
    meta, report = result["meta"], result["report"]
    lines = [
        f"Report of the demo run `{meta['run']}` ({meta['total_timesteps']:,} env steps, batches kept every "
        f"{meta['keep_batch_every']} iterations and the last), {meta['cores']} cores (load "
        f"{meta['load'][0]:.1f}), Chromium {meta['chromium']} headless.",
        "",
        f"| report | size | written in | opens in (median of {len(report['open_s'])}) | slowest open |",
        "|---|---|---|---|---|",
        f"| `milegpo inspect` | {report['bytes'] / 1e6:.2f} MB | {report['write_s']:.2f} s | "
        f"{report['open_s_median']:.2f} s | {report['open_s_max']:.2f} s |",
        "",
        "| kept batch | steps | size | per 1,000 steps | without the observations |",
        "|---|---|---|---|---|",
    ]
    for k in result["kept_batches"]:
        lines.append(f"| {k['file']} | {k['steps']} | {k['bytes'] / 1e3:.1f} kB | "
                     f"{k['bytes_per_1000_steps'] / 1e3:.1f} kB | {k['bytes_without_observations'] / 1e3:.1f} kB |")
    lines += ["", f"All kept batches: {result['kept_bytes_per_1000_steps'] / 1e3:.1f} kB per 1,000 steps.", "",
              "| one group of | report size | opens in | states drawn, then after each Show more | each Show more |",
              "|---|---|---|---|---|"]
    for big in result["large_groups"]:
        shown = ", ".join(str(n) for n in big["drawn_after_each_show_more"])
        lines.append(f"| {big['states']:,} states | {big['report_bytes'] / 1e6:.2f} MB | {big['open_s']:.2f} s | "
                     f"{shown} | {statistics.median(big['show_more_s']):.2f} s median, "
                     f"{max(big['show_more_s']):.2f} s max |")
    clicks = ", ".join(f"{name} {seconds * 1000:.0f} ms" for name, seconds in report["interactions_s"].items())
    lines += ["", f"In the demo report: {clicks}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
