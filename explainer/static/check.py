"""Run the rules over files: `# noqa` suppressions, --select / --ignore, folders walked,
notebooks as one module of their code cells, and `--fix`."""
from __future__ import annotations

import difflib
import gc
import io
import re
import sys
import threading
import tokenize
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..fixes.edits import apply_edits
from ..model import Evidence, Finding, Fix, Location
from ..reading import source as src
from ..reading.notebook import Notebook, NotebookError, without_unparseable_cells
from ..reading.reparse import Reparser
from .module import CheckedModule
from .rules import BY_CODE, RULES

# A noqa comment, bare or naming codes (BX001, BX006); editors add one with `editor.noqa_edit`.
NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*))?", re.I)
_SKIPPED_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", ".tox", ".mypy_cache", "build", "dist",
                 ".ipynb_checkpoints"}
_FIX_PASSES = 8
_MAY_TRAIN = re.compile(r"backward|forward|autograd")


@dataclass(frozen=True)
class Fixing:
    """What `--fix` does: which fixes it applies (`unsafe` too with --unsafe-fixes), and whether
    it writes the files or only reports the change as a diff (`--diff`)."""

    unsafe: bool = False
    write: bool = True

    def accepts(self, fix: Fix) -> bool:
        return fix.applicability == "safe" or self.unsafe and fix.applicability == "unsafe"


@dataclass
class Report:
    diagnostics: list[Finding] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    fixed: int = 0
    # --diff: a unified diff per file the fixes would change, in the order the files were read.
    diffs: list[str] = field(default_factory=list)
    # What the text renderer quotes: the lines of each file with diagnostics, by (file, cell).
    lines: dict[tuple[str, int | None], list[str]] = field(default_factory=dict)

    def line(self, diagnostic: Finding) -> str | None:
        lines = self.lines.get((diagnostic.filename, diagnostic.cell), [])
        row = diagnostic.location.row
        return lines[row - 1].rstrip("\r\n") if 0 < row <= len(lines) else None


def check_text(text: str, filename: str, select: Iterable[str] | None = None,
               ignore: Iterable[str] | None = None, reparser: Reparser | None = None) -> list[Finding]:
    """Findings for one file's text. Raises SyntaxError/ValueError when it does not parse.
    `reparser`: the document's, when the text is a new version of one (an editor's buffer)."""
    if not _MAY_TRAIN.search(text):
        src.parse_tree(text, filename)  # every rule needs a backward call or a module's forward
        return []
    with collector_paused():
        return _check_parsed(text, filename, select, ignore, reparser)


def _check_parsed(text, filename, select, ignore, reparser) -> list[Finding]:
    parsed = reparser.parse(filename, text) if reparser is not None else src.parse(filename, text)
    module = CheckedModule(parsed)  # at most src.MAX_DEPTH deep
    wanted = [r for r in RULES if _enabled(r.CODE, select, ignore)]
    try:
        with recursion_headroom():
            found = [d for rule in wanted for d in rule.check(module)]
            found = _fixes_checked(found, text, filename)
        found = [d for d in found if not _suppressed(d, module.source)]
    finally:
        # Diagnostics are plain data: nothing refers to the tree now.
        if reparser is not None:
            reparser.forget_findings()
        else:
            src.dispose(module.tree)
    unique = {(d.code, d.location, d.end_location): d for d in found}
    return sorted(unique.values(), key=lambda d: (d.location.row, d.location.column, d.code))


def _fixes_checked(found: list[Finding], text: str, filename: str) -> list[Finding]:
    """The findings, each safe fix checked by its own rule on the fixed text: one that leaves as
    many of that rule's findings as before (tianshou's second critic recomputed, while the actor's
    loss still reads both critics' stale Q values) is not the whole fix, and is offered as unsafe."""
    before = Counter(d.code for d in found)
    checked = []
    for finding in found:
        fix = finding.fix
        if fix is not None and fix.applicability == "safe" and not _fewer_after(finding.code, fix, text, filename,
                                                                                before[finding.code]):
            finding = replace(finding, fixes=(fix.unproven(), *finding.fixes[1:]))
        checked.append(finding)
    return checked


def _fewer_after(code: str, fix: Fix, text: str, filename: str, before: int) -> bool:
    try:
        fixed = src.parse(filename, apply_edits(text, fix.edits))
    except (SyntaxError, ValueError):
        return False
    try:
        return sum(1 for _ in BY_CODE[code].check(CheckedModule(fixed))) < before
    finally:
        src.dispose(fixed.tree)


