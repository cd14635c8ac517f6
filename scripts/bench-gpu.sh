#!/bin/bash
# bench-gpu.sh - our decode benchmark and the PyTorch + fla baseline in ONE
# invocation on the same GPU, merged into a results file with ratios.
#
#   scripts/bench-gpu.sh BUILD_DIR OUTDIR BASELINE_PY [MODEL_DIR]
#
# BUILD_DIR: a -Dcuda=enabled release build; BASELINE_PY: the baseline script
# (../shared/bench/baseline_torch_fla.py; it needs torch, triton, einops and
# flash-linear-attention importable); MODEL_DIR: a 1.7B-shaped checkpoint,
# generated with scripts/gen_checkpoint.py --preset 1.7b when absent.
# KDA_LIB_PATH: library path for kda-cli only (libraries carried to a GPU machine).
# Writes OUTDIR/{ours.json,ours.txt,baseline.json,baseline.txt,results.json}.
set -u -o pipefail
BUILD=${1:?build dir}
OUTDIR=${2:?out dir}
BASELINE=${3:?baseline script}
MODEL=${4:-/tmp/kda-1.7b}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUTDIR"
if [ ! -f "$MODEL/config.json" ]; then
    python3 "$HERE/gen_checkpoint.py" "$MODEL" --preset 1.7b --tokenizer none >/dev/null || exit 1
fi
${KDA_LIB_PATH:+env LD_LIBRARY_PATH=$KDA_LIB_PATH} "$BUILD/cli/kda-cli" bench "$MODEL" --json "$OUTDIR/ours.json" ${KDA_BENCH_ARGS:-} 2>&1 | tee "$OUTDIR/ours.txt"
# KDA_BASELINE_POINTS="P:B,..." runs the baseline script through baseline_points.py:
# its code unchanged, only the measured decode points chosen (and prefill/score skipped).
if [ -n "${KDA_BASELINE_POINTS:-}" ]; then
    set -- python3 "$HERE/baseline_points.py" "$BASELINE" --decode "$KDA_BASELINE_POINTS"
else
    set -- python3 "$BASELINE" ${KDA_BASELINE_ARGS:-}
fi
OUT="$OUTDIR" PYTHONUNBUFFERED=1 timeout ${KDA_BASELINE_TIMEOUT:-900} "$@" 2>&1 | grep -v Warning | tee "$OUTDIR/baseline.txt"
python3 "$HERE/bench_merge.py" "$OUTDIR/ours.json" "$OUTDIR/baseline.json" > "$OUTDIR/results.json"
python3 "$HERE/bench_merge.py" --table "$OUTDIR/results.json"
