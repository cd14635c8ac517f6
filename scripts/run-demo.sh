#!/usr/bin/env bash
# Builds a release tree (if needed) and serves the demo model on 127.0.0.1:8080.
# Extra arguments go to kda-server (e.g. --port 9000 --device cuda --model DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f build-release/build.ninja ] || meson setup build-release -Dbuildtype=release >/dev/null
ninja -C build-release >/dev/null
exec ./build-release/server/kda-server "$@"
