#!/usr/bin/env bash
# End-to-end test of the container image, CPU variant, with no registry:
#   1. a Debian 12 base image made locally (debootstrap --variant=minbase,
#      then `podman import`), cached under $KDA_CONTAINER_CACHE;
#   2. the Dockerfile built against it (build args pick the CPU variant);
#   3. the image run with a published loopback port: /health, a streamed
#      completion, a scored text, /metrics, the HEALTHCHECK, non-root, PID 1;
#   4. a model on a /models volume, and SIGTERM during a streamed request:
#      the request finishes, /health drops to 503, exit code 0.
# Needs root, podman (runc), debootstrap and the Debian mirror; installs the
# missing Debian packages itself when run as root with apt.
#
# usage: bash scripts/container-test.sh [--rebuild-base]
#   --rebuild-base  debootstrap a fresh base image even if one is cached
# Kept in podman's storage for the next run: the base image, the test image
# and its build stage (tagged, so their layers are the build cache); older
# untagged layers are pruned at the end, so reruns do not pile up gigabytes.
# env: KDA_CONTAINER_CACHE (default /var/cache/kda-container),
#      KDA_CONTAINER_PORT (default: a free one), KDA_DEBIAN_MIRROR.
# No `set -e`: a failed check is counted and the run goes on; the steps
# that later ones need end it with `|| exit 1`.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${KDA_CONTAINER_CACHE:-/var/cache/kda-container}
MIRROR=${KDA_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# A free loopback port unless one is given: a fixed one may be taken.
PORT=${KDA_CONTAINER_PORT:-$(/usr/bin/python3 -c \
    'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
BASE_IMAGE=localhost/kda-debian:12-minbase
IMAGE=localhost/kda-server:container-test
NAME=kda-container-test-$$
# Known quirks of these machines: runc is the runtime (Debian's podman
# recommends crun, which is not installed), and without explicit ulimits runc
# fails with "error setting rlimit type 7: operation not permitted".
PODMAN=(podman --runtime runc)
LIMITS=(--ulimit nofile=1024:1024 --ulimit nproc=4096:4096)

rebuild_base=0
for a in "$@"; do
    case "$a" in
        --rebuild-base) rebuild_base=1 ;;
        *) echo "usage: $0 [--rebuild-base]" >&2; exit 2 ;;
    esac
done

T0=$(date +%s)
WORK=$(mktemp -d /tmp/kda-container-test.XXXXXX)
passed=0 failed=0
pass() { passed=$((passed + 1)); echo "PASS  $*"; }
fail() { failed=$((failed + 1)); echo "FAIL  $*"; }
check() { local what=$1; shift; if "$@"; then pass "$what"; else fail "$what"; return 1; fi; }
note() { echo "----  $*"; }

summary() {
    local rc=$?
    set +o pipefail
    "${PODMAN[@]}" rm -f -v -t 0 "$NAME" >/dev/null 2>&1 || true
    "${PODMAN[@]}" image prune -f >/dev/null 2>&1 || true
    echo "container-test: wall time $(( $(date +%s) - T0 )) s"
    if [ $rc -ne 0 ] && [ $failed -eq 0 ]; then fail "script aborted (exit $rc)"; fi
    # podman's stderr, minus its complaint that there is no systemd to run
    # healthcheck timers (podman healthcheck run works without them).
    if [ $failed -ne 0 ] && [ -s "$WORK/podman.log" ]; then
        grep -v 'systemd' "$WORK/podman.log" | tail -n 10 | sed 's/^/podman: /'
    fi
    echo "container-test: $passed passed, $failed failed"
    rm -rf "$WORK"
    if [ $failed -eq 0 ]; then echo "container-test: PASS"; exit 0; fi
    echo "container-test: FAIL"
    exit 1
}
trap summary EXIT

# --------------------------------------------------------------- tools
need=()
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v curl >/dev/null || need+=(curl)
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        note "installing ${need[*]}"
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            podman runc debootstrap curl >/dev/null; } \
            || { fail "apt-get install ${need[*]}"; exit 1; }
    else
        fail "missing tools: ${need[*]} (apt-get install podman runc debootstrap curl)"
        exit 1
    fi
fi
[ "$(id -u)" = 0 ] || { fail "needs root (debootstrap, rootful podman)"; exit 1; }

