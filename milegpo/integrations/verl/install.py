"""Put milegpo's estimators into verl-agent's trainer without editing its files.

:func:`install` patches, in the process it runs in:

1. ``ray_trainer.compute_advantage``: milegpo's names go to
   :func:`~milegpo.integrations.verl.estimator.compute_advantage`, every other name to
   verl-agent's own function, arguments unchanged;
2. ``RayPPOTrainer.__init__``: for a milegpo name, the credit settings are read from the
   trainer's config (refusing what cannot be honoured) and the constructor's estimator
   check, which accepts only a fixed list of names, is passed as for GRPO (critic-free).
   Any other name with ``algorithm.milegpo`` keys set (a later ``algorithm.adv_estimator=``
   on the command line replaced milegpo's), or any other name at all when installed by
   milegpo's entry point, stops the constructor with a message naming both;
3. ``ray_trainer.compute_data_metrics``: the credit diagnostics join the step's metrics
   (``credit/*``, so the trainer's loggers show them);
4. ``TrajectoryCollector.gather_rollout_data``: each row gets its step index and its
   trajectory's ``won`` while the rows are still in rollout order (see
   :mod:`~milegpo.integrations.verl.steps`).

verl-agent may build and run the trainer inside a Ray actor (``TaskRunner``), a process a
driver-side patch never reaches: :func:`~milegpo.integrations.verl.hook.setup_worker`, the Ray
``worker_process_setup_hook`` that ``python -m milegpo.integrations.verl.main_ppo`` registers,
gets it patched there, through :class:`PatchOnImport` at the moment the trainer module is first
imported, so the workers that never import it (env workers) pay nothing.
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import sys
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from milegpo.integrations.verl.estimator import compute_advantage, configure
from milegpo.integrations.verl.settings import ESTIMATORS, settings_from_config
from milegpo.integrations.verl.steps import annotate_rollout
from milegpo.integrations.verl.targets import COLLECTOR_MODULE, TRAINER_MODULE

#: the attribute marking a patched function; it holds the original
_ORIGINAL = "__milegpo_original__"


def _original(function: Callable[..., Any]) -> Callable[..., Any]:
    return getattr(function, _ORIGINAL, function)


def _mark(patched: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    functools.update_wrapper(patched, original)
    setattr(patched, _ORIGINAL, original)
    return patched


def _estimator_name(config: Mapping[str, Any]) -> str | None:
    """``config.algorithm.adv_estimator`` as a string (None where the config has none)."""
    try:
        value = config["algorithm"]["adv_estimator"]
    except (KeyError, TypeError):
        return None
    return str(getattr(value, "value", value))


def _refuse_other_estimator(config: Mapping[str, Any], name: str | None, milegpo_only: bool) -> None:
    """Stop a trainer built for a non-milegpo estimator where milegpo was asked for: its
    ``algorithm.milegpo`` keys would be ignored (and GiGPO, say, would train) without a sign."""
    try:
        ours = config["algorithm"]["milegpo"]
    except (KeyError, TypeError):
        ours = None
    if ours:
        keys = ", ".join(f"algorithm.milegpo.{key}={ours[key]!r}" for key in sorted(ours))
        raise ValueError(f"algorithm.adv_estimator={name!r} is not a milegpo estimator, but {keys} is set for one: "
                         f"the milegpo keys would be ignored and {name!r} would train. A later "
                         "`algorithm.adv_estimator=` on the command line (e.g. a run_*.sh script's own) replaces an "
                         f"earlier one: give it once, as one of {sorted(ESTIMATORS)}")
    if milegpo_only:
        raise ValueError(f"algorithm.adv_estimator={name!r} reached milegpo's entry point "
                         "(python -m milegpo.integrations.verl.main_ppo), which trains milegpo's estimators "
                         f"{sorted(ESTIMATORS)}: set one of those, or run verl-agent's {name!r} with "
                         "python -m verl.trainer.main_ppo")


def _swap(owner: object, name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace ``owner.name`` by ``wrap(original)``, where ``original`` is the unpatched function (so a
    second install wraps the original again, never a wrapper)."""
    original = _original(getattr(owner, name))
    setattr(owner, name, _mark(wrap(original), original))


