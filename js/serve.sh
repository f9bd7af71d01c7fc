#!/usr/bin/env bash
# Serves the session-cookie inspector on http://127.0.0.1:8347/inspector/
# (or the port given), building the package first if it is not built yet.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[ -f "$here/pkg/web/tether_js.js" ] || "$here/build.sh"
exec node "$here/inspector/serve.mjs" "${1:-8347}"
