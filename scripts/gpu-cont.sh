#!/usr/bin/env bash
# Run ON THE GPU MACHINE (after scripts/gpu-prepare.sh --with base/kda-server=FILE here;
# carry [".carry.tar.xz", ".whl"]), in one call: what a short prompt continued from a
# restored state costs (issue 17's cached lm-eval requests; issue 13's short prompt rows).
#   1. scripts/gpu-prefix.sh --lm-eval-only (KDA_PREFIX_REPEAT, default 2): the three
#      lm-eval forms through the carried .carry/base/kda-server, then the carried build's;
#   2. kda-cli bench on the same 1.7B shape (vocabulary 256), score points B:T+C (T tokens
#      scored after a C-token context, as a cached continuation: KDA_CONT_POINTS), with
#      prof=1 (device time by kind), under each tuning of KDA_CONT_TUNINGS in turn (default
#      "default short_prompt=0": every short prompt through the chunked kernels instead of
#      the per-token ones; a tuning may repeat, to interleave an A/B, e.g.
#      "kda_chunk_bv=16 kda_chunk_bv=32 kda_chunk_bv=16 kda_chunk_bv=32");
#   3. ncu of our kernels in one timed step of two of those points (KDA_CONT_NCU), per
#      kernel name (scripts/gpu-ncu-pass.sh).
# $OUT: summary.txt, prefix-lmeval-{base,new}.json, cont.txt (the bench lines and the ncu
# tables), cont.tgz (bench JSON, ncu CSV, the step traces, prefix.txt), logs.tgz.
source "$(dirname "$0")/gpu-env.sh"
run_start "${STEP_SKIP:-}"   # e.g. STEP_SKIP=lmeval: the bench and ncu steps only
M17S=/tmp/kda-1.7b-bytes
P=${KDA_CONT_POINTS:-1:2+1023,1:10+1023,1:17+1023,1:33+1023,8:17+1023,1:10,1:128+1023}
mkdir -p "$LOG/cont"
step lmeval 300 "$LOG/cont/lmeval.txt" env KDA_PREFIX_REPEAT=${KDA_PREFIX_REPEAT:-2} bash scripts/gpu-prefix.sh --lm-eval-only
[ -f "$M17S/config.json" ] || step gen 120 "$LOG/cont/gen.txt" python3 scripts/gen_checkpoint.py "$M17S" --preset 1.7b \
  --vocab 256 --tokenizer bytes
i=0
for t in ${KDA_CONT_TUNINGS:-default short_prompt=0}; do
  i=$((i + 1))
  tn=prof=1; [ $t = default ] || tn=$t,prof=1
  step bench-$i-$t 90 "$LOG/cont/bench-$i-$t.txt" $B/cli/kda-cli bench "$M17S" --pairs "" --no-kernels --score "$P" \
    --reps 7 --tuning "$tn" --json "$LOG/cont/bench-$i-$t.json"
  { echo "== kda-cli bench --score $P --tuning $tn"; grep -E "score|prefill" "$LOG/cont/bench-$i-$t.txt"; } >> "$OUT/cont.txt"
done
for pt in ${KDA_CONT_NCU:-1:10+1023 8:17+1023}; do
  n=ncu-${pt//[:+]/_}
  mkdir -p "$LOG/cont/$n"
  step $n 160 "$LOG/cont/$n.txt" env OUT="$LOG/cont/$n" M17="$M17S" KDA_NCU_TIMEOUT=140 \
    KDA_NCU_COUNT=${KDA_CONT_NCU_COUNT:-4000} KDA_NCU_BENCH="--pairs \"\" --no-kernels --score $pt --reps 1" \
    bash scripts/gpu-ncu-pass.sh
  { echo "== ncu, score $pt"; cat "$LOG/cont/$n/ncu-pass.txt" 2>/dev/null | head -40; } >> "$OUT/cont.txt"
done
for f in prefix.txt steps-new-cache.txt steps-new-nocache.txt; do [ -f "$OUT/$f" ] && mv "$OUT/$f" "$LOG/cont/"; done
tar czf "$OUT/cont.tgz" -C "$LOG" cont
[ -f "$OUT/logs.tgz" ] || tar czf "$OUT/logs.tgz" -C /tmp kda-logs --exclude cont
cat "$S"
exit $rc
