"""Put milegpo's estimators into verl-agent's trainer without editing its files.

:func:`install` patches, in the process it runs in:

1. ``ray_trainer.compute_advantage``: milegpo's names go to
   :func:`~milegpo.integrations.verl.estimator.compute_advantage`, every other name to
   verl-agent's own function, arguments unchanged;
2. ``RayPPOTrainer.__init__``: for a milegpo name, the credit settings are read from the
   trainer's config (refusing what cannot be honoured) and the constructor's estimator
   check, which accepts only a fixed list of names, is passed as for GRPO (critic-free);
3. ``ray_trainer.compute_data_metrics``: the credit diagnostics join the step's metrics
   (``credit/*``, so the trainer's loggers show them);
4. ``TrajectoryCollector.gather_rollout_data``: each row gets its step index and its
   trajectory's ``won`` while the rows are still in rollout order (see
   :mod:`~milegpo.integrations.verl.steps`).

verl-agent builds and runs the trainer inside a Ray actor (``TaskRunner``), a process a
driver-side patch never reaches. :func:`setup_worker` is the same install as a Ray
``worker_process_setup_hook``: ``python -m milegpo.integrations.verl.main_ppo`` registers
it in the runtime env so every Ray worker process installs the estimators at start.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from milegpo.integrations.verl.estimator import compute_advantage, configure
from milegpo.integrations.verl.settings import ESTIMATORS, settings_from_config
from milegpo.integrations.verl.steps import annotate_rollout

#: the attribute marking a patched function; it holds the original
_ORIGINAL = "__milegpo_original__"
#: where verl-agent's trainer and collector live
TRAINER_MODULE = "verl.trainer.ppo.ray_trainer"
COLLECTOR_MODULE = "agent_system.multi_turn_rollout.rollout_loop"


def _original(function: Callable[..., Any]) -> Callable[..., Any]:
    return getattr(function, _ORIGINAL, function)


def _mark(patched: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    functools.update_wrapper(patched, original)
    setattr(patched, _ORIGINAL, original)
    return patched


def _estimator_name(config: Mapping[str, Any]) -> str | None:
    try:
        value = config["algorithm"]["adv_estimator"]
    except (KeyError, TypeError):
        return None
    name = str(getattr(value, "value", value))
    return name if name in ESTIMATORS else None


def _swap(owner: object, name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace ``owner.name`` by ``wrap(original)``, where ``original`` is the unpatched function (so a
    second install wraps the original again, never a wrapper)."""
    original = _original(getattr(owner, name))
    setattr(owner, name, _mark(wrap(original), original))


def _patched_trainer_init(original: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self: object, config: Any, *args: Any, **kwargs: Any) -> None:
        name = _estimator_name(config)
        if name is None:
            original(self, config, *args, **kwargs)
            return
        configure(settings_from_config(config, name), name)
        from omegaconf import open_dict

        with open_dict(config.algorithm):
            config.algorithm.adv_estimator = "grpo"  # passes the fixed-list check as a critic-free estimator
        try:
            original(self, config, *args, **kwargs)
        finally:
            with open_dict(config.algorithm):
                config.algorithm.adv_estimator = name

    return __init__


def _patched_metrics(original: Callable[..., Any]) -> Callable[..., Any]:
    def compute_data_metrics(batch: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        metrics = original(batch, *args, **kwargs)
        metrics.update(batch.meta_info.get("milegpo_credit", {}))
        return metrics

    return compute_data_metrics


def _patched_collector(original: Callable[..., Any]) -> Callable[..., Any]:
    def gather_rollout_data(self: object, total_batch_list: Any, *args: Any, **kwargs: Any) -> Any:
        success = kwargs["success"] if "success" in kwargs else args[2]
        annotate_rollout(total_batch_list, success)
        return original(self, total_batch_list, *args, **kwargs)

    return gather_rollout_data


def install(module: ModuleType | None = None, collector: type | None = None) -> None:
    """Install milegpo's estimators in this process's verl-agent trainer (idempotent).

    :param module: the trainer module (default: ``verl.trainer.ppo.ray_trainer``).
    :param collector: verl-agent's ``TrajectoryCollector`` (default: imported from
        ``agent_system.multi_turn_rollout``; skipped where that package is absent, and a
        batch then lacks the step column and is refused with a message saying so).
    """
    if module is None:
        module = importlib.import_module(TRAINER_MODULE)

    def routed(fallback: Callable[..., Any]) -> Callable[..., Any]:
        def compute(data: Any, adv_estimator: Any, *args: Any, **kwargs: Any) -> Any:
            return compute_advantage(data, adv_estimator, *args, fallback=fallback, **kwargs)

        return compute

    _swap(module, "compute_advantage", routed)
    _swap(vars(module)["RayPPOTrainer"], "__init__", _patched_trainer_init)
    if hasattr(module, "compute_data_metrics"):
        _swap(module, "compute_data_metrics", _patched_metrics)
    if collector is None:
        try:
            collector = vars(importlib.import_module(COLLECTOR_MODULE))["TrajectoryCollector"]
        except ImportError:
            collector = None
    if collector is not None:
        _swap(collector, "gather_rollout_data", _patched_collector)


def setup_worker() -> None:
    """Ray ``worker_process_setup_hook``: :func:`install` in a worker process that has verl."""
    try:
        importlib.import_module(TRAINER_MODULE)
    except ImportError:
        return
    install()
