"""What a finding's boundary picture must show, read from the finding's JSON, and what its text
and SVG drawings leave out (tests/test_diagram.py, tests/test_samples.py)."""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from explainer.model import Finding
from explainer.render import diagram


def labels(data: dict) -> list[str]:
    """The carrier, each call's `row  code`, and `row  edits here` for the first line fixes[0]
    edits in the finding's file."""
    evidence = data["evidence"]
    sites = [evidence["made_at"], evidence["freed_by"], *evidence["steps"], evidence["backward"]]
    found = [f"`{evidence['carrier']}`"]
    found += [f"{site['row']}  {_squeezed(site['code'])}" for site in sites if site is not None]
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
    shown = [_squeezed("".join(e.itertext())) for e in ET.fromstring(diagram.svg(drawn)).iter()
             if e.tag.endswith("text")]
    return [f"text: {label}" for label in labels(data) if label not in text] + \
        [f"svg: {label}" for label in labels(data) if not any(label in s for s in shown)]


def _squeezed(text: str) -> str:
    return re.sub(r" {2,}", "  ", text)
