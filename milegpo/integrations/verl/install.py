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
from collections.abc import Callable
from types import ModuleType
from typing import Any, Mapping

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


def _patch_trainer_init(trainer_cls: type) -> None:
    original = _original(trainer_cls.__init__)

    def __init__(self: Any, config: Any, *args: Any, **kwargs: Any) -> None:
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

    trainer_cls.__init__ = _mark(__init__, original)


def _patch_metrics(module: ModuleType) -> None:
    original = _original(module.compute_data_metrics)

    def compute_data_metrics(batch: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        metrics = original(batch, *args, **kwargs)
        metrics.update(batch.meta_info.get("milegpo_credit", {}))
        return metrics

    module.compute_data_metrics = _mark(compute_data_metrics, original)


def _patch_collector(collector_cls: type) -> None:
    original = _original(collector_cls.gather_rollout_data)

    def gather_rollout_data(self: Any, total_batch_list: Any, *args: Any, **kwargs: Any) -> Any:
        success = kwargs["success"] if "success" in kwargs else args[2]
        annotate_rollout(total_batch_list, success)
        return original(self, total_batch_list, *args, **kwargs)

    collector_cls.gather_rollout_data = _mark(gather_rollout_data, original)


def install(module: ModuleType | None = None, collector: type | None = None) -> None:
    """Install milegpo's estimators in this process's verl-agent trainer (idempotent).

    :param module: the trainer module (default: ``verl.trainer.ppo.ray_trainer``).
    :param collector: verl-agent's ``TrajectoryCollector`` (default: imported from
        ``agent_system.multi_turn_rollout``; skipped where that package is absent, and a
        batch then lacks the step column and is refused with a message saying so).
    """
    if module is None:
        module = importlib.import_module(TRAINER_MODULE)
    fallback = _original(module.compute_advantage)

    def routed(data: Any, adv_estimator: Any, *args: Any, **kwargs: Any) -> Any:
        return compute_advantage(data, adv_estimator, *args, fallback=fallback, **kwargs)

    module.compute_advantage = _mark(routed, fallback)
    _patch_trainer_init(module.RayPPOTrainer)
    if hasattr(module, "compute_data_metrics"):
        _patch_metrics(module)
    if collector is None:
        try:
            collector = importlib.import_module(COLLECTOR_MODULE).TrajectoryCollector
        except ImportError:
            collector = None
    if collector is not None:
        _patch_collector(collector)


def setup_worker() -> None:
    """Ray ``worker_process_setup_hook``: :func:`install` in a worker process that has verl."""
    try:
        importlib.import_module(TRAINER_MODULE)
    except ImportError:
        return
    install()
