#!/bin/sh
# Container entrypoint: turn KDA_* environment variables into kda-server
# flags, then exec it. exec matters: kda-server replaces this shell and runs
# as PID 1, so the SIGTERM of `docker stop` / a pod deletion reaches the
# daemon itself, which drains in-flight requests and exits 0.
#
# Flags given to the container (docker run IMAGE --flag ...) come after the
# ones made here, so they win. The model, first match:
#   --model DIR in the arguments > KDA_MODEL > /models (a mounted volume
#   holding config.json) > the demo model baked into the image.
set -eu

server=${KDA_SERVER_BIN:-/usr/local/bin/kda-server}

# `docker run IMAGE kda-cli ...` or `... sh`: run that instead of the server.
case "${1:-}" in
    ""|-*) ;;
    *) exec "$@" ;;
esac

if [ -z "${KDA_MODEL:-}" ]; then
    if [ -f /models/config.json ]; then
        KDA_MODEL=/models
    else
        KDA_MODEL=${KDA_DEMO_MODEL:-/opt/kda/models/demo}
    fi
    export KDA_MODEL
fi
: "${KDA_HOST:=0.0.0.0}" "${KDA_PORT:=8080}"
export KDA_HOST KDA_PORT

# given FLAG ARGS...: did the caller pass FLAG? (kda-server takes "--flag
# value" only, and the last of a repeated flag would win anyway; this keeps
# its command line, as seen in /proc/1/cmdline, free of dead values.)
given() {
    gf=$1; shift
    for a in "$@"; do
        [ "$a" = "$gf" ] && return 0
    done
    return 1
}

# Each set variable becomes "FLAG VALUE" in front of the caller's arguments,
# unless the caller passed FLAG: the server never sees a flag twice.
for pair in \
    --model=KDA_MODEL --model-name=KDA_MODEL_NAME --host=KDA_HOST --port=KDA_PORT --device=KDA_DEVICE \
    --threads=KDA_THREADS --max-batch=KDA_MAX_BATCH --max-queue=KDA_MAX_QUEUE \
    --max-seq-len=KDA_MAX_SEQ_LEN --gpu-memory-fraction=KDA_GPU_MEMORY_FRACTION --log-level=KDA_LOG_LEVEL \
    --grace-seconds=KDA_GRACE_SECONDS --api-key-file=KDA_API_KEY_FILE \
    --prefix-cache=KDA_PREFIX_CACHE --prefix-cache-bytes=KDA_PREFIX_CACHE_BYTES \
    --api-key=KDA_API_KEY
do
    f=${pair%%=*}
    v=$(printenv "${pair#*=}" || true)
    [ -n "$v" ] || continue
    given "$f" "$@" || set -- "$f" "$v" "$@"
done
# KDA_API_KEY ends up on the command line, where anyone who can read
# /proc/1/cmdline in the container sees it; prefer KDA_API_KEY_FILE with a
# mounted secret.

exec "$server" "$@"
