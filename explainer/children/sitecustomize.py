"""Run at start-up by every Python process that a script under `explainer run` starts: `run`
puts this folder first on PYTHONPATH and names the run in BACKWARD_EXPLAINER_RUN. Lightning's
DDP re-runs the script as plain `python` for every rank but the first; with this, those ranks are
explained too, and share the first-failing-rank marker with rank 0.

The hooks go in when the process imports torch (never before, so a Python child that does not
use torch runs as it would). Then the sitecustomize this one hides on sys.path, if any, runs.
"""
import os
import sys


def _install_when_torch_is_imported() -> None:
    try:
        from explainer import notes
        from explainer.runtime import lazy
    except ImportError:  # a Python without the explainer: nothing to install
        return
    if os.environ.get(notes.RUN_VARIABLE):
        lazy.install_when_torch_is_imported(notes.install_or_say_why_not)


def _run_the_one_hidden() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    hidden = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hidden)


try:
    _install_when_torch_is_imported()
except Exception as internal:  # noqa: BLE001 - the user's process starts whatever happens here
    print(f"[explainer] not installed in this process ({type(internal).__name__}: {internal})", file=sys.stderr)
_run_the_one_hidden()
