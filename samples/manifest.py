"""What each sample expects, read from its header comments.

A buggy sample `NAME.py` declares `# expect-kind: KIND` and `# expect-culprit: NAME`, and marks
the culprit line with a trailing `# culprit`; its fixed twin is `NAME_fixed.py`. Used by
samples/validate.py and the test suite.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
_HEADER = re.compile(r"^# expect-(kind|culprit): *(.+?) *$", re.M)


@dataclass(frozen=True)
class Sample:
    path: Path
    kind: str  # a Finding kind, or "none" for scripts that run clean
    culprit: str | None
    culprit_row: int | None
    fixed: Path | None

    @property
    def name(self) -> str:
        return self.path.stem


def load(path: Path) -> Sample:
    text = path.read_text(encoding="utf-8")
    headers = dict(_HEADER.findall(text))
    rows = [i for i, line in enumerate(text.splitlines(), 1) if line.rstrip().endswith("# culprit")]
    twin = path.with_name(f"{path.stem}_fixed.py")
    return Sample(path, headers.get("kind", "none"), headers.get("culprit"),
                  rows[0] if rows else None, twin if twin.exists() else None)


def samples() -> list[Sample]:
    return [load(p) for p in sorted(HERE.glob("*.py"))
            if not p.stem.startswith("_") and not p.stem.endswith("_fixed")
            and p.stem not in ("manifest", "validate")]
