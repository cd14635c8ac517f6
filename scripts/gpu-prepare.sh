#!/usr/bin/env bash
# Run HERE (no GPU needed) before a device call: builds the CUDA release tree and
# gathers what the GPU machine lacks, so one call can test and benchmark.
#   .carry/build/ the binaries of a -Dcuda=enabled release build (build-cuda/), in the
#                 build tree's layout: kda-cli, kda-server, the three GPU test programs
#   .carry/lib/   libcjson, libsentencepiece, libmicrohttpd, libgomp (absent there)
#   .carry/baseline_torch_fla.py   the PyTorch + fla baseline (../shared does not travel)
#   .whl/         flash-linear-attention + fla-core wheels (pure Python)
# packed into .carry.tar.xz: every program links the same kernels, so one xz
# stream over all of them is a fraction of their size, and the 64 MiB a call
# may carry holds it with the working tree. scripts/gpu-env.sh unpacks it there.
# Then: device run with carry [".carry.tar.xz", ".whl"] and the command
#   bash scripts/gpu-session.sh
set -euo pipefail
# --old FILE: also carry FILE (an older kda-cli) as .carry/old/kda-cli (scripts/gpu-ab-bin.sh);
# --old-chunk-test FILE: an older test_kda_chunk as .carry/old/test_kda_chunk (gpu-kda-chunk-ab.sh);
# --with DEST=FILE: FILE (a program of another build: a variant, an older commit) as .carry/DEST
OLD= OLDT= WITH=()
while [ $# -ge 2 ]; do
  case $1 in
    --old) OLD=$(realpath "$2") ;;
    --old-chunk-test) OLDT=$(realpath "$2") ;;
    --with) case $2 in *=*) WITH+=("${2%%=*}=$(realpath "${2#*=}")") ;; *) echo "gpu-prepare: --with DEST=FILE" >&2; exit 2 ;; esac ;;
    *) echo "gpu-prepare: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
[ $# = 0 ] || { echo "gpu-prepare: usage: gpu-prepare.sh [--old KDA_CLI] [--old-chunk-test TEST_KDA_CHUNK] [--with DEST=FILE]..." >&2; exit 2; }
cd "$(dirname "$0")/.."
SHARED=${KDA_SHARED:-../shared}
[ -f build-cuda/build.ninja ] || meson setup build-cuda -Dcuda=enabled -Dbuildtype=release >/dev/null
# meson 1.0's nvcc rule writes no depfile, so ninja does not see a .cu file's
# headers: after any header change every .cu file is rebuilt (a struct laid out
# differently in two objects crashed every engine open on the H200, 63b2e44)
stamp=build-cuda/.kda-cuda-headers
if [ ! -f "$stamp" ] || [ -n "$(find kernels tests/kernels -name '*.h' -o -name '*.cuh' | xargs ls -t | head -1 | xargs -I{} find {} -newer "$stamp")" ]; then
  find kernels tests/kernels -name '*.cu' -exec touch {} +
fi
ninja -C build-cuda
touch "$stamp"
rm -rf .carry && mkdir -p .carry/lib
PROGS="cli/kda-cli server/kda-server tests/kernels/test_kernels tests/kernels/test_cuda_model
       tests/kernels/test_prefill_ops tests/kernels/test_kda_chunk tests/kernels/test_skinny
       kernels/lab/lab_kda_step_tiled"
for f in $PROGS; do
  [ -f "build-cuda/$f" ] || continue
  mkdir -p ".carry/build/$(dirname $f)"
  strip -o ".carry/build/$f" "build-cuda/$f"
done
# every shared library of the five programs except glibc, the C++ runtime and
# CUDA's own (present there): cJSON, cmocka, sentencepiece, libmicrohttpd and
# what gnutls pulls in (unistring, idn2, nettle, ...), libgomp
for lib in $(for f in $PROGS; do [ -f "build-cuda/$f" ] && ldd "build-cuda/$f"; done | awk '/=>/ {print $3}' | sort -u \
             | grep -vE '/lib(c|m|dl|pthread|rt|gcc_s|stdc\+\+|cuda|cudart|cublas|cublasLt)\.so'); do
  cp -L "$lib" .carry/lib/
done
cp "$SHARED/bench/baseline_torch_fla.py" .carry/
cp "$SHARED/data/llama2-tokenizer.model" .carry/   # kda-server needs a tokenizer (gpu-serve.sh)
git rev-parse --short HEAD > .carry/commit
[ -z "$(git status --porcelain --untracked-files=no)" ] || sed -i 's/$/+dirty/' .carry/commit
if ! ls .whl/flash_linear_attention-0.5.2-*.whl .whl/fla_core-0.5.2-*.whl >/dev/null 2>&1; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform any -d .whl flash-linear-attention==0.5.2 fla-core==0.5.2
fi
grep -qx '/.carry/' .gitignore && grep -qx '/.carry.tar.xz' .gitignore && grep -qx '/.whl/' .gitignore
if [ -n "$OLD" ]; then mkdir -p .carry/old && strip -o .carry/old/kda-cli "$OLD"; fi
if [ -n "$OLDT" ]; then mkdir -p .carry/old && strip -o .carry/old/test_kda_chunk "$OLDT"; fi
for w in ${WITH[@]+"${WITH[@]}"}; do
  d=".carry/${w%%=*}"; case $d in *..*) echo "gpu-prepare: bad DEST in --with $w" >&2; exit 2 ;; esac
  mkdir -p "$(dirname "$d")" && strip -o "$d" "${w#*=}"
done
tar cf - .carry | xz -9e -T2 > .carry.tar.xz
du -sh .carry .carry.tar.xz .whl
echo "gpu-prepare: ok (carry .carry.tar.xz .whl; run scripts/gpu-session.sh)"
