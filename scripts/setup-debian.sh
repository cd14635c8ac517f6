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
# The server's integration tests use real clients: requests and the official openai package.
PY=${KDA_PIP_PYTHON:-python3}
if ! "$PY" -c 'import openai, requests' 2>/dev/null; then
  "$PY" -m pip install -q openai requests 2>/dev/null || "$PY" -m pip install -q --break-system-packages openai requests
fi
echo "setup: ok"
