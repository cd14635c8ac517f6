#!/usr/bin/env bash
# Run ON THE GPU MACHINE (after scripts/gpu-prepare.sh here): the whole-model
# test and the decode benchmark under the backend's switches, to attribute a
# failure or a speed change to one component. No baseline (see gpu-session.sh).
# Each variant is a KDA_TUNING value (engine.h kda_tuning; bench/NOTES.md):
#   pdl=0                   programmatic dependent launch off
#   gemv_persist=0          one row group per GEMV block instead of persistent blocks
#   gemm_lt=0               plain cublasGemmEx instead of the tuned cuBLASLt plans
#   graphs=0                no CUDA graphs
# Logs: $OUT/variants.txt (summary) and $OUT/logs.tgz.
source "$(dirname "$0")/gpu-env.sh"
{
  python3 scripts/gen_checkpoint.py "$M17" --preset 1.7b --tokenizer none > "$LOG/gen.txt" 2>&1 &
  gen_pid=$!
  echo "== test_kernels"
  ours timeout 150 $B/tests/kernels/test_kernels > "$LOG/tk.txt" 2>&1; echo "rc=$?"
  grep -E "PASSED|FAILED|variant" "$LOG/tk.txt"
  [ "${KDA_VARIANTS_MEMCHECK:-1}" = 0 ] || { echo "== memcheck test_kernels"
  ours timeout 240 compute-sanitizer --tool memcheck --leak-check no --error-exitcode 3 $B/tests/kernels/test_kernels \
    > "$LOG/memcheck.txt" 2>&1; echo "rc=$?"
  grep -E "ERROR SUMMARY|PASSED|FAILED" "$LOG/memcheck.txt" | tail -4; }
  echo "== kernel lab: lab_kda_step_tiled (test, then against kc_kda_step)"
  ours timeout 120 $B/kernels/lab/lab_kda_step_tiled > "$LOG/lab.txt" 2>&1; echo "rc=$?"
  grep -E "PASSED|FAILED" "$LOG/lab.txt"
  ours timeout 60 $B/kernels/lab/lab_kda_step_tiled --bench 2>&1
  wait $gen_pid
  for v in "" ${KDA_VARIANTS_MODEL-"mixed_pass=0"}; do
    echo "== test_cuda_model ${v:-defaults} (with the 1.7B case)"
    ours KDA_TUNING="$v" KDA_TEST_MODEL_17B=$M17 timeout 240 $B/tests/kernels/test_cuda_model > "$LOG/tcm.txt" 2>&1; echo "rc=$?"
    grep -E "positions|cuda vs|bf16-act vs|vs alone|reuse|PASSED|FAILED" "$LOG/tcm.txt" | head -40
    cat "$LOG/tcm.txt" >> "$LOG/tcm_all.txt"
  done
  echo "== bench defaults"
  ours timeout 150 $B/cli/kda-cli bench "$M17" --json "$OUT/ours.json" 2>&1 | grep -E "kda|attn|gemv T=1|decode|cuda:"
  for v in ${KDA_VARIANTS_BENCH-"gemv_persist=0" "pdl=0"}; do
    echo "== bench $v (decode only)"
    ours KDA_TUNING="$v" timeout 100 $B/cli/kda-cli bench "$M17" --no-kernels 2>&1 | grep -E "decode B"
  done
} 2>&1 | tee "$OUT/variants.txt"
tar czf "$OUT/logs.tgz" -C /tmp kda-logs
