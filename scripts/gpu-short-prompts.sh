#!/usr/bin/env bash
# Run ON THE GPU MACHINE (after scripts/gpu-prepare.sh here; carry
# [".carry.tar.xz", ".whl"]): the chunked KDA forward on short and long prompts
# (issues #12, #13, #17), ~4 minutes:
#   1. test_kda_chunk (all cases);
#   2. its benchmark at the prompt shapes of serving and prefill (per stage ms),
#      and the same benchmark of an older build of the kernel when one was
#      carried in .carry/old/test_kda_chunk (KDA_OLD_COMMIT names it): the A/B of
#      a kernel change in one invocation;
#   3. test_kernels and test_cuda_model (the whole model on the GPU vs the CPU
#      reference and the fla fixtures);
#   4. kda-cli bench on the 1.7B shape: B = 64 decode, prefill of short and long
#      prompts, score 1 x 8192 and 4 x 8192, then again with --tuning prof=1 for
#      the device-time shares;
#   5. compute-sanitizer memcheck / racecheck / synccheck on test_kda_chunk's
#      small cases.
# $OUT: short-summary.txt (every step's status and the figures), short-bench.txt
# (the kernel benchmark, new then old), prefill.json, prefill-prof.json, logs.tgz.
source "$(dirname "$0")/gpu-env.sh"
export KDA_COMMIT=${KDA_COMMIT:-$(cat .carry/commit 2>/dev/null || echo unknown)}
S=$OUT/short-summary.txt
T=$B/tests/kernels/test_kda_chunk
SHAPES=${KDA_SHORT_SHAPES:-1:64,1:128,2:128,8:128,1:512,1:2048,8:2048,1:8192,4:8192}
rc=0
: > "$S"
echo "commit $KDA_COMMIT" | tee -a "$S"
( python3 scripts/gen_checkpoint.py "$M17" --preset 1.7b --tokenizer spm:.carry/llama2-tokenizer.model > "$LOG/gen.txt" 2>&1 ) &
gen=$!
step test 180 "$LOG/kda_chunk_test.txt" "$T"
grep -E "FAIL|test_kda_chunk:" "$LOG/kda_chunk_test.txt" | head -20 | tee -a "$S"
R=$OUT/short-bench.txt
echo "== kernel benchmark, this build ($KDA_COMMIT)" > "$R"
step bench 150 "$LOG/bench_new.txt" env KDA_CHUNK_BENCH_BT="$SHAPES" KDA_CHUNK_BENCH_VARIANT=defaults "$T" --bench
cat "$LOG/bench_new.txt" >> "$R"
if [ -x .carry/old/test_kda_chunk ]; then
  echo "== kernel benchmark, the older build (${KDA_OLD_COMMIT:-see .carry/old/commit})" >> "$R"
  step bench-old 150 "$LOG/bench_old.txt" env KDA_CHUNK_BENCH_BT="$SHAPES" KDA_CHUNK_BENCH_VARIANT=defaults \
    .carry/old/test_kda_chunk --bench
  cat "$LOG/bench_old.txt" >> "$R"
fi
wait $gen
step test_kernels 90 "$LOG/test_kernels.txt" $B/tests/kernels/test_kernels
grep -E "PASSED|FAILED" "$LOG/test_kernels.txt" | tail -3 | tee -a "$S"
step test_cuda_model 150 "$LOG/test_cuda_model.txt" $B/tests/kernels/test_cuda_model
grep -E "PASSED|FAILED|fla fixtures:" "$LOG/test_cuda_model.txt" | tail -4 | tee -a "$S"
P="--pairs 128:64 --prefill ${KDA_SHORT_PREFILL:-1:64,1:128,2:128,8:128,1:1024,1:2048,8:2048} --score 1:8192,4:8192 --reps 5"
step prefill 150 "$LOG/prefill.txt" $B/cli/kda-cli bench "$M17" $P --json "$OUT/prefill.json"
grep -E "decode B|prefill|score" "$LOG/prefill.txt" | tee -a "$S"
step prefill-prof 150 "$LOG/prefill_prof.txt" $B/cli/kda-cli bench "$M17" $P --tuning prof=1 --json "$OUT/prefill-prof.json"
grep -E "prefill|score" "$LOG/prefill_prof.txt" | tee -a "$S"
# the sanitizers last: their time is the instrumentation
for tool in memcheck racecheck synccheck; do
  extra=""; [ $tool = racecheck ] && extra="--racecheck-report hazard"
  [ $tool = memcheck ] && extra="--leak-check no"
  step $tool 90 "$LOG/kda_chunk_$tool.txt" env KDA_CHUNK_TEST_QUICK=2 \
    compute-sanitizer --tool $tool $extra --error-exitcode 3 "$T"
  tail -2 "$LOG/kda_chunk_$tool.txt" | tee -a "$S"
done
cp "$S" "$LOG/"
tar czf "$OUT/logs.tgz" -C /tmp kda-logs
exit $rc
