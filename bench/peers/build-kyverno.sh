#!/usr/bin/env bash
# Build Kyverno (github.com/kyverno/kyverno, cmd/kyverno) from the Go module proxy,
# for the side-by-side benchmark (bench/peers, docs/benchmarks.md).
#
# Kyverno's go.mod carries a `replace` directive, so `go install pkg@version` refuses
# it: download the module, copy it to a writable work dir and `go build` there.
#
# Cache: ${ENVELOPE_PEERS_DIR:-$HOME/.cache/envelope/peers}/kyverno-<version>/
#   bin/kyverno   the binary
#   src/          the module source (its config/crds are installed by the bench)
# A cached binary is kept while bin/kyverno.stamp names the version and the binary's
# sha256 (kyverno has no --version flag, and -trimpath keeps -ldflags out of its build
# info).
# Progress goes to stderr; stdout is one line: the cache dir.
#
# Environment:
#   KYVERNO_VERSION       default v1.19.1
#   ENVELOPE_PEERS_DIR    cache root
#   ENVELOPE_PEERS_FORCE=1  rebuild even when cached
#   GOTOOLCHAIN           defaults to "local" (never download a toolchain); v1.19.1
#                         needs go >= 1.26.6
set -euo pipefail
shopt -s inherit_errexit

VERSION="${KYVERNO_VERSION:-v1.19.1}"
ROOT="${ENVELOPE_PEERS_DIR:-${HOME}/.cache/envelope/peers}"
DIR="${ROOT}/kyverno-${VERSION}"
BIN="${DIR}/bin"
SRC="${DIR}/src"
LOG="${DIR}/build.log"

log() { printf '[peers/build-kyverno.sh] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

command -v go >/dev/null 2>&1 || die "the Go toolchain ('go') is not on PATH"
mkdir -p "${BIN}"

exec 9>"${DIR}/.lock"
if command -v flock >/dev/null 2>&1; then
    flock 9
fi

export CGO_ENABLED=0
export GOFLAGS="-trimpath -buildvcs=false"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

built() {
    [[ "${ENVELOPE_PEERS_FORCE:-0}" != "1" && -x "${BIN}/kyverno" && -d "${SRC}/config/crds" ]] || return 1
    [[ -f "${BIN}/kyverno.stamp" ]] || return 1
    [[ "$(cat "${BIN}/kyverno.stamp")" == "${VERSION} $(sha256sum "${BIN}/kyverno" | cut -d' ' -f1)" ]]
}

if built; then
    log "kyverno ${VERSION}: cached"
    echo "${DIR}"
    exit 0
fi

start=$(date +%s)
log "downloading github.com/kyverno/kyverno@${VERSION} ..."
json="$(go mod download -json "github.com/kyverno/kyverno@${VERSION}")" \
    || die "could not download github.com/kyverno/kyverno@${VERSION}: ${json}"
moddir="$(printf '%s' "${json}" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
[[ -n "${moddir}" && -f "${moddir}/go.mod" ]] || die "no module dir in: ${json}"

# The module cache is read-only; the replace directive points inside the module.
rm -rf "${SRC}"
cp -r "${moddir}" "${SRC}"
chmod -R u+w "${SRC}"

# As Kyverno's Makefile: the version is stamped into pkg/version.BuildVersion.
ldflags="-s -w -X github.com/kyverno/kyverno/pkg/version.BuildVersion=${VERSION}"
log "building cmd/kyverno (log: ${LOG}) ..."
if ! (cd "${SRC}" && go build -ldflags "${ldflags}" -o "${BIN}/.kyverno.tmp" ./cmd/kyverno) >"${LOG}" 2>&1; then
    tail -n 40 "${LOG}" >&2 || true
    die "building kyverno failed; full log: ${LOG}"
fi
chmod 0755 "${BIN}/.kyverno.tmp"
mv -f "${BIN}/.kyverno.tmp" "${BIN}/kyverno"
echo "${VERSION} $(sha256sum "${BIN}/kyverno" | cut -d' ' -f1)" >"${BIN}/kyverno.stamp"
built || die "${BIN}/kyverno.stamp does not match the binary"
log "built kyverno ${VERSION} in $(($(date +%s) - start))s"
echo "${DIR}"
