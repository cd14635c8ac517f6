#!/usr/bin/env bash
# Run ON THE GPU MACHINE (after scripts/gpu-prepare.sh here; carry
# [".carry.tar.xz", ".whl"]): the skinny decode GEMM (kernels/ops_skinny.cu)
# in one call:
#   1. test_skinny (against float64), its small shapes under compute-sanitizer
#      memcheck;
#   2. test_skinny --bench: each decode GEMM shape of the 1.7B model at
#      T = 2..64, alone and back to back in a CUDA graph, against cublasGemmEx
#      and the tuned cuBLASLt plan -> $OUT/skinny-bench.txt;
#   3. kda-cli bench's decode grid with the skinny GEMM left out of tuning
#      (gemm_skinny=0) and in (the default), A B A B -> $OUT/ab-{off,on}{1,2}.json,
#      then one verbose tuning log (which kernel won each shape, and why);
#   4. test_cuda_model with the random 1.7B checkpoint (the tuned decode GEMMs
#      inside the whole model).
# KDA_SK_SKIP="test memcheck bench ab model" skips parts, KDA_SK_PAIRS the
# decode points. $OUT: summary.txt, the files above, logs.tgz.
source "$(dirname "$0")/gpu-env.sh"
run_start "${KDA_SK_SKIP:-}"
gen_m17
L=$B/tests/kernels/test_skinny
if ! skip test; then
  step test 120 "$LOG/test.txt" $L
  grep -E "FAIL|cases failed" "$LOG/test.txt" | tail -8 >> "$S"
fi
if ! skip memcheck; then
  step memcheck 240 "$LOG/memcheck.txt" env KDA_SKINNY_TEST_QUICK=1 compute-sanitizer --tool memcheck \
    --error-exitcode 3 $L
  grep -E "ERROR SUMMARY|cases failed" "$LOG/memcheck.txt" | tail -2 >> "$S"
fi
if ! skip bench; then
  step bench 240 "$OUT/skinny-bench.txt" $L --bench
  cat "$OUT/skinny-bench.txt" >> "$S"
fi
gen_wait
if ! skip ab; then
  P="--pairs ${KDA_SK_PAIRS:-128:2,128:4,128:8,128:16,128:32,128:64,4096:16} --no-kernels"
  for run in off1 on1 off2 on2; do
    t=; [ "${run:0:3}" = off ] && t="--tuning gemm_skinny=0"
    step "bench-$run" 70 "$LOG/bench-$run.txt" \
      bash -c "exec $B/cli/kda-cli bench \"$M17\" $P $t --json \"$OUT/ab-$run.json\""
    echo "-- $run" >> "$S"; grep -E "decode B" "$LOG/bench-$run.txt" >> "$S"
  done
  step bench-verbose 70 "$LOG/bench-verbose.txt" \
    bash -c "exec $B/cli/kda-cli bench \"$M17\" --pairs 128:16 --no-kernels --tuning gemm_verbose=1"
  grep -E "kc_gemm_lt:" "$LOG/bench-verbose.txt" | sed 's/ldx=[0-9]* ldy=[0-9]* //' >> "$S"
fi
if ! skip model; then
  step test_cuda_model 240 "$LOG/test_cuda_model.txt" env KDA_TEST_MODEL_17B=$M17 $B/tests/kernels/test_cuda_model
  grep -E "PASSED|FAILED|ERROR" "$LOG/test_cuda_model.txt" | tail -3 >> "$S"
fi
tar czf "$OUT/logs.tgz" -C /tmp kda-logs
cat "$S"
exit $rc
