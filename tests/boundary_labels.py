"""What a finding's boundary picture must show, read from the finding's JSON, and what its text
and SVG drawings leave out (tests/test_diagram.py, tests/test_samples.py), and what is wrong with
the picture a browser decoded (the JupyterLab and VS Code end-to-end tests)."""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from explainer.model import Finding
from explainer.render import diagram


def labels(data: dict) -> list[str]:
    """The carrier (the tensor the graph saved, `made`, where a module made to write in place is the
    carrier), each call's `row  code` (a statement over several lines read as one line, without
    its comments, cut at 72 characters), and `row  edits here` for the first line fixes[0] edits in the
    finding's file."""
    evidence = data["evidence"]
    sites = [evidence["made_at"], evidence["freed_by"], *evidence["steps"], evidence["backward"]]
    made = dict(evidence.get("facts", ())).get("made")
    found = [f"`{made if isinstance(made, str) else evidence['carrier']}`"]
    found += [f"{site['row']}  {_one_line(site['code'])}" for site in sites if site is not None]
    rows = [e["location"]["row"] for e in data["fixes"][0]["edits"] if e["filename"] == data["filename"]] \
        if data["fixes"] else []
    if rows:
        found.append(f"{min(rows)}  edits here")
    return found


def missing(data: dict, drawn_from: Finding | None = None) -> list[str]:
    """The labels of `data` that the text or the SVG drawing of its timeline (or of
    `drawn_from`'s) does not show ([] when there is no timeline to draw)."""
    drawn = diagram.timeline(drawn_from or Finding.from_json(data))
    if drawn is None:
        return []
    text = _squeezed("\n".join(diagram.text(drawn)))
    # A row of the SVG is a <text> of tspans, one per column: read as columns apart.
    shown = [_squeezed("  ".join(t.strip() for t in e.itertext() if t.strip()))
             for e in ET.fromstring(diagram.svg(drawn)).iter() if e.tag.endswith("text")]
    return [f"text: {label}" for label in labels(data) if label not in text] + \
        [f"svg: {label}" for label in labels(data) if not any(label in s for s in shown)]


def _one_line(code: str) -> str:
    lines = code.splitlines()
    joined = " ".join(" ".join(lines).split())
    if len(lines) > 1:  # the samples' comments hold no "#" in a string
        joined = " ".join(" ".join(line.split("#", 1)[0] for line in lines).split())
        # Lines are joined with no space inside brackets.
        joined = re.sub(r"([(\[{]) ", r"\1", re.sub(r" ([)\]}])", r"\1", joined))
    # A long statement is drawn as its first 71 characters and an ellipsis.
    return joined if len(joined) <= 72 else joined[:71].rstrip() + "…"


def _squeezed(text: str) -> str:
    return re.sub(r" {2,}", "  ", text)


def contrast(first: str, second: str) -> float:
    """WCAG 2 contrast of two `#rrggbb` colours."""
    def luminance(colour: str) -> float:
        channels = [int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
        linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
        return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]

    light, dark = sorted((luminance(first), luminance(second)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def decoded_problems(picture: dict, alt: str) -> list[str]:
    """What is wrong with one picture as tests/editors/pictures.py reads it from a browser: not
    decoded, squeezed, not the alt text expected, or missing one of the diagram's colours (a
    colour counts where at least 20 pixels have it exactly)."""
    problems = []
    if not (picture["natural"][0] > 300 and picture["natural"][1] > 100):
        problems.append(f"decoded at {picture['natural']}")
    if picture["shown"] != picture["natural"]:
        problems.append(f"shown at {picture['shown']}, drawn at {picture['natural']}")
    if picture["alt"] != alt:
        problems.append(f"alt {picture['alt']!r}")
    drawn = {colour for colour, pixels in picture["colours"].items() if pixels >= 20}
    palette = {diagram.BACKGROUND, diagram.FREED_FILL, diagram.INK, diagram.FADED, diagram.ACCENT}
    problems.extend(f"no {colour}" for colour in sorted(palette - drawn))
    return problems
