"""`%load_ext explainer`: explain autograd errors in IPython and Jupyter.

Every error is shown exactly as IPython shows it (the hooks installed here add no note to it);
the errors the engine explains are followed by the explanation, rendered from the journal (HTML
in Jupyter, rich text in a terminal). `%tb` keeps working, `%explain` shows the last explanation
again (or explains the last error post-mortem), and `%unload_ext explainer` restores the
previous handler.
"""
from __future__ import annotations

import os
import sys

_saved: dict[int, tuple] = {}


def load(ip) -> None:
    from .notes import record_only, warn_growth
    from .places import register
    from .runtime import hooks

    if id(ip) in _saved:
        return
    # Explained errors go to the journal, which the handler below renders; an engine failure is
    # still one line on the error. Post-mortem %explain works even without the hooks.
    hooks.install_or_say_why_not(record_only, warn_growth)
    _saved[id(ip)] = (ip.CustomTB, ip.custom_exceptions)
    ip.set_custom_exc((RuntimeError,), _handle)
    ip.register_magic_function(_explain_magic, "line", "explain")
    ip.events.register("post_run_cell", _clear_when_it_runs_clean)
    register(_cell_label)


def unload(ip) -> None:
    from .places import unregister
    from .runtime import hooks

    unregister(_cell_label)
    saved = _saved.pop(id(ip), None)
    if saved is not None:
        ip.CustomTB, ip.custom_exceptions = saved
    ip.magics_manager.magics["line"].pop("explain", None)
    try:
        ip.events.unregister("post_run_cell", _clear_when_it_runs_clean)
    except ValueError:
        pass
    hooks.uninstall()


def _handle(shell, etype, value, tb, tb_offset=None):
    """IPython's custom exception handler. It must never raise: IPython would print "An
    exception occurred in the custom handler" and unregister it for the rest of the session.

    The error is shown as IPython shows it, always: in Jupyter it stays an `error` output, so Run
    All stops, nbconvert and other tools see it, and a saved notebook keeps it. The explanation
    follows it."""
    try:
        from .runtime import journal

        finding = journal.finding_for(value)
    except Exception as internal:  # noqa: BLE001 - one line, then the error as IPython shows it
        _say_not_shown(internal)
        finding = None
    _show_as_usual(shell, etype, value, tb, tb_offset)
    if finding is None:
        return None
    try:
        _hand_off(finding)
        _show_explanation(shell, finding)
    except Exception as internal:  # noqa: BLE001 - the error is shown already: one line
        _say_not_shown(internal)
    return None


def _say_not_shown(internal: Exception) -> None:
    print(f"[explainer] could not display the explanation ({type(internal).__name__}: {internal}).",
          file=sys.stderr)


def _show_as_usual(shell, etype, value, tb, tb_offset=None) -> None:
    """IPython's own traceback (which also sets sys.last_* for %tb and %debug)."""
    try:
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset, running_compiled_code=True)
    except Exception:  # noqa: BLE001 - IPython's own display failed too: the standard library's
        import traceback

        traceback.print_exception(etype, value, tb)


# The backward line of the finding handed to the editor, to clear it once that code runs clean.
_handed_off: dict[str, str] = {}


def _run_id() -> str:
    return f"ipython:{os.getpid()}"


def _hand_off(finding) -> None:
    from .handoff import publish

    if publish(_run_id(), [finding]) is not None and finding.backward is not None:
        _handed_off[_run_id()] = finding.backward.code.strip()


def _clear_when_it_runs_clean(result) -> None:
    """A cell that ran without error through the line that failed clears the editor's finding."""
    line = _handed_off.get(_run_id())
    if not line or not result.success:
        return
    source = getattr(result.info, "raw_cell", "") or ""
    if line in source:
        from .handoff import publish

        publish(_run_id(), [])
        _handed_off.pop(_run_id(), None)


def _show_explanation(shell, finding) -> None:
    if _in_kernel(shell):
        from IPython.display import display

        display(ExplanationView(finding))
    else:
        _print_terminal(finding)


def _in_kernel(shell) -> bool:
    return getattr(shell, "kernel", None) is not None


def _print_terminal(finding) -> None:
    from .render.text import render_note

    try:
        from .render.terminal import render_rich
    except ImportError:
        print(render_note(finding), file=sys.stderr)
        return
    render_rich(finding, sys.stderr)


class ExplanationView:
    """What `display()` shows: HTML in Jupyter, the plain note elsewhere."""

    def __init__(self, finding) -> None:
        self.finding = finding

    def _repr_mimebundle_(self, include=None, exclude=None):
        from .render.html import render_html
        from .render.text import render_note

        return {
            "text/html": render_html(self.finding, _fix_edits_a_cell(self.finding)),
            "text/plain": render_note(self.finding),
        }


def _fix_edits_a_cell(finding) -> bool:
    """Whether fixes[0] edits exactly one cell (not a file on disk)."""
    if not finding.fixes:
        return False
    files = {e.filename for e in finding.fixes[0].edits}
    return len(files) == 1 and _is_cell_file(next(iter(files)))


def _is_cell_file(filename: str) -> bool:
    return "ipykernel_" in filename or filename.startswith("<ipython-input")


def _cell_label(filename: str) -> str | None:
    """`Cell In[3]` for a cell's file, as IPython's own traceback names it."""
    from IPython import get_ipython

    shell = get_ipython()
    named = shell.compile.format_code_name(filename) if shell is not None else None
    return f"{named[0]} {named[1]}" if named else None


def _explain_magic(line: str = ""):
    """%explain [--apply]: show the last explanation again, or explain the last error.

    With --apply, put the fixed code of the current cell (when the fix edits a cell) into the
    next input.
    """
    from IPython import get_ipython

    from .runtime import journal, postmortem

    shell = get_ipython()
    error = getattr(sys, "last_value", None)
    finding = postmortem.explain(error) if error is not None else None
    if finding is None:
        finding = journal.last()
        if error is not None:
            # The last error is another kind: say so, rather than pass an older explanation
            # off as its own.
            headline = f"{type(error).__name__}: {error}".splitlines()[0][:120]
            print(f"[explainer] the last error ({headline}) is not an autograd error this tool explains"
                  + ("; the explanation of an earlier one follows." if finding is not None else "."))
    if finding is None:
        if error is None:
            print("[explainer] nothing to explain: no autograd error has been seen yet.")
        return None
    if "--apply" in line.split():
        _put_fixed_cell(shell, finding)
    _show_explanation(shell, finding)
    return None


def _put_fixed_cell(shell, finding) -> None:
    from .fixes.edits import apply_edits
    from .reading.source import load

    if not finding.fixes:
        print("[explainer] this explanation has no fix to apply.")
        return
    edits = finding.fixes[0].edits
    filenames = {e.filename for e in edits}
    if len(filenames) != 1:
        print("[explainer] the fix spans several files; apply it by hand.")
        return
    source = load(next(iter(filenames)))
    if source is None:
        print("[explainer] the source of the fix is no longer available.")
        return
    shell.set_next_input(apply_edits(source.text, edits).rstrip("\n"), replace=False)
