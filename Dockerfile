# syntax=docker/dockerfile:1
# Envelope admission webhook.
#   docker build -t envelope:0.1.0 .
#   docker run --rm envelope:0.1.0 --help                      # envelope serve --help
#   docker run --rm -i --entrypoint envelope envelope:0.1.0 check -f - < deploy.yaml
# The Helm chart (charts/envelope) runs it as `envelope serve ...` with UID 65532 and a
# read-only root filesystem.

ARG PYTHON_IMAGE=python:3.11-slim

# ---- build: a virtualenv with Envelope and its dependencies (wheels only) ----
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ONLY_BINARY=:all:
WORKDIR /src
RUN python -m venv /opt/envelope
COPY pyproject.toml README.md ./
COPY app ./app
RUN /opt/envelope/bin/pip install --no-compile . \
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
