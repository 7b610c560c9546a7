"""``python -m milegpo.integrations.verl.main_ppo [hydra arguments]``: verl-agent's
``main_ppo`` with milegpo's estimators installed in the driver and in every Ray worker.

It takes exactly the arguments of ``python -m verl.trainer.main_ppo``, passed on untouched
(overrides, and hydra's flags such as a trailing ``--cfg job``). Two things are added:

* in this process, verl's trainer module is patched when it is imported, and only
  milegpo's estimator names are accepted (an ``algorithm.adv_estimator`` given twice with
  different values is refused before anything starts: hydra would keep the last one);
* ``ray.init`` is wrapped so the runtime env of the Ray cluster verl-agent starts carries
  :func:`~milegpo.integrations.verl.hook.setup_worker` as its ``worker_process_setup_hook``
  (sent by value: a worker runs it without importing milegpo).
  A hook of the user's own (``ray_init.runtime_env.worker_process_setup_hook``, from the
  command line or a config file) is kept: it reaches the workers through an env var and
  runs after ours. (If Ray is already initialised in this process, verl-agent does not call
  ``ray.init`` and workers are not set up: start from a fresh process.)
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from milegpo.integrations.verl.hook import HOOK, USER_HOOK_ENV, hook_for_ray, setup_worker
from milegpo.integrations.verl.install import _swap, patch_when_imported

#: the hydra override key of the estimator
ESTIMATOR_KEY = "algorithm.adv_estimator"


def runtime_env_with_hook(runtime_env: Mapping[str, Any] | None) -> dict[str, Any]:
    """``runtime_env`` with milegpo's setup hook; the user's own hook, if any, handed on in
    :data:`~milegpo.integrations.verl.hook.USER_HOOK_ENV` for ours to run."""
    env = dict(runtime_env or {})
    theirs = env.get("worker_process_setup_hook")
    env["worker_process_setup_hook"] = hook_for_ray()
    env_vars = dict(env.get("env_vars") or {})  # a copy: ray.init writes the hook's key into it
    if theirs is not None and theirs not in (HOOK, setup_worker):
        if not isinstance(theirs, str):
            raise TypeError("milegpo's entry point chains a worker_process_setup_hook given as an import path "
                            f"('module.function'), got {theirs!r}")
        env_vars[USER_HOOK_ENV] = theirs
    if env_vars:
        env["env_vars"] = env_vars
    return env


def _ray_init_with_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    def init(*args: Any, runtime_env: Mapping[str, Any] | None = None, **kwargs: Any) -> Any:
        return original(*args, runtime_env=runtime_env_with_hook(runtime_env), **kwargs)

    return init


def refuse_estimator_given_twice(args: Sequence[str]) -> None:
    """Stop when the command line sets ``algorithm.adv_estimator`` to two different values
    (the docs' ``=milegpo`` and a ``run_*.sh`` script's own ``=gigpo``): hydra keeps the last."""
    values = [arg.partition("=")[2] for arg in args
              if not arg.startswith("-") and arg.partition("=")[0].lstrip("+~") == ESTIMATOR_KEY]
    if len(set(values)) > 1:
        raise SystemExit(f"{ESTIMATOR_KEY} is given {len(values)} times on the command line: "
                         f"{', '.join(repr(v) for v in values)}. Hydra keeps the last ({values[-1]!r}), which would "
                         "silently replace the others: give it once")


def main(argv: list[str] | None = None) -> None:
    """Run verl-agent's ``main_ppo`` with ``argv`` (default: this process's arguments)."""
    import ray

    args = list(sys.argv[1:] if argv is None else argv)
    refuse_estimator_given_twice(args)
    patch_when_imported(milegpo_only=True)
    _swap(ray, "init", _ray_init_with_hook)
    sys.argv = [sys.argv[0], *args]
    # as `python -m verl.trainer.main_ppo` runs it: hydra finds the config folder beside the file
    runpy.run_module("verl.trainer.main_ppo", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
