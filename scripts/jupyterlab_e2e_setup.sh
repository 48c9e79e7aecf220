#!/usr/bin/env bash
# Set up what tests/test_jupyterlab_e2e.py drives: JupyterLab 4.6.6 in its own virtual environment
# (apart from the project's: a user's Lab is rarely the kernel's environment), beside chromium and
# Playwright from scripts/vscode_e2e_setup.sh. Cached in $EXPLAINER_E2E_CACHE (default
# ~/.cache/backward-explainer-e2e): a second run only checks the marker. Prints the cache folder.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="$(bash "$here/vscode_e2e_setup.sh" | tail -n 1)"
if [ -f "$cache/jupyterlab-ready" ]; then echo "$cache"; exit 0; fi
log="$cache/jupyterlab-setup.log"
rm -rf "$cache/jupyterlab"
python3 -m venv "$cache/jupyterlab"
"$cache/jupyterlab/bin/pip" install -q "jupyterlab==4.6.6" >"$log" 2>&1
touch "$cache/jupyterlab-ready"
echo "$cache"
