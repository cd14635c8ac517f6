#!/usr/bin/env bash
# Prefix cache benchmark on this machine's CPU (scripts/bench_prefix.py: a
# shared system prompt under concurrency, the lm-eval-style scoring workload,
# a 10-turn chat; cache on vs --prefix-cache off), on the shipped demo model;
# writes bench/results/cpu-<host>-<date>-prefix.json.
#   scripts/bench-prefix.sh [BUILD_DIR] [MODEL_DIR] [extra bench_prefix.py args]
# On the GPU machine: scripts/gpu-prefix.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
MODEL=${2:-models/demo}
shift $(( $# > 2 ? 2 : $# ))
out=bench/results/cpu-$(hostname -s)-$(date -u +%F)-prefix.json
# One engine thread by default: on a small shared VM OpenMP teams of all cores
# stall whenever another process takes a core (4x slower and erratic).
python3 scripts/bench_prefix.py --server "$BUILD/server/kda-server" --model "$MODEL" --device cpu \
  --threads "${KDA_BENCH_THREADS:-1}" --out "$out" --log-dir "${TMPDIR:-/tmp}" \
  --note "${KDA_BENCH_NOTE:-$(nproc) cores shared with other work, engine --threads ${KDA_BENCH_THREADS:-1}: only same-run ratios mean anything}" "$@"
