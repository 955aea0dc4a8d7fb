#!/usr/bin/env bash
# Build promtool (Prometheus' rule and config checker) from the upstream Go module, to
# check the chart's PrometheusRule (tests/chart/test_chart.py, e2e marker).
#
# Prometheus v3.X.Y is published as the Go module github.com/prometheus/prometheus at
# v0.3XX.Y (its go.mod has no replace directives, so `go install` builds it as is).
# The binary is cached outside the clone:
#   ${ENVELOPE_PROMTOOL_DIR:-$HOME/.cache/envelope/promtool}/<version>-remove_all_sd/bin/promtool
# and not rebuilt while it reports the pinned version. Progress goes to stderr; the
# only line on stdout is the bin directory: `BIN=$(bash e2e/controlplane/build-promtool.sh | tail -1)`.
#
# Environment:
#   ENVELOPE_PROMTOOL_DIR       cache root (default ~/.cache/envelope/promtool)
#   ENVELOPE_PROMTOOL_FORCE=1   rebuild even if cached
#   GOTOOLCHAIN                 defaults to "local" (never download a toolchain)
set -euo pipefail
shopt -s inherit_errexit

PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v3.16.0}"

log() { printf '[controlplane/build-promtool.sh] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

command -v go >/dev/null 2>&1 || die "the Go toolchain ('go') is not on PATH; it is needed to build promtool"
ver="${PROMETHEUS_VERSION#v}"
[[ "${ver}" =~ ^3\.([0-9]+)\.([0-9]+)$ ]] || die "PROMETHEUS_VERSION must look like v3.16.0, got '${PROMETHEUS_VERSION}'"
MODULE_VERSION="v0.3$(printf '%02d' "${BASH_REMATCH[1]}").${BASH_REMATCH[2]}"

ROOT="${ENVELOPE_PROMTOOL_DIR:-${HOME}/.cache/envelope/promtool}"
# Built with Prometheus' own `remove_all_sd` tag: no service-discovery plugins (AWS, Azure,
# GCE, Kubernetes, ...), which `check rules` and `test rules` never use; a cold build takes
# ~2 minutes instead of ~6.
DIR="${ROOT}/${PROMETHEUS_VERSION}-remove_all_sd"
BIN="${DIR}/bin"
mkdir -p "${BIN}"
exec 9>"${DIR}/.lock"
if command -v flock >/dev/null 2>&1; then
    flock 9
fi

if [[ "${ENVELOPE_PROMTOOL_FORCE:-0}" != "1" && -x "${BIN}/promtool" ]] \
        && "${BIN}/promtool" --version 2>&1 | grep -q "version ${ver} "; then
    printf '%s\n' "${BIN}"
    exit 0
fi

export CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
start=$(date +%s)
log "building promtool ${PROMETHEUS_VERSION} (module github.com/prometheus/prometheus@${MODULE_VERSION}) ..."
tmp="$(mktemp -d "${DIR}/.gobin.XXXXXX")"
trap 'rm -rf "${tmp}"' EXIT
GOBIN="${tmp}" go install -tags remove_all_sd -ldflags "-s -w \
    -X github.com/prometheus/common/version.Version=${ver} \
    -X github.com/prometheus/common/version.Branch=HEAD \
    -X github.com/prometheus/common/version.Revision=${MODULE_VERSION}" \
    "github.com/prometheus/prometheus/cmd/promtool@${MODULE_VERSION}" >&2
mv -f "${tmp}/promtool" "${BIN}/promtool"
"${BIN}/promtool" --version 2>&1 | grep -q "version ${ver} " || die "promtool does not report version ${ver}"
log "built promtool in $(( $(date +%s) - start ))s"
printf '%s\n' "${BIN}"
