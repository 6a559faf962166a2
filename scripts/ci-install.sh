#!/usr/bin/env bash
# The CI recipe (issue 22, item 8; the GitHub action in action.yml runs
# this): installs softverbs on a Debian or Ubuntu machine and enables it
# machine-wide, so that every program (ibv_devinfo, a project's own tests)
# gets the software RDMA device sv0 with no wrapper.
#   scripts/ci-install.sh [PACKAGE.deb]     (or SOFTVERBS_PACKAGE=PACKAGE.deb)
# With no package, builds one from this tree first (scripts/deps.sh package,
# scripts/package.sh into BUILD_DIR, default build-pkg). Installs it with
# apt (its Depends from the distribution), then `softverbs enable`
# (SOFTVERBS_FORCE=1: `enable --force`, for a machine with RDMA devices of
# its own), then checks that the loader now finds softverbs' libibverbs.so.1
# first (and lists the devices if ibv_devinfo is installed). Root, or sudo.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
SUDO=()
[ "$(id -u)" -ne 0 ] && SUDO=(sudo)
deb=${1:-${SOFTVERBS_PACKAGE:-}}
if [ -z "$deb" ]; then
  "$here/deps.sh" package
  deb=$("$here/package.sh" | grep '/softverbs_[^/]*\.deb$')
fi
[ -f "$deb" ] || { echo "softverbs ci-install: no package $deb" >&2; exit 1; }
deb=$(cd "$(dirname "$deb")" && pwd)/$(basename "$deb")
echo "softverbs ci-install: installing $deb"
install() {
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$deb" >/dev/null
}
# Package lists may be missing or stale on a fresh runner: update only if needed.
install || { "${SUDO[@]}" apt-get update -qq && install; }
force=()
[ "${SOFTVERBS_FORCE:-0}" = 1 ] && force=(--force)
"${SUDO[@]}" softverbs enable "${force[@]}"
# The loader takes the first entry of its cache for a name. The cache is
# read whole first: `ldconfig -p | grep -m1` under pipefail failed now and
# then (grep left at its first match, and ldconfig, still writing the
# cache's last lines, died of SIGPIPE: install.deb's one flake).
cache=$(/sbin/ldconfig -p)
first=$(grep -m1 'libibverbs\.so\.1 ' <<<"$cache" || true)
[[ "$first" == */softverbs/libibverbs.so.1 ]] || {
  echo "softverbs ci-install: the loader does not find softverbs' libibverbs.so.1 first:" >&2
  grep 'libibverbs\.so' <<<"$cache" >&2
  ls -l /etc/ld.so.conf.d >&2
  exit 1
}
if command -v ibv_devinfo >/dev/null; then ibv_devinfo -l; fi
