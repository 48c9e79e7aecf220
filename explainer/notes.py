"""The front-end of scripts and the Python API (`explainer.install()`, `explainer run`): an
explained error carries its explanation as a PEP 678 note, so plain tracebacks, pytest and logs
show it; a retained graph that grows across iterations is a GraphGrowthWarning.

The engine explains (`runtime.analysis`); this module only decides where the explanation goes.
Whatever fails here costs the user one line, never their error.
"""
from __future__ import annotations

import os
import sys
import warnings
from contextlib import contextmanager, suppress

NOTE_PREFIX = "[explainer]"


class GraphGrowthWarning(UserWarning):
    """A graph kept alive with retain_graph=True reaches back into earlier iterations."""


def install() -> None:
    from .runtime import hooks

    hooks.install(add_note, warn_growth)


def install_or_say_why_not() -> bool:
    from .runtime import hooks

    return hooks.install_or_say_why_not(add_note, warn_growth)


def add_note(error, call, roots, caller, calls, steps, loads=(), zeroings=None) -> None:
    """Explain `error` and attach the explanation to it as a note."""
    with _one_line_on_failure(error):
        from .render.text import render_note

        finding = _explain(error, call, roots, caller, calls, steps, loads, zeroings)
        if finding is not None:
            explained_by = _rank_that_explains()
            error.add_note(render_note(finding) if explained_by is None else
                           f"{NOTE_PREFIX} {finding.summary} Explained in full by rank {explained_by}, the first "
                           "rank that failed.")


# Names one `explainer run` to the processes it starts (explainer/children/sitecustomize.py).
RUN_VARIABLE = "BACKWARD_EXPLAINER_RUN"


def _rank_marker(run: str) -> str:
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"backward-explainer-rank-{''.join(c for c in run if c.isalnum() or c == '-')}")


def _rank_that_explains() -> str | None:
    """Under torch.distributed every rank fails alike: the first rank to fail explains in full,
    and the others say in one line which did (None here: this process explains). The ranks of
    one run race for one marker, named after what they share."""
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE", "1")
    if rank is None and os.environ.get("NODE_RANK", "0") == "0":
        rank = os.environ.get("LOCAL_RANK")  # Lightning's DDP names the rank on one machine only
    if rank is None or not world.isdigit() or int(world) < 2:
        return None
    # The ranks of one `explainer run` share its name (Lightning starts them from rank 0); a
    # launcher's workers share its run id and their parent, the launcher's agent.
    marker = _rank_marker(os.environ.get(RUN_VARIABLE)
                          or os.environ.get("TORCHELASTIC_RUN_ID", "") + f"-{os.getppid()}")
    mine = f"{marker}.{os.getpid()}"
    try:
        with open(mine, "w", encoding="utf-8") as claim:
            claim.write(rank)
        os.link(mine, marker)  # atomic, and the marker never exists without its rank in it
    except FileExistsError:
        try:
            with open(marker, encoding="utf-8") as first:
                return first.read().strip()
        except OSError:
            return None
    except OSError:
        return None  # no shared temporary folder: every rank explains
    finally:
        with suppress(OSError):
            os.unlink(mine)
    return None


def record_only(error, call, roots, caller, calls, steps, loads=(), zeroings=None) -> None:
    """Explain `error` into the journal only, for a front-end that renders from there (IPython)."""
    with _one_line_on_failure(error):
        _explain(error, call, roots, caller, calls, steps, loads, zeroings)


def add_note_after(error: BaseException) -> None:
    """For an autograd error that escaped without being explained (the hooks never saw its
    backward: a `torch.compile`d step calls the original), the post-mortem explanation as a
    note; or, where even that finds nothing, one line that says so and what to do instead."""
    if "torch" not in sys.modules:
        return
    from .runtime import journal
    from .runtime.errors import kind_of

    if kind_of(error) is None or journal.finding_for(error) is not None:
        return
    with _one_line_on_failure(error):
        from .render.text import render_note
        from .runtime import postmortem

        finding = postmortem.explain(error)
        if finding is not None:
            error.add_note(render_note(finding))
        elif _in_compiled_code(error.__traceback__):
            error.add_note(f"{NOTE_PREFIX} this error was raised inside a torch.compile'd function, where the "
                           "explainer records nothing, and its frames do not show the cause: run that function "
                           "once without torch.compile (or under torch.compiler.disable) to have it explained.")


def _in_compiled_code(tb) -> bool:
    while tb is not None:
        if f"{os.sep}_dynamo{os.sep}" in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False


def _explain(error, call, roots, caller, calls, steps, loads, zeroings):
    # Imported on the first error only: keeps `import explainer` and `install()` cheap.
    from .runtime import analysis

    return analysis.explain_error(error, call, roots, caller, calls, steps, loads, zeroings)


@contextmanager
def _one_line_on_failure(error):
    """Whatever fails while explaining costs the user's error one line, and the error stands."""
    try:
        yield
    except Exception as internal:  # noqa: BLE001
        error.add_note(f"{NOTE_PREFIX} could not explain this error ({type(internal).__name__}: {internal}); "
                       f"the error above is PyTorch's own.")


def warn_growth(call, roots, caller, calls, steps) -> bool:
    """Warn when a graph grows across iterations, retained by `call` or kept aside from it;
    whether it did."""
    try:
        from .render.text import render_note
        from .runtime import analysis

        finding = analysis.explain_growing(call, roots, caller, calls, steps)
        if finding is None:
            return False
        warnings.warn_explicit(GraphGrowthWarning(render_note(finding)), GraphGrowthWarning, call.filename, call.row)
        return True
    except Exception:  # noqa: BLE001 - a broken explanation must not stop the user's backward
        return False
