# kda-server container image: a build stage with the toolchain and a slim
# runtime stage with only the binaries, the shared libraries they link to and
# the demo model. See deploy/README.md for running it.
#
# GPU (default; NVIDIA hosts with the NVIDIA Container Toolkit):
#   docker build -t kda-server:cuda .
# CPU, from plain Debian 12:
#   docker build -t kda-server:cpu --build-arg BUILD_IMAGE=docker.io/library/debian:12 \
#     --build-arg RUNTIME_IMAGE=docker.io/library/debian:12-slim --build-arg KDA_CUDA=disabled .
# With podman/buildah pass --format docker: the OCI format has no HEALTHCHECK.

# CUDA 12.x runs on drivers >= 525 (minor-version compatibility) and targets
# sm_90a (H100/H200); CUDA 13 needs drivers >= 580. Ubuntu 24.04 is the first
# Ubuntu with meson >= 1.0.
ARG CUDA_VERSION=12.8.1
ARG BUILD_IMAGE=docker.io/nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04
ARG RUNTIME_IMAGE=docker.io/nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04

# ---------------------------------------------------------------- build stage
FROM ${BUILD_IMAGE} AS build
# enabled | disabled | auto: -Dcuda for meson. The CUDA devel image has nvcc.
ARG KDA_CUDA=enabled
# nvcc target flags; empty keeps meson_options.txt's default (sm_90a).
ARG NVCC_GENCODE=
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      meson ninja-build pkg-config gcc g++ binutils \
      libmicrohttpd-dev libcjson-dev libsentencepiece-dev \
 && rm -rf /var/lib/apt/lists/*

# The source comes last so that editing it does not refetch the toolchain.
# .dockerignore keeps build dirs, tests and tooling out of the context.
WORKDIR /src
COPY . .
RUN meson setup /build -Dbuildtype=release -Dcuda=${KDA_CUDA} -Dserver=enabled \
      -Dtests=disabled ${NVCC_GENCODE:+"-Dnvcc_gencode=${NVCC_GENCODE}"} \
 && ninja -C /build \
 && mkdir -p /out/bin \
 && cp /build/server/kda-server /build/cli/kda-cli /out/bin/ \
 && strip /out/bin/* \
 && sh deploy/runtime-packages.sh /out/bin/* > /out/runtime-packages.txt \
 && echo "runtime packages: $(cat /out/runtime-packages.txt | tr '\n' ' ')"

# -------------------------------------------------------------- runtime stage
FROM ${RUNTIME_IMAGE} AS runtime
ENV DEBIAN_FRONTEND=noninteractive
COPY --from=build /out/runtime-packages.txt /tmp/runtime-packages.txt
# Only the packages the base lacks: `apt-get install` of one already there
# would upgrade it, and a newer libcublas would add a second copy of it.
RUN missing=$(for p in $(cat /tmp/runtime-packages.txt); do \
        dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || echo "$p"; done) \
 && if [ -n "$missing" ]; then \
        echo "installing: $missing" \
        && apt-get update && apt-get install -y --no-install-recommends $missing \
        && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin; \
    fi \
 && rm /tmp/runtime-packages.txt \
 && useradd --system --uid 10001 --user-group --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin kda

COPY --from=build /out/bin/ /usr/local/bin/
COPY deploy/entrypoint.sh /usr/local/bin/kda-entrypoint
# Fail the build here, not at first start, if a library is missing. libcuda
# is the driver's: the NVIDIA Container Toolkit mounts it at run time.
RUN ! ldd /usr/local/bin/kda-server /usr/local/bin/kda-cli \
      | grep 'not found' | grep -v 'libcuda\.so'

# The demo model; a volume on /models or --model / KDA_MODEL replace it.
COPY models/demo/ /opt/kda/models/demo/
RUN mkdir -p /models && chown 10001:10001 /models
VOLUME /models

# Defaults the entrypoint turns into flags; every KDA_* is optional.
# auto: CUDA when the GPU image finds a GPU, else the CPU backend.
ENV KDA_HOST=0.0.0.0 \
    KDA_PORT=8080 \
    KDA_DEVICE=auto \
    KDA_DEMO_MODEL=/opt/kda/models/demo
EXPOSE 8080

# A numeric UID lets Kubernetes' runAsNonRoot check it without /etc/passwd.
USER 10001:10001
WORKDIR /tmp

# bash's /dev/tcp: no curl in the image. Runs beside the daemon, not as PID 1.
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/${KDA_PORT:-8080} && printf 'GET /health HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3 && head -n1 <&3 | grep -q ' 200'"]

# The entrypoint execs kda-server, which then is PID 1 and gets SIGTERM
# itself; it drains in-flight requests (--grace-seconds) and exits 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/kda-entrypoint"]
CMD []