# ---------------------------------------------------------- base image
# debootstrap takes ~30 s and needs the mirror; the tarball is kept so that
# later runs (and CI on the same machine) only re-import it, or reuse the
# image if podman's storage still has it.
make_base() {
    local tarball=$CACHE/debian12-minbase.tar
    if [ "$rebuild_base" = 0 ] && "${PODMAN[@]}" image exists "$BASE_IMAGE"; then
        note "base image $BASE_IMAGE: cached in podman storage"
        return 0
    fi
    if [ "$rebuild_base" = 1 ] || [ ! -s "$tarball" ]; then
        note "debootstrap --variant=minbase bookworm ($MIRROR)"
        local root=$WORK/rootfs
        debootstrap --variant=minbase bookworm "$root" "$MIRROR" > "$WORK/debootstrap.log" 2>&1 \
            || { tail -n 20 "$WORK/debootstrap.log"; return 1; }
        # What debian:12-slim drops: apt's caches, docs, man pages, locales.
        # The dpkg excludes keep packages installed later from adding them back.
        rm -rf "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
               "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/* \
               "$root"/usr/share/info/* "$root"/usr/share/locale/* "$root"/var/log/*
        cat > "$root/etc/dpkg/dpkg.cfg.d/01-container-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
EOF
        printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
            > "$root/etc/apt/apt.conf.d/01-container-slim"
        cat > "$root/etc/apt/sources.list" <<EOF
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb ${MIRROR%/debian}/debian-security bookworm-security main
EOF
        mkdir -p "$CACHE"
        tar -C "$root" --numeric-owner -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball" || return 1
        rm -rf "$root"
    fi
    note "importing $tarball as $BASE_IMAGE"
    "${PODMAN[@]}" import --quiet --change 'CMD ["/bin/bash"]' "$tarball" "$BASE_IMAGE" >/dev/null
}
check "base image: Debian 12 minbase made locally" make_base || exit 1

# ------------------------------------------------------------ build context
# The real context is the repo. Until the trained demo model is committed,
# a staged copy of it gets a tiny generated checkpoint as models/demo.
CONTEXT=$ROOT
if [ ! -f "$ROOT/models/demo/config.json" ]; then
    note "models/demo/ missing: baking a generated tiny checkpoint instead"
    CONTEXT=$WORK/context
    mkdir -p "$CONTEXT/models"
    # Tracked and untracked-but-not-ignored files: what a commit would hold.
    (cd "$ROOT" && git ls-files -z -co --exclude-standard \
        | tar --null --ignore-failed-read -T - -cf - 2>/dev/null) | tar -C "$CONTEXT" -xf -
    /usr/bin/python3 "$ROOT/scripts/gen_checkpoint.py" "$CONTEXT/models/demo" \
        --preset tiny --tokenizer bytes > "$WORK/gen.log" 2>&1 \
        || { cat "$WORK/gen.log"; fail "generate a tiny checkpoint"; exit 1; }
fi

# ------------------------------------------------------------------ build
# --network host: the build's apt-get reaches the mirror the way the host
# does. --format docker: OCI images cannot carry HEALTHCHECK.
build_image() {
    "${PODMAN[@]}" build --format docker --network host --layers \
        --build-arg BUILD_IMAGE="$BASE_IMAGE" --build-arg RUNTIME_IMAGE="$BASE_IMAGE" \
        --build-arg KDA_CUDA=disabled \
        -t "$IMAGE" -f "$ROOT/Dockerfile" "$CONTEXT" > "$WORK/build.log" 2>&1 \
        || { tail -n 40 "$WORK/build.log"; return 1; }
    # Tag the build stage too (all cached, a second): the prune at the end
    # then keeps the toolchain layer.
    "${PODMAN[@]}" build --format docker --network host --layers --target build \
        --build-arg BUILD_IMAGE="$BASE_IMAGE" --build-arg KDA_CUDA=disabled \
        -t "$IMAGE-build" -f "$ROOT/Dockerfile" "$CONTEXT" >> "$WORK/build.log" 2>&1 \
        || { tail -n 40 "$WORK/build.log"; return 1; }
    grep -m1 '^runtime packages:' "$WORK/build.log" | sed 's/^/----  /' || true
}
tb=$(date +%s)
check "build: CPU variant of the Dockerfile" build_image || exit 1
note "build took $(( $(date +%s) - tb )) s"

size=$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE")
note "runtime image size: $(( size / 1000000 )) MB ($size bytes)"
inspect() { "${PODMAN[@]}" image inspect --format "$1" "$IMAGE"; }
nonroot_user() { local u; u=$(inspect '{{.Config.User}}'); u=${u%%:*}; [[ "$u" =~ ^[0-9]+$ && "$u" != 0 ]]; }
exposes_port() { [[ "$(inspect '{{json .Config.ExposedPorts}}')" == *'"8080/tcp"'* ]]; }
healthcheck_set() { [[ "$(inspect '{{json .Config.Healthcheck}}')" == */health* ]]; }
no_compiler() {
    "${PODMAN[@]}" run --rm "${LIMITS[@]}" --entrypoint sh "$IMAGE" \
        -c '! command -v cc && ! command -v gcc && ! command -v meson' 2>>"$WORK/podman.log"
}
check "image: runs as a non-root numeric user" nonroot_user
check "image: EXPOSEs 8080" exposes_port
check "image: HEALTHCHECK on /health" healthcheck_set
check "image: no compiler in the runtime stage" no_compiler

