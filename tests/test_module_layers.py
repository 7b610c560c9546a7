"""The package's modules stay small and layered: no module over 450 lines, no import circle, and no
import from a lower floor to a higher one. Imports are read from the source (those inside functions,
under ``TYPE_CHECKING`` and ``importlib.import_module("milegpo....")`` of a literal name too): a circle
hidden in a function body is still a circle.

The floors, bottom first: credit, run_folder, options, spaces (1); config (2); policies, inspect (3);
envs, contracts (4); integrations and the package's own ``__init__`` (5: the version, and the env ids
registered); algos (6); run (7); serve (8); agents (9); cli, ``__main__`` (10). Within a floor any import is
allowed, as long as it closes no circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

from package_modules import module_files

MAX_LINES = 450
FLOORS = {"credit": 1, "run_folder": 1, "options": 1, "spaces": 1, "config": 2, "policies": 3, "inspect": 3,
          "envs": 4, "contracts": 4, "integrations": 5, "algos": 6, "run": 7, "serve": 8, "agents": 9, "cli": 10,
          "__main__": 10}
#: the floor of the package's own ``__init__`` (``milegpo.__version__``; it imports the env registration)
PACKAGE_FLOOR = 5


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports. ``from a.b import c`` imports the module ``a.b.c`` when
    there is one (a submodule), else ``a.b`` (a name defined in it)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        elif isinstance(node, ast.Call) and _imports_by_name(node):
            targets = [node.args[0].value]
        else:
            continue
        found.update(target for target in targets if target in modules and target != name)
    return found


def _imports_by_name(call: ast.Call) -> bool:
    """``importlib.import_module("a.b")`` (or ``import_module("a.b")``) of a literal name."""
    called = getattr(call.func, "attr", getattr(call.func, "id", None))
    return called == "import_module" and bool(call.args) and isinstance(call.args[0], ast.Constant) \
        and isinstance(call.args[0].value, str)


def floor(name: str) -> int:
    parts = name.split(".")
    return FLOORS[parts[1]] if len(parts) > 1 else PACKAGE_FLOOR


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def test_no_module_is_over_450_lines() -> None:
    long = {name: n for name, path in module_files().items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_every_top_level_module_has_a_floor() -> None:
    unplaced = {name.split(".")[1] for name in module_files() if "." in name} - set(FLOORS)
    assert not unplaced, f"give {sorted(unplaced)} a floor in FLOORS (tests/test_module_layers.py)"


def test_no_import_runs_back_up_a_floor() -> None:
    graph = import_graph()
    back_up = sorted(f"{name} (floor {floor(name)}) -> {target} (floor {floor(target)})"
                     for name, targets in graph.items() for target in targets if floor(target) > floor(name))
    assert not back_up, "imports back up a floor:\n" + "\n".join(back_up)


def test_no_import_circle() -> None:
    graph = import_graph()
    circles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        path.append(name)
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                circles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target)
        path.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert not circles, "import circles:\n" + "\n".join(circles)
