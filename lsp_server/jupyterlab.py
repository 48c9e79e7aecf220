"""The spec that lets jupyter-lsp (JupyterLab) find this server: entry point group
`jupyter_lsp_spec_v1`. jupyterlab-lsp sends a notebook as one virtual Python document (its cells
joined), which the server checks like any file.

jupyterlab-lsp runs one server per document, the matching one with the highest priority: offered
by default, this server would take Python notebooks from python-lsp-server (pyflakes, completion
and hover gone). So it is offered only when the user asks, with BACKWARD_EXPLAINER_JUPYTERLAB=1
in the environment JupyterLab starts from, and only where pygls (the `lsp` extra) is installed:
installed for `%load_ext explainer` alone, the package offers nothing (it used to offer a server
that died on import, leaving notebooks with none). docs/editors.md says how it sits beside pylsp.

jupyter-lsp starts servers in the notebook root, and `python -m` would put that folder first on
sys.path (a notebook folder with its own `lsp_server/` or `pygls.py` would run in the server), so
the server is started from `-c` with the working directory (the empty entry) taken off sys.path
first."""
from __future__ import annotations

import importlib.util
import os
import sys

LAUNCH = "import sys; sys.path[:] = [p for p in sys.path if p]; from lsp_server.__main__ import main; main()"
OPT_IN = "BACKWARD_EXPLAINER_JUPYTERLAB"


def spec(manager) -> dict:
    if os.environ.get(OPT_IN, "") not in ("1", "true", "yes"):
        return {}
    if importlib.util.find_spec("pygls") is None:
        manager.log.warning(f"[backward-explainer] {OPT_IN} is set, but pygls is not installed: "
                            "install the package's `lsp` extra for its JupyterLab server")
        return {}
    return {
        "backward-explainer": {
            "argv": [sys.executable, "-c", LAUNCH],
            "languages": ["python"],
            "version": 2,
            "display_name": "backward-explainer",
            "mime_types": ["text/python", "text/x-ipython"],
            "urls": {"home": "https://pypi.org/project/backward-explainer/"},
        }
    }
