#!/usr/bin/env bash
# Build the e2e control plane (kube-apiserver, kube-scheduler, kube-controller-manager,
# etcd, kubectl, helm) from the upstream Go modules pinned in versions.env.
#
# Binaries go to a cache directory outside the clone:
#   ${ENVELOPE_CONTROLPLANE_DIR:-$HOME/.cache/envelope/controlplane}/<key>/bin/
# where <key> encodes the pinned versions. A binary that already exists there
# and reports the expected version is not rebuilt, so a warm run takes about a
# second. All progress goes to stderr; the only line on stdout is the bin
# directory, so `BIN=$(e2e/controlplane/build.sh | tail -1)` works.
#
# Environment:
#   ENVELOPE_CONTROLPLANE_DIR   cache root (default ~/.cache/envelope/controlplane)
#   ENVELOPE_CONTROLPLANE_FORCE=1  rebuild every binary even if it is cached
#   ENVELOPE_CONTROLPLANE_CACHED_ONLY=1  build nothing: exit 3 if a binary is not cached
#                               (`make unit`, which needs no control plane, uses it)
#   ENVELOPE_CONTROLPLANE_APISERVER_ONLY=vX.Y.Z  build only kube-apiserver, at that version,
#                               under its own cache key (the KEP-6060 caller-token e2e runs
#                               TOKEN_KUBERNETES_VERSION from versions.env; etcd stays the
#                               pinned one)
#   ENVELOPE_CONTROLPLANE_KUBERNETES=vX.Y.Z  build the Kubernetes binaries (kube-apiserver,
#                               kube-scheduler, kube-controller-manager, kubectl) at that
#                               version under their own cache key: the second minor of the
#                               version matrix (SECOND_KUBERNETES_VERSION). etcd and helm are
#                               built there too (the same pinned versions: from the Go build
#                               cache, seconds), so either bin dir is a whole control plane.
#                               A pre-release (v1.38.0-beta.0, NEXT_KUBERNETES_VERSION) is built
#                               the same way from its v0.38.0-beta.0 staging modules; its Go
#                               toolchain comes from GOTOOLCHAIN (see below).
#   ENVELOPE_CONTROLPLANE_KUBELET=1  build only the kubelet (for the e2e node,
#                               e2e/harness/node.py), at KUBERNETES_VERSION (or
#                               ENVELOPE_CONTROLPLANE_KUBERNETES), under its own cache key, so
#                               adding it never rebuilds the control plane. `make test` builds
#                               it in the background prebuild.
#   GOTOOLCHAIN                 defaults to "local" (never download a toolchain). A Kubernetes
#                               whose go.mod needs a newer Go than the local one (1.38 needs
#                               Go 1.27) is built with GOTOOLCHAIN=<NEXT_GOTOOLCHAIN> exported
#                               (`make e2e-next` does): the go command then takes that
#                               toolchain from the module proxy.
#
# Only the Go toolchain and the Go module proxy are needed: no Docker, no
# prebuilt release downloads.
set -euo pipefail
shopt -s inherit_errexit

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=SCRIPTDIR/versions.env
source "${HERE}/versions.env"

: "${KUBERNETES_VERSION:?versions.env must set KUBERNETES_VERSION}"
: "${ETCD_VERSION:?versions.env must set ETCD_VERSION}"
: "${HELM_VERSION:?versions.env must set HELM_VERSION}"
: "${CONTROLPLANE_RECIPE:?versions.env must set CONTROLPLANE_RECIPE}"
APISERVER_ONLY="${ENVELOPE_CONTROLPLANE_APISERVER_ONLY:-}"
if [[ -n "${APISERVER_ONLY}" ]]; then
    KUBERNETES_VERSION="${APISERVER_ONLY}"
fi
KUBERNETES_ONLY="${ENVELOPE_CONTROLPLANE_KUBERNETES:-}"
if [[ -n "${KUBERNETES_ONLY}" ]]; then
    KUBERNETES_VERSION="${KUBERNETES_ONLY}"
fi
KUBELET_ONLY="${ENVELOPE_CONTROLPLANE_KUBELET:-0}"