def _patched_trainer_init(original: Callable[..., Any], milegpo_only: bool = False) -> Callable[..., Any]:
    def __init__(self: object, config: Any, *args: Any, **kwargs: Any) -> None:
        name = _estimator_name(config)
        if name not in ESTIMATORS:
            _refuse_other_estimator(config, name, milegpo_only)
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


def install(module: ModuleType | None = None, collector: type | None = None, *, milegpo_only: bool = False) -> None:
    """Install milegpo's estimators in this process's verl-agent trainer (idempotent).

    :param module: the trainer module (default: ``verl.trainer.ppo.ray_trainer``).
    :param collector: verl-agent's ``TrajectoryCollector`` (default: imported from
        ``agent_system.multi_turn_rollout``; skipped where that package is absent, and a
        batch then lacks the step column and is refused with a message saying so).
    :param milegpo_only: the trainer refuses every estimator that is not milegpo's (set by
        the entry point, whose runs are meant to train milegpo's).
    """
    if module is None:
        module = importlib.import_module(TRAINER_MODULE)

    def routed(fallback: Callable[..., Any]) -> Callable[..., Any]:
        def compute(data: Any, adv_estimator: Any, *args: Any, **kwargs: Any) -> Any:
            return compute_advantage(data, adv_estimator, *args, fallback=fallback, **kwargs)

        return compute

    _swap(module, "compute_advantage", routed)
    _swap(vars(module)["RayPPOTrainer"], "__init__",
          functools.partial(_patched_trainer_init, milegpo_only=milegpo_only))
    if hasattr(module, "compute_data_metrics"):
        _swap(module, "compute_data_metrics", _patched_metrics)
    if collector is None:
        try:
            collector = vars(importlib.import_module(COLLECTOR_MODULE))["TrajectoryCollector"]
        except ImportError:
            collector = None
    if collector is not None:
        _swap(collector, "gather_rollout_data", _patched_collector)


class _InstallAfterLoading:
    """The loader of verl's trainer module, wrapped: runs the module's code, then :func:`install` on it."""

    def __init__(self, loader: Any, milegpo_only: bool) -> None:
        self._loader = loader
        self._milegpo_only = milegpo_only

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        install(module, milegpo_only=self._milegpo_only)

    def __getattr__(self, name: str) -> Any:  # get_source, get_resource_reader, ...: the real loader's
        return getattr(self._loader, name)


class PatchOnImport:
    """A ``sys.meta_path`` finder that finds no module itself: when verl's trainer module is
    about to be loaded, it asks the finders after it for the module and wraps its loader
    (:class:`_InstallAfterLoading`), so the trainer is patched the moment it exists."""

    def __init__(self, milegpo_only: bool) -> None:
        self.milegpo_only = milegpo_only

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != TRAINER_MODULE:
            return None
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            if isinstance(finder, PatchOnImport) or find_spec is None:
                continue
            spec = find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _InstallAfterLoading(spec.loader, self.milegpo_only)
                return spec
        return None


def patch_when_imported(*, milegpo_only: bool = False) -> None:
    """:func:`install` in this process as soon as verl's trainer module is imported (now, if it
    already is), without importing it: a process that never imports it pays one finder lookup."""
    module = sys.modules.get(TRAINER_MODULE)
    if module is not None:
        install(module, milegpo_only=milegpo_only)
        return
    for finder in sys.meta_path:
        if isinstance(finder, PatchOnImport):
            finder.milegpo_only = milegpo_only
            return
    sys.meta_path.insert(0, PatchOnImport(milegpo_only))
