#!/usr/bin/env bash
# Create .venv at the repository root and install the project with its test tools, and the
# editors the tests drive (Debian's neovim, emacs with eglot) when they are missing and apt can
# install them.
# Idempotent: a second run only checks that everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[test]"
missing=()
command -v nvim >/dev/null || missing+=(neovim)
{ command -v emacs >/dev/null && ls /usr/share/emacs/site-lisp/elpa/eglot-* >/dev/null 2>&1; } \
    || missing+=(emacs-nox elpa-eglot)
if [ ${#missing[@]} -gt 0 ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "setup: installing ${missing[*]} (tests/test_editors.py drives them)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "${missing[@]}" >/dev/null 2>&1; } \
        || echo "setup: could not install ${missing[*]}; their tests will be skipped" >&2
fi
