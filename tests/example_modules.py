"""The scripts of ``examples/`` loaded as modules, for the tests that run them."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def load_example(name: str) -> ModuleType:
    """``examples/<name>.py`` as a module."""
    path = Path(__file__).resolve().parents[1] / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
