"""The report's one HTML file: the template with the vendored libraries, the report's own script and
style, and the data inlined, so it opens offline from anywhere (no request leaves the page).

Each kept iteration's data is its own ``<script type="application/json">`` block, parsed only when
the iteration is opened: a report of many kept iterations opens as fast as one of a few.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

from milegpo.run_folder import write_atomic

#: the vendored files inlined into every report (vendor/README.md: package, version, source)
VENDOR_SCRIPTS = ("cytoscape.min.js", "uPlot.iife.min.js")
VENDOR_STYLES = ("uPlot.min.css",)


def _package_text(*parts: str) -> str:
    return resources.files("milegpo.inspect").joinpath(*parts).read_text(encoding="utf-8")


def _script_safe(text: str, name: str) -> str:
    """``text`` to put between ``<script>`` tags: it must not close the tag or open an HTML comment."""
    lowered = text.lower()
    if "</script" in lowered or "<!--" in lowered:
        raise ValueError(f"{name} contains '</script' or '<!--' and cannot be inlined as it is")
    return text


def json_block(value: Any) -> str:
    """``value`` as JSON that is safe inside a ``<script type="application/json">`` element (``</``
    and ``<!--`` escaped; JSON.parse reads the escapes back as the same text). Non-finite numbers
    are refused: JSON has none."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False).replace("</", "<\\/").replace("<!--", "<\\u0021--")


def render_report(data: dict[str, Any]) -> str:
    """The report's HTML for :func:`milegpo.inspect.data.report_data`'s ``data``."""
    iterations = data["iterations"]
    summary = {key: value for key, value in data.items() if key != "iterations"}
    blocks = "\n".join(f'<script type="application/json" id="iteration-{i}">{json_block(view)}</script>'
                       for i, view in iterations.items())
    scripts = "\n".join(f"<script>/* {name} */\n{_script_safe(_package_text('vendor', name), name)}\n</script>"
                        for name in VENDOR_SCRIPTS)
    styles = "\n".join(_package_text("vendor", name) for name in VENDOR_STYLES)
    own_script = _script_safe(_package_text("static", "report.js"), "report.js")
    replacements = {
        "<!--milegpo:title-->": _escape(f"{data['run']['name']} - milegpo inspect"),
        "/*milegpo:vendor-style*/": styles,
        "/*milegpo:style*/": _package_text("static", "report.css"),
        "<!--milegpo:vendor-scripts-->": scripts,
        "<!--milegpo:data-->": f'<script type="application/json" id="report-data">{json_block(summary)}</script>\n'
                               + blocks,
        "/*milegpo:script*/": own_script,
    }
    html = _package_text("templates", "report.html")
    for marker, text in replacements.items():
        if html.count(marker) != 1:
            raise ValueError(f"the report template must hold {marker!r} exactly once")
        html = html.replace(marker, text)
    return html


def write_html(html: str, out: str | os.PathLike) -> Path:
    """Write the report to ``out`` atomically (a browser never opens half of it); returns the path."""
    out = Path(out)
    if out.is_dir():
        raise IsADirectoryError(f"--out {str(out)!r} is a folder: name the HTML file to write")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, html)
    return out


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
