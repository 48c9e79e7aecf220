"""A picture of where the history crosses the boundary: what the earlier part made and freed (or
saved, then changed in place), the tensor that carries it across, the backward that needs it
now, and the line `fixes[0]` edits. Drawn from the finding's evidence only, never from the graph: a
graph of 10^6 nodes gives the same few rows as one of 20.

`timeline(finding)` is the layout (facts); `text(...)` and `svg(...)` draw it.
"""
from __future__ import annotations

import io
import tokenize
from dataclasses import dataclass
from html import escape

from ..model import CallSite, Finding
from ..places import place
from ..reading.source import load, statement_code

# The kinds whose error is about time: history made before a boundary, needed after it.
_KINDS = ("second-backward", "inplace-modified", "graph-growth")
# The longest code a row draws: a call written over ten lines would otherwise push what it did
# there off a terminal's right edge (and the SVG's width with it).
_WIDEST_CODE = 72


@dataclass(frozen=True)
class Row:
    """One event on the timeline: a line of the user's and what it did there. `where` is the
    line's number, or its place (`model.py:21`, `Cell In[2], line 5`) where the picture spans
    several files."""

    where: str
    code: str
    role: str  # a key of _SAYS


@dataclass(frozen=True)
class Timeline:
    carrier: str
    earlier: tuple[Row, ...]
    now: tuple[Row, ...]
    fix_at: str | None  # where fixes[0] edits first (in the finding's file if it edits there), as `where`
    inplace: bool


def timeline(finding: Finding) -> Timeline | None:
    """The finding's events in order, or None where there is no boundary to draw (a no-grad
    cut, a checker's finding that never ran)."""
    evidence = finding.evidence
    if finding.kind not in _KINDS or evidence.backward is None or not evidence.carrier:
        return None
    inplace = finding.kind == "inplace-modified"
    facts = dict(evidence.facts)
    events: list[tuple[CallSite, str]] = []
    if inplace and "change" in facts and evidence.made_at is not None:
        # Your own code changed it in place (BX011): `made_at` is that change, and `read` the
        # line whose operation saved it, in the same file.
        if isinstance(facts.get("read"), int):
            events.append((_site(evidence.made_at.filename, facts["read"]), "saves"))
        events.append((evidence.made_at, "changes"))
    elif evidence.made_at is not None:
        events.append((evidence.made_at, "saves" if inplace else "makes"))
    if evidence.freed_by is not None:
        events.append((evidence.freed_by, "retains" if finding.kind == "graph-growth" else "frees"))
    events.extend((step, "changes" if inplace else "steps") for step in evidence.steps)
    if finding.kind != "graph-growth":
        backward = "needs"
    else:
        backward = "passes" if dict(evidence.facts).get("kept_aside") else "walks"
    events.append((evidence.backward, backward))
    edits = sorted(finding.fixes[0].edits, key=lambda e: (e.filename != finding.filename, e.location.row)) \
        if finding.fixes else []
    fix = (edits[0].filename, edits[0].location.row) if edits else None
    files = {site.filename for site, _ in events} | ({fix[0]} if fix else set())

    def where(filename: str, row: int) -> str:
        return place(filename, row) if len(files) > 1 else str(row)

    rows = [Row(where(site.filename, site.row), _one_line(site.code), role) for site, role in events]
    # What the graph saved, where the change is known by another name (a module made to write in
    # place, `self.activ`, changed the `x` a forward made).
    saved = facts["made"] if isinstance(facts.get("made"), str) else evidence.carrier
    return Timeline(saved, tuple(rows[:-1]), tuple(rows[-1:]), where(*fix) if fix else None, inplace)


def _site(filename: str, row: int) -> CallSite:
    source = load(filename)
    return CallSite(filename, row, statement_code(source, row) if source is not None else "")


def _one_line(code: str) -> str:
    """A statement written over several lines, drawn on one: its comments dropped (a comment
    inside it would read as commenting out the rest), its lines joined, and what passes
    _WIDEST_CODE characters cut off with an ellipsis."""
    lines = code.splitlines()
    if len(lines) > 1:
        try:
            for token in tokenize.generate_tokens(io.StringIO(code).readline):
                if token.type == tokenize.COMMENT:
                    row, column = token.start
                    lines[row - 1] = lines[row - 1][:column]
        except (tokenize.TokenError, SyntaxError):
            pass  # not one whole statement: join it as it is
    joined = _joined([" ".join(line.split()) for line in lines])
    return joined if len(joined) <= _WIDEST_CODE else joined[:_WIDEST_CODE - 1].rstrip() + "…"


def _joined(lines: list[str]) -> str:
    """Lines joined by a space, but none after an opening bracket or before a closing one: a
    call's arguments written one per line read as `f(a, b)`, not `f( a, b )`."""
    out = ""
    for line in filter(None, lines):
        glue = "" if not out or out[-1] in "([{" or line[0] in ")]}" else " "
        out += glue + line
    return out


# What each role says beside its line; the kind's own words for the boundary.
_SAYS = {"makes": "makes `{carrier}`", "saves": "saves `{carrier}` for backward", "frees": "frees its graph",
         "retains": "keeps its graph", "steps": "optimizer step", "changes": "changes it in place",
         "needs": "needs it: the error", "walks": "goes through it all again",
         "passes": "runs beside it, never through it"}


