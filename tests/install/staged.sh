#!/bin/bash
# install.staged (issue 22, item 2): `cmake --install` into a staging
# directory (DESTDIR), then use of the staged files only:
#   - the layout: tool and daemon in bin, the drop-in libraries in a private
#     directory (never beside the machine's libibverbs), headers, man pages,
#     softverbs.pc, the CMake package;
#   - an svx_* program (svx_hello.c) compiled with `pkg-config --cflags
#     --libs softverbs` (PKG_CONFIG_SYSROOT_DIR and PKG_CONFIG_LIBDIR into
#     the stage) and with find_package(softverbs), each run under the staged
#     `softverbs run`, and Debian's ibv_devinfo too;
#   - the daemon that served them is the staged softverbsd.
# The source and build trees are hidden (a tmpfs mounted over each in a
# private mount namespace) while the staged files are used, and the
# environment is empty but for PATH: any use of the build tree fails.
#   staged.sh BUILD_DIR SOURCE_DIR C_COMPILER VERSION [CMAKE]
set -u
build=$(cd "${1:?usage: $0 BUILD_DIR SOURCE_DIR C_COMPILER VERSION}" && pwd)
src=$(cd "${2:?}" && pwd)
cc=${3:?}
version=${4:?}
cmake=${5:-cmake}
here=$(cd "$(dirname "$0")" && pwd)

stage=$(mktemp -d /tmp/softverbs-stage.XXXXXX)
daemon_pids=()
cleanup() {
  local p
  for p in "${daemon_pids[@]}"; do kill "$p" 2>/dev/null; done
  rm -rf "$stage"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# 1. Install, one component after the other, under the prefix a package
# would use (not the configured one: the paths are worked out at install time
# or relative to each binary).
for c in runtime dev; do
  DESTDIR=$stage/root "$cmake" --install "$build" --prefix /usr --component $c >"$stage/install-$c.log" 2>&1 ||
    { cat "$stage/install-$c.log" >&2; fail "cmake --install --component $c"; }
done
root=$stage/root
sv=$(find "$root" -path '*/bin/softverbs' -type f)
[ -n "$sv" ] || fail "no bin/softverbs in the stage"
prefix=${sv%/bin/softverbs}
pc=$(find "$root" -name softverbs.pc)
privlib=$(dirname "$(find "$root" -name libibverbs.so.1)")
[ "$(basename "$privlib")" = softverbs ] || fail "libibverbs.so.1 is in $privlib, not in a private softverbs/ directory"
libdir=$(dirname "$privlib")
[ -n "$(find "$libdir" -maxdepth 1 -name 'lib*verbs*' -o -maxdepth 1 -name 'librdmacm*')" ] &&
  fail "a drop-in library is directly in $libdir: it would shadow the machine's"
for f in lib/systemd/system/softverbsd.socket lib/systemd/system/softverbsd.service \
         lib/systemd/user/softverbsd.socket lib/systemd/user/softverbsd.service; do
  [ -e "$prefix/$f" ] || fail "not installed: $f"
done
for f in bin/softverbsd share/man/man1/softverbs.1 share/man/man8/softverbsd.8 share/man/man3/svx_open.3 \
         include/softverbs/softverbs.h include/softverbs/softverbs.hpp; do
  [ -e "$prefix/$f" ] || fail "not installed: $f"
done
for f in librdmacm.so.1 libibverbs.so; do
  [ -e "$privlib/$f" ] || fail "not installed: $privlib/$f"
done
[ -n "$(find "$root" -name softverbsConfig.cmake)" ] || fail "no softverbsConfig.cmake"
[ -n "$pc" ] || fail "no softverbs.pc"

# 2. Use the staged files only.
mkdir -m 0700 "$stage/daemon"
mkdir "$stage/work"
cp "$here/svx_hello.c" "$stage/work/"
cp -r "$here/find_package" "$stage/work/"
cat >"$stage/use.sh" <<INNER
#!/bin/bash
set -eu
cd "$stage/work"
# pkg-config finds only the stage's softverbs.pc; what it gives points into the stage.
flags=\$(pkg-config --cflags --libs softverbs)
echo "pkg-config: \$flags"
case "\$flags" in *"-I$root"*"-L$root"*) ;; *) echo "pkg-config flags do not point into the stage" >&2; exit 1 ;; esac
[ "\$(pkg-config --modversion softverbs)" = "$version" ]
"$cc" -std=c11 -Wall -Werror svx_hello.c \$flags -o svx_hello
"$sv" run ./svx_hello
"$sv" run ibv_devinfo
# find_package(softverbs): the imported target softverbs::softverbs.
"$cmake" -S find_package -B find_package/build -DCMAKE_C_COMPILER="$cc" -DCMAKE_PREFIX_PATH="$prefix" \
  -DSVX_HELLO_SOURCE="$stage/work/svx_hello.c" >cmake.log 2>&1 || { cat cmake.log >&2; exit 1; }
