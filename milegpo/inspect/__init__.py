"""See what a run's credit saw: ``milegpo inspect RUN_DIR`` writes one self-contained HTML report.

The report draws, for each kept iteration (``run.keep_batch_every``) and each task group, the state
graph the credit methods built from the group's rollouts: states with their visits and distance to
the goal, transitions with their success rate, MileGPO's milestones and traps with their scores,
branching points, and every trajectory with its step advantages under every credit method
(recomputed from the kept batch with :func:`milegpo.credit.compute_credit`). It reads the run
folder's files only, and opens offline (Cytoscape.js and uPlot are inlined).

From Python::

    from milegpo.inspect import write_report
    write_report("runs/milegpo-house-...")          # RUN_DIR/report.html
    data = report_data("runs/milegpo-house-...")     # the same numbers as plain values
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from milegpo.inspect.data import report_data
from milegpo.inspect.html import render_report, write_html
from milegpo.inspect.runfiles import KeptBatch, kept_iterations, load_kept
from milegpo.run_folder import INSPECT_REPORT_FILE


def write_report(run_dir: str | os.PathLike, out: str | os.PathLike | None = None,
                 iterations: Sequence[int] | None = None) -> Path:
    """Write the report of ``run_dir`` to ``out`` (default ``RUN_DIR/report.html``); returns its path.

    :param iterations: the kept iterations to include (default: every kept one).
    :raises FileNotFoundError: ``run_dir`` is no run folder or has no kept batch yet.
    :raises ValueError: an iteration that was not kept, or a damaged run file (named).
    """
    html = render_report(report_data(run_dir, iterations))
    return write_html(html, out if out is not None else Path(run_dir) / INSPECT_REPORT_FILE)


__all__ = ["KeptBatch", "kept_iterations", "load_kept", "report_data", "write_report"]
