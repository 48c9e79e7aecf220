"""Run the rules over files: `# noqa` suppressions, --select / --ignore, folders walked."""
from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .. import source as src
from .diagnostic import Diagnostic
from .module import CheckedModule
from .rules import RULES

_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*))?", re.I)
_SKIPPED_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", ".tox", ".mypy_cache", "build", "dist"}


@dataclass
class Report:
    diagnostics: list[Diagnostic] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def check_text(text: str, filename: str, select: Iterable[str] | None = None,
               ignore: Iterable[str] | None = None) -> list[Diagnostic]:
    """Diagnostics for one file's text. Raises SyntaxError/ValueError when it does not parse."""
    module = CheckedModule(src.parse(filename, text))
    wanted = [r for r in RULES if _enabled(r.CODE, select, ignore)]
    found = [d for rule in wanted for d in rule.check(module)]
    found = [d for d in found if not _suppressed(d, module.source)]
    unique = {(d.code, d.location, d.end_location): d for d in found}
    return sorted(unique.values(), key=lambda d: (d.location.row, d.location.column, d.code))


def check_paths(paths: Iterable[str], select=None, ignore=None) -> Report:
    report = Report()
    for path in _files(paths, report):
        try:
            text = _read(path)
        except (OSError, UnicodeDecodeError, SyntaxError) as error:
            report.errors.append(f"{path}: cannot read: {error}")
            continue
        try:
            report.diagnostics.extend(check_text(text, str(path), select, ignore))
        except (SyntaxError, ValueError) as error:
            report.errors.append(f"{path}: cannot parse: {error}")
    return report


def _read(path: Path) -> str:
    """Decode as Python does: the PEP 263 coding cookie, UTF-8 otherwise."""
    raw = path.read_bytes()
    encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    return raw.decode(encoding)


def _files(paths: Iterable[str], report: Report) -> Iterator[Path]:
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            for child in sorted(path.rglob("*.py")):
                if not any(part in _SKIPPED_DIRS or part.startswith(".") for part in child.relative_to(path).parts[:-1]):
                    yield child
        elif path.is_file() and path.suffix == ".ipynb":
            report.errors.append(f"{path}: notebooks are not checked yet")
        elif path.is_file():
            yield path
        else:
            report.errors.append(f"{path}: no such file or directory")


def _enabled(code: str, select, ignore) -> bool:
    if select and not any(code.startswith(prefix) for prefix in select):
        return False
    return not (ignore and any(code.startswith(prefix) for prefix in ignore))


def _suppressed(diagnostic: Diagnostic, source: src.Source) -> bool:
    match = _NOQA.search(source.line(diagnostic.location.row))
    if match is None:
        return False
    codes = match.group("codes")
    return codes is None or diagnostic.code in {c.strip().upper() for c in codes.split(",")}
