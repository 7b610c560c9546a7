"""The benchmarks' shared harness: result files written whole or not at all, under stable names, and its clocks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's root: the benchmarks package

from benchmarks import harness  # noqa: E402


def test_results_keep_a_dotted_name(tmp_path: Path) -> None:
    """``throughput_tool0.05s`` is a name, not a stem with a suffix: its files are ``…0.05s.json`` / ``.md``."""
    harness.write_results(tmp_path / "agent_rollouts_throughput_tool0.05s", {"rows": [1]}, "| a |\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent_rollouts_throughput_tool0.05s.json",
                                                          "agent_rollouts_throughput_tool0.05s.md"]
    harness.write_results(tmp_path / "buffer_get.json", {"rows": [2]}, "| b |\n")
    assert json.loads((tmp_path / "buffer_get.json").read_text()) == {"rows": [2]}
    assert (tmp_path / "buffer_get.md").read_text() == "| b |\n"


def test_a_failed_write_leaves_the_previous_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "results" / "table.md"
    harness.write_text(path, "the committed table\n")
    with pytest.raises(UnicodeEncodeError):
        harness.write_text(path, "half a table \udc80")  # fails while writing
    assert path.read_text() == "the committed table\n"
    assert [p.name for p in path.parent.iterdir()] == ["table.md"]  # no temporary file left behind


def test_interleaved_timing_calls_each_function_in_turn_after_a_warm_up() -> None:
    calls: list[str] = []
    times = harness.timed_interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 3,
                                      before=lambda: calls.append("before"))
    assert calls[:2] == ["a", "b"]  # the warm-ups, untimed and without ``before``
    assert calls[2:] == ["before", "a", "before", "b", "before", "b", "before", "a", "before", "a", "before", "b"]
    assert set(times) == {"a", "b"} and all(wall >= 0 and cpu >= 0 for wall, cpu in times.values())


def test_the_parser_is_the_docstring_and_out() -> None:
    made = harness.parser("What it measures.\n\n    python -m benchmarks.x.y\n", harness.RESULTS / "y.json")
    assert made.parse_args([]).out == harness.RESULTS / "y.json"
    assert made.parse_args(["--out", "elsewhere.json"]).out == Path("elsewhere.json")
    assert "python -m benchmarks.x.y" in made.format_help()
    with pytest.raises(ValueError, match="needs a docstring"):
        harness.parser(None)


#: every benchmark module: benchmarks/<name>.py and benchmarks/<group>/<name>.py
MODULES = [f"benchmarks.{p.stem}" for p in sorted((harness.REPO / "benchmarks").glob("*.py"))] + \
    [f"benchmarks.{p.parent.name}.{p.stem}" for p in sorted((harness.REPO / "benchmarks").glob("*/*.py"))]
MODULES = [name for name in MODULES if not name.endswith(".__init__")]
#: modules that need packages beyond the dev extras (the verl extra, and verl itself): skipped without them
NEEDS = {"benchmarks.integrations.verl_setup_hook": ("ray", "verl")}
IMPORT_ALL = """
import importlib, json, sys
errors = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        errors[name] = ""
    except BaseException as error:
        errors[name] = f"{type(error).__name__}: {error}"
print(json.dumps(errors))
"""


@pytest.fixture(scope="module")
def import_errors() -> dict[str, str]:
    """Each benchmark module's import error ("" when it imports), all imported in one fresh interpreter run from
    the repository's root: importing ray and verl changes the environment variables, the logging and
    ``sys.path`` of the process that does it, which the other tests should not inherit."""
    names = [name for name in MODULES
             if os.environ.get("MILEGPO_CI") or all(find_spec(package) for package in NEEDS.get(name, ()))]
    done = subprocess.run([sys.executable, "-c", IMPORT_ALL, *names], cwd=harness.REPO, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("name", MODULES)
def test_every_benchmark_module_imports(name: str, import_errors: dict[str, str]) -> None:
    missing = [package for package in NEEDS.get(name, ()) if find_spec(package) is None]
    if missing and not os.environ.get("MILEGPO_CI"):  # CI installs the verl extra: there it must import
        pytest.skip(f"{name} needs {', '.join(missing)}")
    assert import_errors[name] == ""
