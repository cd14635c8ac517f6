#!/usr/bin/env bash
# Run ON THE GPU MACHINE (after scripts/gpu-prepare.sh here; carry [".carry.tar.xz", ".whl"]):
# the serving benchmark at C = 64, 256 with --step-tokens 256 / 512 / 1024 (cuda's default), the
# trade-off between ITL (short steps) and efficiency / TTFT (prompt rows cost less in larger steps).
# $OUT: summary.txt, serve-step<N>.json (commit under bench/results/), logs.tgz.
source "$(dirname "$0")/gpu-env.sh"
STEP_BUDGET=${STEP_BUDGET:-420}
run_start ""
gen_m17
gen_wait
for st in 256 512 1024; do
  step serve_st$st 110 $LOG/serve-st$st.txt env KDA_BUILD=$B KDA_SERVE_LEVELS=64,256 \
    KDA_SERVE_FLAGS="--step-tokens $st" KDA_SERVE_NOTE="1.7B shape, random bf16, commit $KDA_COMMIT, --step-tokens $st" \
    bash scripts/bench-serve.sh "$M17" "$LOG/serve-st$st" --device cuda
  cp "$LOG/serve-st$st/results.json" "$OUT/serve-step$st.json" 2>/dev/null
  grep -E "C=|  C " $LOG/serve-st$st.txt | head -3 | sed "s/^/st=$st /" >> $S
  tail -3 $LOG/serve-st$st.txt | sed "s/^/st=$st /" >> $S
done
tar czf $OUT/logs.tgz -C /tmp kda-logs
cat $S
