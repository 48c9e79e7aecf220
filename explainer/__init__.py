"""Explain PyTorch's "Trying to backward through the graph a second time" and its siblings.

`install()` hooks backward calls and optimizer steps; an explained error gets a note naming the
tensor that carries stale history, the line that made it, and the fix. `%load_ext explainer`
does the same in IPython. Importing this package does not import torch.
"""
from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["install", "uninstall", "explain", "load_ipython_extension", "unload_ipython_extension"]


def install() -> None:
    """Hook `Tensor.backward`, `torch.autograd.backward`/`grad` and optimizer steps: an explained
    error carries its explanation as a note."""
    from .notes import install as install_with_notes

    install_with_notes()


def uninstall() -> None:
    from .runtime import hooks

    hooks.uninstall()


def explain(error: BaseException):
    """The Finding already attached to `error`, or one read post-mortem from its traceback."""
    from .runtime import postmortem

    return postmortem.explain(error)


def load_ipython_extension(ipython) -> None:
    from .ipython import load

    load(ipython)


def unload_ipython_extension(ipython) -> None:
    from .ipython import unload

    unload(ipython)
