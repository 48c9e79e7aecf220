"""The spec that lets jupyter-lsp (JupyterLab) find this server: entry point group
`jupyter_lsp_spec_v1`. jupyterlab-lsp sends a notebook as one virtual Python document (its cells
joined), which the server checks like any file.

jupyter-lsp starts servers in the notebook root, and `python -m` would put that folder first on
sys.path (a notebook folder with its own `lsp_server/` or `pygls.py` would run in the server), so
the server is started from `-c` with the working directory (the empty entry) taken off sys.path
first."""
from __future__ import annotations

import sys

LAUNCH = "import sys; sys.path[:] = [p for p in sys.path if p]; from lsp_server.__main__ import main; main()"


def spec(manager) -> dict:
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