def text(line: Timeline) -> list[str]:
    """The timeline as monospace lines, for the terminal note and rich output."""
    width = max(len(r.code) for r in (*line.earlier, *line.now))
    gutter = _gutter(line)

    def event(label: str, row: Row) -> str:
        says = _SAYS[row.role].format(carrier=line.carrier)
        return f"  {label:<7} ┊ {row.where:>{gutter}}  {row.code:<{width}}  {says}"

    crossing = f" `{line.carrier}` {'saved before the change' if line.inplace else 'crosses'} "
    out = [event("earlier" if i == 0 else "", r) for i, r in enumerate(line.earlier)]
    out.append(f"  {'═' * 7}═╪═══{crossing}{'═' * max(3, width + gutter + 8 - len(crossing))}")
    out.extend(event("now" if i == 0 else "", r) for i, r in enumerate(line.now))
    if line.fix_at is not None:
        out.append(f"  {'fix':<7} ┊ {line.fix_at:>{gutter}}  edits here")
    return out


# Colours on the diagram's own background, so that it reads the same in light and dark themes
# and when a sanitiser drops any stylesheet: every label is ≥ 4.5:1 against BACKGROUND.
BACKGROUND = "#ffffff"
INK = "#1f2328"  # the current part
FADED = "#57606a"  # the earlier, freed part
ACCENT = "#9a4d00"  # the crossing and the fix's line
FREED_FILL = "#eaeef2"

# Pixels: a row's height, and the advance of a character of the 13 px monospace font (7.8, rounded
# up so that a line is never cut off).
_ROW, _CHAR, _LEFT = 22, 8, 12


@dataclass(frozen=True)
class _Columns:
    row_right: int  # where the line numbers end (right-aligned)
    code: int
    says: int
    width: int


def _gutter(line: Timeline) -> int:
    """The width of the column of line numbers (or places), in characters."""
    return max(len(w) for w in (*(r.where for r in (*line.earlier, *line.now)), line.fix_at or ""))


def _columns(line: Timeline) -> _Columns:
    events = (*line.earlier, *line.now)
    row_right = _LEFT + _CHAR * (len("earlier") + 2 + _gutter(line))
    code = row_right + 2 * _CHAR
    says = code + _CHAR * (max(len(r.code) for r in events) + 3)
    widest = max(len(_SAYS[r.role].format(carrier=line.carrier)) for r in events)
    return _Columns(row_right, code, says, says + _CHAR * (widest + 2))


def size(line: Timeline) -> tuple[int, int]:
    """The SVG's width and height in pixels."""
    rows = len(line.earlier) + len(line.now) + (1 if line.fix_at is not None else 0)
    return _columns(line).width, _ROW * rows + 38  # the crossing row (28) and a margin below


def svg(line: Timeline) -> str:
    """The timeline as a self-contained SVG: attributes only (no <style>, no script). Columns:
    the part of the timeline, the line number, the user's code, what it did there."""
    columns = _columns(line)
    width, height = size(line)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" font-family="monospace" font-size="13">',
             f"<title>{escape(title(line))}</title>",
             f'<rect width="{width}" height="{height}" fill="{BACKGROUND}"/>']
    y = _ROW
    if line.earlier:
        left = _LEFT + _CHAR * (len("earlier") + 1)
        parts.append(f'<rect x="{left}" y="{y - 16}" width="{width - left - _LEFT}" '
                     f'height="{_ROW * (len(line.earlier) - 1) + 23}" fill="{FREED_FILL}"/>')
    for i, row in enumerate(line.earlier):
        parts.append(_event(columns, y, "earlier" if i == 0 else "", row, line.carrier, FADED))
        y += _ROW
    crossing = f"`{line.carrier}` {'saved before the change' if line.inplace else 'crosses'}"
    y += 2
    parts.append(f'<text x="{columns.code}" y="{y}" fill="{ACCENT}" font-weight="bold">{escape(crossing)}</text>')
    parts.append(f'<line x1="{_LEFT}" y1="{y + 6}" x2="{width - _LEFT}" y2="{y + 6}" stroke="{ACCENT}" '
                 f'stroke-width="2" stroke-dasharray="6 4"/>')
    y += _ROW + 4
    for i, row in enumerate(line.now):
        parts.append(_event(columns, y, "now" if i == 0 else "", row, line.carrier, INK))
        y += _ROW
    if line.fix_at is not None:
        parts.append(f'<text y="{y}" fill="{ACCENT}">{_cells(columns, "fix", line.fix_at, "edits here")}</text>')
    parts.append("</svg>")
    return "".join(parts)


def title(line: Timeline) -> str:
    """The picture in one sentence: its SVG title, and the alt text where it is an image."""
    if line.inplace:
        return f"`{line.carrier}` was saved for this backward, then changed in place"
    if any(r.role == "passes" for r in line.now):
        return f"`{line.carrier}` keeps the graphs of earlier iterations, which no backward goes through again"
    if any(r.role == "walks" for r in line.now):
        return f"`{line.carrier}` keeps the graphs of earlier iterations, and this backward goes through them all again"
    return f"`{line.carrier}` carries history from before the earlier backward into this one"


def _event(columns: _Columns, y: int, part: str, row: Row, carrier: str, colour: str) -> str:
    says = _SAYS[row.role].format(carrier=carrier)
    return (f'<text y="{y}" fill="{colour}">{_cells(columns, part, row.where, row.code)}'
            f'<tspan x="{columns.says}" font-style="italic">{escape(says)}</tspan></text>')


def _cells(columns: _Columns, part: str, where: str, code: str) -> str:
    """One row's first three columns as tspans; a column is placed by its own x, so that the
    spaces between them need no preserving."""
    return (f'<tspan x="{_LEFT}">{escape(part)}</tspan>' if part else "") + \
        (f'<tspan x="{columns.row_right}" text-anchor="end">{escape(where)}</tspan>'
         f'<tspan x="{columns.code}">{escape(code)}</tspan>')
