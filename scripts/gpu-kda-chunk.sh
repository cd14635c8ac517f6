#!/usr/bin/env bash
# Run ON THE GPU MACHINE from the repo root, after scripts/gpu-prepare.sh here (it
# builds the release CUDA tree and packs the binaries into .carry/ and .carry.txz;
# this test travels as test_kda_chunk.xz). In one call: the chunked KDA forward's
# test against the CPU reference and kc_kda_step, its benchmark, and
# compute-sanitizer (memcheck, racecheck, synccheck) on the test.
# Device command (carry [".carry.txz"], or [".carry"]):
#   bash scripts/gpu-kda-chunk.sh
# Writes to $OUT: kda_chunk_summary.txt (one line per step with its exit status),
# kda_chunk_test.txt (the test's full output: per case, per check, rel error,
# tolerance, worst position; a failed case is followed by its stage-by-stage
# diagnosis), kda_chunk_bench.txt (ms, tokens/s, TFLOP/s, GB/s per shape and
# variant, per-stage ms and GB/s), kda_chunk_logs.tgz (those plus the sanitizer logs).
# About 5-9 minutes (capped at KDA_CHUNK_GPU_BUDGET=540 s); KDA_CHUNK_GPU_SKIP="bench
# racecheck ..." skips steps.
source "$(dirname "$0")/gpu-env.sh"
S=$OUT/kda_chunk_summary.txt
# gpu-prepare.sh carries the test xz-compressed (lzma from Python where xz is missing)
T=/tmp/kda-chunk-bin/test_kda_chunk
mkdir -p /tmp/kda-chunk-bin
if [ -f "$B/tests/kernels/test_kda_chunk.xz" ]; then
  xz -dc "$B/tests/kernels/test_kda_chunk.xz" > "$T" 2>/dev/null \
    || python3 -c 'import lzma, sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())' \
         "$B/tests/kernels/test_kda_chunk.xz" > "$T"
  chmod +x "$T"
else
  T=$B/tests/kernels/test_kda_chunk
fi
rc=0
# the device call's limit is 10 minutes: every step's timeout is cut to what is
# left of KDA_CHUNK_GPU_BUDGET seconds, so the outputs always come back (step: gpu-env.sh)
STEP_BUDGET=${KDA_CHUNK_GPU_BUDGET:-540}
STEP_SKIP=${KDA_CHUNK_GPU_SKIP:-}
: > "$S"
echo "commit $(cat .carry/commit 2>/dev/null || echo unknown)" | tee -a "$S"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$S"
[ -x "$T" ] && [ -s "$T" ] || { echo "no $T: run scripts/gpu-prepare.sh first" | tee -a "$S"; exit 1; }

step test 240 "$LOG/kda_chunk_test.txt" "$T"
grep -E "FAIL|test_kda_chunk:" "$LOG/kda_chunk_test.txt" | head -40
cp "$LOG/kda_chunk_test.txt" "$OUT/"
step bench 180 "$LOG/kda_chunk_bench.txt" "$T" --bench
cat "$LOG/kda_chunk_bench.txt"
cp "$LOG/kda_chunk_bench.txt" "$OUT/"
# sanitizers on the smaller cases (their kernels are the same code; the time goes
# into the instrumentation)
step memcheck 180 "$LOG/kda_chunk_memcheck.txt" env KDA_CHUNK_TEST_QUICK=1 \
  compute-sanitizer --tool memcheck --leak-check no --error-exitcode 3 "$T"
tail -4 "$LOG/kda_chunk_memcheck.txt" 2>/dev/null
step racecheck 150 "$LOG/kda_chunk_racecheck.txt" env KDA_CHUNK_TEST_QUICK=2 \
  compute-sanitizer --tool racecheck --racecheck-report hazard --error-exitcode 3 "$T"
tail -4 "$LOG/kda_chunk_racecheck.txt" 2>/dev/null
step synccheck 90 "$LOG/kda_chunk_synccheck.txt" env KDA_CHUNK_TEST_QUICK=2 \
  compute-sanitizer --tool synccheck --error-exitcode 3 "$T"
tail -4 "$LOG/kda_chunk_synccheck.txt" 2>/dev/null
cp "$S" "$LOG/"
tar czf "$OUT/kda_chunk_logs.tgz" -C /tmp kda-logs
exit $rc
