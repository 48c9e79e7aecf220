"""The front-end of scripts and the Python API (`explainer.install()`, `explainer run`): an
explained error carries its explanation as a PEP 678 note, so plain tracebacks, pytest and logs
show it; a retained graph that grows across iterations is a GraphGrowthWarning.

The engine explains (`runtime.analysis`); this module only decides where the explanation goes.
Whatever fails here costs the user one line, never their error.
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager

NOTE_PREFIX = "[explainer]"


class GraphGrowthWarning(UserWarning):
    """A graph kept alive with retain_graph=True reaches back into earlier iterations."""


def install() -> None:
    from .runtime import hooks

    hooks.install(add_note, warn_growth)


def install_or_say_why_not() -> bool:
    from .runtime import hooks

    return hooks.install_or_say_why_not(add_note, warn_growth)


def add_note(error, call, roots, caller, calls, steps, loads=()) -> None:
    """Explain `error` and attach the explanation to it as a note."""
    with _one_line_on_failure(error):
        from .render.text import render_note

        finding = _explain(error, call, roots, caller, calls, steps, loads)
        if finding is not None:
            error.add_note(render_note(finding))


def record_only(error, call, roots, caller, calls, steps, loads=()) -> None:
    """Explain `error` into the journal only, for a front-end that renders from there (IPython)."""
    with _one_line_on_failure(error):
        _explain(error, call, roots, caller, calls, steps, loads)


def _explain(error, call, roots, caller, calls, steps, loads):
    # Imported on the first error only: keeps `import explainer` and `install()` cheap.
    from .runtime import analysis

    return analysis.explain_error(error, call, roots, caller, calls, steps, loads)


@contextmanager
def _one_line_on_failure(error):
    """Whatever fails while explaining costs the user's error one line, and the error stands."""
    try:
        yield
    except Exception as internal:  # noqa: BLE001
        error.add_note(f"{NOTE_PREFIX} could not explain this error ({type(internal).__name__}: {internal}); "
                       f"the error above is PyTorch's own.")


def warn_growth(call, roots, caller, calls, steps) -> bool:
    """Warn when the retained graph of `call` reaches into earlier iterations; whether it did."""
    try:
        from .render.text import render_note
        from .runtime import analysis

        finding = analysis.explain_retained(call, roots, caller, calls, steps)
        if finding is None:
            return False
        warnings.warn_explicit(GraphGrowthWarning(render_note(finding)), GraphGrowthWarning, call.filename, call.row)
        return True
    except Exception:  # noqa: BLE001 - a broken explanation must not stop the user's backward
        return False
