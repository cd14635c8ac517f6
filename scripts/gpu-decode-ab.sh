#!/usr/bin/env bash
# Run ON THE GPU MACHINE (after scripts/gpu-prepare.sh --old OLD_KDA_CLI here; carry
# [".carry.tar.xz", ".whl"]): decode steps of the carried build against an older kda-cli in
# the same call (issue #14), the tests first.
#   tests    test_kernels (the KDA step and stream cases against the CPU reference, ...),
#            test_cuda_model with the random 1.7B checkpoint (CUDA vs CPU, batch vs alone);
#   bench    kda-cli bench decode points, old new old new (A B A B: the card's drift shows
#            between the two runs of one binary);
#   kernels  kda-cli's kernel table (each kernel alone, back to back), old then new.
# KDA_DAB_POINTS (bench options), KDA_DAB_SKIP="tests bench kernels".
# $OUT: summary.txt, dec-{old,new}{1,2}.json, logs.tgz.
source "$(dirname "$0")/gpu-env.sh"
run_start "${KDA_DAB_SKIP:-}"
gen_m17
[ -x .carry/old/kda-cli ] || { echo "no .carry/old/kda-cli" | tee -a "$S"; exit 1; }
if ! skip tests; then
  step test_kernels 150 "$LOG/test_kernels.txt" $B/tests/kernels/test_kernels
  grep -E "PASSED|FAILED|ERROR" "$LOG/test_kernels.txt" | tail -3 >> "$S"
  gen_wait
  step test_cuda_model 240 "$LOG/test_cuda_model.txt" env KDA_TEST_MODEL_17B=$M17 $B/tests/kernels/test_cuda_model
  grep -E "PASSED|FAILED|ERROR" "$LOG/test_cuda_model.txt" | tail -5 >> "$S"
fi
gen_wait
P=${KDA_DAB_POINTS:-"--pairs 128:1,128:16,128:64,128:256,4096:64 --reps 5"}
if ! skip bench; then
  for run in old1 new1 old2 new2; do
    cli=$B/cli/kda-cli; [ "${run:0:3}" = old ] && cli=.carry/old/kda-cli
    step "bench-$run" 90 "$LOG/bench-$run.txt" $cli bench "$M17" $P --no-kernels --json "$OUT/dec-$run.json"
    echo "-- $run" >> "$S"; grep -E "decode B" "$LOG/bench-$run.txt" >> "$S"
  done
fi
if ! skip kernels; then
  for run in old new; do
    cli=$B/cli/kda-cli; [ $run = old ] && cli=.carry/old/kda-cli
    step "kernels-$run" 90 "$LOG/kernels-$run.txt" $cli bench "$M17" --pairs 128:1 --reps 1
    echo "-- kernels $run" >> "$S"; grep -iE "copy|kda|gemv T=1 o-proj" "$LOG/kernels-$run.txt" >> "$S"
  done
fi
tar czf "$OUT/logs.tgz" -C /tmp kda-logs
cat "$S"
exit $rc
