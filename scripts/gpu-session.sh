#!/usr/bin/env bash
# Run ON THE GPU MACHINE (after scripts/gpu-prepare.sh here; carry
# [".carry.tar.xz", ".whl"]): every CUDA correctness check in one call, in
# three lanes at once (the card and the machine's 16 cores have room):
#   lane 1  the kernel tests against the CPU reference (test_kernels, the
#           kernel lab's, test_kda_chunk, test_prefill_ops), the whole-model tests with the
#           1.7B case (test_cuda_model) and a kda-server --device cuda smoke
#           test (greedy output equals kda-cli on the CPU, JSON and SSE);
#   lane 2  compute-sanitizer (memcheck on the three kernel tests, racecheck on
#           the chunked KDA and prefill attention kernels' small cases;
#           KDA_SESSION_SANITIZE=0 skips it);
#   lane 3  checkpoints written by fla / transformers themselves with fla's
#           fp32 log-probs (scripts/make_fla_fixtures.py; KDA_SESSION_FIXTURES=0
#           skips it).
# Every step has a timeout inside KDA_SESSION_BUDGET (default 540 s), so the
# outputs come back within one 10-minute call. Results in $OUT: summary.txt
# (each step's exit status and its key lines), fla-fixtures.tgz, logs.tgz.
# The benchmarks are scripts/gpu-bench.sh (a second call).
source "$(dirname "$0")/gpu-env.sh"
export KDA_COMMIT=${KDA_COMMIT:-$(cat .carry/commit 2>/dev/null || echo unknown)}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
S=$OUT/summary.txt
: > "$S"
BUDGET=${KDA_SESSION_BUDGET:-540}
say() { echo "$*" | tee -a "$S"; }
# step LANE NAME TIMEOUT LOG CMD...: runs CMD with the carried libraries, its
# timeout cut to what is left of the budget
step() {
  local lane=$1 name=$2 to=$3 log=$4; shift 4
  local left=$((BUDGET - SECONDS - 20))
  [ "$to" -le "$left" ] || to=$left
  if [ "$to" -lt 15 ]; then say "[$lane] $name: skipped (time budget spent)"; return 1; fi
  local t0=$SECONDS
  ours timeout "$to" "$@" > "$log" 2>&1
  local r=$?
  say "[$lane] $name: rc=$r ($((SECONDS - t0)) s)$([ $r = 124 ] && echo ' TIMED OUT')"
  return $r
}
say "commit $KDA_COMMIT; $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
( time python3 scripts/gen_checkpoint.py "$M17" --preset 1.7b --tokenizer spm:.carry/llama2-tokenizer.model ) > "$LOG/gen.txt" 2>&1 &
gen_pid=$!

lane1() {
  step 1 test_kernels 150 "$LOG/test_kernels.txt" $B/tests/kernels/test_kernels
  grep -E "PASSED|FAILED|ERROR" "$LOG/test_kernels.txt" | tail -6 >> "$S"
  # the kernel lab's variants (kernels/lab/README.md): test, then their benchmark against production
  step 1 lab_kda_step_tiled 90 "$LOG/lab_kda_step_tiled.txt" $B/kernels/lab/lab_kda_step_tiled
  grep -E "PASSED|FAILED|ERROR" "$LOG/lab_kda_step_tiled.txt" | tail -4 >> "$S"
  step 1 lab_kda_step_tiled_bench 60 "$LOG/lab_kda_step_tiled_bench.txt" $B/kernels/lab/lab_kda_step_tiled --bench
  cat "$LOG/lab_kda_step_tiled_bench.txt" >> "$S"
  step 1 test_kda_chunk 200 "$LOG/test_kda_chunk.txt" $B/tests/kernels/test_kda_chunk
  grep -E "FAIL|PASSED|FAILED|test_kda_chunk:" "$LOG/test_kda_chunk.txt" | head -30 >> "$S"
  step 1 test_prefill_ops 120 "$LOG/test_prefill_ops.txt" $B/tests/kernels/test_prefill_ops
  grep -E "^FAIL|PASSED|FAILED|sticky" "$LOG/test_prefill_ops.txt" | head -30 >> "$S"
  wait $gen_pid
  step 1 test_cuda_model 300 "$LOG/test_cuda_model.txt" env KDA_TEST_MODEL_17B=$M17 $B/tests/kernels/test_cuda_model
  grep -E "PASSED|FAILED|ERROR|positions|cuda vs|bf16-act vs|vs alone|reuse|score:|prefill .* then" \
    "$LOG/test_cuda_model.txt" | tail -40 >> "$S"
  # the KDA decode step's stream path wherever the shapes allow (the default
  # takes it from 16 one-token items; the batch-of-64 test then compares it
  # with the block-per-head kernel of each sequence alone)
  step 1 test_cuda_model_stream 300 "$LOG/test_cuda_model_stream.txt" env KDA_TUNING=kda_stream=1 \
    KDA_TEST_MODEL_17B=$M17 $B/tests/kernels/test_cuda_model
  grep -E "PASSED|FAILED|ERROR|cuda vs|vs alone" "$LOG/test_cuda_model_stream.txt" | tail -20 >> "$S"
  # kda-server --device cuda end to end: greedy output equals kda-cli on the CPU
  local want got gotsse spid
  want=$(ours $B/cli/kda-cli generate models/demo --device cpu --text "ROMEO:" --max-tokens 48 --json)
  LD_LIBRARY_PATH=$KDA_LIB_PATH $B/server/kda-server --model models/demo --device cuda --port 8089 \
    --log-level debug > "$LOG/server.txt" 2>&1 &
  spid=$!
  for i in $(seq 150); do curl -sf localhost:8089/health >/dev/null && break; sleep 0.2; done
  got=$(curl -s localhost:8089/generate -H 'Content-Type: application/json' -d '{"prompt":"ROMEO:","max_tokens":48,"temperature":0}')
  gotsse=$(curl -sN localhost:8089/generate -H 'Content-Type: application/json' -d '{"prompt":"ROMEO:","max_tokens":48,"temperature":0,"stream":true}' | head -c 20000)
  kill -TERM $spid; wait $spid; local src=$?
  python3 - "$want" "$got" "$gotsse" <<'PY' > "$LOG/server_check.txt" 2>&1
import json, sys
w = json.loads(sys.argv[1]); g = json.loads(sys.argv[2])
toks = [json.loads(l[6:]) for l in sys.argv[3].splitlines() if l.startswith("data: {")]
sse = "".join(t.get("text", "") for t in toks)
print("cpu :", repr(w["text"])); print("cuda:", repr(g.get("text"))); print("sse :", repr(sse))
sys.exit(0 if w["text"] == g.get("text") == sse else 1)
PY
  say "[1] server_smoke: match_rc=$? exit=$src"
  cat "$LOG/server_check.txt" >> "$S"
  grep -iE "cuda:|error" "$LOG/server.txt" | head -4 >> "$S"
}

