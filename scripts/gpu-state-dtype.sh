#!/usr/bin/env bash
# Run ON THE GPU MACHINE (after scripts/gpu-prepare.sh here; carry
# [".carry.tar.xz", ".whl"]): the bf16 KDA state storage (issue 14,
# --kda-state-dtype bf16) in one call, ~6 minutes:
#   1. the kernel tests: test_kernels (the step kernel with bf16 state against
#      the CPU reference), test_kda_chunk (bf16 state bit for bit against the
#      fp32-state run, and the quick fp32 cases), test_cuda_model (whole model,
#      the demo checkpoint with bf16 state against the CPU);
#   2. the decode grid with fp32 and with bf16 state (kda-cli bench; the kernel
#      lines include the bf16 KDA step's bandwidth);
#   3. fidelity (scripts/bench_state_dtype.py): the demo model on text (with
#      the fp32 CPU reference as the scale; KDA_TEXT names a text file) and the
#      random 1.7B shape at 512 and 4096 tokens.
# Outputs in $OUT: state-dtype.txt (everything printed), decode-fp32.json,
# decode-bf16.json, fidelity-demo.json, fidelity-1.7b.json, logs.tgz.
# KDA_STATE_ONLY=fidelity runs part 3 alone.
source "$(dirname "$0")/gpu-env.sh"
export KDA_COMMIT=${KDA_COMMIT:-$(cat .carry/commit 2>/dev/null || echo unknown)}
R=$OUT/state-dtype.txt
{ echo "commit $KDA_COMMIT"
  ( python3 scripts/gen_checkpoint.py "$M17" --preset 1.7b --tokenizer spm:.carry/llama2-tokenizer.model > "$LOG/gen.txt" 2>&1 ) &
  gen=$!
  if [ "${KDA_STATE_ONLY:-}" != fidelity ]; then
  ours timeout 90 $B/tests/kernels/test_kernels > "$LOG/test_kernels.txt" 2>&1; echo "test_kernels rc=$?"
  grep -E "bf16 state|PASSED|FAILED" "$LOG/test_kernels.txt" | sort | uniq -c | sort -rn | head -20
  ours env KDA_CHUNK_TEST_QUICK=1 timeout 150 $B/tests/kernels/test_kda_chunk > "$LOG/test_kda_chunk.txt" 2>&1
  echo "test_kda_chunk rc=$?"
  grep -E "bf16 state|test_kda_chunk:|PASSED|FAILED" "$LOG/test_kda_chunk.txt"
  wait $gen
  ours timeout 150 $B/tests/kernels/test_cuda_model > "$LOG/test_cuda_model.txt" 2>&1; echo "test_cuda_model rc=$?"
  grep -E "PASSED|FAILED|mixed_pass" "$LOG/test_cuda_model.txt"
  P=${KDA_STATE_PAIRS:-128:1,128:64,128:256,4096:64}
  ours timeout 120 $B/cli/kda-cli bench "$M17" --pairs "$P" --json "$OUT/decode-fp32.json" 2>&1 |
    grep -E "kda lowrank|copy|decode B"
  ours timeout 90 $B/cli/kda-cli bench "$M17" --pairs "$P" --no-kernels --kda-state-dtype bf16 \
    --json "$OUT/decode-bf16.json" 2>&1 | grep -E "decode B|pool"
  fi
  wait $gen 2>/dev/null
  text=${KDA_TEXT:-}
  ours timeout 240 python3 scripts/bench_state_dtype.py --server $B/server/kda-server --model models/demo \
    --lengths 256,2000 --texts 4 --gen 128 ${text:+--text "$text"} --cpu-reference --log-dir "$LOG" \
    --out "$OUT/fidelity-demo.json" 2>&1 | tail -4
  ours timeout 240 python3 scripts/bench_state_dtype.py --server $B/server/kda-server --model "$M17" \
    --lengths 512,4096 --texts 2 --gen 64 --log-dir "$LOG" --out "$OUT/fidelity-1.7b.json" 2>&1 | tail -4
} 2>&1 | tee "$R"
rc=0
grep -q "rc=[1-9]" "$R" && rc=1
tar czf "$OUT/logs.tgz" -C /tmp kda-logs
exit $rc
