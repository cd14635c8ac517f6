# Sourced by scripts/gpu-session.sh, gpu-variants.sh and gpu-fixtures.sh on the GPU
# machine: repo root, output folders, the programs carried by gpu-prepare.sh.
#   OUT  what the device tool brings back (at most 8 files: logs go to LOG, packed)
#   B    the carried build tree;  M17  where the 1.7B-shaped checkpoint is generated
#   ours CMD...  runs CMD with the carried libraries (only ours: system curl keeps
#                its own) and KDA_SRC / KDA_BUILD set for the test programs
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-/tmp/kda-out}
LOG=/tmp/kda-logs
# once per call (a script sourcing this may run another that does too)
if [ -z "${KDA_GPU_ENV_DONE:-}" ]; then
  rm -rf "$LOG"; mkdir -p "$OUT" "$LOG"
  # the programs travel packed (scripts/gpu-prepare.sh); a warm machine may
  # still hold an older unpacked copy, so always unpack afresh
  if [ -f .carry.tar.xz ]; then
    rm -rf .carry
    python3 -c "import tarfile; tarfile.open('.carry.tar.xz').extractall('.')" || exit 1
  fi
  export KDA_GPU_ENV_DONE=1
fi
B=.carry/build
M17=${M17:-/tmp/kda-1.7b}   # a caller may point it elsewhere (gpu-cont.sh)
export KDA_LIB_PATH=$PWD/.carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
ours() { env LD_LIBRARY_PATH="$KDA_LIB_PATH" KDA_SRC="$PWD" KDA_BUILD="$PWD/$B" "$@"; }
# step NAME TIMEOUT LOG CMD...: runs CMD through ours under a timeout, output to
# LOG, and appends "NAME: rc=R (S s)" to $S; a failure sets rc=1. The timeout is
# cut to what is left of $STEP_BUDGET seconds of this script (when set: the
# device call's limit is 10 minutes and the outputs must come back), and NAME
# is skipped when it is one of the words of $STEP_SKIP.
step() {
  local name=$1 to=$2 log=$3; shift 3
  case " ${STEP_SKIP:-} " in *" $name "*) echo "$name: skipped" | tee -a "$S"; return ;; esac
  if [ -n "${STEP_BUDGET:-}" ]; then
    local left=$((STEP_BUDGET - SECONDS - 15))
    [ "$to" -le "$left" ] || to=$left
    if [ "$to" -lt 20 ]; then echo "$name: skipped (time budget spent)" | tee -a "$S"; return; fi
  fi
  local t0=$SECONDS
  ours timeout "$to" "$@" > "$log" 2>&1
  local r=$?
  [ $r = 0 ] || rc=1
  echo "$name: rc=$r ($((SECONDS - t0)) s)$([ $r = 124 ] && echo ' TIMED OUT')" | tee -a "$S"
}

# run_start SKIP_WORDS: what each one-call GPU script begins with: KDA_COMMIT (the carried
# build's), the summary file S emptied and headed by the commit and the device, rc=0,
# STEP_BUDGET (560 s unless set), STEP_SKIP, and skip NAME (true when NAME is one of them)
run_start() {
  export KDA_COMMIT=${KDA_COMMIT:-$(cat .carry/commit 2>/dev/null || echo unknown)}
  S=$OUT/summary.txt
  : > "$S"
  STEP_BUDGET=${STEP_BUDGET:-560}
  STEP_SKIP=$1
  rc=0
  echo "commit $KDA_COMMIT; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)" | tee -a "$S"
}
skip() { case " ${STEP_SKIP:-} " in *" $1 "*) return 0 ;; esac; return 1; }
# gen_m17: the 1.7B-shaped checkpoint (random bf16, Llama-2 tokenizer) generated into $M17
# in the background unless it is there; gen_wait waits for it
gen_m17() {
  gen=
  if [ ! -f "$M17/config.json" ]; then
    python3 scripts/gen_checkpoint.py "$M17" --preset 1.7b --tokenizer spm:.carry/llama2-tokenizer.model \
      > "$LOG/gen.txt" 2>&1 &
    gen=$!
  fi
}
gen_wait() { [ -z "${gen:-}" ] || wait $gen; }
