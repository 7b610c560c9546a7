"""Deprecated location of :mod:`milegpo.credit` (credit assignment moved to the top level).

``import milegpo.algos.credit`` and ``from milegpo.algos.credit.<module> import ...`` keep
working: each submodule name here is the same module object as under ``milegpo.credit``
(no second copy of any class). Import from :mod:`milegpo.credit` in new code.
"""

from __future__ import annotations

import importlib
import sys
import warnings

import milegpo.credit  # noqa: F401  (the package is the alias target)
from milegpo.credit import *  # noqa: F401,F403  the public names, unchanged
from milegpo.credit import __all__  # noqa: F401

warnings.warn("milegpo.algos.credit moved to milegpo.credit; import it from there", DeprecationWarning, stacklevel=2)

for _name in ("api", "base", "batch", "diagnostics", "gigpo", "graph", "graphgpo", "grpo", "hgpo", "milegpo", "norm",
              "rloo"):
    sys.modules[f"{__name__}.{_name}"] = importlib.import_module(f"milegpo.credit.{_name}")
__path__: list[str] = []  # a package for the import system, so the aliased submodules resolve
