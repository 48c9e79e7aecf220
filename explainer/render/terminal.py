"""Rich terminal rendering (IPython in a terminal), when `rich` is installed."""
from __future__ import annotations

from rich.console import Console, Group
from rich.panel import Panel
from rich.text import Text

from ..model import Finding
from . import diagram
from .text import fix_lead, fix_preview, headline


def render_rich(finding: Finding, file) -> None:
    console = Console(file=file, highlight=False)
    parts = [Text(finding.summary, style="bold"), Text(""), Text(finding.message)]
    for culprit in finding.culprits:
        parts.append(Text.assemble(("  " + culprit.name, "bold red"), f"  ({culprit.role})"))
        parts.append(Text(f"    line {culprit.location.row}: {culprit.source_line}", style="dim"))
    drawn = diagram.timeline(finding)
    if drawn is not None:
        # the earlier, freed part faded; the crossing marked; the fix's line bold
        styles = ["dim"] * len(drawn.earlier) + ["bold red"] + [""] * len(drawn.now) + ["bold"]
        parts.append(Text(""))
        parts.extend(Text(line, style=style) for line, style in zip(diagram.text(drawn), styles))
    if finding.fixes:
        parts.append(Text(""))
        parts.append(Text(f"{fix_lead(finding.fixes[0], True)}: {finding.fixes[0].message}", style="bold green"))
        for line in fix_preview(finding.fixes[0]):
            style = "green" if line.startswith("+ ") else "red" if line.startswith("- ") else "dim"
            parts.append(Text("    " + line, style=style))
    if finding.retain_graph_advice:
        parts.append(Text(""))
        parts.append(Text(finding.retain_graph_advice, style="yellow"))
    if finding.confidence != "certain":
        parts.append(Text(f"(confidence: {finding.confidence})", style="dim"))
    border = "red" if finding.severity == "error" else "yellow"
    console.print(Panel(Group(*parts), title=f"explainer: {headline(finding)}", border_style=border))
