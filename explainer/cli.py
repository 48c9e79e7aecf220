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
        usage="python -m explainer run [-h] [--json OUT] [--svg OUT] (SCRIPT | -m MODULE) [ARGS ...]",
        description="Run SCRIPT as `python SCRIPT ARGS...` would (or MODULE as `python -m MODULE ARGS...`), "
                    "with the explainer installed.",
    )
    run.add_argument("--json", metavar="OUT", help="write the findings as JSON to OUT (always written)")
    run.add_argument("--svg", metavar="OUT", help="draw the explained error's boundary as an SVG picture in OUT")
    run.add_argument("-m", dest="module", metavar="MODULE",
                     help="run a module as `python -m` does; what follows it are its arguments")
    run.add_argument("script", metavar="SCRIPT", nargs="?")
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
    argv = sys.argv[1:] if argv is None else list(argv)
    module_at = _module_flag(argv)
    if module_at is not None:
        # As python's own `-m`: everything after MODULE is the module's, options included.
        options = _parser().parse_args(argv[:module_at + 2])
        return run_module(options.module, argv[module_at + 2:], options.json, options.svg)
    parser = _parser()
    options = parser.parse_args(argv)
    if options.command == "run":
        if options.script is None:
            parser.error("run needs SCRIPT or -m MODULE")
        return run(options.script, options.args, options.json, options.svg)
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


def _module_flag(argv: list[str]) -> int | None:
    """The index of `-m` in `run [--json OUT] [--svg OUT] -m MODULE ...`, or None."""
    if not argv or argv[0] != "run":
        return None
    i = 1
    while i < len(argv):
        if argv[i] == "-m":
            return i if i + 1 < len(argv) else None
        if argv[i] in ("--json", "--svg"):
            i += 2
        elif argv[i].startswith(("--json=", "--svg=")):
            i += 1
        else:
            return None
    return None


def run(script: str, args: list[str], json_out: str | None, svg_out: str | None = None) -> int:
    """`python SCRIPT ARGS`, with the explainer installed."""
    if _refused(json_out):
        return 2
    if _refused(svg_out, "--svg"):
        _write_json(json_out, [])
        return 2
    if not os.path.isfile(script):
        print(f"explainer: can't open file {script!r}: no such file", file=sys.stderr)
        _write_json(json_out, [])
        return 2
    launcher = _launcher(script)
    if launcher is not None:
        print(launcher, file=sys.stderr)
        _write_json(json_out, [])
        return 2
    _install()
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    path = os.path.abspath(script)
    return _run_main(lambda: _run_as_main(path), path, json_out, svg_out)


