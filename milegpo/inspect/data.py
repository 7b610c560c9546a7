"""Everything a report shows, as plain values: the run, its learning curve and, per kept iteration,
its groups' graphs, trajectories and step advantages under every credit method.

Advantages are :func:`milegpo.credit.compute_credit` of the kept batch: for the run's own method with
the config the run used (the numbers the update trained on), for every other method with that
method's defaults. The run's logged statistics of them (``credit_diagnostics.jsonl``) are compared
with the recomputed ones, and the report says whether they match.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from milegpo.credit import CREDIT_METHODS, CreditConfig, compute_credit, make_credit_config
from milegpo.inspect.graphview import batch_graph, evidence_config, group_views
from milegpo.inspect.runfiles import (
    KeptBatch,
    check_run_dir,
    credit_config_of,
    credit_diagnostics,
    kept_iterations,
    learning_curve,
    load_kept,
    run_config,
)
from milegpo.run_folder import KEPT_BATCHES_DIR, LAST_BATCH_FILE

#: the logged advantage statistics a report checks its recomputed advantages against
CHECKED_STATISTICS = ("num_steps", "adv_mean", "adv_std", "adv_abs_max")
#: two statistics agree when they differ by at most this times their scale (at least 1)
CHECK_TOLERANCE = 1e-9


def method_configs(method: str, config: CreditConfig) -> dict[str, CreditConfig]:
    """The config of every credit method in the report: the run's own for ``method``, the defaults
    for the others (a setting of one method means nothing for another: RLOO's normalisation is fixed,
    GAGPO's episode weight is 0 by default)."""
    return {m: config if m == method else make_credit_config(m) for m in CREDIT_METHODS}


def logged_check(advantages: np.ndarray, diagnostics: dict[str, Any] | None) -> dict[str, Any]:
    """Whether the recomputed advantages have the statistics the run logged for that iteration."""
    if diagnostics is None:
        return {"status": "not logged", "compared": {}}
    recomputed = {"num_steps": float(len(advantages)), "adv_mean": float(advantages.mean()),
                  "adv_std": float(advantages.std()), "adv_abs_max": float(np.abs(advantages).max())}
    compared, agree = {}, True
    for name in CHECKED_STATISTICS:
        logged = diagnostics.get(name)
        if not isinstance(logged, (int, float)):
            continue
        compared[name] = {"logged": float(logged), "recomputed": recomputed[name]}
        agree &= math.isclose(float(logged), recomputed[name], rel_tol=CHECK_TOLERANCE, abs_tol=CHECK_TOLERANCE)
    return {"status": "match" if agree and compared else "differ" if compared else "not logged",
            "compared": compared}


def iteration_view(kept: KeptBatch, config: dict[str, Any], diagnostics: dict[str, Any] | None,
                   run_dir: Path) -> dict[str, Any]:
    """What the report shows of one kept iteration (its groups: :func:`group_views`)."""
    batch = kept.batch
    method, credit_config, source = credit_config_of(kept, config)
    configs = method_configs(method, credit_config)
    advantages = {m: compute_credit(m, batch, configs[m]).advantages for m in CREDIT_METHODS}
    graph, evidence = batch_graph(batch, evidence_config(method, credit_config))
    observations = kept.meta.get("observations")
    if observations is not None and len(observations.get("state", ())) != batch.num_steps:
        observations = None  # not this batch's rows: never show texts against the wrong steps
    return {
        "iteration": kept.iteration, "num_timesteps": kept.meta.get("num_timesteps"), "method": method,
        "file": str(kept.path.relative_to(run_dir)), "config_source": source,
        "configs": {m: dataclasses.asdict(c) for m, c in configs.items()},
        "steps": batch.num_steps, "trajectories": batch.num_trajectories,
        "success_rate": float(graph.traj_success.mean()) if batch.num_trajectories else 0.0,
        "check": logged_check(advantages[method], (diagnostics or {}).get("diagnostics")),
        "texts": list(observations["texts"]) if observations else None,
        "groups": group_views(batch, graph, evidence, CREDIT_METHODS, advantages, observations),
    }


def report_data(run_dir: str | os.PathLike, iterations: Sequence[int] | None = None) -> dict[str, Any]:
    """The data of a run folder's report (what :func:`milegpo.inspect.write_report` writes into the HTML).

    :param iterations: the kept iterations to include (default: all of them).
    :raises FileNotFoundError: ``run_dir`` is no run folder, or it has no kept batch yet.
    :raises ValueError: an iteration that was not kept, or a damaged file (named).
    """
    run_dir = Path(run_dir)
    check_run_dir(run_dir)
    files = kept_iterations(run_dir)
    if not files:
        raise FileNotFoundError(f"{str(run_dir)!r} has no kept batch yet ({KEPT_BATCHES_DIR}/ or {LAST_BATCH_FILE}): "
                                "a run writes one after its first iteration")
    chosen = list(files) if iterations is None else list(dict.fromkeys(int(i) for i in iterations))
    missing = [i for i in chosen if i not in files]
    if missing:
        raise ValueError(f"iteration(s) {missing} of {run_dir} were not kept; kept: {list(files)} "
                         "(run.keep_batch_every sets which are)")
    config = run_config(run_dir)
    diagnostics = credit_diagnostics(run_dir)
    eval_splits = list(config.get("eval", {}).get("splits", []))
    views = {i: iteration_view(load_kept(i, files[i]), config, diagnostics.get(i), run_dir) for i in chosen}
    env = config.get("env", {})
    return {
        "run": {"name": run_dir.resolve().name, "env": env.get("id"), "n_tasks": env.get("n_tasks"),
                "group_size": env.get("group_size"), "method": config.get("algo", {}).get("method"),
                "total_timesteps": config.get("run", {}).get("total_timesteps"),
                "keep_batch_every": config.get("run", {}).get("keep_batch_every")},
        "methods": list(CREDIT_METHODS),
        "curve": learning_curve(run_dir, eval_splits),
        "kept": list(files),
        "included": chosen,
        "iterations": views,
    }
