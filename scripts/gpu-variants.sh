#!/usr/bin/env bash
# Run ON THE GPU MACHINE (after scripts/gpu-prepare.sh here): the whole-model
# test and the decode benchmark under the backend's switches, to attribute a
# failure or a speed change to one component. No baseline (see gpu-session.sh).
#   KDA_PDL=0               programmatic dependent launch off
#   KDA_KDA_TILED=1         column-tiled cluster KDA kernel instead of block-per-head
#   KDA_CUDA_GEMM_LT=0      plain cublasGemmEx instead of the tuned cuBLASLt plans
#   KDA_CUDA_GRAPHS=0       no CUDA graphs
# Logs: $OUT/variants.txt (summary) and $OUT/logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kda-out}
LOG=/tmp/kda-logs
rm -rf "$LOG"; mkdir -p "$OUT" "$LOG"
export KDA_LIB_PATH=$PWD/.carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
B=.carry/build
M17=/tmp/kda-1.7b
run() { env LD_LIBRARY_PATH=$KDA_LIB_PATH KDA_SRC=$PWD KDA_BUILD=$PWD/$B "$@"; }
{
  python3 scripts/gen_checkpoint.py "$M17" --preset 1.7b --tokenizer none > "$LOG/gen.txt" 2>&1 &
  gen_pid=$!
  echo "== test_kernels, PDL off"
  run KDA_PDL=0 timeout 120 $B/tests/kernels/test_kernels > "$LOG/tk_pdl.txt" 2>&1; echo "rc=$?"
  grep -E "PASSED|FAILED" "$LOG/tk_pdl.txt"
  echo "== memcheck test_kernels"
  run timeout 200 compute-sanitizer --tool memcheck --leak-check no --error-exitcode 3 $B/tests/kernels/test_kernels \
    > "$LOG/memcheck.txt" 2>&1; echo "rc=$?"
  grep -E "ERROR SUMMARY|PASSED|FAILED" "$LOG/memcheck.txt" | tail -4
  for v in "" "KDA_PDL=0" "KDA_KDA_TILED=1" "KDA_CUDA_GEMM_LT=0" "KDA_CUDA_GRAPHS=0" \
           "KDA_CUDA_GEMM_LT=0 KDA_CUDA_GEMV_MAX_T=0"; do
    echo "== test_cuda_model (tiny models) ${v:-defaults}"
    run $v timeout 120 $B/tests/kernels/test_cuda_model > "$LOG/tcm.txt" 2>&1; echo "rc=$?"
    grep -E "positions|by position|vs alone|reuse|PASSED|FAILED  \]" "$LOG/tcm.txt" | grep -v "^\[  FAILED  \] test_" | head -12
    cat "$LOG/tcm.txt" >> "$LOG/tcm_all.txt"
  done
  wait $gen_pid
  echo "== test_cuda_model 1.7B, defaults"
  run KDA_TEST_MODEL_17B=$M17 timeout 200 $B/tests/kernels/test_cuda_model > "$LOG/tcm17.txt" 2>&1; echo "rc=$?"
  grep -E "kda-1.7b|by position" "$LOG/tcm17.txt"
  echo "== bench defaults"
  run timeout 150 $B/cli/kda-cli bench "$M17" --json "$OUT/ours.json" 2>&1 | grep -E "kda|attn|gemv T=1|decode|cuda:"
  echo "== bench KDA_PDL=0 (decode only)"
  run KDA_PDL=0 timeout 100 $B/cli/kda-cli bench "$M17" --no-kernels 2>&1 | grep -E "decode B"
  echo "== bench KDA_KDA_TILED=1 (decode only)"
  run KDA_KDA_TILED=1 timeout 100 $B/cli/kda-cli bench "$M17" --no-kernels 2>&1 | grep -E "decode B"
} 2>&1 | tee "$OUT/variants.txt"
tar czf "$OUT/logs.tgz" -C /tmp kda-logs
