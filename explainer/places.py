"""How a place in the user's code is named in what we write: `train.py:19`, or, for a notebook
cell, what IPython's own traceback calls it, `Cell In[3], line 4` (the IPython extension
registers that namer while it is loaded; its cells' files are `/tmp/ipykernel_…/4101939383.py`,
a name no user knows)."""
from __future__ import annotations

import os
from collections.abc import Callable

# (filename) -> a label for that file ("Cell In[3]"), or None to leave it to the next namer.
Namer = Callable[[str], "str | None"]
_namers: list[Namer] = []


def register(namer: Namer) -> None:
    if namer not in _namers:
        _namers.append(namer)


def unregister(namer: Namer) -> None:
    if namer in _namers:
        _namers.remove(namer)


def file_label(filename: str) -> str:
    """`train.py`, or `Cell In[3]`."""
    for namer in list(_namers):
        try:
            label = namer(filename)
        except Exception:  # noqa: BLE001 - a namer's failure must not cost the explanation
            label = None
        if label:
            return label
    return os.path.basename(filename)


def place(filename: str, row: int) -> str:
    """`train.py:19`, or `Cell In[3], line 4` as IPython writes it."""
    label = file_label(filename)
    return f"{label}, line {row}" if label != os.path.basename(filename) else f"{label}:{row}"
