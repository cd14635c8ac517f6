#!/bin/sh
# Print the Debian/Ubuntu packages that own the shared libraries the given
# binaries load, one per line. The Dockerfile's build stage runs it so the
# runtime stage installs exactly those (apt adds their own dependencies),
# whichever base it is built on: Debian 12 names them libmicrohttpd12 and
# libcublas-12-x, Ubuntu 24.04 libmicrohttpd12t64, and so on.
#
# usage: runtime-packages.sh BINARY...
set -eu
[ $# -gt 0 ] || { echo "usage: $0 BINARY..." >&2; exit 2; }

libs=$(ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u)
missing=$(ldd "$@" | awk '/not found/ { print $1 }' | grep -v '^libcuda\.so' || true)
if [ -n "$missing" ]; then
    echo "runtime-packages: unresolved libraries: $missing" >&2
    exit 1
fi

# dpkg -S with an exact path, so that lib32/multilib copies never match.
owner() { dpkg -S "$1" 2>/dev/null | grep -v '^diversion' | head -n1 | cut -d: -f1; }

pkgs=$(for lib in $libs; do
    # With merged /usr, ldd may print /lib/... while dpkg recorded /usr/lib/...
    # (or the other way round), and the name may be a symlink dpkg knows by
    # its target only: try each spelling.
    real=$(readlink -f "$lib")
    pkg=""
    for p in "$lib" "${lib#/usr}" "/usr$lib" "$real" "${real#/usr}" "/usr$real"; do
        pkg=$(owner "$p")
        [ -n "$pkg" ] && break
    done
    if [ -z "$pkg" ]; then
        echo "runtime-packages: no package owns $lib" >&2
        exit 1
    fi
    echo "$pkg"
done)
[ -z "$pkgs" ] || echo "$pkgs" | sort -u
