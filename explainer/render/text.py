"""Plain-text rendering: the PEP 678 note on the exception, and stderr for `explainer run`."""
from __future__ import annotations

from ..model import Finding, Fix
from ..places import place
from . import diagram

RULE = "─" * 72


def render_note(finding: Finding) -> str:
    lines = [RULE, f"[explainer] {headline(finding)}: {finding.summary}", "", *_wrap(finding.message), ""]
    for culprit in finding.culprits:
        lines.append(f"  {culprit.name}  ({culprit.role})")
        lines.append(f"    {place(culprit.filename, culprit.location.row)}: {culprit.source_line}")
    if finding.backward:
        lines.append(f"  backward  {place(finding.backward.filename, finding.backward.row)}: {finding.backward.code}")
    drawn = diagram.timeline(finding)
    if drawn is not None:
        lines.extend(["", *diagram.text(drawn)])
    if finding.fixes:
        lines.append("")
        lines.append(f"{fix_lead(finding.fixes[0], True)}: {finding.fixes[0].message}")
        lines.extend("    " + line for line in fix_preview(finding.fixes[0]))
        for other in finding.fixes[1:]:
            lines.append(f"{fix_lead(other, False)}: {other.message}")
    if finding.retain_graph_advice:
        lines.append("")
        lines.extend(_wrap(finding.retain_graph_advice))
    if finding.confidence != "certain":
        lines.append(f"(confidence: {finding.confidence})")
    lines.append(RULE)
    return "\n".join(lines)


def fix_lead(fix: Fix, first: bool) -> str:
    """`Fix` for the preferred fix, `Or` for the others, saying so when the fix is not proven
    safe: it may crash, or change what the current step trains."""
    word = "Fix" if first else "Or"
    return word if fix.applicability == "safe" else f"{word} (unsafe: it may change what trains)"


def headline(finding: Finding) -> str:
    """`second-backward (BX001 carried-state)`: the error's kind, then the cause's code and name."""
    *kind, cause = tags(finding)
    return f"{kind[0]} ({cause})" if kind else cause


def tags(finding: Finding) -> tuple[str, ...]:
    """The error's kind (`second-backward`), if there is one, and the cause (`BX001 carried-state`)."""
    cause = f"{finding.code} {finding.cause.name}"
    return (finding.kind, cause) if finding.kind else (cause,)


def fix_preview(fix: Fix, context: int = 1) -> list[str]:
    """The fix as a diff of the file's own lines: per hunk a `file:row` line (the first changed
    row), then `context` unchanged lines around the change (`  `), the removed (`- `) and the
    added ones (`+ `), each where the edit puts it."""
    import difflib

    from ..fixes.edits import apply_edits
    from ..reading.source import load

    lines: list[str] = []
    by_file: dict[str, list] = {}
    for edit in fix.edits:
        by_file.setdefault(edit.filename, []).append(edit)
    for filename, edits in by_file.items():
        source = load(filename)
        if source is None:
            continue
        before = [line.rstrip("\r\n") for line in source.lines]
        after = apply_edits(source.text, edits).splitlines()
        matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
        for hunk in matcher.get_grouped_opcodes(context):
            changed = next(i1 for tag, i1, _, _, _ in hunk if tag != "equal")
            lines.append(place(filename, changed + 1))
            for tag, i1, i2, j1, j2 in hunk:
                if tag == "equal":
                    lines.extend(f"  {line}" for line in before[i1:i2])
                    continue
                lines.extend(f"- {line}" for line in before[i1:i2])
                lines.extend(f"+ {line}" for line in after[j1:j2])
    return lines


def _wrap(text: str, width: int = 96) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width) or [""]
