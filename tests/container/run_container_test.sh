#!/usr/bin/env bash
# Meson wrapper for scripts/container-test.sh: exit 77 (skip) unless asked
# for with KDA_CONTAINER_TEST=1 (meson test --setup container), so that a
# plain `meson test` never spends minutes building images.
if [ "${KDA_CONTAINER_TEST:-0}" != 1 ]; then
    echo "SKIP: set KDA_CONTAINER_TEST=1 (meson test --setup container --suite container)"
    exit 77
fi
exec bash "${KDA_SRC:-$(dirname "$0")/../..}/scripts/container-test.sh"
