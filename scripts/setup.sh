#!/usr/bin/env bash
# Create .venv at the repository root and install the project with its test tools.
# Idempotent: a second run only checks that everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[test]"
