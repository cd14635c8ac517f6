#!/usr/bin/env bash
# Installs everything kda-server needs to build, run and test on Debian 12 (as root).
#   setup-debian.sh         build + test dependencies (what CI needs)
#   setup-debian.sh --run   only what building and running the server needs
# Idempotent: rerunning only checks. nvcc (CUDA toolkit) is optional: with it the
# CUDA backend is compiled too.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
run_only=0
[ "${1:-}" = "--run" ] && run_only=1
pkgs=(
  build-essential meson ninja-build pkg-config git curl
  libmicrohttpd-dev libcjson-dev libsentencepiece-dev libcmocka-dev
)
if [ $run_only = 0 ]; then
  pkgs+=(sentencepiece python3 python3-numpy python3-torch python3-sentencepiece python3-requests python3-yaml)
  # The fuzz harnesses (fuzz/, scripts/fuzz.sh): clang 14 with libFuzzer, whose runtime
  # (libclang_rt.fuzzer) is only a Recommends of clang-14 on bookworm.
  pkgs+=(clang libclang-rt-14-dev)
  # The playground's browser test (tests/server/test_webui_browser.py): headless
  # Chromium driven by Selenium. On a fresh Debian 12 minbase these take about
  # 2 minutes and 205 packages (most of that download); far fewer next to the rest.
  pkgs+=(chromium chromium-driver python3-selenium)
fi
if [ $run_only = 0 ] && [ "${KDA_CONTAINER_TEST:-1}" = 1 ]; then
  pkgs+=(podman buildah debootstrap runc uidmap slirp4netns fuse-overlayfs)
fi
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
[ $run_only = 1 ] && { echo "setup: ok (run only)"; exit 0; }
# The server's integration tests use real clients: requests and the official openai
# package, Jinja2 (the reference for server/jinja.c), schemathesis (the OpenAPI run) and
# aiohttp (the client of the burst test and of scripts/serve_bench.py, as in vllm bench serve).
PY=${KDA_PIP_PYTHON:-python3}
pip_install() { "$PY" -m pip install -q "$@" 2>/dev/null || "$PY" -m pip install -q --break-system-packages "$@"; }
if ! "$PY" -c 'import openai, requests, jinja2, schemathesis, aiohttp' 2>/dev/null; then
  pip_install openai requests jinja2 schemathesis aiohttp
fi
# lm-evaluation-harness (tests/server/test_lm_eval.py) in its own folder, --no-deps with
# exactly what `lm_eval --model local-completions` imports, pinned: 470 MB in ~90 s on the
# 2-core VM (under load), where `pip install lm-eval[api]` takes 745 MB (scipy, sklearn,
# nltk, ... that a loglikelihood task over HTTP never imports).
LM_DIR=${KDA_LM_EVAL_DIR:-/opt/kda-lm-eval}
if ! PYTHONPATH="$LM_DIR" "$PY" -c 'import lm_eval, datasets, pyarrow, pandas, tenacity, aiohttp' 2>/dev/null; then
  pip_install --no-deps --target "$LM_DIR" lm-eval==0.4.13 datasets==5.2.0 numpy==2.4.6 pandas==3.1.1 \
    pyarrow==26.0.1 huggingface_hub==2.4.0 fsspec==2026.9.0 multiprocess==0.70.19 dill==0.4.1 xxhash==4.1.0 \
    filelock==4.3.1 packaging==26.4 tqdm==4.70.1 sacrebleu==2.6.0 portalocker==4.4.2 tabulate==0.10.0 \
    lxml==6.1.3 pytablewriter==1.2.1 dataproperty==1.1.1 typepy==2.0.0 mbstrdecoder==1.1.5 tabledata==1.3.5 \
    tcolorpy==0.1.7 pathvalidate==3.3.1 chardet==7.7.0 tenacity==9.2.1 aiohttp==3.14.5 aiohappyeyeballs==2.7.1 \
    aiosignal==1.4.0 attrs==26.1.0 frozenlist==1.8.0 multidict==7.2.1 propcache==0.5.4 yarl==1.25.1 \
    python-dateutil==2.9.0.post0 six==1.17.0 PyYAML==6.0.3 colorama==0.4.6 wcwidth==0.7.0 typing_extensions==4.16.0
fi
# guidellm, the vLLM project's serving benchmark client (tests/server/test_bench_client.py), in
# its own folder, --no-deps with what `guidellm run` imports, pinned. It runs on Debian's
# Python over lm-eval's folder (datasets, pyarrow, pandas, numpy: the same versions guidellm
# resolves) so that python3-torch provides the torch.utils.data loader it needs: its own
# dependency is a 2.x torch with CUDA wheels, gigabytes. Built for Debian's Python's version.
GL_DIR=${KDA_GUIDELLM_DIR:-/opt/kda-guidellm}
DEB_PY_VER=$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if ! PYTHONPATH="$GL_DIR:$LM_DIR" /usr/bin/python3 -c 'import guidellm, transformers, datasets, torch.utils.data' 2>/dev/null; then
  pip_install --no-deps --only-binary=:all: --python-version "$DEB_PY_VER" --target "$GL_DIR" guidellm==0.8.1 \
    transformers==5.24.0 tokenizers==0.23.3 safetensors==0.8.0 regex==2026.11.19 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 \
    pydantic==2.14.4 pydantic_core==2.50.5 pydantic-settings==2.16.3 python-dotenv==1.2.4 typing-inspection==0.4.5 \
    annotated-types==0.8.0 httpx==0.28.1 httpcore==1.0.9 h11==0.16.0 h2==4.4.1 hpack==4.2.0 hyperframe==6.1.0 \
    anyio==4.16.0 sniffio==1.3.1 certifi==2026.10.19.post1 idna==3.20 click==8.4.2 culsans==0.10.0 aiologic==0.17.1 \
    wrapt==2.5.2 Faker==40.63.0 ftfy==6.3.1 loguru==0.7.3 msgpack==1.2.4 rich==15.0.0 Pygments==2.21.0 \
    more-itertools==11.2.1 websockets==17.4 uvloop==0.23.0 Jinja2==3.1.6 MarkupSafe==3.0.4
fi
# promtool (the /metrics lint) from Debian's prometheus package, unpacked only: installing
# the package would also set up a Prometheus service.
if ! command -v promtool >/dev/null && [ ! -x /opt/kda-promtool/usr/bin/promtool ]; then
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download -qq prometheus && dpkg-deb -x prometheus_*.deb "$tmp/x") &&
    mkdir -p /opt/kda-promtool/usr/bin && cp "$tmp/x/usr/bin/promtool" /opt/kda-promtool/usr/bin/
  rm -rf "$tmp"
fi
echo "setup: ok"
