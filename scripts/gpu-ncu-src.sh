#!/usr/bin/env bash
# Run ON THE GPU MACHINE (after scripts/gpu-prepare.sh here; carry [".carry.tar.xz", ".whl"]):
# Nsight Compute with source counters on single launches of the prompt-path kernels, to
# say where inside a kernel the warps stall (what the per-kernel totals of
# gpu-ncu-pass.sh cannot). Per job: one launch profiled with --set full and the
# SourceCounters section (the build has -lineinfo), then the SASS source page as CSV
# (per instruction: address, CUDA file:line, warp-stall samples) and the details page.
# Jobs (KDA_NCSRC_JOBS, default all):
#   attn     the prefill attention kernel, 1 x 8192 at the 1.7B shape (test_prefill_ops
#            --bench: 1x2048 and 8x2048 run first, 3 variants x 17 launches each)
#   chunk    the chunked KDA stages of one 1 x 8192 layer call (test_kda_chunk --bench)
#   chunk128 the same for 8 x 128 (short prompts in mixed steps, issue #13)
# $OUT: ncsrc-<job>-details.txt, ncsrc-<job>-src.csv.xz (per kernel), summary.txt.
source "$(dirname "$0")/gpu-env.sh"
run_start ""
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
JOBS=${KDA_NCSRC_JOBS:-"attn chunk chunk128"}
prof() { # job, kernel regex, launch skip, launch count, command...
  local job=$1 kr=$2 skip=$3 cnt=$4; shift 4
  step "ncu-$job" 240 "$LOG/ncu-$job.txt" "$NCU" --clock-control none --set full --section SourceCounters \
    --import-source yes --kernel-name regex:"$kr" --launch-skip "$skip" --launch-count "$cnt" \
    -f -o "/tmp/ncsrc-$job" "$@"
  ours "$NCU" -i "/tmp/ncsrc-$job.ncu-rep" --page details > "$OUT/ncsrc-$job-details.txt" 2>&1
  ours "$NCU" -i "/tmp/ncsrc-$job.ncu-rep" --page source --csv --print-source sass,cuda \
    > "$LOG/ncsrc-$job-src.csv" 2>&1
  xz -9 -c "$LOG/ncsrc-$job-src.csv" > "$OUT/ncsrc-$job-src.csv.xz"
  grep -E "^  [a-zA-Z_].*\(|Duration|Issue Slots Busy|Achieved Occupancy" "$OUT/ncsrc-$job-details.txt" >> "$S"
}
for j in $JOBS; do
  case $j in
    attn) prof attn attn_prefill_kernel 102 1 $B/tests/kernels/test_prefill_ops --bench ;;
    chunk) prof chunk kc_chunk_ 0 6 env KDA_CHUNK_BENCH_SHAPES=2 KDA_CHUNK_BENCH_VARIANT=defaults \
             KDA_CHUNK_BENCH_NOSTAGES=1 $B/tests/kernels/test_kda_chunk --bench ;;
    chunk128) prof chunk128 kc_chunk_ 0 7 env KDA_CHUNK_BENCH_BT=8:128 KDA_CHUNK_BENCH_VARIANT=defaults \
                KDA_CHUNK_BENCH_NOSTAGES=1 $B/tests/kernels/test_kda_chunk --bench ;;
  esac
done
tar czf "$OUT/logs.tgz" -C /tmp kda-logs
cat "$S"
exit $rc
