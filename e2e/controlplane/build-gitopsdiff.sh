#!/usr/bin/env bash
# Build e2e/gitopsdiff (Argo CD's diff code, the gitops-engine pkg/diff package, run
# against a live API server) for e2e/test_gitops_drift.py.
#
# The gitops-engine version is the one Argo CD v3.2.12 builds with (its go.mod requires
# the standalone module github.com/argoproj/gitops-engine at that pseudo-version, with
# no replace); Argo CD v3.3 and later vendor it in-tree (replace => ./gitops-engine,
# module path github.com/argoproj/argo-cd/gitops-engine), which the Go module proxy
# cannot serve on its own, and v3.6's go.mod needs Go >= 1.27. e2e/gitopsdiff/go.mod
# and go.sum pin every module; the binary is cached outside the clone, keyed by the
# engine version and a hash of the sources:
#   ${ENVELOPE_CONTROLPLANE_DIR:-$HOME/.cache/envelope/controlplane}/gitopsdiff-<engine>-<hash>/bin/gitopsdiff
# Progress goes to stderr; the only line on stdout is the bin directory:
#   BIN=$(bash e2e/controlplane/build-gitopsdiff.sh | tail -1)
# It also links Argo CD's ignoreDifferences normalizer (github.com/argoproj/argo-cd/v3
# util/argo/normalizers at v3.2.12). A cold build took ~15 minutes for gitops-engine and
# ~35 more for argo-cd's packages on this busy 2-core machine (shared with seven other
# jobs); with warm Go caches it links in ~20 s; cached, nothing is built.
#
# Environment:
#   ENVELOPE_CONTROLPLANE_DIR     cache root (default ~/.cache/envelope/controlplane)
#   ENVELOPE_GITOPSDIFF_FORCE=1   rebuild even if cached
#   GOTOOLCHAIN                   defaults to "local" (never download a toolchain)
set -euo pipefail
shopt -s inherit_errexit

log() { printf '[controlplane/build-gitopsdiff.sh] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SRC="${HERE}/../gitopsdiff"
command -v go >/dev/null 2>&1 || die "the Go toolchain ('go') is not on PATH; it is needed to build gitopsdiff"
ENGINE="$(awk '$1 == "github.com/argoproj/gitops-engine" {print $2; exit}' "${SRC}/go.mod")"
[[ -n "${ENGINE}" ]] || die "${SRC}/go.mod does not require github.com/argoproj/gitops-engine"
HASH="$(cat "${SRC}/main.go" "${SRC}/go.mod" "${SRC}/go.sum" | sha256sum | cut -c1-12)"

ROOT="${ENVELOPE_CONTROLPLANE_DIR:-${HOME}/.cache/envelope/controlplane}"
DIR="${ROOT}/gitopsdiff-${ENGINE}-${HASH}"
BIN="${DIR}/bin"
mkdir -p "${BIN}"
exec 9>"${DIR}/.lock"
if command -v flock >/dev/null 2>&1; then
    flock 9
fi

if [[ "${ENVELOPE_GITOPSDIFF_FORCE:-0}" != "1" && -x "${BIN}/gitopsdiff" ]] \
        && [[ "$("${BIN}/gitopsdiff" version 2>/dev/null)" == "${ENGINE}" ]]; then
    printf '%s\n' "${BIN}"
    exit 0
fi

export CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false -mod=readonly" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
start=$(date +%s)
log "building gitopsdiff against github.com/argoproj/gitops-engine@${ENGINE} ..."
tmp="$(mktemp "${DIR}/.gitopsdiff.XXXXXX")"
trap 'rm -f "${tmp}"' EXIT
(cd "${SRC}" && go build -ldflags "-s -w -X main.EngineVersion=${ENGINE}" -o "${tmp}" .) >&2
mv -f "${tmp}" "${BIN}/gitopsdiff"
[[ "$("${BIN}/gitopsdiff" version)" == "${ENGINE}" ]] || die "gitopsdiff does not report ${ENGINE}"
log "built gitopsdiff in $(( $(date +%s) - start ))s"
printf '%s\n' "${BIN}"
