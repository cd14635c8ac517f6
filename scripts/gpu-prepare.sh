#!/usr/bin/env bash
# Run HERE (no GPU needed) before a device call: builds the CUDA release tree and
# gathers what the GPU machine lacks, so one call can test and benchmark.
#   .carry/build/ the binaries of a -Dcuda=enabled release build (build-cuda/), in the
#                 build tree's layout: kda-cli, kda-server, the two GPU test programs
#   .carry/lib/   libcjson, libsentencepiece, libmicrohttpd, libgomp (absent there)
#   .carry/baseline_torch_fla.py   the PyTorch + fla baseline (../shared does not travel)
#   .whl/         flash-linear-attention + fla-core wheels (pure Python)
# The whole build tree would not fit the 64 MiB a call may carry; these do (~50 MiB
# with the working tree). Then: device run with carry [".carry", ".whl"] and the command
#   bash scripts/gpu-session.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${KDA_SHARED:-../shared}
[ -f build-cuda/build.ninja ] || meson setup build-cuda -Dcuda=enabled -Dbuildtype=release >/dev/null
ninja -C build-cuda
rm -rf .carry && mkdir -p .carry/lib
for f in cli/kda-cli server/kda-server tests/kernels/test_kernels tests/kernels/test_cuda_model; do
  mkdir -p ".carry/build/$(dirname $f)"
  strip -o ".carry/build/$f" "build-cuda/$f"
done
# every shared library of the four programs except glibc, the C++ runtime and
# CUDA's own (present there): cJSON, cmocka, sentencepiece, libmicrohttpd and
# what gnutls pulls in (unistring, idn2, nettle, ...), libgomp
for lib in $(for f in cli/kda-cli server/kda-server tests/kernels/test_kernels tests/kernels/test_cuda_model; do
                 ldd "build-cuda/$f"; done | awk '/=>/ {print $3}' | sort -u \
             | grep -vE '/lib(c|m|dl|pthread|rt|gcc_s|stdc\+\+|cuda|cudart|cublas|cublasLt)\.so'); do
  cp -L "$lib" .carry/lib/
done
cp "$SHARED/bench/baseline_torch_fla.py" .carry/
git rev-parse --short HEAD > .carry/commit
[ -z "$(git status --porcelain --untracked-files=no)" ] || sed -i 's/$/+dirty/' .carry/commit
if ! ls .whl/flash_linear_attention-0.5.2-*.whl .whl/fla_core-0.5.2-*.whl >/dev/null 2>&1; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform any -d .whl flash-linear-attention==0.5.2 fla-core==0.5.2
fi
grep -qx '/.carry/' .gitignore && grep -qx '/.whl/' .gitignore
du -sh .carry .whl
echo "gpu-prepare: ok (carry .carry .whl; run scripts/gpu-session.sh)"
