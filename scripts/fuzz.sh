#!/usr/bin/env bash
# Builds the libFuzzer harnesses of fuzz/ (clang, ASan+UBSan, build-fuzz/) and
# runs each for SECONDS (default 60) from its committed seeds
# (fuzz/corpus/NAME + fuzz/regressions/NAME) with its dictionary
# (fuzz/dict/NAME.dict). New inputs go to a temporary working corpus, so the
# committed corpus only changes with --merge. Fails if any harness crashes,
# times out, leaks or runs out of memory; the input is left in
# build-fuzz/crashes/NAME/ (crash-*, timeout-*, leak-*, oom-*) with the
# command that replays it. Hours-long runs: scripts/fuzz.sh 3600.
#
#   scripts/fuzz.sh [options] [SECONDS]
#     --only a,b      run only these harnesses (default: all of fuzz/corpus/)
#     --jobs N        harnesses at once (default 1; each is one process)
#     --merge         minimise the new inputs into fuzz/corpus/NAME (then review and commit)
#     --report FILE   write the figures (executions, exec/s, coverage, crashes) to FILE
#     --testlog FILE  also one meson-testlog-style JSON line per harness (scripts/test-all.sh)
#     --nice N        run the fuzzers under nice -n N (default 10: the machine is shared)
#     --build-only    build the harnesses and stop
# Environment: FUZZ_CC/FUZZ_CXX (default clang/clang++), FUZZ_BUILD (default build-fuzz).
set -uo pipefail
# The whole script is one function, read before it starts: a run lasts hours,
# and bash would otherwise read an edited (or checked-out) file mid-run.
main() {
cd "$(dirname "$0")/.."
root=$(pwd)

secs=60 jobs=1 merge=0 report="" testlog="" only="" niceness=10 build_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --only) only=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --merge) merge=1; shift ;;
    --report) report=$2; shift 2 ;;
    --testlog) testlog=$2; shift 2 ;;
    --nice) niceness=$2; shift 2 ;;
    --build-only) build_only=1; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    [0-9]*) secs=$1; shift ;;
    *) echo "fuzz.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

build=${FUZZ_BUILD:-build-fuzz}
# clang whatever CC says (the other build trees may use gcc)
export CC=${FUZZ_CC:-clang} CXX=${FUZZ_CXX:-clang++}
probe=$(mktemp /tmp/kda-fuzz-probe.XXXXXX)
if ! command -v "$CC" >/dev/null || ! printf '%s\n' '#include <stddef.h>' \
     'int LLVMFuzzerTestOneInput(const unsigned char *d, size_t n) { return (int)(d && n) * 0; }' |
     "$CC" -x c - -fsanitize=fuzzer,address,undefined -o "$probe" 2>/dev/null; then
  rm -f "$probe"
  echo "fuzz.sh: $CC cannot link -fsanitize=fuzzer (Debian: apt-get install clang libclang-rt-14-dev)" >&2
  exit 1
fi
rm -f "$probe"

if [ -n "$only" ]; then
  IFS=, read -r -a names <<<"$only"
