#!/usr/bin/env bash
# The hostile-client attacks of issue 19 at the issue's target sizes, on the demo model with the
# default limits (4,000 slow connections from one client, 200 stalled 8 MiB uploads, 8 MiB
# amplification bodies, SIGTERM under streaming load 20 times), recorded against the targets in
# bench/results/cpu-vm-DATE-hostile.json. CPU only; about a minute. Needs a build (ninja -C build)
# and a descriptor limit above 4,200 (ulimit -n; the test raises its soft limit to the hard one).
#   bash scripts/bench-hostile.sh [OUT.json]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/cpu-vm-$(date -u +%Y-%m-%d)-hostile.json}
export KDA_SERVER=${KDA_SERVER:-build/server/kda-server}
[ -x "$KDA_SERVER" ] || { echo "no $KDA_SERVER: build first (meson setup build && ninja -C build)"; exit 1; }
python3 tests/server/test_hostile.py --full --json "$out"
