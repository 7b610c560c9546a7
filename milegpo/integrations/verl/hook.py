"""The Ray worker setup hook of milegpo's entry point, light enough for every worker.

Ray runs a runtime env's ``worker_process_setup_hook`` in every worker process it starts:
the ``TaskRunner`` that builds verl-agent's trainer, but also every env worker (ALFWorld's
recipe starts 128 + 128). Only the process that imports verl's trainer module needs
milegpo's patches, so the hook only leaves a finder on ``sys.meta_path``; when (if ever)
``verl.trainer.ppo.ray_trainer`` is imported, the finder imports
:mod:`~milegpo.integrations.verl.install`, which patches that module the moment its code
has run.

This module imports nothing but the standard library (and the module names of
:mod:`~milegpo.integrations.verl.targets`, which imports nothing), and the entry point hands Ray the
hook as a function pickled by value (:func:`hook_for_ray`), so a worker runs it without
importing milegpo at all: importing milegpo imports numpy, which alone adds about 0.3 s
to a Ray worker's start (benchmarks/results/verl_setup_hook.md). Registered by its import
path instead (``ray_init.runtime_env.worker_process_setup_hook=milegpo.integrations.verl.hook.setup_worker``),
the hook does the same but its import brings milegpo's package in.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

from milegpo.integrations.verl.targets import TRAINER_MODULE

#: the import path of :func:`setup_worker`
HOOK = "milegpo.integrations.verl.hook.setup_worker"
#: the env var through which a user's own setup hook (``module.function``) reaches :func:`setup_worker`
USER_HOOK_ENV = "MILEGPO_VERL_USER_SETUP_HOOK"


class TrainerImportWatch:
    """A ``sys.meta_path`` finder that finds no module itself. At the first import of verl's
    trainer module it steps aside and hands the lookup to milegpo's patching finder
    (:class:`~milegpo.integrations.verl.install.PatchOnImport`), importing milegpo only then."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname != TRAINER_MODULE:
            return None
        sys.meta_path.remove(self)
        install = importlib.import_module("milegpo.integrations.verl.install")
        spec: ModuleSpec | None = install.PatchOnImport(milegpo_only=True).find_spec(fullname, path, target)
        return spec


def setup_worker() -> None:
    """Ray ``worker_process_setup_hook``: watch for verl's trainer module (milegpo's estimators
    only, as the entry point trains them), then run the user's own setup hook if the entry
    point passed one on in :data:`USER_HOOK_ENV`."""
    if TRAINER_MODULE in sys.modules:  # imported before the hook ran: patch it now
        importlib.import_module("milegpo.integrations.verl.install").patch_when_imported(milegpo_only=True)
    elif not any(isinstance(finder, TrainerImportWatch) for finder in sys.meta_path):
        sys.meta_path.insert(0, TrainerImportWatch())
    theirs = os.environ.get(USER_HOOK_ENV)
    if theirs:
        module_name, _, function = theirs.rpartition(".")
        getattr(importlib.import_module(module_name), function)()


def hook_for_ray() -> Callable[[], None]:
    """:func:`setup_worker`, marked so Ray's pickler sends it by value (a worker then unpickles it
    without importing milegpo; this module needs only the standard library)."""
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return setup_worker
