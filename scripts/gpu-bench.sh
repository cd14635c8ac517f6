#!/usr/bin/env bash
# Run ON THE GPU MACHINE (after scripts/gpu-prepare.sh here; carry
# [".carry.tar.xz", ".whl"]): every speed figure in one call, on a quiet card,
# one after the other:
#   1. scripts/bench-gpu.sh: our decode grid, prefill and score points (and
#      their device-time shares with prof=1), then the PyTorch + fla
#      baseline's same points -> $OUT/results.json;
#   1b. scripts/bench_score_server.py: /score 1 x 8192 and 4 x 8192 through kda-server beside
#      the engine's figures of step 1 -> $OUT/score-server.json;
#   2. the prefill kernels' own benchmarks (test_kda_chunk --bench,
#      test_prefill_ops --bench) -> $OUT/kernels-bench.txt;
#   3. scripts/gpu-serve.sh: kda-server under C = 1/16/64/256 streaming clients
#      with the engine's rate in the same run, then the burst test
#      -> $OUT/serve-results.json, $OUT/burst.txt;
#   4. scripts/bench_prefix.py: the prefix cache on vs off (shared system
#      prompt under concurrency, lm-eval-style scoring, a 10-turn chat)
#      -> $OUT/prefix-h200.json.
# KDA_BENCH_SKIP="engine score-server kernels serve prefix" skips parts. Logs: $OUT/logs.tgz.
source "$(dirname "$0")/gpu-env.sh"
export KDA_COMMIT=${KDA_COMMIT:-$(cat .carry/commit 2>/dev/null || echo unknown)}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
skip() { case " ${KDA_BENCH_SKIP:-} " in *" $1 "*) return 0 ;; esac; return 1; }
rc=0
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$LOG/gpu.txt"
if [ ! -f "$M17/config.json" ]; then
  # with the llama2 tokenizer: kda-server (step 3) needs one
  ( time python3 scripts/gen_checkpoint.py "$M17" --preset 1.7b --tokenizer spm:.carry/llama2-tokenizer.model ) \
    > "$LOG/gen.txt" 2>&1 || { cat "$LOG/gen.txt"; exit 1; }
fi
if ! skip engine; then
  echo "== bench-gpu.sh"
  timeout ${KDA_BENCH_ENGINE_S:-330} bash scripts/bench-gpu.sh $B "$LOG/engine" .carry/baseline_torch_fla.py "$M17" \
    || rc=1
  cp "$LOG/engine/results.json" "$OUT/" 2>/dev/null
fi
if ! skip score-server; then
  echo "== /score through kda-server vs the engine"
  ours timeout ${KDA_BENCH_SCORE_SERVER_S:-120} python3 scripts/bench_score_server.py --server $B/server/kda-server \
    --model "$M17" --device cuda --points 1:8192,4:8192 --reps 5 --engine-json "$LOG/engine/results.json" \
    --log "$LOG/score-server.log" --out "$OUT/score-server.json" || rc=1
fi
if ! skip kernels; then
  echo "== kernel benchmarks"
  { ours timeout 60 $B/tests/kernels/test_kda_chunk --bench; ours timeout 60 $B/tests/kernels/test_prefill_ops --bench; } \
    > "$OUT/kernels-bench.txt" 2>&1 || rc=1
  grep -E "BENCH|ms" "$OUT/kernels-bench.txt" | head -40
fi
if ! skip serve; then
  echo "== gpu-serve.sh"
  KDA_BURST_ROUNDS=${KDA_BURST_ROUNDS:-10} KDA_BURST_BUDGET=${KDA_BURST_BUDGET:-120} OUT_KEEP=1 \
    bash scripts/gpu-serve.sh || rc=1
fi
if ! skip prefix; then
  echo "== bench_prefix (1.7B shape with a byte vocabulary, cuda)"
  M17S=/tmp/kda-1.7b-bytes
  [ -f "$M17S/config.json" ] || python3 scripts/gen_checkpoint.py "$M17S" --preset 1.7b --vocab 256 --tokenizer bytes \
    > "$LOG/gen-bytes.txt" 2>&1
  timeout ${KDA_BENCH_PREFIX_S:-200} python3 scripts/bench_prefix.py --server $B/server/kda-server --model "$M17S" \
    --device cuda --concurrent 64 --system-tokens 2000 --suffix-tokens 32 --max-tokens 32 --context-tokens 1024 \
    --chat-system-tokens 500 --chat-user-tokens 60 --chat-reply-tokens 32 --log-dir "$LOG" \
    --out "$OUT/prefix-h200.json" 2>&1 | tail -25 || rc=1
fi
tar czf "$OUT/logs.tgz" -C /tmp kda-logs
exit $rc
