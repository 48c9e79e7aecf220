"""Colour for text a terminal shows: whether to use it, and the styles `check`'s text uses."""
from __future__ import annotations

import os

_CODES = {"bold": "1", "red": "31", "green": "32", "yellow": "33", "blue": "34", "cyan": "36"}


def colors_wanted(stream) -> bool:
    """NO_COLOR (no-color.org) turns colour off whatever else is set; FORCE_COLOR (any value
    but empty, 0 or false) turns it on; otherwise colour only on a terminal that is not dumb."""
    if os.environ.get("NO_COLOR"):
        return False
    forced = os.environ.get("FORCE_COLOR")
    if forced is not None and forced != "":
        return forced.lower() not in ("0", "false")
    return hasattr(stream, "isatty") and stream.isatty() and os.environ.get("TERM") != "dumb"


class Painter:
    """`paint(text, "bold", "red")`: the text in those styles, or as it is when colour is off."""

    def __init__(self, on: bool) -> None:
        self.on = on

    def __call__(self, text: str, *styles: str) -> str:
        if not self.on or not styles or not text:
            return text
        return f"\x1b[{';'.join(_CODES[s] for s in styles)}m{text}\x1b[0m"