"$cmake" --build find_package/build >>cmake.log 2>&1 || { cat cmake.log >&2; exit 1; }
"$sv" run ./find_package/build/svx_hello_cmake
"$sv" status
INNER
chmod +x "$stage/use.sh"

hide="mount -t tmpfs softverbs-hidden '$src'"
case "$build/" in "$src/"*) ;; *) hide="$hide && mount -t tmpfs softverbs-hidden '$build'" ;; esac
userns=()
[ "$(id -u)" -ne 0 ] && userns=(--user --map-root-user)
if ! unshare "${userns[@]}" --mount true 2>/dev/null; then
  echo "SKIP: no private mount namespace here (unshare), so the build tree cannot be hidden" >&2
  exit 77
fi
# run_hidden OUT VAR=VALUE... SCRIPT: runs SCRIPT with only PATH and the
# given variables in its environment, in a private mount namespace where
# the source and build trees are hidden; its output in OUT. Records the pid
# of the daemon that `softverbs status` printed, to kill it at the end.
run_hidden() {
  local out=$1 rc pid
  shift
  env -i PATH=/usr/bin:/bin HOME="$stage" "${@:1:$#-1}" \
    unshare "${userns[@]}" --mount --propagation private \
    sh -c "$hide && [ ! -e '$build/bin/softverbs' ] && exec '${*: -1}'" >"$out" 2>&1
  rc=$?
  pid=$(sed -n 's/^softverbsd (pid \([0-9]*\)).*/\1/p' "$out")
  [ -n "$pid" ] && daemon_pids+=("$pid")
  [ $rc -eq 0 ] || { cat "$out" >&2; fail "$(basename "${*: -1}") failed (exit $rc)"; }
}
out=$stage/use.out
run_hidden "$out" SOFTVERBS_DIR="$stage/daemon" PKG_CONFIG_SYSROOT_DIR="$root" PKG_CONFIG_LIBDIR="$(dirname "$pc")" \
  "$stage/use.sh"
daemon_pid=${daemon_pids[0]:-0}

# 3. What they printed.
check() {  # check DESCRIPTION EXTENDED-REGEX
  grep -Eq "$2" "$out" || { cat "$out" >&2; fail "$1 (want /$2/)"; }
}
check "the pkg-config build of svx_hello ran" '^svx_hello: sv0: published and opened /install-test/cq$'
[ "$(grep -c '^svx_hello: sv0: published and opened' "$out")" -eq 2 ] || fail "the find_package build of svx_hello did not run"
grep -q 'softverbs run: warning' "$out" && { cat "$out" >&2; fail "softverbs run did not find the staged libraries"; }
check "ibv_devinfo lists sv0" '^hca_id:[[:space:]]+sv0$'
check "ibv_devinfo: port active" 'state:[[:space:]]+PORT_ACTIVE'
check "status names the staged daemon directory" "^softverbsd \(pid [0-9]+\) at $stage/daemon\$"
exe=$(readlink "/proc/$daemon_pid/exe")
[ "$exe" = "$prefix/bin/softverbsd" ] || fail "the daemon that served is $exe, not the staged $prefix/bin/softverbsd"
# 4. Installed for real (no DESTDIR) under another prefix: a program built
# with pkg-config runs on softverbs with no wrapper, through the rpath, and
# the library starts the daemon installed beside it (found relative to the
# library: no SOFTVERBSD, no PATH).
direct=$stage/direct
for c in runtime dev; do
  "$cmake" --install "$build" --prefix "$direct" --component $c >"$stage/direct-$c.log" 2>&1 ||
    { cat "$stage/direct-$c.log" >&2; fail "cmake --install --prefix $direct --component $c"; }
done
mkdir -m 0700 "$stage/daemon2"
cat >"$stage/direct.sh" <<INNER
#!/bin/bash
set -eu
cd "$stage/work"
"$cc" -std=c11 -Wall -Werror svx_hello.c \$(pkg-config --cflags --libs softverbs) -o svx_direct
./svx_direct
"$direct/bin/softverbs" status
INNER
chmod +x "$stage/direct.sh"
out2=$stage/direct.out
run_hidden "$out2" SOFTVERBS_DIR="$stage/daemon2" PKG_CONFIG_LIBDIR="$(dirname "$(find "$direct" -name softverbs.pc)")" \
  "$stage/direct.sh"
grep -q '^svx_hello: sv0: published and opened /install-test/cq$' "$out2" ||
  { cat "$out2" >&2; fail "the program linked through softverbs.pc did not run on softverbs without a wrapper"; }
exe=$(readlink "/proc/${daemon_pids[1]:-0}/exe")
[ "$exe" = "$direct/bin/softverbsd" ] || fail "the library started $exe, not $direct/bin/softverbsd"

echo "install.staged: passed (prefix ${prefix#"$root"}, private libraries ${privlib#"$root"})"