@contextmanager
def collector_paused():
    """No garbage collection while a check runs: a check allocates tens of thousands of AST
    nodes, and the collections they trigger took a fifth of `explainer check`'s time and were
    most of an editor's tail latency. The trees are freed by reference counting
    (`source.dispose`), so nothing piles up meanwhile."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# Recursion the rules may need beyond the caller's own frames: ast.unparse takes three frames per
# level of a tree at most src.MAX_DEPTH deep, the rules' own recursion is bounded (has_history
# follows 8 steps). Python 3.11 runs Python-to-Python calls without growing the C stack, so a
# higher limit for these frames is safe (tests/test_fuzz.py checks every chain shape at the cap,
# in a worker thread too, as the language server runs checks).
_HEADROOM = 5 * src.MAX_DEPTH
_headroom_lock = threading.Lock()
_headroom_users = 0
_limit_before: int | None = None


@contextmanager
def recursion_headroom():
    """sys.setrecursionlimit raised for the rules while any thread runs them, then put back."""
    global _headroom_users, _limit_before
    with _headroom_lock:
        if _headroom_users == 0:
            _limit_before = sys.getrecursionlimit()
            sys.setrecursionlimit(_limit_before + _HEADROOM)
        _headroom_users += 1
    try:
        yield
    finally:
        with _headroom_lock:
            _headroom_users -= 1
            if _headroom_users == 0 and sys.getrecursionlimit() == _limit_before + _HEADROOM:
                sys.setrecursionlimit(_limit_before)


def check_paths(paths: Iterable[str], select=None, ignore=None, fix: bool | Fixing = False) -> Report:
    """Check every file under `paths`. `fix`: apply fixes first (True: the safe ones, written)."""
    report = Report()
    fixing = Fixing() if fix is True else fix or None
    for path in _files(paths, report):
        try:
            _check_file(path, report, select, ignore, fixing)
        except Exception as error:  # noqa: BLE001 (the one per-file boundary: report, go on)
            # A checker bug must not cost the other files their check; it is an internal error
            # (exit code 2), named with the file so it can be reported (tests/test_fuzz.py fails
            # on any of these).
            report.errors.append(f"{path}: internal error: {type(error).__name__}: {_one_line(error)}")
    return report


def _check_file(path: Path, report: Report, select, ignore, fix: Fixing | None) -> None:
    try:
        raw = _read(path)
    except (OSError, UnicodeError, SyntaxError) as error:  # UnicodeError: also the punycode codec's
        report.errors.append(f"{path}: cannot read: {_one_line(error)}")
        return
    if path.suffix == ".ipynb":
        _check_notebook(path, raw, report, select, ignore, fix)
        return
    try:
        if fix:
            raw = _fix_file(path, raw, report, select, ignore, lambda text: text, fix)
        found = check_text(raw, str(path), select, ignore)
    except (SyntaxError, ValueError) as error:
        if not isinstance(error, SyntaxError) or error.lineno is None:
            # Code Python parses but nests deeper than the rules can follow: not the user's error.
            report.errors.append(f"{path}: cannot parse: {_one_line(error)}")
        elif _enabled("BX000", select, ignore):
            report.diagnostics.append(does_not_parse(str(path), error.lineno, error.offset or 1, error.msg))
            report.lines[(str(path), None)] = list(src.split_lines(raw))
        return
    if found:
        report.diagnostics.extend(found)
        report.lines[(str(path), None)] = list(src.split_lines(raw))  # the rows the AST counts


def _check_notebook(path: Path, raw: str, report: Report, select, ignore, fix: Fixing | None) -> None:
    try:
        notebook = _parseable_notebook(path, raw, report, select=select, ignore=ignore)
    except NotebookError as error:
        report.errors.append(f"{path}: {_one_line(error)}")
        return
    try:
        if fix and notebook.text:
            try:
                fixed_json = _fix_file(path, notebook.text, report, select, ignore, notebook.with_text, fix)
                notebook = _parseable_notebook(path, fixed_json, report, quiet=True)
            except NotebookError as error:
                report.errors.append(f"{path}: not fixed: {_one_line(error)}")
        found = [notebook.to_cells(d) for d in check_text(notebook.text, str(path), select, ignore)]
    except (SyntaxError, ValueError) as error:  # the cells parse, but nest too deeply to check
        report.errors.append(f"{path}: cannot parse: {_one_line(error)}")
        return
    report.diagnostics.extend(found)
    for cell in {d.cell for d in found}:
        report.lines[(str(path), cell)] = notebook.cell_lines(cell)


def _parseable_notebook(path: Path, raw: str, report: Report, quiet: bool = False,
                        select=None, ignore=None) -> Notebook:
    """The notebook with cells that don't parse left out (each reported as BX000)."""
    notebook, skipped = without_unparseable_cells(lambda hidden: Notebook.read(str(path), raw, hidden))
    if not quiet and _enabled("BX000", select, ignore):
        for cell in skipped:
            report.diagnostics.append(replace(does_not_parse(str(path), cell.row, cell.column, cell.message),
                                              cell=cell.cell))
            report.lines[(str(path), cell.cell)] = notebook.cell_lines(cell.cell)
    return notebook


