#!/usr/bin/env bash
# Run ON THE GPU MACHINE (after scripts/gpu-prepare.sh here): in one call,
# the CUDA tests against the CPU reference, compute-sanitizer, a kda-server
# --device cuda smoke test, and the decode benchmark with the PyTorch baseline
# in the same invocation. The device tool returns at most 8 files from $OUT, so
# logs are packed into $OUT/logs.tgz; the results file is $OUT/results.json,
# to be committed under bench/results/.
# Time: about 7-9 minutes; KDA_SESSION_SKIP=tests|bench skips a part.
source "$(dirname "$0")/gpu-env.sh"
export KDA_COMMIT=${KDA_COMMIT:-$(cat .carry/commit 2>/dev/null || echo unknown)}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$LOG/gpu.txt"
( time python3 scripts/gen_checkpoint.py "$M17" --preset 1.7b --tokenizer none ) > "$LOG/gen.txt" 2>&1 &
gen_pid=$!
rc=0
step() { echo "== $1: $2"; }
if [ "${KDA_SESSION_SKIP:-}" != tests ]; then
  ours timeout 150 $B/tests/kernels/test_kernels > "$LOG/test_kernels.txt" 2>&1
  r=$?; [ $r = 0 ] || rc=1; step test_kernels "rc=$r"; grep -E "PASSED|FAILED|ERROR|\[  FAILED|fail" "$LOG/test_kernels.txt" | tail -15
  ours timeout 240 compute-sanitizer --tool memcheck --leak-check no --error-exitcode 3 $B/tests/kernels/test_kernels \
    > "$LOG/memcheck.txt" 2>&1
  r=$?; [ $r = 0 ] || rc=1; step memcheck "rc=$r"; tail -3 "$LOG/memcheck.txt"
  # kda-server --device cuda end to end: greedy output equals kda-cli on the CPU
  want=$(ours $B/cli/kda-cli generate models/demo --device cpu --text "ROMEO:" --max-tokens 48 --json)
  LD_LIBRARY_PATH=$KDA_LIB_PATH $B/server/kda-server --model models/demo --device cuda --port 8089 > "$LOG/server.txt" 2>&1 &
  spid=$!
  for i in $(seq 100); do curl -sf localhost:8089/health >/dev/null && break; sleep 0.2; done
  got=$(curl -s localhost:8089/generate -d '{"prompt":"ROMEO:","max_tokens":48,"temperature":0}')
  gotsse=$(curl -sN localhost:8089/generate -d '{"prompt":"ROMEO:","max_tokens":48,"temperature":0,"stream":true}' | head -c 20000)
  kill -TERM $spid; wait $spid; src=$?
  python3 - "$want" "$got" <<'PY' > "$LOG/server_check.txt" 2>&1
import json, sys
w = json.loads(sys.argv[1]); g = json.loads(sys.argv[2])
print("cpu :", repr(w["text"])); print("cuda:", repr(g.get("text")))
sys.exit(0 if w["text"] == g.get("text") else 1)
PY
  r=$?; [ $r = 0 ] && [ $src = 0 ] || rc=1; step server_smoke "match_rc=$r exit=$src"
  cat "$LOG/server_check.txt"; grep -iE "memory|pool|weights|concurrent|error" "$LOG/server.txt" | head -8
  echo "$gotsse" | head -c 600 > "$LOG/server_sse.txt"
  wait $gen_pid
  ours KDA_TEST_MODEL_17B=$M17 timeout 300 $B/tests/kernels/test_cuda_model \
    > "$LOG/test_cuda_model.txt" 2>&1
  r=$?; [ $r = 0 ] || rc=1; step test_cuda_model "rc=$r"; grep -E "PASSED|FAILED|positions|cuda vs|bf16-act vs|vs alone|reuse" "$LOG/test_cuda_model.txt" | tail -30
fi
wait $gen_pid 2>/dev/null
if [ "${KDA_SESSION_SKIP:-}" != bench ]; then
  KDA_BASELINE_POINTS=${KDA_BASELINE_POINTS-128:1,128:64,128:256,4096:64} \
  KDA_BASELINE_TIMEOUT=${KDA_BASELINE_TIMEOUT:-300} \
    bash scripts/bench-gpu.sh $B "$LOG" .carry/baseline_torch_fla.py "$M17" || rc=1
  cp "$LOG/results.json" "$OUT/" 2>/dev/null
fi
tar czf "$OUT/logs.tgz" -C /tmp kda-logs
exit $rc
