"""`python -m explainer run [--json OUT] SCRIPT [ARGS...]` (see CONTRACT.md)."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import runpy
import sys

from . import __version__


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m explainer",
        description="Explain PyTorch's 'backward through the graph a second time' errors.",
    )
    parser.add_argument("--version", action="version", version=f"explainer {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser(
        "run", help="run a script with the explainer installed",
        description="Run SCRIPT as `python SCRIPT ARGS...` would, with the explainer installed.",
    )
    run.add_argument("--json", metavar="OUT", help="write the findings as JSON to OUT (always written)")
    run.add_argument("script", metavar="SCRIPT")
    run.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS")
    check = commands.add_parser(
        "check", help="find graph-history bugs in source, without running it",
        description="Static analysis of .py files and .ipynb notebooks (folders are walked). "
                    "Never imports or runs them.",
    )
    check.add_argument("paths", nargs="+", metavar="PATH")
    check.add_argument("--format", choices=["text", "json", "sarif"], default="text")
    check.add_argument("--fix", action="store_true", help="apply the safe fixes in place, then report what is left")
    check.add_argument("--unsafe-fixes", action="store_true",
                       help="with --fix or --diff, apply the unsafe fixes too (shown as `unsafe fix`)")
    check.add_argument("--diff", action="store_true",
                       help="print the changes --fix would make as a unified diff, and write nothing")
    check.add_argument("--statistics", action="store_true", help="print how many diagnostics of each code")
    check.add_argument("--select", type=_codes, help="only these codes (comma-separated prefixes)")
    check.add_argument("--ignore", type=_codes, help="skip these codes (comma-separated prefixes)")
    rule = commands.add_parser("rule", help="show a rule's documentation")
    rule.add_argument("code", metavar="CODE")
    return parser


def _codes(text: str) -> list[str]:
    """Comma-separated code prefixes, each of at least one known code: a typo in `--select`
    would otherwise silently check nothing."""
    from .causes import BY_CODE

    codes = [c.strip().upper() for c in text.split(",") if c.strip()]
    unknown = [c for c in codes if not any(known.startswith(c) for known in BY_CODE)]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown rule code {unknown[0]!r}; known: {', '.join(sorted(BY_CODE))}")
    return codes


def main(argv: list[str] | None = None) -> int:
    options = _parser().parse_args(argv)
    if options.command == "run":
        return run(options.script, options.args, options.json)
    if options.command == "check":
        return check(options.paths, options.format, options.select, options.ignore, options.fix,
                     options.unsafe_fixes, options.diff, options.statistics)
    return show_rule(options.code)


def check(paths: list[str], output: str, select, ignore, fix: bool = False, unsafe_fixes: bool = False,
          diff: bool = False, statistics: bool = False) -> int:
    from .render.ansi import colors_wanted
    from .render.diagnostics import render_json, render_statistics, render_text
    from .render.sarif import render_sarif
    from .static.check import Fixing, check_paths

    fixing = Fixing(unsafe=unsafe_fixes, write=not diff) if fix or diff else None
    report = check_paths(paths, select, ignore, fixing or False)
    if diff:
        rendered = "".join(report.diffs).rstrip("\n")
        fixes = f"{report.fixed} fix{'es' if report.fixed != 1 else ''}"
        summary = f"Would apply {fixes}." if report.fixed else "No fixes would be applied."
        rendered = f"{rendered}\n\n{summary}" if rendered else summary
    elif statistics:
        rendered = render_statistics(report.diagnostics, unsafe_fixes)
    elif output == "json":
        rendered = render_json(report.diagnostics)
    elif output == "sarif":
        rendered = render_sarif(report.diagnostics)
    else:
        rendered = render_text(report.diagnostics, report.line, fixed=report.fixed if fix else None,
                               unchecked=len(report.errors), unsafe_fixes=unsafe_fixes,
                               color=colors_wanted(sys.stdout))
    try:
        print(rendered)
        sys.stdout.flush()
    except BrokenPipeError:  # `explainer check ... | head`: the reader left, which is fine
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    for error in report.errors:
        print(f"explainer: {error}", file=sys.stderr)
    if report.errors:
        return 2
    if diff:
        return 1 if report.diffs else 0
    return 1 if report.diagnostics else 0


def show_rule(code: str) -> int:
    from .causes import BY_CODE

    cause = BY_CODE.get(code.upper())
    if cause is None:
        print(f"explainer: unknown rule {code!r}; known: {', '.join(sorted(BY_CODE))}", file=sys.stderr)
        return 2
    print(cause.doc_page().rstrip("\n"))
    return 0


def run(script: str, args: list[str], json_out: str | None) -> int:
    problem = _unwritable(json_out)
    if problem is not None:  # said before the script runs: a long training must not end in this
        print(f"explainer: can't write --json {json_out!r}: {problem}", file=sys.stderr)
        return 2
    if not os.path.isfile(script):
        print(f"explainer: can't open file {script!r}: no such file", file=sys.stderr)
        _write_json(json_out, [])
        return 2
    from . import notes
    from .runtime import journal, lazy

    lazy.install_when_torch_is_imported(notes.install_or_say_why_not)
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    code, error = 0, None
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        code = _exit_code(exit_.code)
    except BaseException as uncaught:  # noqa: BLE001 (reported exactly as Python would)
        error = uncaught
        code = 1
        _strip_own_frames(uncaught)
        sys.excepthook(type(uncaught), uncaught, uncaught.__traceback__)
    finally:
        sys.stdout.flush()
    findings = journal.warnings()
    explained = journal.finding_for(error)
    if explained is not None:
        findings.append(explained)
    error = None
    _write_json(json_out, findings)
    from . import handoff

    handoff.publish(os.path.abspath(script), findings, where=os.path.dirname(os.path.abspath(script)))
    return code


def _exit_code(value) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)
    return 1


def _unwritable(path: str | None) -> str | None:
    """Why `--json PATH` cannot be written, or None."""
    if not path:
        return None
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return "it is a folder"
    if not os.path.isdir(folder):
        return f"no folder {folder}"
    if not os.access(folder, os.W_OK):
        return f"the folder {folder} is not writable"
    return None


def _write_json(path: str | None, findings) -> None:
    """Write OUT; if that fails now (the folder went away while the script ran), say so in one
    line and leave the exit code the script's."""
    if not path:
        return
    document = {"version": 1, "findings": [f.to_json() for f in findings]}
    temporary = f"{path}.tmp{os.getpid()}"
    try:
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=2)
            handle.write("\n")
        os.replace(temporary, path)
    except OSError as error:
        print(f"explainer: can't write --json {path!r}: {error.strerror or error}", file=sys.stderr)
        with contextlib.suppress(OSError):
            os.unlink(temporary)


def _is_own(tb) -> bool:
    """A frame this runner or the hooks added: python SCRIPT would not show it."""
    from .runtime.records import PACKAGE_DIR

    return tb.tb_frame.f_code.co_filename.startswith((PACKAGE_DIR, runpy.__file__, "<frozen runpy"))


def _strip_own_frames(error: BaseException) -> None:
    """Drop this runner's and the hooks' frames, so the traceback reads as `python SCRIPT`."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        tb = error.__traceback__
        while tb is not None and _is_own(tb):
            tb = tb.tb_next
        head = tb
        while tb is not None:
            following = tb.tb_next
            while following is not None and _is_own(following):
                following = following.tb_next
            tb.tb_next = following
            tb = following
        error.__traceback__ = head
        error = error.__cause__ or error.__context__