log() { printf '[controlplane/build.sh] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

if ! command -v go >/dev/null 2>&1; then
    die "the Go toolchain ('go') is not on PATH; it is needed to build the e2e control plane (see docs/testing.md)"
fi

# vMAJOR.MINOR.PATCH[-PRERELEASE] -> parts; staging modules are published as
# v0.MINOR.PATCH[-PRERELEASE] (v1.38.0-beta.0 -> v0.38.0-beta.0).
k8s_ver="${KUBERNETES_VERSION#v}"
if [[ ! "${k8s_ver}" =~ ^([0-9]+)\.([0-9]+)\.([0-9]+)(-(alpha|beta|rc)\.[0-9]+)?$ ]]; then
    die "KUBERNETES_VERSION must look like v1.34.2 or v1.38.0-beta.0, got '${KUBERNETES_VERSION}'"
fi
K8S_MAJOR="${BASH_REMATCH[1]}"
K8S_MINOR="${BASH_REMATCH[2]}"
K8S_PATCH="${BASH_REMATCH[3]}"
K8S_PRERELEASE="${BASH_REMATCH[4]}"
STAGING_VERSION="v0.${K8S_MINOR}.${K8S_PATCH}${K8S_PRERELEASE}"

KEY="k8s-${KUBERNETES_VERSION}_etcd-${ETCD_VERSION}_helm-${HELM_VERSION}_r${CONTROLPLANE_RECIPE}"
if [[ "${KUBELET_ONLY}" == "1" ]]; then
    KEY="kubelet-${KUBERNETES_VERSION}_r${CONTROLPLANE_RECIPE}"
elif [[ -n "${APISERVER_ONLY}" ]]; then
    KEY="kube-apiserver-${KUBERNETES_VERSION}_r${CONTROLPLANE_RECIPE}"
elif [[ -n "${KUBERNETES_ONLY}" ]]; then
    KEY="kubernetes-${KUBERNETES_VERSION}_r${CONTROLPLANE_RECIPE}"
fi
ROOT="${ENVELOPE_CONTROLPLANE_DIR:-${HOME}/.cache/envelope/controlplane}"
DIR="${ROOT}/${KEY}"
BIN="${DIR}/bin"
WORK="${DIR}/work"
LOGS="${DIR}/logs"
mkdir -p "${BIN}" "${WORK}" "${LOGS}"

# Serialise concurrent invocations (parallel test runs) on the same cache key.
exec 9>"${DIR}/.lock"
if command -v flock >/dev/null 2>&1; then
    flock 9
fi

export CGO_ENABLED=0
export GOFLAGS="-trimpath -buildvcs=false"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
# GOPATH, GOMODCACHE and GOCACHE stay at their defaults (outside the clone).

TIMES="${DIR}/build-times.log"

# reports_version BINARY EXPECTED ARGS... : the binary exists, runs, and prints EXPECTED.
reports_version() {
    local bin="$1" expected="$2"
    shift 2
    [[ -x "${bin}" ]] || return 1
    local out
    out="$("${bin}" "$@" 2>&1)" || return 1
    [[ "${out}" == *"${expected}"* ]]
}

# is_built BINARY EXPECTED ARGS... : cached and usable (unless a rebuild is forced).
is_built() {
    [[ "${ENVELOPE_CONTROLPLANE_FORCE:-0}" == "1" ]] && return 1
    reports_version "$@"
}

# timed NAME FUNCTION : run FUNCTION, log the wall-clock time.
timed() {
    local name="$1" fn="$2" start end
    start=$(date +%s)
    log "building ${name} (log: ${LOGS}/${name}.log) ..."
    # Not in an `if`: errexit must stay in force inside the build function.
    local rc=0
    set +e
    (set -e; "${fn}") >"${LOGS}/${name}.log" 2>&1
    rc=$?
    set -e
    if [[ "${rc}" != 0 ]]; then
        tail -n 40 "${LOGS}/${name}.log" >&2 || true
        die "building ${name} failed (exit ${rc}); full log: ${LOGS}/${name}.log"
    fi
    end=$(date +%s)
    log "built ${name} in $((end - start))s"
    printf '%s\t%s\t%ss\tgo=%s\tnproc=%s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "${name}" \
        "$((end - start))" "$(go env GOVERSION)" "$(nproc 2>/dev/null || echo '?')" >>"${TIMES}"
}

# k8s_ldflags : version ldflags as set by upstream hack/lib/version.sh.
k8s_ldflags() {
    local flags="-s -w" pkg
    for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
        flags+=" -X ${pkg}.gitVersion=${KUBERNETES_VERSION}"
        flags+=" -X ${pkg}.gitMajor=${K8S_MAJOR}"
        flags+=" -X ${pkg}.gitMinor=${K8S_MINOR}"
        flags+=" -X ${pkg}.gitTreeState=clean"
    done
    printf '%s' "${flags}"
}

# module_gomod MODULE@VERSION : download the module, print the path of its go.mod.
module_gomod() {
    local json gomod
    if ! json="$(go mod download -json "$1" 2>&1)"; then
        die "could not download $1: $(printf '%s' "${json}" | sed -n 's/^[[:space:]]*"Error": "\(.*\)",\{0,1\}$/\1/p')"
    fi
    gomod="$(printf '%s' "${json}" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
    [[ -n "${gomod}" && -f "${gomod}" ]] || die "could not find the go.mod of $1 in: ${json}"
    printf '%s' "${gomod}"
}

# fresh_workdir NAME : an empty work dir holding our main.go for NAME.
fresh_workdir() {
    local w="${WORK}/$1"
    rm -rf "${w}"
    mkdir -p "${w}"
    cp "${HERE}/$1/main.go" "${w}/main.go"
    printf '%s' "${w}"
}

install_bin() { # install_bin TMPFILE NAME
    chmod 0755 "$1"
    mv -f "$1" "${BIN}/$2"
}

# ------------------------------------------------- kube-apiserver, kube-scheduler
# build_kubernetes_cmd NAME : build k8s.io/kubernetes cmd/NAME through our main.go
# for NAME, in its own work dir with a go.mod generated from upstream's. Both
# commands use the same generated requirements, so the second build reuses most
# of the first one's compiled packages from the Go build cache.
build_kubernetes_cmd() {
    local name="$1" w upstream
    w="$(fresh_workdir "${name}")"
    upstream="$(module_gomod "k8s.io/kubernetes@${KUBERNETES_VERSION}")"
    echo "upstream go.mod: ${upstream}"
    # k8s.io/kubernetes cannot be required as is: its go.mod replaces every
    # k8s.io/* staging module with ./staging/src/... Generate a go.mod that
    # requires it and replaces each staging module with its published version.
    {
        echo "// Code generated by e2e/controlplane/build.sh from the go.mod of"
        echo "// k8s.io/kubernetes@${KUBERNETES_VERSION}. DO NOT EDIT."
        echo
        echo "module envelope.local/e2e/controlplane/${name}"
        echo
        awk '$1 == "go" { print; exit }' "${upstream}"
        awk 'inb { print; if ($0 ~ /^\)/) inb = 0; next }
             /^godebug[ \t]*\(/ { print; inb = 1; next }
             /^godebug[ \t]/ { print }' "${upstream}"
        echo
        echo "require k8s.io/kubernetes ${KUBERNETES_VERSION}"
        echo
        echo "replace ("
        awk -v v="${STAGING_VERSION}" \
            '$2 == "=>" && $3 ~ /^\.\/staging\// { printf "\t%s => %s %s\n", $1, $1, v }' "${upstream}"
        echo ")"
    } >"${w}/go.mod"
    grep -q "=> k8s.io/api ${STAGING_VERSION}" "${w}/go.mod" \
        || die "no staging replace directives found in ${upstream}"
    cat "${w}/go.mod"
    (cd "${w}" && go mod tidy && go build -ldflags "$(k8s_ldflags)" -o "${BIN}/.${name}.tmp" .)
    install_bin "${BIN}/.${name}.tmp" "${name}"
}

build_kube_apiserver() { build_kubernetes_cmd kube-apiserver; }
build_kube_scheduler() { build_kubernetes_cmd kube-scheduler; }
build_kube_controller_manager() { build_kubernetes_cmd kube-controller-manager; }
build_kubelet() { build_kubernetes_cmd kubelet; }

# ------------------------------------------------------------- etcd, kubectl
# A module of our own (its main.go is copied in by fresh_workdir) that requires one
# upstream module: go.mod is made here, not committed.
build_small_module() {
    local name="$1" requirement="$2" ldflags="$3" w
    w="$(fresh_workdir "${name}")"
    (
        cd "${w}"
        go mod init "envelope.local/e2e/controlplane/${name}"
        go get "${requirement}"
        go mod tidy
        go build -ldflags "${ldflags}" -o "${BIN}/.${name}.tmp" .
    )
    install_bin "${BIN}/.${name}.tmp" "${name}"
}

build_etcd() {
    build_small_module etcd "go.etcd.io/etcd/server/v3@${ETCD_VERSION}" "-s -w"
}

build_kubectl() {
    build_small_module kubectl "k8s.io/kubectl@${STAGING_VERSION}" "$(k8s_ldflags)"
}

# ---------------------------------------------------------------------- helm
build_helm() {
    local gomod client_go major minor flags gobin
    gomod="$(module_gomod "helm.sh/helm/v3@${HELM_VERSION}")"
    # As helm's Makefile: the Kubernetes version helm assumes offline (lint,
    # template's .Capabilities) is derived from its k8s.io/client-go version.
    client_go="$(awk '$1 == "k8s.io/client-go" { print $2; exit }' "${gomod}")"
    [[ "${client_go}" =~ ^v0\.([0-9]+)\. ]] || die "cannot find k8s.io/client-go in ${gomod}"
    major=1
    minor="${BASH_REMATCH[1]}"
    echo "helm ${HELM_VERSION} uses k8s.io/client-go ${client_go} -> Kubernetes ${major}.${minor}"
    flags="-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}"
    flags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
    flags+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=${major}"
    flags+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=${minor}"
    flags+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=${major}"
    flags+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=${minor}"
    # Builds of one cache key are serialised by the lock above, so a fixed dir is safe.
    gobin="${WORK}/helm-gobin"
    rm -rf "${gobin}"
    mkdir -p "${gobin}"
    # helm's go.mod has no replace directives, so `go install pkg@version`
    # builds it with exactly its own pinned dependencies.
    GOBIN="${gobin}" go install -ldflags "${flags}" "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"
    install_bin "${gobin}/helm" helm
    rm -rf "${gobin}"
}

total_start=$(date +%s)
built_any=0

# ensure NAME BUILD_FUNCTION VERSION EXPECTED ARGS... : keep ${BIN}/NAME when `NAME ARGS`
# prints EXPECTED; otherwise build it with BUILD_FUNCTION and check that it now does.
ensure() {
    local name="$1" fn="$2" version="$3" expected="$4"
    shift 4
    if is_built "${BIN}/${name}" "${expected}" "$@"; then
        log "${name} ${version}: cached"
        return
    fi
    if [[ "${ENVELOPE_CONTROLPLANE_CACHED_ONLY:-0}" == "1" ]]; then
        log "${name} ${version} is not built (ENVELOPE_CONTROLPLANE_CACHED_ONLY=1); run make controlplane"
        exit 3
    fi
    timed "${name}" "${fn}"
    built_any=1
    reports_version "${BIN}/${name}" "${expected}" "$@" \
        || die "${name} $* does not report ${version}"
}

if [[ "${KUBELET_ONLY}" == "1" ]]; then
    ensure kubelet build_kubelet "${KUBERNETES_VERSION}" "Kubernetes ${KUBERNETES_VERSION}" --version
    echo "${BIN}"
    exit 0
fi
# Slowest first, so a failure there shows early. One at a time (2 cores).
ensure kube-apiserver build_kube_apiserver "${KUBERNETES_VERSION}" "Kubernetes ${KUBERNETES_VERSION}" --version
if [[ -n "${APISERVER_ONLY}" ]]; then
    echo "${BIN}"
    exit 0
fi
ensure kube-scheduler build_kube_scheduler "${KUBERNETES_VERSION}" "Kubernetes ${KUBERNETES_VERSION}" --version
ensure kube-controller-manager build_kube_controller_manager "${KUBERNETES_VERSION}" \
    "Kubernetes ${KUBERNETES_VERSION}" --version
ensure kubectl build_kubectl "${KUBERNETES_VERSION}" "${KUBERNETES_VERSION}" version --client
# etcd and helm are the same pinned versions under every key: take them from the
# default key when it holds them (another Go toolchain, e.g. 1.38's, would otherwise
# rebuild both from a cold build cache for nothing).
DEFAULT_BIN="${ROOT}/k8s-$(sed -n 's/^KUBERNETES_VERSION=//p' "${HERE}/versions.env")_etcd-${ETCD_VERSION}_helm-${HELM_VERSION}_r${CONTROLPLANE_RECIPE}/bin"
reuse() { # reuse NAME EXPECTED ARGS... : copy NAME from the default key if it reports EXPECTED
    local name="$1"
    shift
    if [[ "${DEFAULT_BIN}" != "${BIN}" ]] && ! is_built "${BIN}/${name}" "$@" \
        && is_built "${DEFAULT_BIN}/${name}" "$@"; then
        cp -f "${DEFAULT_BIN}/${name}" "${BIN}/.${name}.tmp"
        install_bin "${BIN}/.${name}.tmp" "${name}"
        log "${name}: copied from ${DEFAULT_BIN}"
    fi
}
reuse etcd "etcd Version: ${ETCD_VERSION#v}" --version
reuse helm "${HELM_VERSION}" version --short
ensure etcd build_etcd "${ETCD_VERSION}" "etcd Version: ${ETCD_VERSION#v}" --version
ensure helm build_helm "${HELM_VERSION}" "${HELM_VERSION}" version --short

if [[ "${built_any}" == "1" ]]; then
    log "control plane built in $(($(date +%s) - total_start))s (times: ${TIMES})"
fi

echo "${BIN}"