def does_not_parse(filename: str, row: int, column: int, message: str) -> Finding:
    """The BX000 diagnostic of code that does not parse, at the parser's position."""
    return Finding("BX000", "syntax", filename, Location(row, column), Location(row, column + 1),
                   Evidence(facts=(("error", message),)))


def _fix_file(path: Path, text: str, report: Report, select, ignore, serialize, fixing: Fixing) -> str:
    """Apply the fixes `fixing` accepts to `text` (a module); write `serialize(text)` back to
    `path` when something changed, or with --diff record the change. Returns the fixed
    `serialize(text)`, as written (with --diff, as it would be)."""
    fixed_text, fixed = apply_safe_fixes(text, str(path), select, ignore, fixing=fixing)
    written = serialize(fixed_text)
    if fixed_text != text:
        report.fixed += fixed
        if fixing.write:
            path.write_text(written, encoding="utf-8")
        else:
            name = str(path) + (" (code cells)" if path.suffix == ".ipynb" else "")
            report.diffs.append("".join(difflib.unified_diff(
                text.splitlines(keepends=True), fixed_text.splitlines(keepends=True), name, name)))
    return written


def apply_safe_fixes(text: str, filename: str, select=None, ignore=None, accept=None,
                     fixing: Fixing = Fixing()) -> tuple[str, int]:
    """`text` with non-overlapping safe fixes applied (unsafe ones too where `fixing` says so),
    pass after pass until none is left (at most a few passes), and how many were applied. Never
    returns code that does not parse. `accept(text, fix)`, if given, picks which of the fixes
    found in `text` may be applied."""
    fixed = 0
    for _ in range(_FIX_PASSES):
        fixes = _compatible([d.fix for d in check_text(text, filename, select, ignore)
                             if d.fix is not None and fixing.accepts(d.fix)
                             and (accept is None or accept(text, d.fix))])
        if not fixes:
            break
        patched = apply_edits(text, [edit for f in fixes for edit in f.edits])
        try:
            src.parse_tree(patched)
        except (SyntaxError, ValueError):
            break
        text = patched
        fixed += len(fixes)
    return text, fixed


def _compatible(fixes: list[Fix]) -> list[Fix]:
    """Fixes whose edits overlap no earlier chosen fix's edits (the rest wait for the next pass)."""
    chosen, taken = [], []
    for fix in fixes:
        spans = [((e.location.row, e.location.column), (e.end_location.row, e.end_location.column)) for e in fix.edits]
        if any(start < other_end and other_start < end or start == other_start
               for start, end in spans for other_start, other_end in taken):
            continue
        chosen.append(fix)
        taken.extend(spans)
    return chosen


def _read(path: Path) -> str:
    """Decode as Python does: the PEP 263 coding cookie, UTF-8 otherwise (notebooks: UTF-8)."""
    raw = path.read_bytes()
    if path.suffix == ".ipynb":
        return raw.decode("utf-8")
    encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    try:
        return raw.decode(encoding)
    except LookupError:  # a cookie naming a codec that is not a text encoding: `# coding: rot13`
        raise SyntaxError(f"encoding problem: {encoding} is not a text encoding") from None


def _one_line(error: Exception) -> str:
    """An error's message on one line (a codec's message may hold the offending newline)."""
    return " ".join(str(error).split())


def _files(paths: Iterable[str], report: Report) -> Iterator[Path]:
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            for child in sorted([*path.rglob("*.py"), *path.rglob("*.ipynb")]):
                if any(part in _SKIPPED_DIRS or part.startswith(".") for part in child.relative_to(path).parts[:-1]):
                    continue
                if child.is_file():
                    yield child
                elif not child.is_dir():  # a folder named x.py is walked itself
                    report.errors.append(f"{child}: cannot read: {_not_a_file(child)}")
        elif path.is_file():
            yield path
        elif path.exists():
            report.errors.append(f"{path}: cannot read: {_not_a_file(path)}")
        else:
            report.errors.append(f"{path}: no such file or directory")


def _not_a_file(path: Path) -> str:
    """Why `path` is not read: reading a named pipe would wait for a writer forever."""
    return "a broken symbolic link" if path.is_symlink() and not path.exists() else "not a regular file"


def _enabled(code: str, select, ignore) -> bool:
    if select and not any(code.startswith(prefix) for prefix in select):
        return False
    return not (ignore and any(code.startswith(prefix) for prefix in ignore))


def _suppressed(diagnostic: Finding, source: src.Source) -> bool:
    match = NOQA.search(source.line(diagnostic.location.row))
    if match is None:
        return False
    codes = match.group("codes")
    return codes is None or diagnostic.code in {c.strip().upper() for c in codes.split(",")}
