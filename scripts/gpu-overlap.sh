#!/usr/bin/env bash
# Run ON THE GPU MACHINE (after scripts/gpu-prepare.sh here; carry [".carry.tar.xz", ".whl"],
# plus ".old.tar.xz" for step 2): the overlapped scheduler and the stream path's folded
# prologue (ninth session), tests first, in one call of at most ~9 minutes.
#   1. test_kernels; test_cuda_model's begin/end test and the ones whose steps it touches
#      (prefill then decode, scoring alone / batched / split, the fla fixtures, batch of 64);
#   2. with .old.tar.xz (an older stripped kda-cli in .old/, its commit in .old/commit):
#      kda-cli bench old / new / old / new on the 1.7B shape (decode points and the kernel rows,
#      whose "kda lowrank+..." rows time the KDA step with its low-rank pass);
#   2b. scripts/bench_score_server.py: /score 1 x 8192 and 4 x 8192 through kda-server beside the
#      engine's figures of the last new run;
#   3. scripts/bench-serve.sh at C = 1/16/64/256 with the defaults (overlap on), then variants
#      off / on at C = 64, 256 (the scheduler's phases per step in each level's "server" block);
#   4. the burst test (KDA_BURST_ROUNDS, default 4, of 512 clients + 3 x 8000-token /score);
#   5. scripts/bench_prefix.py (cache on vs off) unless KDA_OV_SKIP has "prefix".
# KDA_OV_SKIP="tests ab score serve burst prefix" skips parts. $OUT: summary.txt and the JSON files.
source "$(dirname "$0")/gpu-env.sh"
run_start "${KDA_OV_SKIP:-}"
gen_m17
if ! skip tests; then
  step test_kernels 150 "$LOG/test_kernels.txt" $B/tests/kernels/test_kernels
  grep -E "PASSED|FAILED|ERROR" "$LOG/test_kernels.txt" | tail -4 >> "$S"
  for t in begin_end prefill_then_decode score_is_the_same fla_fixtures batch_of_64; do
    step "tcm_$t" 150 "$LOG/tcm-$t.txt" env KDA_TEST_ONLY=$t $B/tests/kernels/test_cuda_model
    grep -E "PASSED|FAILED|ERROR|vs alone" "$LOG/tcm-$t.txt" | tail -3 >> "$S"
  done
fi
gen_wait
if ! skip ab && [ -f .old.tar.xz ]; then
  python3 -c "import tarfile; tarfile.open('.old.tar.xz').extractall('.')"
  echo "old = $(cat .old/commit)" | tee -a "$S"
  P="--pairs 128:1,128:16,128:64,128:256,4096:64 --steps 32 --prefill 1:2048,8:2048 --score 1:8192,4:8192 --reps 5"
  for r in old1 new1 old2 new2; do
    bin=$B/cli/kda-cli; [ "${r:0:3}" = old ] && bin=.old/kda-cli
    step "bench_$r" 100 "$LOG/bench-$r.txt" $bin bench "$M17" --device cuda $P --json "$OUT/bench-$r.json"
    grep -E "kda lowrank|decode B=|prefill  |score  " "$LOG/bench-$r.txt" | sed "s/^/$r /" >> "$S"
  done
fi
if ! skip score && [ -f "$OUT/bench-new2.json" ]; then
  step score_server 90 "$LOG/score-server.txt" python3 scripts/bench_score_server.py --server $B/server/kda-server \
    --model "$M17" --device cuda --points 1:8192,4:8192 --reps 5 --engine-json "$OUT/bench-new2.json" \
    --log "$LOG/score-server.log" --out "$OUT/score-server.json"
  tail -6 "$LOG/score-server.txt" >> "$S"
fi
if ! skip serve; then
  step serve 150 "$LOG/serve.txt" env KDA_BUILD=$B KDA_SERVE_NOTE="1.7B shape, random bf16, commit $KDA_COMMIT, overlap default (on)" \
    bash scripts/bench-serve.sh "$M17" "$LOG/serve" --device cuda
  cp "$LOG/serve/results.json" "$OUT/serve-results.json" 2>/dev/null
  tail -8 "$LOG/serve.txt" >> "$S"
  for v in off on; do
    step "serve_$v" 100 "$LOG/serve-$v.txt" env KDA_BUILD=$B KDA_SERVE_LEVELS=64,256 KDA_SERVE_FLAGS="--step-overlap $v" \
      KDA_SERVE_NOTE="1.7B shape, random bf16, commit $KDA_COMMIT, --step-overlap $v" \
      bash scripts/bench-serve.sh "$M17" "$LOG/serve-$v" --device cuda
    cp "$LOG/serve-$v/results.json" "$OUT/serve-overlap-$v.json" 2>/dev/null
    tail -4 "$LOG/serve-$v.txt" | sed "s/^/overlap $v: /" >> "$S"
  done
fi
if ! skip burst; then
  step burst 120 "$OUT/burst.txt" env KDA_BURST_ROUNDS=${KDA_BURST_ROUNDS:-4} KDA_BURST_SIZES=512 \
    KDA_BURST_SCORE_TOKENS=8000 KDA_BURST_MAX_TOKENS=128 KDA_BURST_FLAGS="--max-batch 256" \
    KDA_BURST_BUDGET=${KDA_BURST_BUDGET:-70} KDA_BURST_MODEL="$M17" KDA_BURST_DEVICE=cuda \
    KDA_BURST_SERVER_LOG="$LOG/burst-server.log" python3 tests/server/test_burst.py
  grep -E "PASS|FAIL|requests in" "$OUT/burst.txt" | tail -12 >> "$S"
fi
if ! skip prefix; then
  M17S=/tmp/kda-1.7b-bytes
  [ -f "$M17S/config.json" ] || python3 scripts/gen_checkpoint.py "$M17S" --preset 1.7b --vocab 256 --tokenizer bytes \
    > "$LOG/gen-bytes.txt" 2>&1
  step prefix 150 "$LOG/prefix.txt" python3 scripts/bench_prefix.py --server $B/server/kda-server --model "$M17S" \
    --device cuda --concurrent 64 --system-tokens 2000 --suffix-tokens 32 --max-tokens 32 --context-tokens 1024 \
    --chat-system-tokens 500 --chat-user-tokens 60 --chat-reply-tokens 32 --log-dir "$LOG" --out "$OUT/prefix-h200.json"
  tail -12 "$LOG/prefix.txt" >> "$S"
fi
tar czf "$OUT/logs.tgz" -C /tmp kda-logs
cat "$S"
exit $rc
