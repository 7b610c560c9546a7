"""``python -m milegpo.integrations.verl.main_ppo [hydra overrides]``: verl-agent's
``main_ppo`` with milegpo's estimators installed in the driver and in every Ray worker.

It takes exactly the arguments of ``python -m verl.trainer.main_ppo`` and adds one
override, ``++ray_init.runtime_env.worker_process_setup_hook=<our hook>``, which verl-agent
merges into the runtime env of the Ray cluster it starts, so the ``TaskRunner`` actor that
builds the trainer (and every other worker) runs :func:`~milegpo.integrations.verl.install.setup_worker`
when it starts. (If Ray is already initialised in this process, verl-agent does not call
``ray.init`` and the override has no effect: start from a fresh process.)
"""

from __future__ import annotations

import runpy
import sys

from milegpo.integrations.verl.install import install, setup_worker

HOOK_OVERRIDE = f"++ray_init.runtime_env.worker_process_setup_hook={setup_worker.__module__}.{setup_worker.__name__}"


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    install()
    sys.argv = [sys.argv[0], *args, HOOK_OVERRIDE]
    # as `python -m verl.trainer.main_ppo` runs it: hydra finds the config folder beside the file
    runpy.run_module("verl.trainer.main_ppo", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
