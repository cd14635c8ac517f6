#!/usr/bin/env bash
# Run ON THE GPU MACHINE: a change to the prompt kernels (flash attention of
# kernels/ops_attn_prefill.cu, chunked KDA of kernels/ops_kda_chunk.cu) against the
# programs of an older commit, in one call. Prepare here with
#   scripts/gpu-prepare.sh --with old/test_prefill_ops=OLD_BUILD/tests/kernels/test_prefill_ops \
#     --with old/test_kda_chunk=OLD_BUILD/tests/kernels/test_kda_chunk --with old/kda-cli=OLD_BUILD/cli/kda-cli \
#     [--with var/NAME/test_prefill_ops=FILE]...
# and carry [".carry.tar.xz", ".whl"]. Steps (KDA_PAB_SKIP="tests sanitize kernels model"):
#   tests     test_kernels, test_prefill_ops and test_kda_chunk of the carried build (every case vs the CPU
#             reference), test_cuda_model on the random 1.7B checkpoint (CUDA vs CPU);
#   sanitize  memcheck + racecheck: the small attention shapes, the chunk test's quick cases;
#   kernels   test_prefill_ops --bench and test_kda_chunk --bench, old / new / each variant
#             alternately, twice (the card's drift shows between the two rounds);
#   model     kda-cli bench (prefill 1x2048, 8x2048; score 1x8192, 4x8192), old new old new,
#             then each once more with prof=1 (device time by kind).
# $OUT: summary.txt (every BENCH row, labelled by run), pab-{old,new}{1,2,-prof}.json (kda-cli),
# logs.tgz.
source "$(dirname "$0")/gpu-env.sh"
run_start "${KDA_PAB_SKIP:-}"
gen_m17
TP=$B/tests/kernels/test_prefill_ops TC=$B/tests/kernels/test_kda_chunk
for f in .carry/old/test_prefill_ops .carry/old/test_kda_chunk .carry/old/kda-cli; do
  [ -x "$f" ] || { echo "no $f" | tee -a "$S"; exit 1; }
done
if ! skip tests; then
  step test_kernels 120 "$LOG/test_kernels.txt" $B/tests/kernels/test_kernels
  grep -E "PASSED|FAILED" "$LOG/test_kernels.txt" | head -5 >> "$S"
  step test_prefill_ops 120 "$LOG/test_prefill_ops.txt" $TP
  grep -E "^FAIL|PASSED|FAILED" "$LOG/test_prefill_ops.txt" | head -20 >> "$S"
  step test_kda_chunk 240 "$LOG/test_kda_chunk.txt" $TC
  grep -E "FAIL|test_kda_chunk:" "$LOG/test_kda_chunk.txt" | head -20 >> "$S"
fi
if ! skip sanitize; then
  step racecheck-attn 120 "$LOG/racecheck-attn.txt" compute-sanitizer --tool racecheck --racecheck-report hazard \
    --error-exitcode 3 $TP test_attn_prefill_every_head_dim_and_group
  tail -2 "$LOG/racecheck-attn.txt" >> "$S"
  step memcheck-attn 120 "$LOG/memcheck-attn.txt" compute-sanitizer --tool memcheck --leak-check no \
    --error-exitcode 3 $TP test_attn_prefill_every_head_dim_and_group
  tail -2 "$LOG/memcheck-attn.txt" >> "$S"
  step memcheck-chunk 120 "$LOG/memcheck-chunk.txt" env KDA_CHUNK_TEST_QUICK=2 \
    compute-sanitizer --tool memcheck --leak-check no --error-exitcode 3 $TC
  tail -2 "$LOG/memcheck-chunk.txt" >> "$S"
  step racecheck-chunk 120 "$LOG/racecheck-chunk.txt" env KDA_CHUNK_TEST_QUICK=2 \
    compute-sanitizer --tool racecheck --racecheck-report hazard --error-exitcode 3 $TC
  tail -2 "$LOG/racecheck-chunk.txt" >> "$S"
fi
if ! skip kernels; then
  vars=$(ls -d .carry/var/*/ 2>/dev/null | xargs -r -n1 basename)
  BT=${KDA_PAB_BT:-"1:128,8:128,1:2048,8:2048,1:8192,4:8192"}
  for round in 1 2; do
    for v in old new $vars; do
      case $v in old) t=.carry/old/test_prefill_ops ;; new) t=$TP ;; *) t=.carry/var/$v/test_prefill_ops ;; esac
      if [ -x "$t" ]; then
        step "attn-bench-$v$round" 90 "$LOG/attn-bench-$v$round.txt" $t --bench
        grep "^BENCH" "$LOG/attn-bench-$v$round.txt" | sed "s/^BENCH/attn $v$round/" >> "$S"
      fi
      case $v in old) t=.carry/old/test_kda_chunk ;; new) t=$TC ;; *) t=.carry/var/$v/test_kda_chunk ;; esac
      if [ -x "$t" ]; then
        step "chunk-bench-$v$round" 90 "$LOG/chunk-bench-$v$round.txt" env KDA_CHUNK_BENCH_BT="$BT" \
          KDA_CHUNK_BENCH_VARIANT=defaults $t --bench
        grep "defaults" "$LOG/chunk-bench-$v$round.txt" | sed "s/^/chunk $v$round /" >> "$S"
      fi
    done
  done
fi
gen_wait
if ! skip tests; then
  step test_cuda_model 240 "$LOG/test_cuda_model.txt" env KDA_TEST_MODEL_17B=$M17 $B/tests/kernels/test_cuda_model
  grep -E "PASSED|FAILED|ERROR|cuda vs|differ" "$LOG/test_cuda_model.txt" | tail -30 >> "$S"
fi
if ! skip model; then
  P=${KDA_PAB_POINTS:-"--pairs 128:1 --no-kernels --prefill 1:2048,8:2048 --score 1:8192,4:8192 --reps 5"}
  for run in old1 new1 old2 new2 old-prof new-prof; do
    cli=$B/cli/kda-cli; [ "${run:0:3}" = old ] && cli=.carry/old/kda-cli
    t=; [ "${run#*-}" = prof ] && t="--tuning prof=1"
    step "bench-$run" 100 "$LOG/bench-$run.txt" bash -c "exec $cli bench \"$M17\" $P $t --json \"$OUT/pab-$run.json\""
    echo "-- $run" >> "$S"; grep -E "prefill|score|gemm|kda|attention|other" "$LOG/bench-$run.txt" >> "$S"
  done
fi
tar czf "$OUT/logs.tgz" -C /tmp kda-logs
cat "$S"
exit $rc
