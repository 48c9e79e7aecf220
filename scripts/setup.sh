#!/usr/bin/env bash
# Create .venv at the repository root and install the project with its test tools, and the
# editors the tests drive (Debian's neovim) when they are missing and apt can install them.
# Idempotent: a second run only checks that everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[test]"
if ! command -v nvim >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "setup: installing neovim (tests/test_editors.py drives it)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q neovim >/dev/null \
        || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q neovim >/dev/null; } \
        || echo "setup: could not install neovim; its test will be skipped" >&2
fi
