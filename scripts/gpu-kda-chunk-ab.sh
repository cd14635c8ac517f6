#!/usr/bin/env bash
# Run ON THE GPU MACHINE (after scripts/gpu-prepare.sh --old-chunk-test FILE here, carry
# [".carry.tar.xz", ".whl"]): the chunked KDA forward of the carried build against an older
# test_kda_chunk in the same call.
#   1. the carried test_kda_chunk (all cases), then memcheck and racecheck on its small cases;
#   2. its benchmark, old and new alternately (A B A B), defaults only, per-stage times, on
#      KDA_CHUNK_AB_BT (B:L list; default the serving, prefill and scoring shapes).
# KDA_CHUNK_AB_SKIP="test sanitize bench". $OUT: summary.txt (each bench row, old / new
# labelled), chunk-test.txt, chunk-bench-{old,new}{1,2}.txt, logs.tgz.
source "$(dirname "$0")/gpu-env.sh"
run_start "${KDA_CHUNK_AB_SKIP:-}"
T=$B/tests/kernels/test_kda_chunk OLDT=.carry/old/test_kda_chunk
[ -x "$OLDT" ] || { echo "no $OLDT" | tee -a "$S"; exit 1; }
if ! skip test; then
  step test 240 "$OUT/chunk-test.txt" "$T"
  grep -E "FAIL|test_kda_chunk:" "$OUT/chunk-test.txt" | head -20 >> "$S"
fi
if ! skip sanitize; then
  step memcheck 120 "$LOG/memcheck.txt" env KDA_CHUNK_TEST_QUICK=2 \
    compute-sanitizer --tool memcheck --leak-check no --error-exitcode 3 "$T"
  tail -3 "$LOG/memcheck.txt" >> "$S"
  step racecheck 120 "$LOG/racecheck.txt" env KDA_CHUNK_TEST_QUICK=2 \
    compute-sanitizer --tool racecheck --racecheck-report hazard --error-exitcode 3 "$T"
  tail -3 "$LOG/racecheck.txt" >> "$S"
fi
if ! skip bench; then
  BT=${KDA_CHUNK_AB_BT:-"1:128,8:128,1:2048,8:2048,1:8192,4:8192"}
  for run in old1 new1 old2 new2; do
    t=$T; [ "${run:0:3}" = old ] && t=$OLDT
    step "bench-$run" 90 "$OUT/chunk-bench-$run.txt" env KDA_CHUNK_BENCH_BT="$BT" KDA_CHUNK_BENCH_VARIANT=defaults "$t" --bench
    grep -E "defaults" "$OUT/chunk-bench-$run.txt" | sed "s/^/$run /" >> "$S"
  done
fi
tar czf "$OUT/logs.tgz" -C /tmp kda-logs
cat "$S"
exit $rc
