#!/usr/bin/env bash
# The whole test suite: install what is missing, build, run every test
# (unit, verbs, and Debian's own binaries under softverbs), the docs'
# command blocks (scripts/doc-tests.py), build the
# Release type, then the same
# gtest suites under ASan+UBSan and under TSan, then time-boxed fuzz runs of
# the daemon's control-message decoding and of work-request validation.
# SOFTVERBS_SANITIZERS=0 skips the sanitizer builds; SOFTVERBS_FUZZ_SECONDS=0
# the fuzz run; SOFTVERBS_WR_FUZZ_SECONDS=0 the work-request fuzz run;
# SOFTVERBS_CM_FUZZ_SECONDS=0 the CM gateway's; SOFTVERBS_HOSTILE_SECONDS=0 the
# hostile-client fuzz stage.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh test
status=0
# CI shows only the last lines of this script's output: each failed stage
# leaves a digest (scripts/failure-digest.sh) that is printed at the end.
digests=$(mktemp)
stage() {  # stage NAME DIR CMD...: CMD in DIR, its output also kept for the digest
  local name=$1 dir=$2; shift 2
  local log="$PWD/$dir/stage-output.log"
  if (cd "$dir" && "$@") 2>&1 | tee "$log"; then return 0; fi
  scripts/failure-digest.sh "$name" "$log" >> "$digests"
  return 1
}
failed() { echo "-- $1" >> "$digests"; status=1; }
# Unity builds (several sources per compiler run): the three builds below
# are most of this script's time on a 2-CPU runner, and the sanitizer builds
# most of that (an ASan build took 23 CPU-minutes file by file).
unity=-DCMAKE_UNITY_BUILD=ON
# The tests run on a Release build (-O3: it finds warnings the others do
# not; GCC 12's -Wrestrict and maybe-uninitialized broke it once, unseen),
# with line tables (-g1) for the stacks a hung test prints. The sanitizer builds below are
# RelWithDebInfo: every build type CI builds is tested (issue 22, item 1).
# One build, not a tested RelWithDebInfo one and an untested Release one:
# three minutes of CI's time.
echo "== [${SECONDS} s] build and test (Release, -g1) =="
# /usr: the Debian packages install.deb makes from this build get the multiarch LIBDIR.
BUILD_TYPE=Release BUILD_DIR=build scripts/build.sh $unity -DCMAKE_INSTALL_PREFIX=/usr -DCMAKE_C_FLAGS=-g1 -DCMAKE_CXX_FLAGS=-g1
# No rerun of a failed test: a flaky test is a bug to find (issue 18).
stage "plain ctest" build ctest -j2 -LE docs --output-on-failure --timeout 120 || status=1
# The hostile-client fuzzer (tests/security/hostile_fuzz.cc) once more, on
# its own and longer than its ctest run: nobody against a victim of another
# uid and a prober, a fresh seed each run, printed (and in the digest) so
# that a failure replays with SOFTVERBS_HOSTILE_SEED.
if [ "${SOFTVERBS_HOSTILE_SECONDS:-60}" != 0 ]; then
  echo "== [${SECONDS} s] hostile-client fuzz (${SOFTVERBS_HOSTILE_SECONDS:-60} s) =="
  stage "hostile-client fuzz" build env SOFTVERBS_HOSTILE_SECONDS="${SOFTVERBS_HOSTILE_SECONDS:-60}" \
    timeout -k 10 600 tests/hostile_fuzz || status=1
fi
# The docs as tests (scripts/doc-tests.py): every command block of README.md,
# docs/CONTAINERS.md and the man pages' EXAMPLES, as written, with this
# build's softverbs first on PATH, as root and (blocks without sudo) as a
# made user (ctest docs.blocks, label docs; under 5 minutes). Not under the
# sanitizers: the docs' programs (Debian's ibv_devinfo, podman's images)
# load uninstrumented libraries only.
echo "== [${SECONDS} s] the docs' command blocks =="
stage "doc tests" build ctest -L docs --output-on-failure --timeout 300 || status=1
if [ "${SOFTVERBS_SANITIZERS:-1}" != 0 ]; then
  for san in address thread; do
    echo "== [${SECONDS} s] build and test with SANITIZE=$san (gtest suites) =="
    BUILD_DIR=build-$san scripts/build.sh -DSANITIZE=$san -DSOFTVERBS_BENCH=OFF $unity
    # The tests fork after the library started threads (as applications may):
    # TSan must not refuse to go on in the child. librdmacm keeps its device
    # contexts (and their watchdog threads) for the life of the process, as
    # rdma-core's does: threads still running at exit are not leaks here.
    stage "SANITIZE=$san ctest" build-$san env TSAN_OPTIONS="die_after_fork=0 report_thread_leaks=0 ${TSAN_OPTIONS:-}" \
       ctest -j2 -LE compat --output-on-failure --timeout 300 || status=1
  done