# -------------------------------------------------------------------- run
URL=http://127.0.0.1:$PORT
start() {
    "${PODMAN[@]}" run -d --name "$NAME" "${LIMITS[@]}" -p "127.0.0.1:$PORT:8080" "$@" \
        > /dev/null 2>>"$WORK/podman.log"
}
check "run: container starts with a published loopback port" \
    start -e KDA_DEVICE=cpu -e KDA_THREADS=2 -e KDA_GRACE_SECONDS=60 "$IMAGE" || exit 1

# Up to 60 s in all, whatever the network does (a timeout, not a refusal,
# is what a broken port forward looks like).
wait_health() {
    local end=$((SECONDS + 60))
    while [ $SECONDS -lt $end ]; do
        curl -fsS -m 1 "$URL/health" > "$WORK/health.json" 2>/dev/null && return 0
        [ "$("${PODMAN[@]}" inspect --format '{{.State.Running}}' "$NAME")" = true ] || return 1
        sleep 0.3
    done
    return 1
}
if ! check "run: /health answers 200 on the published loopback port" wait_health; then
    "${PODMAN[@]}" logs "$NAME" 2>&1 | tail -n 30
    exit 1
fi
note "health: $(head -c 300 "$WORK/health.json")"

in_ctr() { "${PODMAN[@]}" exec "$NAME" "$@"; }
pid1_is_server() { [ "$(in_ctr cat /proc/1/comm)" = kda-server ]; }
pid1_nonroot() { local u; u=$(in_ctr sed -n 's/^Uid:[[:space:]]*\([0-9]*\).*/\1/p' /proc/1/status); [ -n "$u" ] && [ "$u" != 0 ]; }
pid1_model() { in_ctr cat /proc/1/cmdline | tr '\0' ' ' | grep -q -- "--model $1 "; }
exit_code_0() { [ "$("${PODMAN[@]}" inspect --format '{{.State.ExitCode}}' "$NAME")" = 0 ]; }
check "run: kda-server is PID 1 (no shell in between)" pid1_is_server
check "run: PID 1 runs as a non-root user" pid1_nonroot
check "run: model is the baked-in demo" pid1_model /opt/kda/models/demo
check "run: the image's HEALTHCHECK passes" "${PODMAN[@]}" healthcheck run "$NAME"

stream_ok() {
    curl -fsS -N -m 60 "$URL/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt": "The quick brown fox", "max_tokens": 8, "stream": true}' > "$WORK/stream.txt" \
        && grep -q '^data: {' "$WORK/stream.txt" && grep -q '^data: \[DONE\]' "$WORK/stream.txt"
}
check "api: streamed completion (SSE data chunks, then [DONE])" stream_ok \
    || head -c 600 "$WORK/stream.txt"

score_ok() {
    curl -fsS -m 60 "$URL/score" -H 'Content-Type: application/json' \
        -d '{"text": "The quick brown fox jumps over the lazy dog."}' > "$WORK/score.json" \
        && /usr/bin/python3 - "$WORK/score.json" <<'EOF'
import json, math, sys
r = json.load(open(sys.argv[1]))
lps, s = r["token_logprobs"], r["sum_logprob"]
assert len(lps) == len(r["tokens"]) - 1 > 0, r
assert all(math.isfinite(x) and x <= 0 for x in lps), r
assert math.isfinite(s) and s < 0 and abs(s - sum(lps)) < 1e-3 * max(1, -s), r
EOF
}
check "api: /score gives per-token log-probabilities that sum up" score_ok \
    || head -c 600 "$WORK/score.json"

metrics_ok() {
    curl -fsS -m 10 "$URL/metrics" > "$WORK/metrics.txt" \
        && grep -Eq '^# (TYPE|HELP) ' "$WORK/metrics.txt" \
        && grep -Eq '^[a-z_:]+(\{[^}]*\})? [0-9.eE+-]+' "$WORK/metrics.txt"
}
check "api: /metrics in Prometheus text format" metrics_ok || head -c 600 "$WORK/metrics.txt"

