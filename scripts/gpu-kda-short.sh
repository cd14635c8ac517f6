#!/usr/bin/env bash
# Run ON THE GPU MACHINE (after scripts/gpu-prepare.sh --with old/kda-cli=FILE --with
# old/test_kda_chunk=FILE here, both from the commit before the change; carry
# [".carry.tar.xz", ".whl"]): a chunked-KDA change for short chunks (items of a few
# tokens: lm-eval continuations after a cached context, the last chunk of every prompt)
# against the build before it, in one call. For kernels/lab/kda-chunk-short-bounds.patch:
#   git worktree add /tmp/base HEAD && (cd /tmp/base && meson setup build-cuda -Dcuda=enabled \
#     -Dbuildtype=release && ninja -C build-cuda cli/kda-cli tests/kernels/test_kda_chunk server/kda-server)
#   git apply kernels/lab/kda-chunk-short-bounds.patch
#   bash scripts/gpu-prepare.sh --with old/kda-cli=/tmp/base/build-cuda/cli/kda-cli \
#     --with old/test_kda_chunk=/tmp/base/build-cuda/tests/kernels/test_kda_chunk \
#     --with base/kda-server=/tmp/base/build-cuda/server/kda-server
# then the device call `bash scripts/gpu-kda-short.sh` (about 2 minutes; 5 with step 5).
#   1. the carried test_kda_chunk, every case; racecheck on its short-item cases; test_prefill_ops;
#   2. its benchmark, old and new alternately (A B A B), defaults only, per-stage times, on
#      KDA_SHORT_BT (B:L list: short items, a serving chunk, one long prompt as the control);
#   3. kda-cli bench --score on cached-continuation steps and fresh prompts (KDA_SHORT_POINTS),
#      old and new alternately with prof=1 (device time by kind);
#   4. ncu of the new build's kernels in one 8 x 17 after 1,023 step (scripts/gpu-ncu-pass.sh);
#   5. with .carry/base/kda-server (gpu-prepare.sh --with base/kda-server=FILE): the lm-eval
#      forms of the prefix-cache workload through it and the new build
#      (scripts/gpu-prefix.sh --lm-eval-only, KDA_PREFIX_REPEAT default 2).
# $OUT: summary.txt, chunk-bench.txt, cli-bench.txt, ncu.txt, prefix-lmeval-{base,new}.json,
# logs.tgz (the test output among the logs).
source "$(dirname "$0")/gpu-env.sh"
run_start "${STEP_SKIP:-}"
T=$B/tests/kernels/test_kda_chunk OLDT=.carry/old/test_kda_chunk OLDC=.carry/old/kda-cli
for f in $OLDT $OLDC; do [ -x "$f" ] || { echo "no $f" | tee -a "$S"; exit 1; }; done
M17S=/tmp/kda-1.7b-bytes gen=
if [ ! -f "$M17S/config.json" ]; then
  python3 scripts/gen_checkpoint.py "$M17S" --preset 1.7b --vocab 256 --tokenizer bytes > "$LOG/gen.txt" 2>&1 &
  gen=$!
fi
# the test and the A B A B kernel bench: scripts/gpu-kda-chunk-ab.sh (its sanitizer step
# covers every small case; here racecheck on the short items only)
CAB=/tmp/kda-chunk-ab; rm -rf "$CAB"; mkdir -p "$CAB"
env OUT=$CAB STEP_BUDGET=$((STEP_BUDGET - SECONDS)) KDA_CHUNK_AB_SKIP=sanitize \
  KDA_CHUNK_AB_BT="${KDA_SHORT_BT:-8:17,1:17,8:33,16:9,8:128,1:2048}" bash scripts/gpu-kda-chunk-ab.sh \
  > "$LOG/chunk-ab.txt" 2>&1 || rc=1
grep -vE "^(old|new)[12] " "$CAB/summary.txt" >> "$S"
grep -E "^(old|new)[12] " "$CAB/summary.txt" > "$OUT/chunk-bench.txt"
cp "$CAB/chunk-test.txt" "$LOG/" 2>/dev/null
step racecheck 90 "$LOG/racecheck.txt" env KDA_CHUNK_TEST_QUICK=2 KDA_CHUNK_TEST_ONLY=short \
  compute-sanitizer --tool racecheck --racecheck-report hazard --error-exitcode 3 "$T"
tail -2 "$LOG/racecheck.txt" >> "$S"
step prefill_ops 60 "$LOG/prefill-ops.txt" $B/tests/kernels/test_prefill_ops
grep -E "^FAIL|^\[  (PASSED|FAILED)" "$LOG/prefill-ops.txt" | head -5 >> "$S"
cat "$OUT/chunk-bench.txt" >> "$S"
[ -z "$gen" ] || wait $gen
P=${KDA_SHORT_POINTS:-8:17+1023,1:17+1023,8:33+1023,1:128+1023,8:128,1:2048}
for run in old1 new1 old2 new2; do
  c=$B/cli/kda-cli; [ "${run:0:3}" = old ] && c=$OLDC
  step "cli-bench-$run" 80 "$LOG/cli-bench-$run.txt" $c bench "$M17S" --pairs "" --no-kernels --score "$P" \
    --reps 7 --tuning prof=1 --json "$LOG/cli-bench-$run.json"
  { echo "== $run: kda-cli bench --score $P --tuning prof=1"; grep -E "score|prefill" "$LOG/cli-bench-$run.txt"; } >> "$OUT/cli-bench.txt"
done
cat "$OUT/cli-bench.txt" >> "$S"
mkdir -p "$LOG/ncu"
step ncu 150 "$LOG/ncu.txt" env OUT="$LOG/ncu" M17="$M17S" KDA_NCU_TIMEOUT=130 KDA_NCU_COUNT=4000 \
  KDA_NCU_BENCH="--pairs \"\" --no-kernels --score 8:17+1023 --reps 1" bash scripts/gpu-ncu-pass.sh
head -30 "$LOG/ncu/ncu-pass.txt" > "$OUT/ncu.txt" 2>/dev/null
cat "$OUT/ncu.txt" >> "$S"
if [ -x .carry/base/kda-server ]; then
  mkdir -p "$LOG/prefix"
  step lmeval 300 "$LOG/lmeval.txt" env OUT="$LOG/prefix" KDA_PREFIX_REPEAT=${KDA_PREFIX_REPEAT:-2} \
    bash scripts/gpu-prefix.sh --lm-eval-only
  cp "$LOG"/prefix/prefix-lmeval-*.json "$OUT/" 2>/dev/null
  grep -iE "ratio|wall|lm.eval|computed" "$LOG/prefix/prefix.txt" | head -30 >> "$S"
fi
tar czf "$OUT/logs.tgz" -C /tmp kda-logs
cat "$S"
exit $rc
