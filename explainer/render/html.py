"""Jupyter HTML, shown after the error's own output: the summary in plain words with the kind and
the cause as tags, the user's lines with the culprit and the backward call marked, the fix as a
diff; the full explanation folds away.

Colours come from the theme: JupyterLab's `--jp-*` variables, else VS Code's `--vscode-*`, else
the page's own text colour; marks only tint backgrounds, so text keeps the theme's contrast. An
untrusted notebook loses the `<style>` block, so every mark is also written as text: a gutter
label (`hidden ▶`, `backward ▶`) on the marked lines and `+ `/`- ` on the diff's.

The boundary picture (render/diagram.py) is an `<img>` of its SVG as a `data:` URI rather than an
`<svg>` element: JupyterLab's sanitiser (4.6) has no SVG tag in its allow-list, but keeps `<img>`
and its `src` whatever the scheme. The SVG brings its own background, so it reads the same in
light and dark themes."""
from __future__ import annotations

import base64
import html

from ..model import Finding
from ..places import file_label
from ..reading.source import load
from . import diagram
from .text import fix_lead, fix_preview, tags

_STYLE = (
    "<style>"
    ".explainer{border-left:4px solid var(--jp-error-color1,var(--vscode-editorError-foreground,#d9534f));"
    "padding:6px 12px;margin:4px 0;color:var(--jp-content-font-color1,var(--vscode-editor-foreground,inherit));"
    "font-family:var(--jp-ui-font-family,var(--vscode-font-family,sans-serif))}"
    ".explainer.warning{border-left-color:var(--jp-warn-color1,var(--vscode-editorWarning-foreground,#f0ad4e))}"
    ".explainer pre{margin:4px 0;padding:4px 8px;color:inherit;overflow-x:auto;"
    "background:var(--jp-layout-color2,var(--vscode-textCodeBlock-background,rgba(127,127,127,.12)));"
    "font-family:var(--jp-code-font-family,var(--vscode-editor-font-family,monospace))}"
    ".explainer .mark{display:inline-block;width:100%}"
    ".explainer .culprit,.explainer .del{background:rgba(229,83,75,.25)}"
    ".explainer .call{background:rgba(56,139,253,.25)}"
    ".explainer .add{background:rgba(46,160,67,.25)}"
    ".explainer .tag{border:1px solid;border-radius:3px;padding:0 4px;font-size:85%}"
    ".explainer summary{cursor:pointer}"
    ".explainer img.boundary{display:block;margin:8px 0;max-width:100%;height:auto}"
    "</style>"
)


def render_html(finding: Finding, apply_hint: bool = False) -> str:
    e = html.escape
    parts = [_STYLE, f'<div class="explainer {e(finding.severity)}">',
             f"<p><b>{_code_spans(finding.summary or finding.message)}</b></p>",
             "<p>" + " ".join(f'<span class="tag">{e(tag)}</span>' for tag in tags(finding)) + "</p>"]
    parts.append(_lines_view(finding))
    parts.append(_picture(finding))
    if finding.fixes:
        fix = finding.fixes[0]
        parts.append(f"<p><b>{e(fix_lead(fix, True))}</b>: {_code_spans(fix.message)}</p>")
        diff = []
        for line in fix_preview(fix):
            css = "add" if line.startswith("+ ") else "del" if line.startswith("- ") else ""
            diff.append(f'<span class="mark {css}">{e(line)}</span>' if css else e(line))
        parts.append("<pre>" + "\n".join(diff) + "</pre>")
        if apply_hint:
            parts.append("<p><small>Run <code>%explain --apply</code> to put the fixed cell into "
                         "the next input.</small></p>")
    parts.append("<details><summary>Details</summary>")
    parts.append(f"<p>{_code_spans(finding.message)}</p>")
    if finding.retain_graph_advice:
        parts.append(f"<p>{_code_spans(finding.retain_graph_advice)}</p>")
    for other in finding.fixes[1:]:
        parts.append(f"<p>{e(fix_lead(other, False))}: {_code_spans(other.message)}</p>")
    if finding.confidence != "certain":
        parts.append(f"<p><i>Confidence: {e(finding.confidence)}.</i></p>")
    parts.append("</details></div>")
    return "".join(parts)


def _line_marks(finding: Finding) -> dict[tuple[str, int], tuple[str, str]]:
    """(file, row) -> (css class, gutter label) for the lines the explanation marks: where each
    culprit was made (labelled with its name), then the backward call, the call that freed the
    graph and the optimizer steps. The first mark of a line wins."""
    marks: dict[tuple[str, int], tuple[str, str]] = {}
    for culprit in finding.culprits:
        marks.setdefault((culprit.filename, culprit.location.row), ("culprit", culprit.name))
    for call, label in ((finding.backward, "backward"), (finding.freed_by, "freed by"),
                        *((step, "step") for step in finding.steps)):
        if call is not None:
            marks.setdefault((call.filename, call.row), ("call", label))
    return marks


def _lines_view(finding: Finding) -> str:
    marks = _line_marks(finding)
    gutter = max((len(label) for _, label in marks.values()), default=0) + 2
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
                lines.append(" " * gutter + "   ⋮")
            css, label = marks.get((filename, row), ("", ""))
            text = html.escape(f"{label + ' ▶' if label else '':>{gutter}}{row:>4} {source.line(row)}")
            lines.append(f'<span class="mark {css}">{text}</span>' if css else text)
            previous = row
        blocks.append(f"<div>{html.escape(file_label(filename))}</div><pre>" + "\n".join(lines) + "</pre>")
    return "".join(blocks)


def _picture(finding: Finding) -> str:
    drawn = diagram.timeline(finding)
    if drawn is None:
        return ""
    width, height = diagram.size(drawn)
    data = base64.b64encode(diagram.svg(drawn).encode()).decode("ascii")
    return (f'<p><img class="boundary" src="data:image/svg+xml;base64,{data}" width="{width}" height="{height}" '
            f'alt="{html.escape(diagram.title(drawn))}"></p>')


def _code_spans(text: str) -> str:
    """`x` -> <code>x</code>, everything escaped."""
    pieces = html.escape(text).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(pieces))
