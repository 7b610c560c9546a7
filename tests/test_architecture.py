"""The package's structure: no import circle, and the trainer's seams take what they need.

* **No import circle**: the graph of ``milegpo``'s modules, one edge per import statement
  run when a module is imported (the module level, ``if TYPE_CHECKING:`` blocks included), has
  no cycle. An import inside a function body runs when the function is called, after every
  module has loaded, so it is not an edge (``milegpo.envs.registration`` imports the hubs
  package that way on purpose).
* **No reach into the algorithm**: outside ``milegpo/algos/base.py`` no code reads or writes an
  underscore attribute of the algorithm, i.e. ``<name>._x`` where ``<name>`` is a variable
  that holds the algorithm by this package's naming (``model``, ``algo``, ``algorithm``), or
  ``self.algorithm._x`` / ``self.model._x`` in :mod:`milegpo.algos` (SB3 callbacks keep the
  algorithm as ``self.model``). Dunder attributes (``__class__``) are not private.
"""

from __future__ import annotations

import ast

from package_modules import PACKAGE, module_files

ALGORITHM_NAMES = {"model", "algo", "algorithm"}


def import_time_statements(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The import statements of a module that run when it is imported: every one outside function bodies."""
    found: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            stack.append(child)
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports at import time (``from pkg import sub`` is an edge to ``pkg.sub``)."""
    modules = module_files()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for statement in import_time_statements(ast.parse(path.read_text(), str(path))):
            if isinstance(statement, ast.Import):
                graph[name] |= {alias.name for alias in statement.names if alias.name in modules}
                continue
            if statement.level:
                base = package.split(".")[: len(package.split(".")) - statement.level + 1]
                source = ".".join(base + ([statement.module] if statement.module else []))
            else:
                source = statement.module or ""
            for alias in statement.names:
                if f"{source}.{alias.name}" in modules:
                    graph[name].add(f"{source}.{alias.name}")
                elif source in modules:
                    graph[name].add(source)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def private_algorithm_reads(source: str, where: str, in_algos: bool) -> list[str]:
    """``where:line expression`` of every underscore attribute of the algorithm read or written in
    ``source`` (``in_algos``: a module of :mod:`milegpo.algos`, where ``self.model`` is the algorithm)."""
    found = []
    for node in ast.walk(ast.parse(source, where)):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        owner = node.value
        holds_algorithm = (isinstance(owner, ast.Name) and owner.id in ALGORITHM_NAMES) or (
            in_algos and isinstance(owner, ast.Attribute) and isinstance(owner.value, ast.Name)
            and owner.value.id == "self" and owner.attr in ("model", "algorithm"))
        if holds_algorithm:
            found.append(f"{where}:{node.lineno} {ast.unparse(node)}")
    return found


def test_the_graph_sees_imports_of_every_kind(tmp_path):
    """The checker itself: a circle through a TYPE_CHECKING import and a relative import is found,
    an import inside a function is not an edge."""
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from milegpo.algos import base\n"
                     "def f():\n    import milegpo.run\n")
    assert [ast.unparse(s) for s in import_time_statements(tree)] == [
        "from typing import TYPE_CHECKING", "from milegpo.algos import base"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    graph = import_graph()
    assert "milegpo.algos.buffer" in graph["milegpo.algos.base"]  # `from milegpo.algos.buffer import ...`
    assert "milegpo.algos.iteration" in graph["milegpo.algos.base"]  # `from milegpo.algos import iteration`


def test_no_import_circle_in_the_package():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_private_scan_finds_what_it_names():
    """The scan flags ``model._x``, ``algo._x`` and a callback's ``self.model._x``, not dunders."""
    source = ("def f(model, algo):\n    model._iterations += 1\n    return algo._last_obs, model.__class__\n"
              "class C:\n    def g(self):\n        return self.model._rng\n")
    assert [hit.split(" ", 1)[1] for hit in private_algorithm_reads(source, "sample.py", in_algos=True)] == [
        "model._iterations", "algo._last_obs", "self.model._rng"]
    assert [hit.split(" ", 1)[1] for hit in private_algorithm_reads(source, "sample.py", in_algos=False)] == [
        "model._iterations", "algo._last_obs"]


def test_no_module_but_base_reads_private_attributes_of_the_algorithm():
    base = PACKAGE / "algos" / "base.py"
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) if path != base
             for hit in private_algorithm_reads(path.read_text(), str(path.relative_to(PACKAGE.parent)),
                                                in_algos=path.parent == PACKAGE / "algos")]
    assert not found, "private attributes of the algorithm read outside algos/base.py:\n" + "\n".join(found)
