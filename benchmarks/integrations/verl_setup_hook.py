"""What milegpo's Ray setup hook costs a worker that never computes advantages (an env worker).

verl-agent starts its Ray cluster with a runtime env (``get_ppo_ray_runtime_env()``: a few
env vars), and milegpo's entry point adds a ``worker_process_setup_hook`` to it, which Ray
runs in every worker process it starts. Four runtime envs are compared, each on a fresh
local Ray cluster, by starting ``--actors`` plain actors one after the other (worker
prestart off, so each actor starts its own process) and timing each from ``.remote()`` to
its first reply; the actor also reports its resident memory (``VmRSS``) and whether verl's
trainer or milegpo were imported:

- ``verl runtime env``: no hook (the baseline);
- ``eager hook (before)``: the hook as it was: import verl's trainer module and patch it;
- ``entry point hook (after)``: what ``python -m milegpo.integrations.verl.main_ppo`` now
  registers (stdlib-only, sent by value; patches the trainer only when it is imported);
- ``hook by import path``: the same hook registered as
  ``milegpo.integrations.verl.hook.setup_worker`` (its import brings milegpo's package in).

    python -m benchmarks.integrations.verl_setup_hook   # writes benchmarks/results/verl_setup_hook.{json,md}
"""

from __future__ import annotations

import copy
import os
import platform
import statistics
import sys
from typing import Any

import ray
from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

from benchmarks import harness
from milegpo.integrations.verl.hook import HOOK
from milegpo.integrations.verl.main_ppo import runtime_env_with_hook


def eager_hook() -> None:
    """The setup hook before the change: every worker imported verl's trainer stack and patched it."""
    import importlib

    from milegpo.integrations.verl.install import install

    install(importlib.import_module("verl.trainer.ppo.ray_trainer"))


@ray.remote(num_cpus=0)
class Probe:
    """A worker that does nothing but report on itself, as an env worker would look at start."""

    def report(self) -> dict[str, Any]:
        with open("/proc/self/status") as status:
            rss_kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
        return {"rss_mib": rss_kib / 1024, "verl_trainer": "verl.trainer.ppo.ray_trainer" in sys.modules,
                "milegpo": "milegpo" in sys.modules}


def measure(runtime_env: dict[str, Any], actors: int) -> dict[str, Any]:
    """Start ``actors`` probes one by one on a fresh cluster: start times (s), RSS (MiB), imports."""
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, runtime_env=runtime_env,
             _system_config={"enable_worker_prestart": False})
    times, reports = [], []
    try:
        for _ in range(actors):
            with harness.Stopwatch() as clock:
                probe = Probe.remote()  # type: ignore[attr-defined]
                reports.append(ray.get(probe.report.remote(), timeout=600))
            times.append(clock.wall_s)
            ray.kill(probe)
    finally:
        ray.shutdown()
    return {"start_s": times, "median_start_s": statistics.median(times),
            "median_rss_mib": statistics.median(r["rss_mib"] for r in reports),
            "imports_verl_trainer": any(r["verl_trainer"] for r in reports),
            "imports_milegpo": any(r["milegpo"] for r in reports), "load_1min": harness.load_1min()}


def markdown(results: dict[str, dict[str, Any]], actors: int) -> str:
    base = results["verl runtime env"]
    lines = [f"Median of {actors} plain Ray actors started one by one, each in a new worker process, "
             f"ray {ray.__version__}, {os.cpu_count()} cores, Python {platform.python_version()}.", "",
             "| runtime env | start, s | vs baseline | RSS, MiB | imports verl trainer | imports milegpo |",
             "|---|---:|---:|---:|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['median_start_s']:.2f} | {r['median_start_s'] / base['median_start_s']:.2f}x "
                     f"| {r['median_rss_mib']:.0f} | {r['imports_verl_trainer']} | {r['imports_milegpo']} |")
    lines += ["", "The trainer stack is plain verl 0.9.1 from PyPI on CPU torch (no verl-agent, no vLLM): verl-agent's "
              "trainer module imports more, so the eager hook cost it more per worker. The baseline already pays "
              "for verl's runtime env (a Ray worker under any non-empty runtime env starts slower than one under "
              "none); the entry point's hook adds its finder and nothing else until verl's trainer is imported."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = harness.parser(__doc__, harness.RESULTS / "verl_setup_hook",
                            "OUT: the results' path without its suffix (OUT.json, OUT.md)")
    parser.add_argument("--actors", type=int, default=5)
    args = parser.parse_args()
    verl_env = dict(get_ppo_ray_runtime_env())
    envs = {
        "verl runtime env": verl_env,
        "eager hook (before)": {**verl_env, "worker_process_setup_hook": eager_hook},
        "entry point hook (after)": runtime_env_with_hook(verl_env),
        "hook by import path": {**verl_env, "worker_process_setup_hook": HOOK},
    }
    # deep copies: ray.init writes a callable hook's key into the env_vars dict it is given
    results = {name: measure(copy.deepcopy(env), args.actors) for name, env in envs.items()}
    harness.write_results(args.out, results, markdown(results, args.actors))
    print(markdown(results, args.actors))


if __name__ == "__main__":
    main()
