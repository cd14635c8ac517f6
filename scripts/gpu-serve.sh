#!/usr/bin/env bash
# Run ON THE GPU MACHINE (after scripts/gpu-prepare.sh and
# `cp ../shared/data/llama2-tokenizer.model .carry/` here): issue 13's serving figures and burst
# test in one call, ~5 minutes.
#   1. a 1.7B-shaped random checkpoint (with the llama2 tokenizer: kda-server needs one);
#   2. scripts/bench-serve.sh --device cuda: kda-cli bench at B = 1/16/64/256, then kda-server
#      --max-batch 256 under C = 1/16/64/256 closed-loop streaming clients (prompt 128 random
#      ids, 128 tokens, ignore_eos, 3 x C requests) -> $OUT/serve-results.json;
#   3. tests/server/test_burst.py on that model: the 128/256 full-epoll-batch cases, then bursts
#      of 512 mixed clients with 3 x 8000-token /score each, until 20 rounds or KDA_BURST_BUDGET
#      seconds -> $OUT/burst.txt.
# Logs (server logs, engine output, nvidia-smi, ulimit) in $OUT/logs.tgz.
#   4. KDA_SERVE_VARIANTS="name=kda-server flags;name=flags": bench-serve.sh again at
#      C = KDA_SERVE_VARIANT_LEVELS (64,256) per variant -> $OUT/serve-NAME.json, to compare
#      scheduler and tuning choices in the same call (e.g. "split=--tuning mixed_pass=0").
# KDA_GPU_SERVE_SKIP=bench|burst skips a part. Dry run here on the CPU:
#   KDA_GPU_SERVE_DRY=1 bash scripts/gpu-serve.sh   (build/, models/demo, tiny levels)
source "$(dirname "$0")/gpu-env.sh"
export KDA_COMMIT=${KDA_COMMIT:-$(cat .carry/commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)}
DEVICE=cuda
if [ "${KDA_GPU_SERVE_DRY:-0}" = 1 ]; then
  B=build; M17=models/demo; DEVICE=cpu; export KDA_LIB_PATH=
  export KDA_SERVE_LEVELS=${KDA_SERVE_LEVELS:-1,4} KDA_SERVE_OUTPUT=${KDA_SERVE_OUTPUT:-16}
  BURST_ENV=(KDA_BURST_ROUNDS=1 KDA_BURST_SIZES=256 KDA_BURST_SCORE_TOKENS=512 KDA_BURST_MAX_TOKENS=8
             KDA_BURST_FLAGS="--max-batch 32")
else
  BURST_ENV=(KDA_BURST_ROUNDS=${KDA_BURST_ROUNDS:-20} KDA_BURST_SIZES=512 KDA_BURST_SCORE_TOKENS=8000
             KDA_BURST_MAX_TOKENS=128 KDA_BURST_FLAGS="--max-batch 256" KDA_BURST_BUDGET=${KDA_BURST_BUDGET:-180})
fi
rc=0
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1; echo "ulimit -n: soft $(ulimit -Sn) hard $(ulimit -Hn)";
  nproc; python3 -c 'import sys, aiohttp, requests; print(sys.version, "aiohttp", aiohttp.__version__, "requests", requests.__version__)' 2>&1; } \
  | tee "$LOG/machine.txt"
if [ "$DEVICE" = cuda ] && [ ! -f "$M17/tokenizer.model" ]; then
  [ -f .carry/llama2-tokenizer.model ] || { echo "missing .carry/llama2-tokenizer.model (cp ../shared/data/llama2-tokenizer.model .carry/)"; exit 2; }
  ( time python3 scripts/gen_checkpoint.py "$M17" --preset 1.7b --tokenizer spm:.carry/llama2-tokenizer.model ) \
    > "$LOG/gen.txt" 2>&1 || { cat "$LOG/gen.txt"; exit 1; }
fi
if [ "${KDA_GPU_SERVE_SKIP:-}" != bench ]; then
  echo "== bench-serve.sh $M17 --device $DEVICE"
  KDA_BUILD=$B KDA_SERVE_NOTE="1.7B shape, random bf16, commit $KDA_COMMIT" \
    timeout 240 bash scripts/bench-serve.sh "$M17" "$LOG/serve" --device "$DEVICE" 2>&1 | tail -30
  r=${PIPESTATUS[0]}; [ $r = 0 ] || rc=1; echo "== bench-serve rc=$r"
  cp "$LOG/serve/results.json" "$OUT/serve-results.json" 2>/dev/null
fi
if [ "${KDA_GPU_SERVE_SKIP:-}" != burst ]; then
  echo "== test_burst.py on $M17 (${BURST_ENV[*]})"
  ours env "${BURST_ENV[@]}" KDA_BURST_MODEL="$M17" KDA_BURST_DEVICE="$DEVICE" KDA_BURST_SERVER_LOG="$LOG/burst-server.log" \
    timeout 300 python3 tests/server/test_burst.py > "$OUT/burst.txt" 2>&1
  r=$?; [ $r = 0 ] || rc=1; echo "== test_burst rc=$r"
  grep -E "round|PASS|FAIL|budget|requests in" "$OUT/burst.txt" | tail -40
fi
IFS=';' read -ra variants <<< "${KDA_SERVE_VARIANTS:-}"
for v in "${variants[@]}"; do
  name=${v%%=*}; vflags=${v#*=}
  echo "== variant $name: kda-server $vflags"
  KDA_BUILD=$B KDA_SERVE_LEVELS=${KDA_SERVE_VARIANT_LEVELS:-64,256} KDA_SERVE_FLAGS="$vflags" \
    KDA_SERVE_NOTE="1.7B shape, random bf16, commit $KDA_COMMIT, variant $name: $vflags" \
    timeout 150 bash scripts/bench-serve.sh "$M17" "$LOG/serve-$name" --device "$DEVICE" 2>&1 | tail -8
  cp "$LOG/serve-$name/results.json" "$OUT/serve-$name.json" 2>/dev/null
done
tar czf "$OUT/logs.tgz" -C /tmp kda-logs
exit $rc
