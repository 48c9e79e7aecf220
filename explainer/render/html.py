"""Jupyter HTML: the summary first, then the user's lines with the culprit and the backward call
marked, then the fix as a diff; the full explanation and the traceback fold away."""
from __future__ import annotations

import html

from ..model import Finding
from ..places import file_label
from ..reading.source import load
from .text import fix_preview, headline

_STYLE = (
    "<style>.explainer{border-left:4px solid #d9534f;padding:6px 12px;margin:4px 0;"
    "font-family:var(--jp-ui-font-family,sans-serif)}"
    ".explainer.warning{border-color:#f0ad4e}.explainer pre{margin:4px 0;padding:4px 8px;"
    "background:var(--jp-layout-color2,#f6f8fa);overflow-x:auto}"
    ".explainer .hl{background:rgba(217,83,79,.18);display:inline-block;width:100%}"
    ".explainer .bw{background:rgba(91,192,222,.18);display:inline-block;width:100%}"
    ".explainer .add{color:#22863a}.explainer .del{color:#b31d28}"
    ".explainer summary{cursor:pointer}</style>"
)


def render_html(finding: Finding, traceback_text: str = "", apply_hint: bool = False) -> str:
    e = html.escape
    parts = [_STYLE, f'<div class="explainer {e(finding.severity)}">',
             f"<p><b>{e(headline(finding))}</b>: {_code_spans(finding.summary)}</p>"]
    parts.append(_lines_view(finding))
    if finding.fixes:
        fix = finding.fixes[0]
        parts.append(f"<p><b>Fix</b>: {_code_spans(fix.message)}</p>")
        diff = []
        for line in fix_preview(fix):
            css = "add" if line.startswith("+ ") else "del" if line.startswith("- ") else ""
            diff.append(f'<span class="{css}">{e(line)}</span>' if css else e(line))
        parts.append("<pre>" + "\n".join(diff) + "</pre>")
        if apply_hint:
            parts.append("<p><small>Run <code>%explain --apply</code> to put the fixed cell into "
                         "the next input.</small></p>")
    parts.append("<details><summary>Details</summary>")
    parts.append(f"<p>{_code_spans(finding.message)}</p>")
    if finding.retain_graph_advice:
        parts.append(f"<p>{_code_spans(finding.retain_graph_advice)}</p>")
    for other in finding.fixes[1:]:
        parts.append(f"<p>Or: {_code_spans(other.message)}</p>")
    if finding.confidence != "certain":
        parts.append(f"<p><i>Confidence: {e(finding.confidence)}.</i></p>")
    if traceback_text:
        parts.append(f"<details><summary>Traceback</summary><pre>{e(traceback_text)}</pre></details>")
    parts.append("</details></div>")
    return "".join(parts)


def _lines_view(finding: Finding) -> str:
    marks: dict[tuple[str, int], str] = {}
    for culprit in finding.culprits:
        marks.setdefault((culprit.filename, culprit.location.row), "hl")
    for call in (finding.backward, finding.freed_by, *finding.steps):
        if call is not None:
            marks.setdefault((call.filename, call.row), "bw")
    blocks = []
    for filename in dict.fromkeys(f for f, _ in marks):
        source = load(filename)
        if source is None:
            continue
        rows = sorted(r for f, r in marks if f == filename)
        shown: list[int] = []
        for row in rows:
            shown.extend(r for r in range(max(1, row - 1), min(len(source.lines), row + 1) + 1) if r not in shown)
        lines, previous = [], None
        for row in sorted(shown):
            if previous is not None and row > previous + 1:
                lines.append("   ⋮")
            text = html.escape(f"{row:>4} {source.line(row)}")
            css = marks.get((filename, row))
            lines.append(f'<span class="{css}">{text}</span>' if css else text)
            previous = row
        blocks.append(f"<div>{html.escape(file_label(filename))}</div><pre>" + "\n".join(lines) + "</pre>")
    return "".join(blocks)


def _code_spans(text: str) -> str:
    """`x` -> <code>x</code>, everything escaped."""
    pieces = html.escape(text).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(pieces))
