#!/usr/bin/env bash
# Run ON THE GPU MACHINE (after scripts/gpu-prepare.sh here; carry [".carry.tar.xz", ".whl"]):
# the device time of every kernel of a whole-model pass, from Nsight Compute's
# gpu__time_duration (each kernel replayed alone: no overlap, no launch gaps), grouped by
# kernel name, for the last pass (the timed one). What prof=1's buckets cannot say: which
# kernel inside "attention", "KDA" or "other" takes the time. Our kernels only
# (KDA_NCU_KERNELS, a regex): cuBLAS's GEMMs are prof's GEMM bucket, and its plan tuning at
# start-up would fill the launch count.
#   KDA_NCU_BENCH  kda-cli bench options (default: one score 1 x 8192 pass after the warm-up)
#   KDA_NCU_COUNT  kernels profiled (default 1500: the warm-up and timed passes of one point)
# $OUT: ncu-pass.txt (per kernel name: launches, total ms, mean us, share), ncu-pass.csv.
source "$(dirname "$0")/gpu-env.sh"
run_start ""
gen_m17 # generates only when $M17 is absent
gen_wait
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
NB=${KDA_NCU_BENCH:-"--pairs \"\" --no-kernels --score 1:8192 --reps 1"}
KR=${KDA_NCU_KERNELS:-"add_bias_kernel|attn_prefill|cast_bf16|embed_kernel|gather_lp|gemv_kernel|gqa_|hist_kernel|kc_chunk|kda_|logprob|lse_kernel|rmsnorm|sample_kernel|swiglu"}
step ncu ${KDA_NCU_TIMEOUT:-400} "$LOG/ncu.csv" "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv \
  --print-units base --kernel-name regex:"$KR" --launch-count ${KDA_NCU_COUNT:-1500} \
  bash -c "exec $B/cli/kda-cli bench \"$M17\" $NB"
cp "$LOG/ncu.csv" "$OUT/ncu-pass.csv"
python3 - "$LOG/ncu.csv" "$OUT/ncu-pass.txt" "$NB" <<'PY'
import csv, sys, collections, re
rows = [l for l in open(sys.argv[1]) if l.startswith('"')]
seq = [(re.sub(r"\(.*", "", r["Kernel Name"]).strip()[:90], float(r["Metric Value"].replace(",", "")) * 1e-6)
       for r in csv.DictReader(rows) if r.get("Metric Name") == "gpu__time_duration.sum"]  # ns -> ms
# a pass starts at the embedding kernel: the last one is the timed pass, earlier ones warm up
starts = [i for i, (n, _) in enumerate(seq) if "embed_kernel" in n]
last = seq[starts[-1]:] if starts else seq
tot = collections.defaultdict(float); cnt = collections.Counter()
for n, ms in last:
    tot[n] += ms; cnt[n] += 1
all_ms = sum(tot.values())
with open(sys.argv[2], "w") as f:
    f.write("# bench %s: %d profiled launches, %d passes; the last pass: %d launches, %.3f ms of kernel time\n"
            "# (kernels replayed one at a time: no overlap, no launch gaps; cuBLAS's GEMMs not profiled)\n"
            % (sys.argv[3], len(seq), len(starts), len(last), all_ms))
    f.write("%-90s %7s %10s %10s %6s\n" % ("kernel", "count", "total ms", "mean us", "share"))
    for n in sorted(tot, key=lambda n: -tot[n]):
        f.write("%-90s %7d %10.3f %10.2f %5.1f%%\n" % (n, cnt[n], tot[n], 1e3 * tot[n] / cnt[n], 100 * tot[n] / all_ms))
print(open(sys.argv[2]).read())
PY
cat "$S"
exit $rc
