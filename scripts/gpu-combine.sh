#!/usr/bin/env bash
# Run ON THE GPU MACHINE (after scripts/gpu-prepare.sh here; carry [".carry.tar.xz", ".whl"]):
# the two merge kernels of prefill attention's context splits (kc_attn_prefill_tuning.combine,
# engine tuning attn_prefill_combine) in one call:
#   1. test_prefill_ops: every case against the fp32 reference, and every split case under
#      both merges, byte for byte;
#   2. test_prefill_ops --bench: kernel time per shape, variant and merge (BENCH lines);
#   3. scripts/gpu-cont.sh without its lm-eval step: kda-cli bench of cached-continuation
#      steps under attn_prefill_combine=1, 2, 1, 2 (interleaved against drift), then an ncu
#      pass of 8:17+1023 under combine 2.
# $OUT: summary.txt, ops-test.txt, ops-bench.txt, cont/ (summary.txt, cont.txt, cont.tgz).
source "$(dirname "$0")/gpu-env.sh"
run_start ""
T=$B/tests/kernels/test_prefill_ops
step test_prefill_ops 150 "$OUT/ops-test.txt" $T
grep -E "^FAIL|^\[  (PASSED|FAILED)|combine 2 vs" "$OUT/ops-test.txt" | sort | uniq -c | head -20 >> "$S"
step bench 120 "$OUT/ops-bench.txt" $T --bench
grep -E '"combine":[12]' "$OUT/ops-bench.txt" | sed 's/^BENCH //' >> "$S"
mkdir -p "$OUT/cont"
c=attn_prefill_combine
env OUT="$OUT/cont" STEP_SKIP=lmeval STEP_BUDGET=$((${STEP_BUDGET:-560} - SECONDS)) KDA_TUNING=$c=2 \
  KDA_CONT_TUNINGS="$c=1 $c=2 $c=1 $c=2" KDA_CONT_NCU=8:17+1023 \
  KDA_CONT_POINTS=${KDA_CONT_POINTS:-1:17+1023,1:33+1023,8:17+1023,8:33+1023,1:128+1023,1:2048} \
  bash scripts/gpu-cont.sh > "$LOG/cont.txt" 2>&1 || rc=1
echo "gpu-cont.sh: rc=$rc" >> "$S"
cat "$OUT/cont/cont.txt" >> "$S" 2>/dev/null
rm -f "$OUT/cont/logs.tgz"
cat "$S"
exit $rc
