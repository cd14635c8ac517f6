#!/usr/bin/env bash
# Meson wrapper for scripts/container-test.sh. It takes minutes, root and
# the Debian mirror, so a developer's plain `meson test` skips it (exit 77);
# it runs when asked for (KDA_CONTAINER_TEST=1, which `meson test --setup
# container` sets) and in CI (CI=true), unless KDA_CONTAINER_TEST=0.
want=${KDA_CONTAINER_TEST:-}
if [ -z "$want" ] && [ "${CI:-}" = true ]; then want=1; fi
if [ "$want" != 1 ]; then
    echo "SKIP: set KDA_CONTAINER_TEST=1 (meson test --setup container --suite container)"
    exit 77
fi
exec bash "${KDA_SRC:-$(dirname "$0")/../..}/scripts/container-test.sh"
