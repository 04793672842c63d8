#!/usr/bin/env bash
# Builds, tests and packages the VS Code extension; prints the path of the .vsix. Needs Node 20+ and
# the npm registry, nothing else.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

npm ci --no-audit --no-fund
npm run build
npm test
rm -f ./*.vsix
npm run package
vsix="$(ls "$PWD"/*.vsix)"
echo "vsix: $vsix ($(du -k "$vsix" | cut -f1) KiB)"
