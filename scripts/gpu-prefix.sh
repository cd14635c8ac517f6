#!/usr/bin/env bash
# Run ON THE GPU MACHINE (after scripts/gpu-prepare.sh here), in one call: the
# prefix cache on the CUDA backend (issue 17).
#   1. test_cuda_model's prefix tests (KDA_TEST_ONLY=prefix): restored sequences
#      against the uncached GPU run and the fp32 CPU reference, greedy output,
#      block sharing and accounting (demo model);
#   2. scripts/bench_prefix.py on the 1.7B shape (random bf16) with a 256-entry
#      vocabulary and the byte tokenizer, so that kda-server loads it with no
#      tokenizer file to carry (the lm-head is 4% of the 1.7B's weights; the
#      other 24 layers are the real shape), cache on vs --prefix-cache off:
#      64 concurrent requests sharing a 2,000-token system prompt (target:
#      throughput >= 3x), the lm-eval-style workload (1,024-token context, 8
#      continuations: tokens computed <= 1/6, wall <= 1/3, log-prob differences),
#      a 10-turn chat (TTFT of turn 10 within 1.5x of turn 1); and the no-cache server once more
#      with --prefill-chunk 64 --step-tokens 256 --step-tokens-idle 256 (every prompt cut into
#      256-token steps), whose differences from the no-cache run are the scale of what
#      step boundaries alone change in bf16 on random weights (exactness.yardstick_no_cache).
# With --lm-eval-only: no tests, only the three lm-eval forms (bench_prefix.py
# --lm-eval-only --repeat 3, the server's step trace in its debug log) into
# $OUT/prefix-lmeval-new.json (and -base.json for .carry/base/kda-server, an
# older server carried with gpu-prepare.sh --with base/kda-server=FILE), about 1
# minute a server.
# Outputs: $OUT/prefix-h200.json (commit under bench/results/), $OUT/prefix.txt
# (summary), $OUT/steps-cache.txt (the cached server's step trace), $OUT/logs.tgz
# (server logs). About 4-7 minutes (the device limit is 10).
source "$(dirname "$0")/gpu-env.sh"
export KDA_COMMIT=${KDA_COMMIT:-$(cat .carry/commit 2>/dev/null || echo unknown)}
M17S=/tmp/kda-1.7b-bytes
rc=0
exec > >(tee "$OUT/prefix.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
( time python3 scripts/gen_checkpoint.py "$M17S" --preset 1.7b --vocab 256 --tokenizer bytes ) \
  > "$LOG/gen.txt" 2>&1 &
gen_pid=$!
if [ "${1:-}" = --lm-eval-only ]; then
  wait $gen_pid || exit 1
  rc=0
  # with .carry/base/kda-server (gpu-prepare.sh --with base/kda-server=FILE): that
  # server first, into prefix-lmeval-base.json, then the carried build's
  # and with KDA_PREFIX_TUNING=k=v,... the carried build's once more under that
  # --tuning (KDA_TUNING), into prefix-lmeval-tuned.json
  for which in base new tuned; do
    srv=$B/server/kda-server; [ $which = base ] && srv=.carry/base/kda-server
    [ -x "$srv" ] || continue
    tune=; if [ $which = tuned ]; then tune=${KDA_PREFIX_TUNING:-}; [ -n "$tune" ] || continue; fi
    mkdir -p "$LOG/$which"
    KDA_TUNING=$tune timeout 200 python3 scripts/bench_prefix.py --server "$srv" --model "$M17S" --device cuda \
      --context-tokens 1024 --lm-eval-only --repeat ${KDA_PREFIX_REPEAT:-3} --server-arg=--log-level=debug \
      --log-dir "$LOG/$which" --out "$OUT/prefix-lmeval-$which.json" > "$LOG/$which/bench.txt" 2>&1 || rc=1
    tail -25 "$LOG/$which/bench.txt"
  done
  for k in cache nocache; do grep " step: " "$LOG/new/server-$k.log" > "$OUT/steps-new-$k.txt"; done
  tar czf "$OUT/logs.tgz" -C /tmp kda-logs
  exit $rc
fi
echo "== test_cuda_model, prefix tests"
ours KDA_TEST_ONLY=prefix timeout 150 $B/tests/kernels/test_cuda_model > "$LOG/test_cuda_prefix.txt" 2>&1
r=$?; [ $r = 0 ] || rc=1; echo "rc=$r"
grep -E "restore at|restores decoding|PASSED|FAILED|ERROR" "$LOG/test_cuda_prefix.txt"
wait $gen_pid || rc=1
tail -3 "$LOG/gen.txt"
echo "== bench_prefix (1.7B shape, cuda)"
timeout 420 python3 scripts/bench_prefix.py --server $B/server/kda-server --model "$M17S" --device cuda \
  --concurrent 64 --system-tokens 2000 --suffix-tokens 32 --max-tokens 32 --context-tokens 1024 \
  --chat-system-tokens 500 --chat-user-tokens 60 --chat-reply-tokens 32 \
  --yardstick "--prefill-chunk 64 --step-tokens 256 --step-tokens-idle 256" --server-arg=--log-level=debug \
  --log-dir "$LOG" --out "$OUT/prefix-h200.json"
r=$?; [ $r = 0 ] || rc=1; echo "rc=$r"
# the step trace of the cached server: which steps each workload's requests took
grep " step: " "$LOG/server-cache.log" > "$OUT/steps-cache.txt"
grep -hE "prefix cache|cuda:|error" "$LOG"/server-*.log | head -12
tar czf "$OUT/logs.tgz" -C /tmp kda-logs
exit $rc