def _run_as_main(path: str) -> None:
    """Run the file as python runs a script: in a fresh `__main__` module whose globals are the
    ones python gives it (`__file__` absolute, the builtins module, a SourceFileLoader,
    `__package__` None), its code compiled under its absolute name, so tracebacks read the same."""
    import builtins
    import importlib.machinery
    import types

    with open(path, "rb") as handle:
        code = compile(handle.read(), path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __cached__=None, __builtins__=builtins,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", path))
    if sys.version_info < (3, 14):  # annotations became lazy (PEP 649): 3.14 makes no dict up front
        main.__dict__["__annotations__"] = {}
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main  # pickling the script's classes (DataLoader workers) finds them
    try:
        exec(code, main.__dict__)  # noqa: S102 - running the user's script is this command's job
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def run_module(module: str, args: list[str], json_out: str | None, svg_out: str | None = None) -> int:
    """`python -m MODULE ARGS`, with the explainer installed: the current folder first on
    sys.path, sys.argv[0] the module's file, a package run through its `__main__`."""
    if _refused(json_out):
        return 2
    if _refused(svg_out, "--svg"):
        _write_json(json_out, [])
        return 2
    _install()
    sys.path[0] = os.getcwd()
    path = _module_file(module)
    if path is None:
        print(f"explainer: no module named {module!r} (from {os.getcwd()})", file=sys.stderr)
        _write_json(json_out, [])
        return 1
    sys.argv = [path, *args]
    return _run_main(lambda: runpy.run_module(module, run_name="__main__", alter_sys=True), path, json_out, svg_out)


def _module_file(module: str) -> str | None:
    """The file `python -m MODULE` runs (a package's `__main__`), or None where there is none.
    Finding it imports MODULE's parent packages, as python does."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
        if spec is not None and spec.submodule_search_locations is not None:
            spec = importlib.util.find_spec(f"{module}.__main__")
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None and spec.origin and os.path.isfile(spec.origin) else None


# Console-script launchers that start the training in other processes, and how to reach them.
_LAUNCHERS = {
    "torch.distributed.run": "torchrun [its options] -m explainer run SCRIPT [ARGS]",
    "accelerate.commands.launch": "accelerate launch [its options] -m explainer run SCRIPT [ARGS]",
    "accelerate.commands.accelerate_cli": "accelerate launch [its options] -m explainer run SCRIPT [ARGS]",
}


def _launcher(script: str) -> str | None:
    """What to say when SCRIPT is a launcher pip made (`torchrun`, `accelerate`): the workers it
    starts are new processes this run never reaches, so it would explain nothing."""
    import re

    try:
        with open(script, "rb") as handle:
            head = handle.read(2048).decode("utf-8", "replace")
    except OSError:
        return None
    made = re.search(r"^from ([\w.]+) import \w+\s*$", head, re.M)
    if made is None or "sys.exit(" not in head or len(head.splitlines()) > 12:
        return None
    instead = _LAUNCHERS.get(made.group(1), f"put `-m explainer run` where {os.path.basename(script)} names your "
                                            "script, or call explainer.install() at the top of it")
    return (f"explainer: {os.path.basename(script)} is a launcher ({made.group(1)}): the training it starts runs "
            f"in other processes, which this run does not reach. Instead: {instead}")


def _install() -> None:
    """The hooks, as soon as the user's code imports torch (before anything of it runs), here and
    in the Python processes the script starts."""
    from . import notes
    from .runtime import lazy

    lazy.install_when_torch_is_imported(notes.install_or_say_why_not)
    _reach_child_processes()


def _reach_child_processes() -> None:
    """Lightning's DDP starts its other ranks as `python SCRIPT`: put the children's start-up
    hook first on PYTHONPATH and name this run, so they are explained too. A worker of a
    launcher (torchrun sets RANK) leaves the naming to its launcher's run id."""
    children = os.path.join(os.path.dirname(os.path.abspath(__file__)), "children")
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if children not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([children, *paths])
    if "RANK" not in os.environ:
        import time

        from .notes import RUN_VARIABLE

        # Never reused: a marker left by an earlier run must not be taken for this one's (rank 0
        # may end before its other ranks fail, so the run cannot remove it when it ends).
        os.environ.setdefault(RUN_VARIABLE, f"{os.getpid()}-{time.time_ns()}")


def _run_main(execute, path: str, json_out: str | None, svg_out: str | None = None) -> int:
    """Run the script or module as __main__; report, write --json (and --svg) and hand off its
    findings."""
    import threading

    from . import notes
    from .runtime import journal

    code, error = 0, None
    died_in_threads: list[BaseException] = []
    thread_hook = threading.excepthook

    def remember(args) -> None:
        died_in_threads.append(args.exc_value)
        thread_hook(args)

    threading.excepthook = remember
    try:
        execute()
    except SystemExit as exit_:
        code = _exit_code(exit_.code)
    except BaseException as uncaught:  # noqa: BLE001 (reported exactly as Python would)
        error = uncaught
        code = 1
        notes.add_note_after(uncaught)
        _strip_own_frames(uncaught)
        sys.excepthook(type(uncaught), uncaught, uncaught.__traceback__)
    finally:
        threading.excepthook = thread_hook
        sys.stdout.flush()
    # The error that ended the script, or one a thread died of; else, when the script ended
    # badly another way (it caught the error and called sys.exit(1), as Hydra does), the error
    # explained last.
    errors = [f for f in (journal.finding_for(e) for e in (error, *died_in_threads)) if f is not None]
    if not errors and code != 0 and journal.last_error() is not None:
        errors = [journal.last_error()]
    findings = journal.warnings() + [f for i, f in enumerate(errors) if f not in errors[:i]]
    interrupted = isinstance(error, KeyboardInterrupt)
    error = None
    died_in_threads.clear()
    _write_json(json_out, findings)
    _write_svg(svg_out, errors + journal.warnings())
    from . import handoff

    handoff.publish(path, findings, where=os.path.dirname(path))
    if interrupted:
        _die_of_sigint()
    return code


def _die_of_sigint() -> None:
    """What python does after Ctrl-C's traceback: end by SIGINT itself, so the shell sees 130
    and a calling script stops too."""
    import signal

    sys.stdout.flush()
    sys.stderr.flush()
    if hasattr(signal, "SIGINT") and hasattr(os, "kill"):
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)


def _exit_code(value) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)
    return 1


def _refused(out: str | None, option: str = "--json") -> bool:
    """Whether `--json OUT` (or `--svg OUT`) cannot be written, said in one line before anything
    runs: a long training must not end in this."""
    problem = _unwritable(out)
    if problem is not None:
        print(f"explainer: can't write {option} {out!r}: {problem}", file=sys.stderr)
    return problem is not None


def _unwritable(path: str | None) -> str | None:
    """Why an output file at PATH cannot be written, or None."""
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


def _write_svg(path: str | None, findings) -> None:
    """Write the boundary picture of the first of `findings` that has one (the error the script
    ended with comes first, then the growth warnings); where there is none to draw, say so in one
    line and write nothing."""
    if not path:
        return
    from .render import diagram

    drawn = next((t for t in map(diagram.timeline, findings) if t is not None), None)
    if drawn is None:
        print(f"explainer: no explained error or growth warning to draw; --svg {path!r} not written",
              file=sys.stderr)
        return
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(diagram.svg(drawn) + "\n")
    except OSError as error:
        print(f"explainer: can't write --svg {path!r}: {error.strerror or error}", file=sys.stderr)


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
