"""The part every benchmark script shares: its arguments, its clocks, the machine's load and its result files.

A script builds its command line with :func:`parser` (the description is the script's own docstring, and
``--out`` names where its results go, under :data:`RESULTS` unless told otherwise), times its calls with
:func:`timed` / :func:`timed_interleaved` (median wall and process CPU seconds; interleaved so that a change
of load on a shared machine hits every timed function alike) or a :class:`Stopwatch`, records
:func:`load_1min` beside every timing, and writes its results with :func:`write_json` / :func:`write_text`
(atomic: a run killed mid-write leaves the previous file whole, and the docs that include it keep building).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

#: the repository's root: benchmarks run from here (``python -m benchmarks.<group>.<script>``)
REPO = Path(__file__).resolve().parent.parent
#: the committed results the docs include (``--8<-- "benchmarks/results/<name>"``): their names stay stable
RESULTS = REPO / "benchmarks" / "results"
#: the run folders the learning studies train into (not committed)
RUNS = REPO / "benchmarks" / "runs"


def parser(doc: str | None, out: Path | None = None, out_help: str | None = None) -> argparse.ArgumentParser:
    """The script's argument parser: ``--help`` shows its docstring as written (the commands in it included)
    and, where the script writes results (``out`` given), ``--out`` says where, ``out`` by default."""
    if not doc:
        raise ValueError("a benchmark script needs a docstring: it is the script's --help")
    made = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if out is not None:
        made.add_argument("--out", type=Path, default=out, help=out_help or f"where the results go (default: {out})")
    return made


def load_1min() -> float:
    """The machine's 1-minute load average: recorded beside every timing, so a slow number taken while
    other jobs ran can be told from a slow program."""
    return os.getloadavg()[0]


class Stopwatch:
    """Wall and process CPU seconds of a ``with`` block (``wall_s``, ``cpu_s`` once it closes): CPU time
    beside wall time, because on a shared machine the wall clock also counts the other jobs."""

    wall_s: float
    cpu_s: float

    def __enter__(self) -> Stopwatch:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.wall_s = time.perf_counter() - self._wall
        self.cpu_s = time.process_time() - self._cpu


def timed(fn: Callable[[], object], repeats: int, warm_up: bool = True,
          before: Callable[[], None] | None = None) -> tuple[float, float]:
    """Median (wall, process CPU) seconds of ``repeats`` calls of ``fn``, after one untimed warm-up call
    (unless ``warm_up`` is False); garbage is collected and ``before`` (untimed) runs before each call."""
    if warm_up:
        fn()
    wall, cpu = [], []
    for _ in range(repeats):
        gc.collect()
        if before is not None:
            before()
        with Stopwatch() as clock:
            fn()
        wall.append(clock.wall_s)
        cpu.append(clock.cpu_s)
    return statistics.median(wall), statistics.median(cpu)


def timed_interleaved(fns: dict[str, Callable[[], object]], repeats: int,
                      before: Callable[[], None] | None = None) -> dict[str, tuple[float, float]]:
    """:func:`timed` of every function, the calls interleaved: one warm-up each, then ``repeats`` rounds that
    call each function once (the order rotated every round), so a change of load on the shared machine hits
    every function alike. ``before`` (untimed) runs before every timed call. Median (wall, process CPU)
    seconds by name."""
    for fn in fns.values():
        fn()
    names = list(fns)
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            gc.collect()
            if before is not None:
                before()
            with Stopwatch() as clock:
                fns[name]()
            wall[name].append(clock.wall_s)
            cpu[name].append(clock.cpu_s)
    return {name: (statistics.median(wall[name]), statistics.median(cpu[name])) for name in names}


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a temporary file beside it, then renamed over it), making its
    folder if needed: a run killed mid-write leaves the previous results whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # one per process; opened as usual (the umask)
    try:
        temporary.write_text(text)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def write_json(path: Path, data: Any, indent: int | None = 2) -> None:
    """Write ``data`` as JSON (``indent`` spaces, a final newline) to ``path``, atomically."""
    write_text(path, json.dumps(data, indent=indent) + "\n")


def write_results(out: Path, data: Any, markdown: str | None = None, indent: int | None = 2) -> None:
    """A benchmark's results: ``data`` as ``<out>.json`` and, when given, ``markdown`` (the table the docs
    include) as ``<out>.md`` beside it; both atomic. ``out`` may end in ``.json`` or ``.md`` or in neither
    (a dotted name such as ``throughput_tool0.05s`` keeps its dot)."""
    out = Path(out)
    stem = out.with_suffix("") if out.suffix in (".json", ".md") else out
    write_json(stem.with_name(stem.name + ".json"), data, indent)
    if markdown is not None:
        write_text(stem.with_name(stem.name + ".md"), markdown)
