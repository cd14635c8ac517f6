#!/bin/bash
# bench-gpu.sh - our engine and the PyTorch + fla baseline in ONE invocation
# on the same GPU, merged into a results file with ratios and targets.
#
#   scripts/bench-gpu.sh BUILD_DIR OUTDIR BASELINE_PY [MODEL_DIR]
#
# Ours: kda-cli bench (decode grid, prefill and score points, per-kernel
# bandwidth), then the prefill/score points again with tuning prof=1 for the
# device-time shares (GEMM, KDA, attention, lm-head, other). Baseline: the
# shared script with the same points (its --prefill/--score/--decode lists;
# its code unchanged). BUILD_DIR: a -Dcuda=enabled release build; BASELINE_PY:
# ../shared/bench/baseline_torch_fla.py (needs torch, triton, einops and
# flash-linear-attention importable); MODEL_DIR: a 1.7B-shaped checkpoint,
# generated with scripts/gen_checkpoint.py --preset 1.7b when absent.
# KDA_LIB_PATH: library path for kda-cli only (libraries carried to a GPU machine).
# Points (env): KDA_BENCH_PAIRS (decode CTX:B), KDA_BENCH_PREFILL / KDA_BENCH_SCORE
# (B:T), KDA_BASELINE_DECODE (P:B; "" skips the baseline's decode).
# Writes OUTDIR/{ours.json,ours.txt,prof.json,prof.txt,baseline.json,baseline.txt,results.json}.
set -u -o pipefail
BUILD=${1:?build dir}
OUTDIR=${2:?out dir}
BASELINE=${3:?baseline script}
MODEL=${4:-/tmp/kda-1.7b}
HERE=$(cd "$(dirname "$0")" && pwd)
PAIRS=${KDA_BENCH_PAIRS-128:1,128:16,128:64,128:256,4096:1,4096:16,4096:64,4096:256}
PREFILL=${KDA_BENCH_PREFILL-1:2048,8:2048}
SCORE=${KDA_BENCH_SCORE-1:8192,4:8192}
BDECODE=${KDA_BASELINE_DECODE-128:1,128:64,128:256,4096:64}
mkdir -p "$OUTDIR"
if [ ! -f "$MODEL/config.json" ]; then
    python3 "$HERE/gen_checkpoint.py" "$MODEL" --preset 1.7b --tokenizer none >/dev/null || exit 1
fi
cli() { ${KDA_LIB_PATH:+env LD_LIBRARY_PATH=$KDA_LIB_PATH} "$BUILD/cli/kda-cli" "$@"; }
cli bench "$MODEL" --pairs "$PAIRS" --prefill "$PREFILL" --score "$SCORE" --json "$OUTDIR/ours.json" \
    ${KDA_BENCH_ARGS:-} 2>&1 | tee "$OUTDIR/ours.txt"
cli bench "$MODEL" --pairs "" --prefill "$PREFILL" --score "$SCORE" --reps 3 --no-kernels --tuning prof=1 \
    --json "$OUTDIR/prof.json" 2>&1 | tee "$OUTDIR/prof.txt"
OUT="$OUTDIR" PYTHONUNBUFFERED=1 timeout ${KDA_BASELINE_TIMEOUT:-420} python3 "$BASELINE" --quick \
    --prefill "$PREFILL" --score "$SCORE" --decode "$BDECODE" 2>&1 | grep -v Warning | tee "$OUTDIR/baseline.txt"
python3 "$HERE/bench_merge.py" "$OUTDIR/ours.json" "$OUTDIR/baseline.json" "$OUTDIR/prof.json" > "$OUTDIR/results.json"
python3 "$HERE/bench_merge.py" --table "$OUTDIR/results.json"
