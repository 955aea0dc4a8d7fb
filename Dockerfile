# syntax=docker/dockerfile:1
# Envelope admission webhook.
#   make image                                  # docker, podman or buildah, whichever works
#   docker run --rm envelope:0.1.0 --help                      # envelope serve --help
#   docker run --rm -i --entrypoint envelope envelope:0.1.0 check -f - < deploy.yaml
# The Helm chart (charts/envelope) runs it as `envelope serve ...` with UID 65532 and a
# read-only root filesystem.
#
# Reproducible: the base image is pinned by digest (override with
# --build-arg PYTHON_IMAGE=...; refresh with `docker buildx imagetools inspect
# python:3.11-slim`), and every Python package is installed from requirements.lock with
# its sha256 (pip --require-hashes; `make lock` regenerates it from pyproject.toml), so two
# builds a week apart ship the same code.

ARG PYTHON_IMAGE=python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7

# ---- build: a virtualenv with Envelope and its dependencies (wheels only) ----
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ONLY_BINARY=:all:
WORKDIR /src
RUN python -m venv /opt/envelope
# The locked dependencies first (a layer that changes only with the lock), then Envelope
# itself without resolving anything (--no-deps: nothing outside the lock is installed).
COPY requirements.lock ./
RUN /opt/envelope/bin/pip install --no-compile --require-hashes --no-deps -r requirements.lock
COPY pyproject.toml README.md ./
COPY app ./app
RUN /opt/envelope/bin/pip install --no-compile --no-deps --no-build-isolation . \
    && /opt/envelope/bin/pip check \
    && /opt/envelope/bin/python -m compileall -q /opt/envelope/lib

# ---- runtime: the same slim Python, the virtualenv, nothing else ----
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="envelope" \
      org.opencontainers.image.description="Kubernetes admission webhook that keeps resource envelopes consistent" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/envelope /opt/envelope
ENV PATH=/opt/envelope/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# Numeric non-root UID/GID, so runAsNonRoot can be verified without /etc/passwd.
USER 65532:65532
EXPOSE 8443 9090
ENTRYPOINT ["envelope", "serve"]
