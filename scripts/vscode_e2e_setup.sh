#!/usr/bin/env bash
# Set up what tests/test_vscode_e2e.py drives: code-server 4.100.3 (VS Code in a browser, the last
# release for Node 20) installed from npm without its GitHub downloads, and Playwright to drive
# Debian's chromium. Cached in $EXPLAINER_E2E_CACHE (default ~/.cache/backward-explainer-e2e):
# a second run only checks the marker. Prints the cache folder.
set -euo pipefail
cache="${EXPLAINER_E2E_CACHE:-$HOME/.cache/backward-explainer-e2e}"
if [ -f "$cache/ready" ]; then echo "$cache"; exit 0; fi
mkdir -p "$cache"
log="$cache/setup.log"
: > "$log"

packages=()
command -v rg >/dev/null || packages+=(ripgrep)
command -v chromium >/dev/null || packages+=(chromium)
for dev in libkrb5-dev libxkbfile-dev libsecret-1-dev libx11-dev; do
    dpkg -s "$dev" >/dev/null 2>&1 || packages+=("$dev")
done
if [ ${#packages[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q "${packages[@]}" >>"$log" 2>&1 \
        || { apt-get update -q >>"$log" 2>&1 && apt-get install -y -q "${packages[@]}" >>"$log" 2>&1; }
fi

cd "$cache"
[ -f package.json ] || npm init -y >>"$log" 2>&1
npm install --ignore-scripts --no-audit --no-fund code-server@4.100.3 >>"$log" 2>&1
vscode="$cache/node_modules/code-server/lib/vscode"
(cd "$vscode" && npm install --ignore-scripts --omit=dev --no-audit --no-fund >>"$log" 2>&1)
# Debian's ripgrep where @vscode/ripgrep's postinstall would download one.
mkdir -p "$vscode/node_modules/@vscode/ripgrep/bin"
ln -sf "$(command -v rg)" "$vscode/node_modules/@vscode/ripgrep/bin/rg"
(cd "$vscode" && npm_config_yes=true npm rebuild >>"$log" 2>&1)
# The links code-server's own postinstall would make.
(cd "$vscode" && rm -rf node_modules.asar && ln -s node_modules node_modules.asar)
(cd "$vscode/bin/remote-cli" && ln -sf code-linux.sh code-server)
(cd "$vscode/bin/helpers" && ln -sf browser-linux.sh browser.sh)
(cd "$vscode/extensions" && npm install --omit=dev --no-audit --no-fund >>"$log" 2>&1)
npm_config_yes=true npm rebuild argon2 >>"$log" 2>&1

python3 -m venv "$cache/playwright"
"$cache/playwright/bin/pip" install -q playwright >>"$log" 2>&1
touch "$cache/ready"
echo "$cache"
