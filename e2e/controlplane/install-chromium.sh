#!/usr/bin/env bash
# Install headless Chromium from Debian's own archive (the `chromium` package), for the
# browser test of `envelope quotas -o html` (tests/quotaview/test_browser.py).
#
# No download outside the package registry: `apt-get install` from the configured Debian
# mirror; `apt-get update` only when the install fails (stale lists). Concurrent callers
# wait on one lock, like build.sh and build-promtool.sh. The only line on stdout is the
# path of the browser: `CHROMIUM=$(bash e2e/controlplane/install-chromium.sh | tail -1)`.
#
# Environment:
#   ENVELOPE_CHROMIUM       use this browser binary instead (nothing is installed)
#   ENVELOPE_CHROMIUM_LOCK  lock file (default ~/.cache/envelope/chromium.lock)
set -euo pipefail

log() { printf '[controlplane/install-chromium.sh] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

find_browser() {
    if [[ -n "${ENVELOPE_CHROMIUM:-}" ]]; then
        [[ -x "${ENVELOPE_CHROMIUM}" ]] || die "ENVELOPE_CHROMIUM=${ENVELOPE_CHROMIUM} is not executable"
        printf '%s\n' "${ENVELOPE_CHROMIUM}"
        return 0
    fi
    local name
    for name in chromium chromium-browser chromium-headless-shell; do
        if command -v "${name}" >/dev/null 2>&1; then
            command -v "${name}"
            return 0
        fi
    done
    return 1
}

if find_browser; then
    exit 0
fi

LOCK="${ENVELOPE_CHROMIUM_LOCK:-${HOME}/.cache/envelope/chromium.lock}"
mkdir -p "$(dirname "${LOCK}")"
exec 9>"${LOCK}"
if command -v flock >/dev/null 2>&1; then
    flock 9
fi
if find_browser; then  # another caller installed it while we waited
    exit 0
fi

command -v apt-get >/dev/null 2>&1 || die "no chromium on PATH and no apt-get to install it; set ENVELOPE_CHROMIUM"
[[ "$(id -u)" == 0 ]] || die "no chromium on PATH; installing it needs root (apt-get install -y chromium)"
export DEBIAN_FRONTEND=noninteractive
log "installing chromium from the Debian archive"
if ! apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core >&2; then
    log "install failed; refreshing the package lists once"
    apt-get update -q >&2
    apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core >&2
fi
find_browser || die "apt-get installed chromium but no chromium binary is on PATH"
