"""What each sample expects, read from its header comments.

A buggy sample `NAME.py` declares `# expect-kind: KIND` and `# expect-culprit: NAME`, and marks
the culprit line with a trailing `# culprit`; its fixed twin is `NAME_fixed.py`, and any
`NAME_fixed_WHY.py` is a second fix that is just as right. Where the culprit autograd names
differs on a GPU, `# expect-culprit-cuda: NAME` says what it is there. `samples()` are the
scenarios written here; `real_cases()` those reconstructed from public reports (samples/real/);
`library_cases()` training code run by libraries (accelerate, Lightning, the HF Trainer) (samples/libraries/).
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
    alternatives: tuple[Path, ...] = ()  # other twins whose fix is just as right

    @property
    def name(self) -> str:
        """The stem, under its folder for the real-world cases: `real/NAME`."""
        return self.path.relative_to(HERE).with_suffix("").as_posix()

    @property
    def twins(self) -> tuple[Path, ...]:
        """Every right fix of this script: a fix is right when it trains what one of these trains."""
        return ((self.fixed,) if self.fixed else ()) + self.alternatives

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
    alternatives = tuple(sorted(path.parent.glob(f"{path.stem}_fixed_*.py")))
    return Sample(path, headers.get("kind", "none"), headers.get("culprit"),
                  rows[0] if rows else None, twin if twin.exists() else None, headers.get("culprit-cuda"),
                  alternatives)


def _scripts(folder: Path) -> list[Sample]:
    return [load(p) for p in sorted(folder.glob("*.py"))
            if not p.stem.startswith("_") and "_fixed" not in p.stem
            and p.stem not in ("manifest", "validate", "trained")]


def samples() -> list[Sample]:
    """The scenarios written for this project, beside this file."""
    return _scripts(HERE)


def real_cases() -> list[Sample]:
    """Cases reconstructed from public code and reports, in samples/real/."""
    return _scripts(HERE / "real")


def library_cases() -> list[Sample]:
    """Training code run by libraries (accelerate, Lightning, the HF Trainer), in samples/libraries/: their frames
    are never the user's."""
    return _scripts(HERE / "libraries")
