#!/usr/bin/env bash
# bench-serve.sh - the serving benchmark of issue 13 in one invocation: the engine alone
# (kda-cli bench, B = each level's C, server not running), then kda-server on the same model
# driven by scripts/serve_bench.py: C streaming clients in a closed loop, prompt 128 random ids,
# 128 tokens with ignore_eos, 3 x C requests per level. Efficiency = output tok/s / engine tok/s.
#
#   scripts/bench-serve.sh MODEL_DIR OUTDIR [--device cuda]
#
# Writes OUTDIR/engine.json and engine-after.json (kda-cli bench before and after the load: the
# efficiency is given against both, their spread being the machine's noise), OUTDIR/results.json
# (serve_bench.py: machine, date, commit, args, engine figures, per-level figures, failures),
# OUTDIR/server.log, OUTDIR/run.txt (the run as printed), OUTDIR/table.txt (the final table).
# Exit status 1 if any request failed or the server did not exit 0.
# Environment:
#   KDA_BUILD      build tree with cli/kda-cli and server/kda-server (default build; the GPU
#                  machine: .carry/build from scripts/gpu-prepare.sh)
#   KDA_LIB_PATH   library path for our two programs only (carried libraries)
#   KDA_SERVE_LEVELS      closed-loop concurrencies (default 1,16,64,256 on cuda, 1,4,16 on cpu)
#   KDA_SERVE_INPUT/OUTPUT  prompt / output length (128 / 128)
#   KDA_SERVE_ARGS        extra serve_bench.py arguments (e.g. "--request-rate 50 --num-requests 300")
#   KDA_SERVE_FLAGS       extra kda-server flags
#   KDA_SERVE_THREADS     cpu: engine threads for both programs (default 1: the client needs a core)
set -u -o pipefail
MODEL=${1:?model dir}
OUTDIR=${2:?out dir}
DEVICE=cpu
[ "${3:-}" = --device ] && DEVICE=${4:?--device cpu|cuda}
HERE=$(cd "$(dirname "$0")" && pwd)
BUILD=${KDA_BUILD:-$HERE/../build}
mkdir -p "$OUTDIR"
if [ "$DEVICE" = cuda ]; then LEVELS=${KDA_SERVE_LEVELS:-1,16,64,256}; else LEVELS=${KDA_SERVE_LEVELS:-1,4,16}; fi
IN=${KDA_SERVE_INPUT:-128}
OUTLEN=${KDA_SERVE_OUTPUT:-128}
MAXC=$(echo "$LEVELS" | tr , '\n' | sort -n | tail -1)
THREADS=${KDA_SERVE_THREADS:-1}
run() { env ${KDA_LIB_PATH:+LD_LIBRARY_PATH=$KDA_LIB_PATH} OMP_NUM_THREADS=$THREADS "$@"; }

pairs=$(echo "$LEVELS" | tr , '\n' | sed "s/^/$IN:/" | paste -sd,)
echo "== engine alone: kda-cli bench --pairs $pairs"
run "$BUILD/cli/kda-cli" bench "$MODEL" --device "$DEVICE" --pairs "$pairs" --steps 32 --no-kernels --threads "$THREADS" \
    --json "$OUTDIR/engine.json" 2>&1 | tee "$OUTDIR/engine.txt" || exit 1

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
flags=(--model "$MODEL" --device "$DEVICE" --port "$port" --max-batch "$MAXC" --max-queue $((MAXC * 4 + 64))
       --log-level warn)
[ "$DEVICE" = cpu ] && flags+=(--threads "$THREADS")
echo "== kda-server ${flags[*]} ${KDA_SERVE_FLAGS:-}"
# not through run(): $! must be the server itself, not a subshell, for the SIGTERM below
env ${KDA_LIB_PATH:+LD_LIBRARY_PATH=$KDA_LIB_PATH} OMP_NUM_THREADS=$THREADS \
    "$BUILD/server/kda-server" "${flags[@]}" ${KDA_SERVE_FLAGS:-} > "$OUTDIR/server.log" 2>&1 &
spid=$!
for _ in $(seq 600); do
    curl -sf "localhost:$port/health" > /dev/null && break
    kill -0 $spid 2>/dev/null || { echo "kda-server exited:"; cat "$OUTDIR/server.log"; exit 1; }
    sleep 0.2
done
python3 "$HERE/serve_bench.py" --url "http://127.0.0.1:$port" --model-dir "$MODEL" --concurrency "$LEVELS" \
    --input-len "$IN" --output-len "$OUTLEN" --ignore-eos --engine-json "$OUTDIR/engine.json" \
    --json "$OUTDIR/results.json" --note "kda-server --device $DEVICE, model $MODEL${KDA_SERVE_NOTE:+; $KDA_SERVE_NOTE}" \
    ${KDA_SERVE_ARGS:-} | tee "$OUTDIR/run.txt"
brc=${PIPESTATUS[0]}
kill -TERM $spid
wait $spid
src=$?
echo "== kda-server exit $src; engine alone again, after the load (the spread is the machine's noise)"
run "$BUILD/cli/kda-cli" bench "$MODEL" --device "$DEVICE" --pairs "$pairs" --steps 32 --no-kernels --threads "$THREADS" \
    --json "$OUTDIR/engine-after.json" > "$OUTDIR/engine-after.txt" 2>&1 &&
  python3 "$HERE/serve_bench.py" --merge "$OUTDIR/results.json" --engine-after "$OUTDIR/engine-after.json" \
    | tee "$OUTDIR/table.txt"
echo "== kda-server exit $src; bench exit $brc"
[ $brc = 0 ] && [ $src = 0 ]
