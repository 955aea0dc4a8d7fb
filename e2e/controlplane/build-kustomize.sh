#!/usr/bin/env bash
# Build kustomize from the upstream Go module, to run `envelope krm-fn` as a real
# exec KRM function (tests/fix/test_krmfn.py, e2e marker: `kustomize build
# --enable-alpha-plugins --enable-exec` with a `transformers:` function config).
#
# kustomize is published as the Go module sigs.k8s.io/kustomize/kustomize/v5 (tags
# kustomize/v5.X.Y); `go install` builds it as is. The binary is cached outside the clone:
#   ${ENVELOPE_CONTROLPLANE_DIR:-$HOME/.cache/envelope/controlplane}/kustomize-<version>/bin/kustomize
# and not rebuilt while it reports the pinned version. Progress goes to stderr; the only
# line on stdout is the bin directory: `BIN=$(bash e2e/controlplane/build-kustomize.sh | tail -1)`.
#
# Environment:
#   KUSTOMIZE_VERSION            default v5.8.1
#   ENVELOPE_CONTROLPLANE_DIR    cache root (default ~/.cache/envelope/controlplane)
#   ENVELOPE_KUSTOMIZE_FORCE=1   rebuild even if cached
#   GOTOOLCHAIN                  defaults to "local" (never download a toolchain)
set -euo pipefail
shopt -s inherit_errexit

KUSTOMIZE_VERSION="${KUSTOMIZE_VERSION:-v5.8.1}"

log() { printf '[controlplane/build-kustomize.sh] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

command -v go >/dev/null 2>&1 || die "the Go toolchain ('go') is not on PATH; it is needed to build kustomize"
[[ "${KUSTOMIZE_VERSION}" =~ ^v5\.[0-9]+\.[0-9]+$ ]] || die "KUSTOMIZE_VERSION must look like v5.8.1, got '${KUSTOMIZE_VERSION}'"

ROOT="${ENVELOPE_CONTROLPLANE_DIR:-${HOME}/.cache/envelope/controlplane}"
DIR="${ROOT}/kustomize-${KUSTOMIZE_VERSION}"
BIN="${DIR}/bin"
mkdir -p "${BIN}"
exec 9>"${DIR}/.lock"
if command -v flock >/dev/null 2>&1; then
    flock 9
fi

reports_version() { "${BIN}/kustomize" version 2>/dev/null | grep -q "${KUSTOMIZE_VERSION}"; }

if [[ "${ENVELOPE_KUSTOMIZE_FORCE:-0}" != "1" && -x "${BIN}/kustomize" ]] && reports_version; then
    printf '%s\n' "${BIN}"
    exit 0
fi

export CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
start=$(date +%s)
log "building kustomize ${KUSTOMIZE_VERSION} (module sigs.k8s.io/kustomize/kustomize/v5@${KUSTOMIZE_VERSION}) ..."
tmp="$(mktemp -d "${DIR}/.gobin.XXXXXX")"
trap 'rm -rf "${tmp}"' EXIT
# kustomize's `version` reads provenance.version, set by its release builds with -X.
GOBIN="${tmp}" go install -ldflags "-s -w \
    -X sigs.k8s.io/kustomize/api/provenance.version=${KUSTOMIZE_VERSION}" \
    "sigs.k8s.io/kustomize/kustomize/v5@${KUSTOMIZE_VERSION}" >&2
mv -f "${tmp}/kustomize" "${BIN}/kustomize"
reports_version || die "kustomize does not report version ${KUSTOMIZE_VERSION}: $("${BIN}/kustomize" version 2>&1)"
log "built kustomize in $(( $(date +%s) - start ))s"
printf '%s\n' "${BIN}"
