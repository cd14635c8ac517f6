#!/usr/bin/env bash
# Run ON THE GPU MACHINE (after scripts/gpu-prepare.sh here; carry
# [".carry.tar.xz", ".whl"]): one tuning switch measured against its other
# setting in the same call, with the tests it touches first.
#   1. test_kernels, then test_cuda_model (fla fixtures and the random 1.7B
#      checkpoint against the CPU reference) with the defaults;
#   2. kda-cli bench on the 1.7B shape, prefill / score / decode points, with
#      --tuning $KDA_AB_A and $KDA_AB_B alternately (A B A B: the card's drift
#      shows as the difference between the two runs of one setting), then B
#      once more with prof=1 (device-time shares);
#   3. with KDA_AB_NCU=1, ncu (SpeedOfLight) on the first $KDA_AB_NCU_COUNT
#      non-GEMM kernels of one 8 x 2048 prefill under setting B: each one's time
#      and fraction of DRAM bandwidth.
# $OUT: ab-summary.txt (every step's status and the figures), ab-{A,B}{1,2}.json,
# ab-B-prof.json, ncu.txt, logs.tgz.
source "$(dirname "$0")/gpu-env.sh"
export KDA_COMMIT=${KDA_COMMIT:-$(cat .carry/commit 2>/dev/null || echo unknown)}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
S=$OUT/ab-summary.txt
: > "$S"
STEP_BUDGET=${STEP_BUDGET:-560}
rc=0
A=${KDA_AB_A:?KDA_AB_A: the first --tuning string}
Bt=${KDA_AB_B:?KDA_AB_B: the second --tuning string}
echo "commit $KDA_COMMIT; A = $A, B = $Bt; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)" | tee -a "$S"
gen=
if [ ! -f "$M17/config.json" ]; then # a session script in the same call may have made it
  ( python3 scripts/gen_checkpoint.py "$M17" --preset 1.7b --tokenizer spm:.carry/llama2-tokenizer.model ) \
    > "$LOG/gen.txt" 2>&1 &
  gen=$!
fi
step test_kernels 120 "$LOG/test_kernels.txt" $B/tests/kernels/test_kernels
grep -E "PASSED|FAILED|ERROR|y16" "$LOG/test_kernels.txt" | sort | uniq -c | sort -rn | head -12 >> "$S"
[ -z "$gen" ] || wait $gen
step test_cuda_model 240 "$LOG/test_cuda_model.txt" env KDA_TEST_MODEL_17B=$M17 $B/tests/kernels/test_cuda_model
grep -E "PASSED|FAILED|ERROR|cuda vs|bf16-act vs" "$LOG/test_cuda_model.txt" | tail -30 >> "$S"
P=${KDA_AB_POINTS:-"--pairs 128:1,128:64,128:256 --no-kernels --prefill 1:64,8:128,1:2048,8:2048 --score 1:8192,4:8192 --reps 5"}
for run in A1 B1 A2 B2; do
  t=$A; [ "${run:0:1}" = B ] && t=$Bt
  step "bench-$run" 90 "$LOG/bench-$run.txt" $B/cli/kda-cli bench "$M17" $P --tuning "$t" --json "$OUT/ab-$run.json"
  echo "-- $run ($t)" >> "$S"; grep -E "decode B|prefill|score" "$LOG/bench-$run.txt" >> "$S"
done
step bench-B-prof 90 "$LOG/bench-B-prof.txt" $B/cli/kda-cli bench "$M17" $P --tuning "$Bt,prof=1" --json "$OUT/ab-B-prof.json"
echo "-- B prof" >> "$S"; grep -E "prefill|score" "$LOG/bench-B-prof.txt" >> "$S"
if [ "${KDA_AB_NCU:-0}" = 1 ]; then
  NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
  # defaults: SpeedOfLight of the first 48 non-GEMM kernels of one 8 x 2048 prefill;
  # KDA_AB_NCU_{KERNELS,SKIP,COUNT,SECTIONS,BENCH} choose others (SKIP may be a
  # list: one ncu run per value, e.g. the n-th launch of two kernels of one benchmark)
  KR=${KDA_AB_NCU_KERNELS:-"swiglu|rmsnorm|kc_chunk|cast|embed|hist|gqa_qkv|attn|bias|lowrank"}
  SEC=${KDA_AB_NCU_SECTIONS:-SpeedOfLight}
  NB=${KDA_AB_NCU_BENCH:-"--pairs \"\" --no-kernels --prefill 8:2048 --reps 1"}
  : > "$OUT/ncu.txt"
  for sk in ${KDA_AB_NCU_SKIP:-0}; do
    secs=(); for x in $SEC; do secs+=(--section "$x"); done
    step "ncu-skip$sk" 200 "$LOG/ncu-$sk.txt" "$NCU" --clock-control none "${secs[@]}" \
      --kernel-name regex:"$KR" --launch-skip "$sk" --launch-count ${KDA_AB_NCU_COUNT:-48} \
      bash -c "exec $B/cli/kda-cli bench \"$M17\" $NB --tuning \"$Bt\""
    cat "$LOG/ncu-$sk.txt" >> "$OUT/ncu.txt"
  done
fi
tar czf "$OUT/logs.tgz" -C "$LOG" . 2>/dev/null
cat "$S"
exit $rc