else
  names=()
  for d in fuzz/corpus/*/; do names+=("$(basename "$d")"); done
fi

if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" -Dfuzz=true -Dcuda=disabled -Dtests=disabled -Dbuildtype=debugoptimized >/dev/null || exit 1
fi
targets=()
for n in "${names[@]}"; do targets+=("fuzz/fuzz_$n"); done
[ -f "$build/fuzz/fuzz-bpe.model" ] || [ ! -x "$(command -v spm_train)" ] || targets+=(fuzz/fuzz-bpe.model)
ninja -C "$build" -j "$(nproc)" "${targets[@]}" >/dev/null || { ninja -C "$build" "${targets[@]}"; exit 1; }
[ "$build_only" = 1 ] && { echo "fuzz.sh: built ${targets[*]} in $build"; exit 0; }

if [ -n "$testlog" ]; then mkdir -p "$(dirname "$testlog")" && : >"$testlog"; fi

work=$(mktemp -d /tmp/kda-fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

# One harness: its log in $work/NAME.log, new inputs in $work/NAME/, findings in $build/crashes/NAME/.
run_one() {
  local n=$1 exe="$root/$build/fuzz/fuzz_$1" art="$root/$build/crashes/$1"
  mkdir -p "$work/$n" "$art"
  local seeds=("$root/fuzz/corpus/$n")
  [ -d "$root/fuzz/regressions/$n" ] && seeds+=("$root/fuzz/regressions/$n")
  local dict=()
  [ -f "$root/fuzz/dict/$n.dict" ] && dict=(-dict="$root/fuzz/dict/$n.dict")
  nice -n "$niceness" "$exe" -max_total_time="$secs" -timeout=25 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$art/" "${dict[@]}" "$work/$n" "${seeds[@]}" >"$work/$n.log" 2>&1
  echo $? >"$work/$n.rc"
}

echo "fuzz.sh: ${#names[@]} harnesses x ${secs}s, $jobs at a time (${names[*]})"
t0=$(date +%s)
touch "$work/start"   # findings are the files written after this
running=0
for n in "${names[@]}"; do
  run_one "$n" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
done
wait
elapsed=$(( $(date +%s) - t0 ))

# Figures from libFuzzer's final stats and its last status line.
stat() { grep -a "^stat::$2:" "$work/$1.log" | tail -1 | awk '{print $2}'; }
status_field() { grep -aE '^#[0-9]+' "$work/$1.log" | tail -1 | grep -oE "$2: [0-9]+" | awk '{print $2}'; }
rc=0
table=$(printf '%-12s %8s %12s %8s %7s %7s %7s %9s %7s  %s\n' harness seconds executions exec/s cov ft corpus new_units rss_mb findings)
for n in "${names[@]}"; do
  frc=$(cat "$work/$n.rc" 2>/dev/null || echo 1)
  found=$(find "$root/$build/crashes/$n" -maxdepth 1 -type f -newer "$work/start" \( -name 'crash-*' -o -name 'timeout-*' \
          -o -name 'leak-*' -o -name 'oom-*' \) 2>/dev/null | sort)
  nfound=$(printf '%s' "$found" | grep -c . || true)
  execs=$(stat "$n" number_of_executed_units)
  line=$(printf '%-12s %8s %12s %8s %7s %7s %7s %9s %7s  %s' "$n" "$secs" "${execs:-?}" "$(stat "$n" average_exec_per_sec)" \
         "$(status_field "$n" cov)" "$(status_field "$n" ft)" "$(status_field "$n" corp | head -1)" \
         "$(stat "$n" new_units_added)" "$(stat "$n" peak_rss_mb)" "$nfound")
  table+=$'\n'"$line"
  ok=1
  if [ "$frc" != 0 ] || [ "$nfound" != 0 ]; then
    ok=0 rc=1
    echo "fuzz.sh: $n FAILED (exit $frc); last lines of its log:" >&2
    grep -av '^INFO\|^#' "$work/$n.log" | tail -25 >&2
    for f in $found; do echo "  finding: $f  (replay: $build/fuzz/fuzz_$n $f)" >&2; done
  fi
  if [ -n "$testlog" ]; then
    python3 -c 'import json,sys; print(json.dumps({"name": "fuzz " + sys.argv[1], "result": "OK" if sys.argv[2] == "1" else "FAIL", "stdout": sys.argv[3]}))' \
      "$n" "$ok" "$line" >>"$testlog"
  fi
  if [ "$merge" = 1 ] && [ "$ok" = 1 ]; then
    before=$(ls "$root/fuzz/corpus/$n" | wc -l)
    "$root/$build/fuzz/fuzz_$n" -merge=1 -max_len=65536 "$root/fuzz/corpus/$n" "$work/$n" >"$work/$n.merge.log" 2>&1 ||
      { echo "fuzz.sh: merge of $n failed (see below)" >&2; tail -5 "$work/$n.merge.log" >&2; rc=1; }
    echo "fuzz.sh: $n: corpus $before -> $(ls "$root/fuzz/corpus/$n" | wc -l) files"
  fi
done
echo "$table"
echo "fuzz.sh: ${elapsed}s wall, $([ $rc = 0 ] && echo 'no findings' || echo 'FINDINGS (see above)')"

if [ -n "$report" ]; then
  {
    echo "# scripts/fuzz.sh $secs (jobs $jobs): libFuzzer + ASan + UBSan (-fno-sanitize-recover=all), clang $("$CC" -dumpversion)"
    echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(git describe --always --dirty 2>/dev/null), $(nproc) cores:" \
         "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), load $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "# seeds: fuzz/corpus/NAME + fuzz/regressions/NAME; dictionaries fuzz/dict/NAME.dict; nice $niceness"
    echo "# cov/ft: libFuzzer's edge and feature counts at the end (instrumented code only: libsentencepiece"
    echo "# is not); corpus: inputs kept; findings: crash/timeout/leak/oom files written"
    echo "$table"
    echo "# wall ${elapsed}s; result: $([ $rc = 0 ] && echo 'no findings' || echo FINDINGS)"
  } >"$report"
  echo "fuzz.sh: figures in $report"
fi
exit $rc
}
main "$@"
exit $?
