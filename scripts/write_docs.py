"""Write the causes' docs pages (explainer/causes/docs/BXnnn.md) from the catalog, and remove
pages of codes it no longer has. tests/test_causes.py fails while a page is out of date."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from explainer.causes import CAUSES  # noqa: E402
from explainer.causes.cause import DOCS  # noqa: E402


def main() -> None:
    wanted = {f"{cause.code}.md": cause.doc_page() for cause in CAUSES}
    for stale in DOCS.glob("*.md"):
        if stale.name not in wanted:
            stale.unlink()
    for name, page in wanted.items():
        path = DOCS / name
        if not path.exists() or path.read_text() != page:
            path.write_text(page)
            print(f"wrote {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")


if __name__ == "__main__":
    main()
