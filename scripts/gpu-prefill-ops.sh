#!/usr/bin/env bash
# Run ON THE GPU MACHINE from the repo root (after scripts/gpu-prepare.sh here):
# the prompt-chunk kernels of kernels/prefill_ops.h (issue #12) in one call:
#   1. test_prefill_ops            vs the CPU reference (per-case errors, FAIL lines)
#   2. test_prefill_ops --bench    prefill attention + log-prob benchmarks (BENCH lines)
#   3. compute-sanitizer memcheck  on the test
#   4. compute-sanitizer racecheck on the small-shape attention test (shared memory hazards
#      of the cp.async pipeline)
# Needs only .carry/build/tests/kernels/test_prefill_ops, .carry/lib and .carry/commit
# (carry those three paths when the whole .carry is too big). Time: ~3-5 minutes,
# at most ~9.5 (the timeouts: 120 + 120 + 200 + 120 s).
# Results in $OUT: summary.txt (every step's rc, the FAIL lines, the case errors),
# prefill_ops_bench.json (the BENCH points with device, commit, date), logs.tgz.
source "$(dirname "$0")/gpu-env.sh"
T=$B/tests/kernels/test_prefill_ops
commit=$(cat .carry/commit 2>/dev/null || echo unknown)
S=$OUT/summary.txt
: > "$S"
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)
echo "gpu: $gpu  commit: $commit" | tee -a "$S"
rc=0
step() { echo "== $1: rc=$2" | tee -a "$S"; }

ours timeout 120 $T > "$LOG/test.txt" 2>&1
r=$?; [ $r = 0 ] || rc=1; step test_prefill_ops $r
grep -E "^FAIL|^\[  (PASSED|FAILED)|^\[  FAILED|error|sticky" "$LOG/test.txt" | head -60 >> "$S"
grep -E "^attn |^  item|^qkv|^logprob|^refuse|^workspace" "$LOG/test.txt" > "$LOG/test_cases.txt"
head -c 30000 "$LOG/test_cases.txt" >> "$S"

ours timeout 120 $T --bench > "$LOG/bench.txt" 2>&1
r=$?; [ $r = 0 ] || rc=1; step bench $r
python3 - "$LOG/bench.txt" "$OUT/prefill_ops_bench.json" "$gpu" "$commit" <<'PY' >> "$S" 2>&1
import json, sys, time
pts = [json.loads(l[6:]) for l in open(sys.argv[1]) if l.startswith("BENCH ")]
json.dump({"machine": sys.argv[3], "commit": sys.argv[4], "date": time.strftime("%Y-%m-%d"),
           "command": "test_prefill_ops --bench", "points": pts}, open(sys.argv[2], "w"), indent=1)
for p in pts:
    print(" ".join(f"{k}={v}" for k, v in p.items()))
PY

ours timeout 200 compute-sanitizer --tool memcheck --leak-check no --error-exitcode 3 $T > "$LOG/memcheck.txt" 2>&1
r=$?; [ $r = 0 ] || rc=1; step memcheck $r
tail -4 "$LOG/memcheck.txt" >> "$S"
grep -m5 -A12 "=========.*Invalid" "$LOG/memcheck.txt" >> "$S"

# racecheck is slow: only the small shapes (every hd x group, forced splits)
ours timeout 120 compute-sanitizer --tool racecheck --racecheck-report hazard --error-exitcode 3 $T \
  test_attn_prefill_every_head_dim_and_group > "$LOG/racecheck.txt" 2>&1
r=$?; [ $r = 0 ] || rc=1; step racecheck $r
tail -4 "$LOG/racecheck.txt" >> "$S"

tar czf "$OUT/logs.tgz" -C /tmp kda-logs
echo "overall rc=$rc" | tee -a "$S"
exit $rc