fi
if [ "${SOFTVERBS_FUZZ_SECONDS:-20}" != 0 ] && command -v clang++ >/dev/null; then
  echo "== [${SECONDS} s] fuzz: control messages (${SOFTVERBS_FUZZ_SECONDS:-20} s, libFuzzer + ASan/UBSan) =="
  cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DSOFTVERBS_FUZZ=ON $unity >/dev/null
  cmake --build build-fuzz --target control_fuzz -j"$(nproc)" >/dev/null
  work=$(mktemp -d)
  cp fuzz/corpus/control/* "$work/"
  if build-fuzz/fuzz/control_fuzz -max_total_time="${SOFTVERBS_FUZZ_SECONDS:-20}" -rss_limit_mb=4096 \
       -print_final_stats=1 "$work" fuzz/corpus/control > build-fuzz/fuzz.log 2>&1; then
    grep -E "^stat::number_of_executed_units|^Done" build-fuzz/fuzz.log || true
    echo "fuzz: no crash"
  else
    tail -40 build-fuzz/fuzz.log
    echo "fuzz: FAILED (the crashing input is in build-fuzz/, see above)"
    failed "fuzz found a crash (above)"
  fi
  rm -rf "$work"
fi
# Work requests and SGEs (fuzz/wr_fuzz.cc): its own time box, after the control fuzzer.
if [ "${SOFTVERBS_WR_FUZZ_SECONDS:-15}" != 0 ] && command -v clang++ >/dev/null; then
  echo "== [${SECONDS} s] fuzz: work requests and SGEs (${SOFTVERBS_WR_FUZZ_SECONDS:-15} s, libFuzzer + ASan/UBSan) =="
  cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DSOFTVERBS_FUZZ=ON $unity >/dev/null
  cmake --build build-fuzz --target wr_fuzz softverbsd -j"$(nproc)" >/dev/null
  work=$(mktemp -d)
  cp fuzz/corpus/wr/* "$work/"
  if (cd build-fuzz && fuzz/wr_fuzz -max_total_time="${SOFTVERBS_WR_FUZZ_SECONDS:-15}" -max_len=1024 \
        -rss_limit_mb=4096 -print_final_stats=1 "$work" ../fuzz/corpus/wr > wr_fuzz.log 2>&1); then
    grep -E "^stat::number_of_executed_units|^Done" build-fuzz/wr_fuzz.log || true
    echo "wr fuzz: no crash"
  else
    tail -40 build-fuzz/wr_fuzz.log
    echo "wr fuzz: FAILED (the crashing input is in build-fuzz/, see above)"
    failed "wr fuzz found a crash (above)"
  fi
  rm -rf "$work"
fi
# The CM gateway's MADs from the wire (fuzz/cm_fuzz.cc): its own time box.
if [ "${SOFTVERBS_CM_FUZZ_SECONDS:-10}" != 0 ] && command -v clang++ >/dev/null; then
  echo "== [${SECONDS} s] fuzz: CM MADs from the wire (${SOFTVERBS_CM_FUZZ_SECONDS:-10} s, libFuzzer + ASan/UBSan) =="
  cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DSOFTVERBS_FUZZ=ON $unity >/dev/null
  cmake --build build-fuzz --target cm_fuzz -j"$(nproc)" >/dev/null
  if build-fuzz/fuzz/cm_fuzz -max_total_time="${SOFTVERBS_CM_FUZZ_SECONDS:-10}" -max_len=1025 -rss_limit_mb=4096 \
       -print_final_stats=1 > build-fuzz/cm_fuzz.log 2>&1; then
    grep -E "^stat::number_of_executed_units|^Done" build-fuzz/cm_fuzz.log || true
    echo "cm fuzz: no crash"
  else
    tail -40 build-fuzz/cm_fuzz.log
    echo "cm fuzz: FAILED (the crashing input is in build-fuzz/, see above)"
    failed "cm fuzz found a crash (above)"
  fi
fi
echo "== [${SECONDS} s] summary =="
if [ "$status" = 0 ]; then echo "every stage passed"; else cat "$digests"; echo "FAILED"; fi
rm -f "$digests"
exit $status
