#!/usr/bin/env bash
# Run ON THE GPU MACHINE (after scripts/gpu-prepare.sh here; carry [".carry.tar.xz", ".whl"]):
# mixed steps (decoding sequences + prompt items) with the decode rows on a second stream
# (tuning mixed_reserve, tenth session), tests first, in one call of at most ~9 minutes.
#   1. test_cuda_model: the two-stream test (identical logits at reserves 16 / 64 / 1000 vs one
#      stream), then the tests whose steps it touches (begin/end, prefill then decode, batch of 64);
#   2. kda-cli bench --mixed on the 1.7B shape at each reserve of KDA_MX_RESERVES (default
#      "0 8 16 32 48"): a mixed step of B decoding + P prompts of T tokens against B decoding alone;
#   3. scripts/bench-serve.sh at C = 64, 256 with mixed_reserve=0 and with the default.
# KDA_MX_SKIP="tests mixed serve" skips parts. $OUT: summary.txt and the JSON files.
source "$(dirname "$0")/gpu-env.sh"
run_start "${KDA_MX_SKIP:-}"
gen_m17
if ! skip tests; then
  for t in two_streams begin_end prefill_then_decode batch_of_64; do
    step "tcm_$t" 150 "$LOG/tcm-$t.txt" env KDA_TEST_ONLY=$t $B/tests/kernels/test_cuda_model
    grep -E "PASSED|FAILED|ERROR|differ|vs alone|worst" "$LOG/tcm-$t.txt" | tail -5 >> "$S"
  done
fi
gen_wait
if ! skip mixed; then
  MX=${KDA_MX_POINTS:-16:1:128,64:1:128,64:2:128,64:8:128,64:1:512,256:2:128,256:4:128,256:1:1024}
  for r in ${KDA_MX_RESERVES:-0 8 16 32 48}; do
    step "mixed_r$r" 60 "$LOG/mixed-r$r.txt" $B/cli/kda-cli bench "$M17" --device cuda --no-kernels --pairs "" \
      --mixed "$MX" --reps 9 --tuning mixed_reserve=$r --json "$OUT/mixed-r$r.json"
    grep -E "mixed " "$LOG/mixed-r$r.txt" | sed "s/^/r=$r /" >> "$S"
  done
fi
if ! skip serve; then
  for v in 0 default; do
    f=; [ $v = default ] || f="--tuning mixed_reserve=$v"
    step "serve_$v" 110 "$LOG/serve-$v.txt" env KDA_BUILD=$B KDA_SERVE_LEVELS=${KDA_MX_LEVELS:-64,256} \
      KDA_SERVE_FLAGS="$f" KDA_SERVE_NOTE="1.7B shape, random bf16, commit $KDA_COMMIT, mixed_reserve $v" \
      bash scripts/bench-serve.sh "$M17" "$LOG/serve-$v" --device cuda
    cp "$LOG/serve-$v/results.json" "$OUT/serve-mixed-reserve-$v.json" 2>/dev/null
    tail -4 "$LOG/serve-$v.txt" | sed "s/^/reserve $v: /" >> "$S"
  done
fi
tar czf "$OUT/logs.tgz" -C /tmp kda-logs
cat "$S"
exit $rc
