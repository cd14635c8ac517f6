#!/usr/bin/env bash
# Run ON THE GPU MACHINE (after scripts/gpu-prepare.sh here; carry
# [".carry.tar.xz", ".whl"]): the kernel lab's skinny decode GEMM
# (kernels/lab/skinny_gemm.cu) in one call:
#   1. lab_skinny_gemm (against float64), its small shapes under
#      compute-sanitizer memcheck;
#   2. lab_skinny_gemm --bench: each decode GEMM shape of the 1.7B model at
#      T = 2..64, isolated and in a back-to-back sequence, against cublasGemmEx
#      and the backend's tuned cuBLASLt plan -> $OUT/skinny-bench.txt.
# KDA_SK_SKIP="test memcheck bench" skips parts. $OUT: summary.txt, skinny-bench.txt, logs.tgz.
source "$(dirname "$0")/gpu-env.sh"
run_start "${KDA_SK_SKIP:-}"
L=$B/kernels/lab/lab_skinny_gemm
step test 120 "$LOG/test.txt" $L
grep -E "FAIL|cases failed" "$LOG/test.txt" | tail -8 >> "$S"
step memcheck 240 "$LOG/memcheck.txt" env KDA_SKINNY_TEST_QUICK=1 compute-sanitizer --tool memcheck --error-exitcode 3 $L
grep -E "ERROR SUMMARY|cases failed" "$LOG/memcheck.txt" | tail -2 >> "$S"
step bench 240 "$OUT/skinny-bench.txt" $L --bench
cat "$OUT/skinny-bench.txt" >> "$S"
tar czf "$OUT/logs.tgz" -C /tmp kda-logs
cat "$S"
exit $rc
