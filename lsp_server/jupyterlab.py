"""The spec that lets jupyter-lsp (JupyterLab) find this server: entry point group
`jupyter_lsp_spec_v1`. jupyterlab-lsp sends a notebook as one virtual Python document (its cells
joined), which the server checks like any file."""
from __future__ import annotations

import sys


def spec(manager) -> dict:
    return {
        "backward-explainer": {
            "argv": [sys.executable, "-m", "lsp_server"],
            "languages": ["python"],
            "version": 2,
            "display_name": "backward-explainer",
            "mime_types": ["text/python", "text/x-ipython"],
            "urls": {"home": "https://pypi.org/project/backward-explainer/"},
        }
    }
