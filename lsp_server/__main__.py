"""`backward-explainer-lsp [--tcp --port N]` (or `python -m lsp_server`): start the language server
(stdio by default)."""
from __future__ import annotations

import gc

from pygls.cli import start_server

from .server import server


def main(argv: list[str] | None = None) -> None:
    # Everything imported so far lives as long as the server: keep the collector off it.
    gc.freeze()
    start_server(server, argv)


if __name__ == "__main__":
    main()
