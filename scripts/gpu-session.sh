#!/usr/bin/env bash
# Run ON THE GPU MACHINE (after scripts/gpu-prepare.sh here): in one call,
# the CUDA tests against the CPU reference, compute-sanitizer, and the decode
# benchmark with the PyTorch baseline in the same invocation. Logs go to $OUT
# (the device tool brings them back); the results file to $OUT/results.json,
# to be committed under bench/results/.
# Time: about 8-9 minutes; KDA_SESSION_SKIP=tests|bench skips a part.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kda-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.carry/lib:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
M17=/tmp/kda-1.7b
( time python3 scripts/gen_checkpoint.py "$M17" --preset 1.7b ) > "$OUT/gen.txt" 2>&1 &
gen_pid=$!
rc=0
if [ "${KDA_SESSION_SKIP:-}" != tests ]; then
  KDA_SRC=$PWD KDA_BUILD=$PWD/.carry/build timeout 150 .carry/build/tests/kernels/test_kernels 2>&1 | tee "$OUT/test_kernels.txt" || rc=1
  timeout 120 compute-sanitizer --tool memcheck --leak-check none .carry/build/tests/kernels/test_kernels \
    > "$OUT/memcheck.txt" 2>&1 || rc=1
  tail -3 "$OUT/memcheck.txt"
  wait $gen_pid
  KDA_SRC=$PWD KDA_BUILD=$PWD/.carry/build KDA_TEST_MODEL_17B=$M17 timeout 200 .carry/build/tests/kernels/test_cuda_model \
    2>&1 | tee "$OUT/test_cuda_model.txt" || rc=1
fi
wait $gen_pid 2>/dev/null
if [ "${KDA_SESSION_SKIP:-}" != bench ]; then
  KDA_BASELINE_ARGS=${KDA_BASELINE_ARGS:---quick} KDA_BASELINE_TIMEOUT=${KDA_BASELINE_TIMEOUT:-300} \
    bash scripts/bench-gpu.sh .carry/build "$OUT" .carry/baseline_torch_fla.py "$M17" || rc=1
fi
exit $rc
