"""Where MileGPO stands against GraphGPO, per env, state-key regime and metric: the "Why MileGPO" summary.

MileGPO is GraphGPO plus a shaping term (milestones and traps); the question a user asks is
where that term pays. This script reads the committed results and writes the answer, so no
number in the summary is typed by hand:

* learning (``learning_efficiency*.json``): MileGPO minus GraphGPO per seed (paired, same
  initial weights and task draws), mean and 95 % t interval, for each env's area under the
  held-out success curve and final held-out success (and WebShop's score);
* credit quality (``credit_quality_regimes.json``): MileGPO minus GraphGPO pairwise accuracy
  and weighted agreement against the ground truth, both regimes; and the same over a learning
  policy's own groups (``memory_quality.json``'s learning stages: every iteration of the learning
  benchmark's memory runs, replayed with the ground truth).

The same comparison against G2PO (the newest graph method with public code) follows in its own
table, where its runs exist (learning: House and TWX coin; credit quality: every env scored with it).
Then MileGPO's opt-in milestone memory against MileGPO and against GraphGPO: learning from the
learning results' ``milegpo_memory`` runs (paired by seed with MileGPO's and GraphGPO's), credit quality
from ``memory_quality.json`` (``benchmarks/credit/memory_quality.py``; its tuning and held-out stages,
random-policy sequences and a learning policy's own groups).

A difference is **ahead** when its 95 % interval lies above zero, **behind** when below, and
**level** otherwise; with fewer than 3 seeds (e.g. WebShop's random groups, where few seeds
have a success) it is not judged. The two regimes are the envs'
own state keys (this library's default: the true state, collision-free) and the paper's
(``state_key="observation"``: the observation text, as the paper's and verl-agent's code).

Outputs: ``benchmarks/results/why_milegpo.md`` (the table; the docs' home page includes it) and
the block of README.md between the ``why-milegpo`` markers (a two-line summary).

    python -m benchmarks.credit.why_milegpo
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks import harness

RESULTS = harness.RESULTS
README = harness.REPO / "README.md"
MARK_START, MARK_END = "<!-- why-milegpo:start -->", "<!-- why-milegpo:end -->"

#: learning results: (file stem, regime, how every run starts)
LEARNING_SOURCES = [
    ("learning_efficiency", "env keys", "random init"),
    ("learning_efficiency_paper_envs", "env keys", "random init"),
    ("learning_efficiency_warm_start", "env keys", "warm start"),
    ("learning_efficiency_paper_keys", "paper keys", "random init"),
    ("learning_efficiency_paper_keys_warm_start", "paper keys", "warm start"),
    ("learning_efficiency_paper_envs_paper_keys", "paper keys", "random init"),
]
#: the milestone memory's learning results: its variant's runs are in these (the warm start's beside MileGPO
#: and GraphGPO trained again by the same code: the warm-start policy changes with the code)
MEMORY_LEARNING_SOURCES = [*LEARNING_SOURCES, ("learning_efficiency_warm_start_memory", "env keys", "warm start")]
#: the learning metrics shown (the first a table has of each family), with their label
LEARNING_METRICS = {"auc": "success AUC", "final eval_id": "final success", "final eval": "final success",
                    "auc score": "score AUC"}
CREDIT_SOURCE = "credit_quality_regimes"
#: the learning benchmark's name of the milestone memory variant (at the protocol's chosen half-life)
MEMORY_VARIANT = "milegpo_memory"
#: the credit benchmark's regime names, as this table says them
REGIME_NAMES = {"env": "env keys", "observation": "paper keys"}


@dataclass(frozen=True)
class Comparison:
    """One MileGPO − GraphGPO difference."""

    env: str
    regime: str
    start: str
    kind: str  # "learning" or "credit"
    metric: str
    mean: float
    low: float
    high: float
    n: int

    @property
    def verdict(self) -> str:
        if self.n < 3 or not (math.isfinite(self.low) and math.isfinite(self.high)):
            return "too few seeds"
        return "ahead" if self.low > 0 else "behind" if self.high < 0 else "level"


def learning_rows(sources: list[tuple[str, str, str]], differences: Callable[[dict], dict | None],
                  missing_ok: bool = False) -> list[Comparison]:
    """One row per results file of ``sources``, env and metric of :data:`LEARNING_METRICS`: the paired
    differences ``differences`` picks from an env's entry of the file's table (None: that env has none). A
    missing file stops the script, naming it, unless ``missing_ok``."""
    rows = []
    for stem, regime, start in sources:
        path = RESULTS / f"{stem}.json"
        if not path.exists():
            if missing_ok:
                continue
            raise SystemExit(f"{path} is missing: run benchmarks/learning/learning_efficiency.py with --out "
                             f"benchmarks/results/{stem} first (its docstring has the command)")
        for env, entry in json.loads(path.read_text())["table"].items():
            diffs = differences(entry) or {}
            for metric, label in LEARNING_METRICS.items():
                if metric in diffs:
                    d = diffs[metric]
                    rows.append(Comparison(env, regime, start, "learning", label, d["mean"], d["ci95"][0],
                                           d["ci95"][1], d["n"]))
    return rows


def learning_comparisons(baseline: str = "graphgpo") -> list[Comparison]:
    """MileGPO − ``baseline`` (a method name) per learning results file, env and metric."""
    return learning_rows(LEARNING_SOURCES, lambda entry: entry["milegpo_minus"].get(baseline))


def credit_comparisons_against(baseline: str) -> list[Comparison]:
    """MileGPO − ``baseline`` (a credit_quality variant label, e.g. ``G2PO``): paired over the seeds scored for
    both, from the per-seed rows of ``credit_quality_regimes.json``."""
    from benchmarks.learning.learning_efficiency import paired_difference

    rows = []
    for run in json.loads((RESULTS / f"{CREDIT_SOURCE}.json").read_text())["runs"].values():
        start = "warm start" if run["warm_start"] else "random policy"
        for env, entry in run["envs"].items():
            for regime in run["state_keys"]:
                methods = [r["regimes"][regime]["methods"] for r in entry["per_seed"]]
                paired = [m for m in methods if baseline in m and "MileGPO" in m]
                for metric in ("pairwise_accuracy", "weighted_agreement"):
                    pairs = [(m["MileGPO"][metric], m[baseline][metric]) for m in paired]
                    pairs = [p for p in pairs if math.isfinite(p[0] - p[1])]
                    if len(pairs) < 2:
                        continue
                    d = paired_difference([p[0] for p in pairs], [p[1] for p in pairs])
                    rows.append(Comparison(env, REGIME_NAMES[regime], start, "credit", metric.replace("_", " "),
                                           d["mean"], d["ci95"][0], d["ci95"][1], len(pairs)))
    return rows


def credit_comparisons() -> list[Comparison]:
    """MileGPO − GraphGPO pairwise accuracy and weighted agreement from ``credit_quality_regimes.json``
    (``benchmarks/credit/credit_quality.py --state-key env observation``), per group kind, env and regime."""
    path = RESULTS / f"{CREDIT_SOURCE}.json"
    if not path.exists():
        raise SystemExit(f"{path} is missing: run python -m benchmarks.credit.credit_quality "
                         "--state-key env observation first")
    rows = []
    for run in json.loads(path.read_text())["runs"].values():
        start = "warm start" if run["warm_start"] else "random policy"
        for env, entry in run["envs"].items():
            for regime, result in entry["regimes"].items():
                milegpo = result["methods"]["MileGPO"]
                for metric in ("pairwise_accuracy", "weighted_agreement"):
                    low, high = milegpo[metric]["vs_graphgpo_ci95"]
                    rows.append(Comparison(env, REGIME_NAMES[regime], start, "credit", metric.replace("_", " "),
                                           milegpo[metric]["vs_graphgpo_mean"], low, high, len(entry["seeds"])))
    return rows


def stage_start(stage_name: str) -> str:
    """How the groups of a ``memory_quality.json`` stage were played, as the tables say it."""
    from benchmarks.credit import memory_quality

    if stage_name in memory_quality.LEARNING_STAGES:
        return f"learning policy's groups, {memory_quality.LEARNING_STAGES[stage_name]}"
    return f"random policy, sequence ({stage_name})"


def learning_group_comparisons() -> list[Comparison]:
    """MileGPO − GraphGPO pairwise accuracy and weighted agreement over a learning policy's own groups: the
    learning stages of ``memory_quality.json`` (every iteration's groups of the memory's learning runs,
    replayed with the ground truth; MileGPO and GraphGPO credit them without memory)."""
    from benchmarks.credit import memory_quality

    path = RESULTS / "memory_quality.json"
    stages = json.loads(path.read_text())["stages"] if path.exists() else {}
    rows = {}
    for stage_name in memory_quality.LEARNING_STAGES:
        for c in memory_quality.comparisons(stages.get(stage_name, {"envs": {}})):
            if c["metric"] in memory_quality.METRICS:
                d = c["milegpo_vs_graphgpo"]
                rows[(c["env"], c["regime"], stage_name, c["metric"])] = Comparison(
                    c["env"], REGIME_NAMES[c["regime"]], stage_start(stage_name), "credit",
                    c["metric"].replace("_", " "), d["mean"], d["low"], d["high"], d["n"])
    return list(rows.values())


def memory_comparisons(baseline: str) -> list[Comparison]:
    """MileGPO with its milestone memory (the protocol's chosen half-life) − ``baseline`` (``"milegpo"`` or
    ``"graphgpo"``) from ``memory_quality.json`` (``benchmarks/credit/memory_quality.py``: random-policy groups drawn
    in a training sequence), per stage (tuning: House, TWX coin; held-out: ALFWorld, WebShop), env and regime."""
    from benchmarks.credit import memory_quality

    path = RESULTS / "memory_quality.json"
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    if "tuning" not in data["stages"]:
        return []
    chosen = memory_quality.chosen_half_life(data["stages"]["tuning"])[0]
    rows = []
    for stage_name, stage in data["stages"].items():
        start = stage_start(stage_name)
        for c in memory_quality.comparisons(stage):
            if c["variant"] != chosen or c["metric"] not in memory_quality.METRICS:
                continue
            d = c[f"vs_{baseline}"]
            rows.append(Comparison(c["env"], REGIME_NAMES[c["regime"]], start, "credit", c["metric"].replace("_", " "),
                                   d["mean"], d["low"], d["high"], d["n"]))
    return rows


def memory_learning_comparisons(baseline: str) -> list[Comparison]:
    """The memory's learning runs (the learning benchmark's ``milegpo_memory`` variant) − ``baseline``
    (``"milegpo"`` or ``"graphgpo"``), paired by seed, per learning results file that has them."""
    return learning_rows(MEMORY_LEARNING_SOURCES,
                         lambda entry: entry.get("variant_minus", {}).get(MEMORY_VARIANT, {}).get(baseline),
                         missing_ok=True)


def table(rows: list[Comparison], baseline: str = "GraphGPO", method: str = "MileGPO") -> str:
    lines = [f"| env | state keys | start | measure | {method} − {baseline} [95% CI] | seeds | verdict |",
             "|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r.env, r.regime, r.start, r.kind, r.metric)):
        verdict = {"ahead": "**ahead**", "behind": "*behind*"}.get(r.verdict, r.verdict)
        interval = f"[{r.low:+.3f}, {r.high:+.3f}]" if math.isfinite(r.low) else "(one seed)"
        lines.append(f"| {r.env} | {r.regime} | {r.start} | {r.kind}: {r.metric} | {r.mean:+.3f} {interval} "
                     f"| {r.n} | {verdict} |")
    return "\n".join(lines)


def summary(rows: list[Comparison], baseline: str = "GraphGPO") -> str:
    """Two lines for the README: the counts, and where MileGPO is ahead or behind."""
    counts = {v: sum(r.verdict == v for r in rows) for v in ("ahead", "level", "behind")}
    judged = sum(counts.values())

    def where(verdict: str) -> str:
        cases = sorted(f"{r.env} ({r.regime}, {r.start}, {r.kind}: {r.metric})" for r in rows if r.verdict == verdict)
        return "; ".join(cases) if cases else "nowhere"

    return (f"Against {baseline} on this project's CPU benchmarks (95 % intervals over seeds), MileGPO is ahead "
            f"in {counts['ahead']}, level in {counts['level']} and behind in {counts['behind']} of {judged} "
            f"comparisons with 3 or more seeds. Ahead: {where('ahead')}. Behind: {where('behind')}.")


def write_readme_block(text: str) -> None:
    readme = README.read_text()
    start, end = readme.find(MARK_START), readme.find(MARK_END)
    if start < 0 or end < start:
        raise SystemExit(f"README.md has no {MARK_START} ... {MARK_END} block to fill")
    harness.write_text(README, readme[:start + len(MARK_START)] + "\n" + text + "\n" + readme[end:])


def main() -> None:
    args = harness.parser(__doc__, RESULTS / "why_milegpo.md").parse_args()
    rows = learning_comparisons() + credit_comparisons() + learning_group_comparisons()
    text = summary(rows)
    g2po = learning_comparisons("g2po") + credit_comparisons_against("G2PO")
    out = args.out
    memory = "MileGPO + memory"
    memory_part = "".join(
        f"\n### {memory} (ours, opt-in) against {label}\n\n"
        f"{summary(rows_of, label).replace('MileGPO is', f'{memory} is')}\n\n{table(rows_of, label, memory)}\n"
        for label, rows_of in (("MileGPO", memory_learning_comparisons("milegpo") + memory_comparisons("milegpo")),
                               ("GraphGPO", memory_learning_comparisons("graphgpo") + memory_comparisons("graphgpo")))
        if rows_of)
    harness.write_text(out, f"{text}\n\n{table(rows)}\n\n### MileGPO against G2PO\n\n{summary(g2po, 'G2PO')}\n\n"
                   f"{table(g2po, 'G2PO')}\n{memory_part}")
    write_readme_block(text)
    print(out.read_text())


if __name__ == "__main__":
    main()
