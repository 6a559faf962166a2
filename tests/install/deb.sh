#!/bin/bash
# install.deb (issue 22, items 3 and 8): the Debian packages built from the
# tree, in a clean Debian 12 root (debootstrap --variant=minbase bookworm),
# used from the installed files only:
#   1. cpack -G DEB from BUILD_DIR: softverbs and softverbs-dev, which
#      lintian passes without an error (its warnings are printed);
#   2. a minbase bookworm root with Debian's ibverbs-utils (made once with
#      debootstrap and kept in BUILD_DIR/debroot-cache; each run works on a
#      fresh copy);
#   3. apt-get install of both packages in a chroot: Depends resolved, the
#      files where they belong, softverbsd.socket enabled (deb-systemd-helper);
#   4. `softverbs run -- ibv_devices` and an ibv_rc_pingpong server and client
#      over 127.0.0.1, GID index 0 (scripts/demo.sh's commands);
#   5. upgrade: the same version again, then a bumped one (0.1.0-1 -> -2);
#      remove (not purge) and install again;
#   6. purge: nothing of softverbs left in /usr, /etc, /run, /opt, /var/lib
#      (the list of files before installing against the list after purging);
#   7. the CI recipe: scripts/ci-install.sh (action.yml's script) with the
#      package, then Debian's ibv_devinfo and an ibv_rc_pingpong pair with no
#      wrapper; purging undoes the machine-wide mode.
# Root only. The whole run is in a private mount namespace, so the root's
# /proc, /sys and /dev mounts vanish on every way out; processes left in the
# root are killed by pid and the copy removed.
# No network at all (no default route): skipped, saying so. A network that
# cannot reach the mirror: a failure (SOFTVERBS_DEBIAN_MIRROR picks another).
#   deb.sh BUILD_DIR SOURCE_DIR
set -u
inner_mode=0
if [ "${1:-}" = --inner ]; then inner_mode=1; shift; fi
build=$(cd "${1:?usage: $0 BUILD_DIR SOURCE_DIR}" && pwd)
src=$(cd "${2:?}" && pwd)
mirror=${SOFTVERBS_DEBIAN_MIRROR:-http://deb.debian.org/debian}
fail() { echo "FAIL: $*" >&2; exit 1; }
export SOFTVERBS_DEB_T0=${SOFTVERBS_DEB_T0:-$(date +%s)}
step() { echo "== [$(($(date +%s) - SOFTVERBS_DEB_T0)) s] $*"; }

inner() {
  # Runs in the private mount namespace: mounts the root's file systems,
  # then every step in the chroot.
  local root=$1 work=$2
  mount -t proc proc "$root/proc" || fail "mount proc"
  mount --rbind /sys "$root/sys" || fail "mount sys"
  # A clean runner has no RDMA devices of its own (`softverbs enable` refuses otherwise).
  [ -d "$root/sys/class/infiniband" ] && { mount -t tmpfs none "$root/sys/class/infiniband" || fail "hide infiniband"; }
  # The root's /dev: a tmpfs holding a bind mount (or the symlink) of each of
  # the host's entries but infiniband, so that the device node `softverbs
  # enable` makes (/dev/infiniband/uverbs0) is the root's, never the host's.
  mount -t tmpfs -o mode=755 rootdev "$root/dev" || fail "mount dev"
  local e n
  for e in /dev/* /dev/.[!.]*; do
    [ -e "$e" ] || [ -L "$e" ] || continue
    n=${e#/dev/}
    [ "$n" = infiniband ] && continue
    if [ -L "$e" ]; then cp -P "$e" "$root/dev/$n"
    elif [ -d "$e" ]; then mkdir "$root/dev/$n" && mount --rbind "$e" "$root/dev/$n"
    else : >"$root/dev/$n" && mount --bind "$e" "$root/dev/$n"
    fi || fail "bind /dev/$n"
  done
  mount -t tmpfs -o mode=1777 shm "$root/dev/shm" || fail "mount dev/shm"
  c() {  # runs a command in the root, with a clean environment
    chroot "$root" env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
      DEBIAN_FRONTEND=noninteractive SOFTVERBSD_IDLE=2 "$@"
  }
  apt() { c apt-get -y -q -o Dpkg::Use-Pty=0 --no-install-recommends "$@" >>"$work/apt.log" 2>&1 ||
            { tail -30 "$work/apt.log" >&2; fail "apt-get $*"; }; }
  snapshot() {  # every path a package could leave behind
    c find /usr /etc /run /opt /srv /var/lib -xdev \
      \( -path /var/lib/dpkg -o -path /var/lib/apt -o -path /var/lib/ucf -o -path /etc/ld.so.cache \) -prune \
      -o -print | LC_ALL=C sort
  }
  pingpong() {  # pingpong LABEL [WRAPPER...]: a server and a client on 127.0.0.1, GID 0
    local label=$1 port=$((20000 + RANDOM % 10000)) ok=1 i
    shift
    c "$@" ibv_rc_pingpong -g 0 -p $port -n 200 -s 4096 -c >"$work/server.out" 2>&1 &
    local server=$!
    for i in $(seq 50); do
      if c "$@" ibv_rc_pingpong -g 0 -p $port -n 200 -s 4096 -c 127.0.0.1 >"$work/client.out" 2>&1; then ok=0; break; fi
      sleep 0.2
    done
    wait $server || ok=1
    if [ $ok -ne 0 ] || ! grep -q "bytes in .* seconds" "$work/client.out" || ! grep -q "bytes in .* seconds" "$work/server.out"; then
      echo "-- client:"; cat "$work/client.out"; echo "-- server:"; cat "$work/server.out"
      fail "ibv_rc_pingpong ($label)"
    fi
    grep "iters in" "$work/client.out"
  }
  local deb=/tmp/pkgs/$(basename "$work"/pkgs/softverbs_*.deb) dev=/tmp/pkgs/$(basename "$work"/pkgs/softverbs-dev_*.deb)

  step "install: $(basename "$deb") $(basename "$dev")"
  snapshot >"$work/before.txt"
  apt install "$deb" "$dev"
  c dpkg-query -W -f='${Package} ${Version} ${Status}\n  Depends: ${Depends}\n' softverbs softverbs-dev
  c dpkg-query -W -f='${db:Status-Abbrev}' softverbs | grep -q '^ii' || fail "softverbs is not installed"
  local dep
  dep=$(c dpkg-query -W -f='${Depends}' softverbs)
  echo "$dep" | grep -q libc6 || fail "softverbs' Depends lack libc6 (shlibdeps): $dep"
  # GCC's C++ runtime is linked in (SOFTVERBS_STATIC_CXX_RUNTIME): the files
  # need the C library alone, in any glibc image they are mounted into.
  if echo "$dep" | grep -q 'libstdc++6\|libgcc-s1'; then fail "softverbs depends on GCC's C++ runtime: $dep"; fi
  c dpkg -L softverbs >"$work/files.txt"
  local f
  for f in /usr/bin/softverbs /usr/bin/softverbsd /usr/share/man/man1/softverbs.1.gz /usr/share/man/man8/softverbsd.8.gz \
           /usr/lib/systemd/system/softverbsd.socket /usr/lib/systemd/system/softverbsd.service \
           /usr/lib/systemd/user/softverbsd.socket /usr/lib/systemd/user/softverbsd.service; do
    grep -qx "$f" "$work/files.txt" || fail "softverbs does not install $f"
  done
  grep -Eq '^/usr/lib/([^/]+/)?softverbs/libibverbs\.so\.1$' "$work/files.txt" || fail "no private libibverbs.so.1"
  grep -Eq '^/usr/lib/([^/]+/)?softverbs/librdmacm\.so\.1$' "$work/files.txt" || fail "no private librdmacm.so.1"
  # (/usr/lib/softverbs is private too: a build configured with another prefix
  # than /usr has no multiarch LIBDIR)
  grep -E '^/usr/lib/([^/]+/)?lib(ibverbs|rdmacm)' "$work/files.txt" | grep -v '/softverbs/' &&
    fail "a drop-in library beside the machine's"
  c dpkg -L softverbs-dev | grep -q '/softverbs.pc$' || fail "softverbs-dev has no softverbs.pc"
  c dpkg -L softverbs-dev | grep -q '/usr/include/softverbs/softverbs.h$' || fail "softverbs-dev has no softverbs.h"
  # Debian's default for a packaged unit: enabled (started too where systemd runs).
  [ -L "$root/etc/systemd/system/sockets.target.wants/softverbsd.socket" ] || fail "softverbsd.socket is not enabled"

  step "demo from the installed files"
  c softverbs run -- ibv_devices >"$work/devices.out" 2>&1 || { cat "$work/devices.out"; fail "softverbs run -- ibv_devices"; }
  cat "$work/devices.out"
  grep -Eq '^[[:space:]]+sv0[[:space:]]' "$work/devices.out" || fail "ibv_devices does not list sv0"
  pingpong "softverbs run" softverbs run --
  c softverbs status | tee "$work/status.out"
  local pid exe
  pid=$(sed -n 's/^softverbsd (pid \([0-9]*\)).*/\1/p' "$work/status.out")
  exe=$(readlink "/proc/${pid:-0}/exe")
  [ "$exe" = "$root/usr/bin/softverbsd" ] || fail "the daemon that served is ${exe:-none}, not the installed /usr/bin/softverbsd"

  step "upgrade: the same version again"
  apt install --reinstall "$deb" "$dev"
  step "upgrade: a bumped version"
  local v v2 p
  v=$(c dpkg-query -W -f='${Version}' softverbs)
  v2=${v%-*}-$((${v##*-} + 1))
  for p in softverbs softverbs-dev; do
    rm -rf "$work/repack"
    dpkg-deb -R "$work/pkgs/${p}_${v}_"*.deb "$work/repack" || fail "dpkg-deb -R $p"
    sed -i -e "s/^Version: .*/Version: $v2/" -e "s/(= $v)/(= $v2)/" "$work/repack/DEBIAN/control"
    dpkg-deb --root-owner-group -b "$work/repack" "$root/tmp/pkgs/${p}_${v2}.deb" >/dev/null || fail "dpkg-deb -b $p"
  done
  apt install "/tmp/pkgs/softverbs_${v2}.deb" "/tmp/pkgs/softverbs-dev_${v2}.deb"
  [ "$(c dpkg-query -W -f='${Version}' softverbs)" = "$v2" ] || fail "not upgraded to $v2"
  [ -L "$root/etc/systemd/system/sockets.target.wants/softverbsd.socket" ] || fail "the upgrade lost the socket's enablement"
  c softverbs run -- ibv_devices | grep -q sv0 || fail "ibv_devices after the upgrade"

  step "remove (not purge), then install again"
  apt remove softverbs-dev softverbs
  [ "$(c dpkg-query -W -f='${db:Status-Abbrev}' softverbs)" = "rc " ] || fail "softverbs is not in state rc after remove"
  [ -e "$root/usr/bin/softverbs" ] && fail "remove left /usr/bin/softverbs"
  # As Debian does for a removed unit: masked, its enablement kept for a reinstallation.
  [ "$(readlink "$root/etc/systemd/system/softverbsd.socket")" = /dev/null ] || fail "the removed unit is not masked"
  apt install "/tmp/pkgs/softverbs_${v2}.deb" "/tmp/pkgs/softverbs-dev_${v2}.deb"
  [ -L "$root/etc/systemd/system/softverbsd.socket" ] && fail "the reinstalled unit is still masked"
  [ -L "$root/etc/systemd/system/sockets.target.wants/softverbsd.socket" ] || fail "the reinstallation lost the enablement"

  step "purge"
  sleep 3  # SOFTVERBSD_IDLE=2: the daemons exit
  apt purge softverbs softverbs-dev
  apt autoremove --purge
  c dpkg-query -W softverbs 2>/dev/null | grep -q . && fail "softverbs still known to dpkg"
  snapshot >"$work/after.txt"
  # New paths that no installed package owns (softverbs-dev's dependencies
  # may stay: ibverbs-providers, which libibverbs1 recommends, is not
  # autoremoved), and paths that were there before and are gone.
  LC_ALL=C comm -13 "$work/before.txt" "$work/after.txt" >"$work/new.txt"
  : >"$work/left.txt"
  if [ -s "$work/new.txt" ]; then
    xargs -a "$work/new.txt" chroot "$root" dpkg-query -S >/dev/null 2>"$work/unowned.txt"
    sed -n 's/^dpkg-query: no path found matching pattern //p' "$work/unowned.txt" | sed 's/^/left: /' >"$work/left.txt"
  fi
  LC_ALL=C comm -23 "$work/before.txt" "$work/after.txt" | sed 's/^/gone: /' >>"$work/left.txt"
  if [ -s "$work/left.txt" ]; then
    cat "$work/left.txt"
    fail "purge left the above behind (left: not there before installing; gone: there before, not after)"
  fi
  echo "purged: nothing left ($(wc -l <"$work/new.txt") new paths, all of packages still installed)"

  step "CI recipe: scripts/ci-install.sh $deb, then no wrapper"
  mkdir -p "$root/tmp/ci/scripts"
  cp "$src/scripts/ci-install.sh" "$src/scripts/deps.sh" "$src/scripts/package.sh" "$root/tmp/ci/scripts/"
  c /tmp/ci/scripts/ci-install.sh "$deb" >"$work/ci.out" 2>&1 || { cat "$work/ci.out"; fail "scripts/ci-install.sh"; }
  cat "$work/ci.out"
  c ldd /usr/bin/ibv_devinfo | grep -q "libibverbs.so.1 => /usr/lib/.*softverbs/libibverbs.so.1" ||
    fail "ibv_devinfo does not load softverbs' libibverbs: $(c ldd /usr/bin/ibv_devinfo | grep verbs)"
  c ibv_devinfo >"$work/devinfo.out" 2>&1 || { cat "$work/devinfo.out"; fail "ibv_devinfo, unwrapped"; }
  grep -Eq '^hca_id:[[:space:]]+sv0$' "$work/devinfo.out" || { cat "$work/devinfo.out"; fail "ibv_devinfo does not list sv0"; }
  grep -Eq 'state:[[:space:]]+PORT_ACTIVE' "$work/devinfo.out" || fail "ibv_devinfo: port not active"
  echo "ibv_devinfo (no wrapper): hca_id sv0, PORT_ACTIVE"
  [ -c "$root/dev/infiniband/uverbs0" ] || fail "the machine-wide mode made no /dev/infiniband/uverbs0"
  pingpong "no wrapper"
  sleep 3
  apt purge softverbs
  [ -e "$root/etc/ld.so.conf.d/00-softverbs.conf" ] && fail "purge left the machine-wide mode's file"
  [ -e "$root/etc/tmpfiles.d/softverbs.conf" ] && fail "purge left the machine-wide mode's tmpfiles.d entry"
  [ -e "$root/dev/infiniband/uverbs0" ] && fail "purge left the device node /dev/infiniband/uverbs0"
  c ldd /usr/bin/ibv_devinfo | grep -q softverbs && fail "ibv_devinfo still loads softverbs after purge"
  step "done"
}

if [ $inner_mode = 0 ]; then
  [ "$(id -u)" -eq 0 ] || { echo "SKIP: not root (debootstrap, chroot and dpkg in a root)" >&2; exit 77; }
  for tool in debootstrap dpkg-deb dpkg-shlibdeps cpack chroot unshare lintian; do
    command -v $tool >/dev/null || fail "no $tool (scripts/deps.sh test installs it)"
  done
  if [ -z "$(ip route show default 2>/dev/null)$(ip -6 route show default 2>/dev/null)" ]; then
    echo "SKIP: this machine has no network at all (no default route): debootstrap cannot fetch Debian" >&2
    exit 77
  fi
  # debootstrap's and apt's downloads would wait minutes on a mirror that
  # does not answer: ask it first, briefly, and say so.
  command -v wget >/dev/null || fail "no wget (debootstrap needs it)"
  err=$(wget -nv -T 15 -t 2 -O /dev/null "$mirror/dists/bookworm/InRelease" 2>&1)
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "$err" >&2
    fail "this machine has a network but cannot reach the Debian mirror $mirror (wget exit $rc: 4 network, 8 server error); set SOFTVERBS_DEBIAN_MIRROR to one it can reach"
  fi
  work=$(mktemp -d /tmp/softverbs-deb.XXXXXX)
  root=$work/root
  cleanup() {
    local p
    for p in /proc/[0-9]*; do  # processes left in the root (a daemon): by pid
      [ "$(readlink "$p/root" 2>/dev/null)" = "$root" ] && kill -9 "${p#/proc/}" 2>/dev/null
    done
    # The mounts were in the namespace only; never remove through a mount.
    if grep -q " $root/" /proc/self/mountinfo; then
      echo "warning: mounts left under $root; not removed" >&2
    else
      rm -rf "$work"
    fi
  }
  trap cleanup EXIT
  trap 'exit 143' TERM INT HUP

  step "packages: cpack -G DEB from $build"
  mkdir -p "$work/pkgs"
  cpack --config "$build/CPackConfig.cmake" -B "$work/cpack" >"$work/cpack.log" 2>&1 || { cat "$work/cpack.log"; fail "cpack"; }
  cp "$work"/cpack/softverbs*.deb "$work/pkgs/" || fail "cpack made no packages"
  ls -l "$work/pkgs"
  dpkg-deb -f "$work"/pkgs/softverbs_*.deb Depends
  # Debian policy as lintian checks it: an error fails, warnings are listed.
  step "lintian"
  command -v lintian >/dev/null || fail "no lintian (scripts/deps.sh test installs it)"
  lintian --no-tag-display-limit "$work"/pkgs/*.deb >"$work/lintian.log" 2>&1
  cat "$work/lintian.log"
  grep -q '^E: ' "$work/lintian.log" && fail "lintian reports errors (E: above)"

  cache=$build/debroot-cache/bookworm
  if [ ! -x "$cache/usr/bin/ibv_devinfo" ]; then
    step "a clean root: debootstrap --variant=minbase bookworm $mirror (kept in $cache)"
    rm -rf "$cache.tmp"
    mkdir -p "$(dirname "$cache")"
    if ! debootstrap --variant=minbase bookworm "$cache.tmp" "$mirror" >"$work/debootstrap.log" 2>&1; then
      tail -20 "$work/debootstrap.log" >&2
      rm -rf "$cache.tmp"
      fail "debootstrap could not make a bookworm root from $mirror (the network or the mirror; SOFTVERBS_DEBIAN_MIRROR)"
    fi
    cp /etc/resolv.conf "$cache.tmp/etc/resolv.conf"
    chroot "$cache.tmp" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
      sh -c 'apt-get -q update && apt-get -y -q install --no-install-recommends ibverbs-utils && apt-get clean' \
      >"$work/utils.log" 2>&1 || { tail -20 "$work/utils.log" >&2; rm -rf "$cache.tmp"; fail "apt-get install ibverbs-utils"; }
    mv "$cache.tmp" "$cache"
  fi
  step "a fresh copy of the clean root"
  cp -a "$cache" "$root" || fail "cp -a $cache"
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  mkdir -p "$root/tmp/pkgs"
  cp "$work"/pkgs/*.deb "$root/tmp/pkgs/"
  unshare --mount --propagation private "$0" --inner "$build" "$src" "$root" "$work"
  rc=$?
  [ $rc -eq 0 ] && echo "install.deb: passed in $(($(date +%s) - SOFTVERBS_DEB_T0)) s"
  exit $rc
fi
inner "$3" "$4"
