#!/usr/bin/env bash
# Run ON THE GPU MACHINE (after scripts/gpu-prepare.sh here; carry
# [".carry.tar.xz", ".whl"]): the skinny decode GEMM (kernels/ops_skinny.cu)
# in one call:
#   1. test_skinny (against float64), its small shapes under compute-sanitizer
#      memcheck, then test_kernels and
#      test_cuda_model with the random 1.7B checkpoint (the tuned decode GEMMs
#      inside the whole model);
#   2. test_skinny --bench: each decode GEMM shape at T = 2..64, the kernel at
#      every split-K beside cublasGemmEx, as fractions of the copy bandwidth
#      -> $OUT/skinny-bench.txt;
#   3. kda-cli bench's decode grid with the skinny GEMM left out of tuning
#      (gemm_skinny=0) and in (the default), A B A B, then the default once
#      with gemm_verbose=1 (which kernel won each shape) and once with prof=1
#      -> $OUT/skinny-{off,on}{1,2}.json, skinny-prof.json.
# KDA_SK_SKIP="tests bench ab" skips parts, KDA_SK_PAIRS the decode points.
# $OUT: summary.txt, the files above, logs.tgz.
source "$(dirname "$0")/gpu-env.sh"
run_start "${KDA_SK_SKIP:-}"
gen_m17
if ! skip tests; then
  step test_skinny 120 "$LOG/test_skinny.txt" $B/tests/kernels/test_skinny
  grep -E "FAIL|cases failed" "$LOG/test_skinny.txt" | tail -8 >> "$S"
  step memcheck_skinny 240 "$LOG/memcheck_skinny.txt" env KDA_SKINNY_TEST_QUICK=1 \
    compute-sanitizer --tool memcheck --error-exitcode 3 \
    $B/tests/kernels/test_skinny
  grep -E "ERROR SUMMARY|cases failed" "$LOG/memcheck_skinny.txt" | tail -2 >> "$S"
  step test_kernels 120 "$LOG/test_kernels.txt" $B/tests/kernels/test_kernels
  grep -E "PASSED|FAILED|ERROR" "$LOG/test_kernels.txt" | tail -3 >> "$S"
  gen_wait
  step test_cuda_model 240 "$LOG/test_cuda_model.txt" env KDA_TEST_MODEL_17B=$M17 $B/tests/kernels/test_cuda_model
  grep -E "PASSED|FAILED|ERROR|cuda vs|differ" "$LOG/test_cuda_model.txt" | tail -30 >> "$S"
fi
if ! skip bench; then
  step skinny_bench 120 "$OUT/skinny-bench.txt" $B/tests/kernels/test_skinny --bench
  cat "$OUT/skinny-bench.txt" >> "$S"
fi
gen_wait
if ! skip ab; then
  P="--pairs ${KDA_SK_PAIRS:-128:1,128:2,128:4,128:8,128:16,128:32,128:64,128:256,4096:16,4096:64} --no-kernels"
  for run in off1 on1 off2 on2; do
    t=; [ "${run:0:3}" = off ] && t="--tuning gemm_skinny=0"
    step "bench-$run" 100 "$LOG/bench-$run.txt" bash -c "exec $B/cli/kda-cli bench \"$M17\" $P $t --json \"$OUT/skinny-$run.json\""
    echo "-- $run" >> "$S"; grep -E "decode B" "$LOG/bench-$run.txt" >> "$S"
  done
  step bench-verbose 100 "$LOG/bench-verbose.txt" bash -c "exec $B/cli/kda-cli bench \"$M17\" --pairs 128:16 --no-kernels --tuning gemm_verbose=1"
  grep -E "kc_gemm_lt:" "$LOG/bench-verbose.txt" >> "$S"
  step bench-prof 100 "$LOG/bench-prof.txt" bash -c "exec $B/cli/kda-cli bench \"$M17\" --pairs 128:1,128:16,128:64,128:256 --no-kernels --tuning prof=1 --json \"$OUT/skinny-prof.json\""
  grep -E "decode B|gemm|GEMM" "$LOG/bench-prof.txt" | head -40 >> "$S"
fi
tar czf "$OUT/logs.tgz" -C /tmp kda-logs
cat "$S"
exit $rc
