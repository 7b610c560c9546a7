"""MkDocs hooks: the benchmark outputs of ``benchmarks/results/`` become part of the site.

The plots are added to the site as ``results/<name>.png`` (pages link them as
``../results/...``), and ``{{ raw_results }}`` on a page becomes one collapsible block per
JSON result that has no Markdown table of its own. Nothing is copied into ``docs/``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


def on_files(files: Files, config) -> Files:
    for png in sorted(RESULTS.glob("*.png")):
        files.append(File.generated(config, f"results/{png.name}", abs_src_path=str(png)))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    if "{{ raw_results }}" not in markdown:
        return markdown
    blocks = []
    for path in sorted(RESULTS.glob("*.json")):
        if path.with_suffix(".md").exists():
            continue
        data = json.loads(path.read_text())
        text = json.dumps(data, indent=2)
        if len(text) > 20_000:
            text = text[:20_000] + "\n... (cut; the whole file is benchmarks/results/" + path.name + ")"
        body = "\n".join("    " + line for line in ["```json", *text.splitlines(), "```"])
        blocks.append(f'??? note "{path.name}"\n\n{body}\n')
    return markdown.replace("{{ raw_results }}", "\n".join(blocks))


_SPHINX_ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|exc|obj):<code>(?P<tilde>~?)(?P<name>[\w.]+)</code>")
_LITERAL_MARKER = re.compile(r"<p>::</p>\s*|(?<=\S) ::(?=</p>)")


def _cross_reference(match: re.Match) -> str:
    """A reST role's target as an autorefs cross-reference (``~`` shows the last name only); a target
    autorefs does not know stays plain code (``optional``)."""
    name = match["name"]
    shown = name.rsplit(".", 1)[-1] if match["tilde"] else name
    return f'<autoref identifier="{name}" optional><code>{shown}</code></autoref>'


def on_page_content(html: str, page, config, files) -> str:
    """The docstrings are reST: mkdocstrings renders ``:class:`~a.b.C``` as the role's text and the
    name as code, and keeps the ``::`` that opens a literal block. The role becomes a link to the
    object's page (autorefs resolves it after every page is built); a lone ``::`` is dropped and a
    paragraph's closing ``::`` becomes ``:``."""
    html = _SPHINX_ROLE.sub(_cross_reference, html)
    return _LITERAL_MARKER.sub(lambda m: "" if m.group(0).startswith("<p>") else ":", html)