# ------------------------------------------------------------- plain stop
# `podman stop` sends the image's STOPSIGNAL (SIGTERM) to PID 1.
"${PODMAN[@]}" stop -t 30 "$NAME" > /dev/null 2>>"$WORK/podman.log"
check "stop: exit status 0 after podman stop" exit_code_0
"${PODMAN[@]}" logs "$NAME" > "$WORK/server.log" 2>&1 || true
check "stop: kda-server itself got the SIGTERM (its log says so)" grep -q 'SIGTERM: draining' "$WORK/server.log"
no_crash() { ! grep -Eiq 'segfault|sanitizer|core dumped|abort' "$WORK/server.log"; }
check "stop: logs hold no crash report" no_crash
note "last log lines:"; tail -n 3 "$WORK/server.log" | sed 's/^/      /'
"${PODMAN[@]}" rm -f -v "$NAME" > /dev/null 2>>"$WORK/podman.log"

# ------------------------------------------- /models volume + SIGTERM drain
# A volume on /models replaces the demo model, and flags after the image
# name reach the server. The checkpoint has a long context (--max-pos) so
# that the drain request below can be made to last seconds whatever the
# engine's speed.
mkdir -p "$WORK/models"
gen_long() {
    /usr/bin/python3 "$ROOT/scripts/gen_checkpoint.py" "$WORK/models" --preset tiny \
        --tokenizer bytes --max-pos 32768 > "$WORK/gen2.log" 2>&1 && chmod -R a+rX "$WORK"
}
check "volume: generate a long-context tiny checkpoint" gen_long || { cat "$WORK/gen2.log"; exit 1; }
check "volume: container starts with a model volume on /models" \
    start -v "$WORK/models:/models:ro" -e KDA_GRACE_SECONDS=60 "$IMAGE" --device cpu --max-batch 4 \
    || exit 1
check "volume: /health with a model mounted on /models" wait_health || exit 1
check "volume: the server was given --model /models" pid1_model /models

# A streamed request is in flight when SIGTERM arrives: the server must
# finish it (all its tokens, then [DONE]) and exit 0 on its own. Its length
# is ~1 s of decoding at the rate a 256-token probe shows (longer in fact:
# attention grows with the context), within the context and the 60 s grace.
ctx=$(curl -fsS -m 10 "$URL/v1/models" | /usr/bin/python3 -c \
      'import json, sys; print(json.load(sys.stdin)["data"][0]["max_model_len"])' 2>/dev/null || echo 512)
probe_s=$(curl -fsS -o /dev/null -w '%{time_total}' -m 60 "$URL/v1/completions" \
    -H 'Content-Type: application/json' -d '{"prompt": "Once", "max_tokens": 256, "ignore_eos": true}' \
    || echo 1)
n_drain=$(/usr/bin/python3 -c "print(int(min(max(256 * 1.0 / max($probe_s, 1e-3), 256), $ctx - 64)))")
note "drain request: $n_drain tokens (256 took $probe_s s; context $ctx)"
curl -sS -N -m 120 "$URL/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"prompt\": \"Once\", \"max_tokens\": $n_drain, \"ignore_eos\": true, \"stream\": true}" \
    > "$WORK/drain.txt" 2>&1 &
client=$!
for _ in $(seq 1 100); do grep -q '^data: {' "$WORK/drain.txt" 2>/dev/null && break; sleep 0.05; done
"${PODMAN[@]}" kill --signal TERM "$NAME" > /dev/null 2>>"$WORK/podman.log"
# Readiness must drop while draining, so a load balancer stops sending work.
not_ready() {
    local code
    for _ in $(seq 1 20); do
        code=$(curl -s -o /dev/null -w '%{http_code}' -m 2 "$URL/health" || true)
        [ "$code" != 200 ] && return 0
        sleep 0.1
    done
    return 1
}
check "drain: /health stops answering 200 while draining" not_ready
exited() {
    for _ in $(seq 1 180); do
        [ "$("${PODMAN[@]}" inspect --format '{{.State.Running}}' "$NAME")" = false ] && return 0
        sleep 0.5
    done
    return 1
}
check "drain: container exits on its own after SIGTERM (< 90 s)" exited
check "drain: exit status 0" exit_code_0
wait "$client" || true
"${PODMAN[@]}" logs "$NAME" > "$WORK/server2.log" 2>&1 || true
# The server's own count, not the client's view, says whether the request
# was still running when the signal came.
in_flight() { grep -Eq 'SIGTERM: draining \(.*[1-9][0-9]* sequences? pending' "$WORK/server2.log"; }
check "drain: the stream was in flight at SIGTERM (server log: sequences pending)" in_flight \
    || grep 'SIGTERM' "$WORK/server2.log"
drained() {
    grep -q '^data: \[DONE\]' "$WORK/drain.txt" \
        && grep '^data: {' "$WORK/drain.txt" | tail -n 1 | grep -q '"finish_reason":"length"'
}
check "drain: the in-flight stream got its last token and [DONE], not cut" drained \
    || tail -c 400 "$WORK/drain.txt"
note "last log lines:"; tail -n 3 "$WORK/server2.log" | sed 's/^/      /'
