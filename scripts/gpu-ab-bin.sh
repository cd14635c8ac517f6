#!/usr/bin/env bash
# Run ON THE GPU MACHINE (after scripts/gpu-prepare.sh here, plus an older kda-cli put in
# .carry/old/kda-cli before packing: scripts/gpu-prepare.sh --old FILE does both; carry
# [".carry.tar.xz", ".whl"]): the carried build against an older kda-cli in the same call,
# the tests of the carried build first.
#   1. test_kernels, test_prefill_ops, test_cuda_model (with the random 1.7B checkpoint);
#   2. kda-cli bench on the 1.7B shape, old and new alternately (A B A B: the card's drift
#      shows between the two runs of one binary), then each once more with prof=1.
# KDA_ABB_POINTS (bench options), KDA_ABB_SKIP="tests bench". $OUT: summary.txt,
# abb-{old,new}{1,2}.json, abb-{old,new}-prof.json, logs.tgz.
source "$(dirname "$0")/gpu-env.sh"
run_start "${KDA_ABB_SKIP:-}"
gen_m17
[ -x .carry/old/kda-cli ] || { echo "no .carry/old/kda-cli" | tee -a "$S"; exit 1; }
if ! skip tests; then
  step test_kernels 120 "$LOG/test_kernels.txt" $B/tests/kernels/test_kernels
  grep -E "PASSED|FAILED|ERROR" "$LOG/test_kernels.txt" | tail -3 >> "$S"
  step test_prefill_ops 120 "$LOG/test_prefill_ops.txt" $B/tests/kernels/test_prefill_ops
  grep -E "PASSED|FAILED|ERROR" "$LOG/test_prefill_ops.txt" | tail -3 >> "$S"
  gen_wait
  step test_cuda_model 240 "$LOG/test_cuda_model.txt" env KDA_TEST_MODEL_17B=$M17 $B/tests/kernels/test_cuda_model
  grep -E "PASSED|FAILED|ERROR|cuda vs|differ" "$LOG/test_cuda_model.txt" | tail -30 >> "$S"
fi
gen_wait
if ! skip bench; then
  P=${KDA_ABB_POINTS:-"--pairs 128:1,128:64,128:256 --no-kernels --prefill 1:2048,8:2048 --score 1:8192,4:8192 --reps 5"}
  for run in old1 new1 old2 new2 old-prof new-prof; do
    cli=$B/cli/kda-cli; [ "${run:0:3}" = old ] && cli=.carry/old/kda-cli
    t=; [ "${run#*-}" = prof ] && t="--tuning prof=1"
    step "bench-$run" 100 "$LOG/bench-$run.txt" bash -c "exec $cli bench \"$M17\" $P $t --json \"$OUT/abb-$run.json\""
    echo "-- $run" >> "$S"; grep -E "decode B|prefill|score" "$LOG/bench-$run.txt" >> "$S"
  done
fi
tar czf "$OUT/logs.tgz" -C /tmp kda-logs
cat "$S"
exit $rc
