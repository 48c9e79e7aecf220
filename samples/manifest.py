"""What each sample expects, read from its header comments.

A buggy sample `NAME.py` declares `# expect-kind: KIND` and `# expect-culprit: NAME`, and marks
the culprit line with a trailing `# culprit`; its fixed twin is `NAME_fixed.py`. Where the
culprit autograd names differs on a GPU, `# expect-culprit-cuda: NAME` says what it is there.
Used by samples/validate.py and the test suite.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
_HEADER = re.compile(r"^# expect-(kind|culprit|culprit-cuda): *(.+?) *$", re.M)


@dataclass(frozen=True)
class Sample:
    path: Path
    kind: str  # a Finding kind, or "none" for scripts that run clean
    culprit: str | None
    culprit_row: int | None
    fixed: Path | None
    culprit_on_cuda: str | None = None  # where it differs from `culprit`

    @property
    def name(self) -> str:
        return self.path.stem

    def culprit_on(self, device: str) -> str | None:
        """The expected culprit when the sample runs on `device` ("cpu", "cuda", "cuda:1")."""
        if device.startswith("cuda") and self.culprit_on_cuda:
            return self.culprit_on_cuda
        return self.culprit


def load(path: Path) -> Sample:
    text = path.read_text(encoding="utf-8")
    headers = dict(_HEADER.findall(text))
    rows = [i for i, line in enumerate(text.splitlines(), 1) if line.rstrip().endswith("# culprit")]
    twin = path.with_name(f"{path.stem}_fixed.py")
    return Sample(path, headers.get("kind", "none"), headers.get("culprit"),
                  rows[0] if rows else None, twin if twin.exists() else None, headers.get("culprit-cuda"))


def samples() -> list[Sample]:
    return [load(p) for p in sorted(HERE.glob("*.py"))
            if not p.stem.startswith("_") and not p.stem.endswith("_fixed")
            and p.stem not in ("manifest", "validate")]
