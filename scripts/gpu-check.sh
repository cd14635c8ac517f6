#!/usr/bin/env bash
# Run ON THE GPU MACHINE (after scripts/gpu-prepare.sh here; carry
# [".carry.tar.xz", ".whl"]): the short check after a kernel change, ~3 minutes:
# the kernel and whole-model tests (test_kernels, test_cuda_model), our decode
# grid with the per-kernel bandwidth (kda-cli bench, no baseline: a full run
# with the baseline is scripts/gpu-bench.sh), and /score 1 x 8192 through
# kda-server. Results in $OUT: check.txt (everything printed), decode.json,
# score-server.json. KDA_CHECK_PAIRS sets the decode points.
source "$(dirname "$0")/gpu-env.sh"
export KDA_COMMIT=${KDA_COMMIT:-$(cat .carry/commit 2>/dev/null || echo unknown)}
R=$OUT/check.txt
rc=0
{ echo "commit $KDA_COMMIT"
  # the checkpoint is made while the kernel tests run (started inside this
  # group so that wait sees it: the group runs in a subshell of the pipe)
  ( python3 scripts/gen_checkpoint.py "$M17" --preset 1.7b --tokenizer spm:.carry/llama2-tokenizer.model > "$LOG/gen.txt" 2>&1 ) &
  gen=$!
  ours timeout 60 $B/tests/kernels/test_kernels > "$LOG/test_kernels.txt" 2>&1; echo "test_kernels rc=$?"
  grep -E "PASSED|FAILED" "$LOG/test_kernels.txt"
  wait $gen
  ours timeout 120 $B/tests/kernels/test_cuda_model > "$LOG/test_cuda_model.txt" 2>&1; echo "test_cuda_model rc=$?"
  grep -E "PASSED|FAILED|fla fixtures:|mixed_pass" "$LOG/test_cuda_model.txt"
  ours timeout 120 $B/cli/kda-cli bench "$M17" --pairs "${KDA_CHECK_PAIRS:-128:1,128:16,128:64,128:256,4096:64}" \
    --json "$OUT/decode.json" 2>&1 | grep -E "kda lowrank|gqa decode|decode B|copy"
  ours timeout 60 python3 scripts/bench_score_server.py --server $B/server/kda-server --model "$M17" --device cuda \
    --points 1:8192 --reps 3 --log "$LOG/score-server.log" --out "$OUT/score-server.json"
} 2>&1 | tee "$R"
grep -q "rc=[1-9]" "$R" && rc=1
tar czf "$OUT/logs.tgz" -C /tmp kda-logs
exit $rc