lane2() {
  [ "${KDA_SESSION_SANITIZE:-1}" = 1 ] || return 0
  step 2 memcheck_kda_chunk 150 "$LOG/memcheck_kda_chunk.txt" env KDA_CHUNK_TEST_QUICK=1 \
    compute-sanitizer --tool memcheck --leak-check no --error-exitcode 3 $B/tests/kernels/test_kda_chunk
  grep -m3 -E "ERROR SUMMARY|Invalid" "$LOG/memcheck_kda_chunk.txt" >> "$S"
  step 2 memcheck_prefill_ops 150 "$LOG/memcheck_prefill_ops.txt" \
    compute-sanitizer --tool memcheck --leak-check no --error-exitcode 3 $B/tests/kernels/test_prefill_ops
  grep -m3 -E "ERROR SUMMARY|Invalid" "$LOG/memcheck_prefill_ops.txt" >> "$S"
  step 2 racecheck_kda_chunk 90 "$LOG/racecheck_kda_chunk.txt" env KDA_CHUNK_TEST_QUICK=2 \
    compute-sanitizer --tool racecheck --racecheck-report hazard --error-exitcode 3 $B/tests/kernels/test_kda_chunk
  grep -m3 -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard" "$LOG/racecheck_kda_chunk.txt" >> "$S"
  step 2 racecheck_prefill_attn 90 "$LOG/racecheck_prefill_attn.txt" compute-sanitizer --tool racecheck \
    --racecheck-report hazard --error-exitcode 3 $B/tests/kernels/test_prefill_ops test_attn_prefill_every_head_dim_and_group
  grep -m3 -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard" "$LOG/racecheck_prefill_attn.txt" >> "$S"
  step 2 racecheck_kda_stream 90 "$LOG/racecheck_kda_stream.txt" compute-sanitizer --tool racecheck \
    --racecheck-report hazard --error-exitcode 3 $B/tests/kernels/test_kernels test_kda_step_stream
  grep -m3 -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard" "$LOG/racecheck_kda_stream.txt" >> "$S"
  step 2 synccheck_kda_stream 90 "$LOG/synccheck_kda_stream.txt" compute-sanitizer --tool synccheck \
    --error-exitcode 3 $B/tests/kernels/test_kernels test_kda_step_stream
  grep -m3 -E "ERROR SUMMARY" "$LOG/synccheck_kda_stream.txt" >> "$S"
  step 2 memcheck_kernels 200 "$LOG/memcheck_kernels.txt" \
    compute-sanitizer --tool memcheck --leak-check no --error-exitcode 3 $B/tests/kernels/test_kernels
  grep -m3 -E "ERROR SUMMARY|Invalid" "$LOG/memcheck_kernels.txt" >> "$S"
}

lane3() {
  [ "${KDA_SESSION_FIXTURES:-1}" = 1 ] || return 0
  mkdir -p /tmp/fix-out
  KDA_FIXTURE_BUDGET_S=$((BUDGET - 90)) step 3 fla_fixtures $((BUDGET - 60)) "$LOG/fixtures.txt" \
    env OUT=/tmp/fix-out PYTHONPATH=${PYTHONPATH:-} python3 scripts/make_fla_fixtures.py --out /tmp/fix-out
  cp /tmp/fix-out/fla-fixtures.tgz "$OUT/" 2>/dev/null
  head -c 6000 /tmp/fix-out/summary.txt >> "$S" 2>/dev/null
}

lane1 & l1=$!
lane2 & l2=$!
lane3 & l3=$!
wait $l1 $l2 $l3
cp "$S" "$LOG/"
tar czf "$OUT/logs.tgz" -C /tmp kda-logs
grep -q "rc=[1-9]\|TIMED OUT\|match_rc=[1-9]" "$S" && exit 1
exit 0
