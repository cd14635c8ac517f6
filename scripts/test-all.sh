#!/usr/bin/env bash
# Builds from scratch and runs every test: the default suites, the C unit tests
# again under AddressSanitizer + UndefinedBehaviorSanitizer, every libFuzzer
# harness for KDA_FUZZ_SECONDS (default 40; 0 skips) under clang's ASan+UBSan,
# and the container test. Ends with one line "N passed, N failed, N skipped".
set -uo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
rc=0
logs=()

rm -rf build build-asan build-fuzz
meson setup build -Dbuildtype=debugoptimized >/dev/null && ninja -C build -j "$jobs" || exit 1
meson test -C build --no-suite container --num-processes "$jobs" --print-errorlogs || rc=1
logs+=(build/meson-logs/testlog.json)

# C unit tests and the daemon under sanitizers (no CUDA: the sanitizers do not see
# device code). The server tests check that kda-server exits 0, which LeakSanitizer
# turns into "no leaks".
ASAN_SUITES=(safetensors engine tokenizer server fuzz)
meson setup build-asan -Dbuildtype=debug -Dcuda=disabled -Db_sanitize=address,undefined -Db_lundef=false >/dev/null \
  && ninja -C build-asan -j "$jobs" || exit 1
suite_args=()
for s in "${ASAN_SUITES[@]}"; do suite_args+=(--suite "$s"); done
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 \
  meson test -C build-asan "${suite_args[@]}" --num-processes "$jobs" --print-errorlogs || rc=1
logs+=(build-asan/meson-logs/testlog.json)

# The fuzz harnesses (fuzz/README.md), two at a time: on the 2-core CI machine
# 6 x 40 s is 2 minutes after a 1-2 minute build. A finding fails the run
# and is left in build-fuzz/crashes/.
fuzz_secs=${KDA_FUZZ_SECONDS:-40}
if [ "$fuzz_secs" -gt 0 ]; then
  bash scripts/fuzz.sh --jobs 2 --nice 0 --testlog build-fuzz/meson-logs/fuzzlog.json "$fuzz_secs" || rc=1
  logs+=(build-fuzz/meson-logs/fuzzlog.json)
fi

if [ "${KDA_CONTAINER_TEST:-1}" = 1 ] && [ -x scripts/container-test.sh ]; then
  KDA_CONTAINER_TEST=1 meson test -C build --suite container --logbase container --print-errorlogs || rc=1
  logs+=(build/meson-logs/container.json)
fi

python3 scripts/test-summary.py "${logs[@]}" || rc=1
exit $rc
