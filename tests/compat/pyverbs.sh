#!/bin/bash
# compat.pyverbs: rdma-core's own test suite (its Python tests/, run with
# run_tests.py on pyverbs), as Debian's python3-pyverbs ships it in
# /usr/share/doc/rdma-core/tests (rdma-core v44.0; some files gzipped). The
# files are unpacked to this test's directory, nothing of them is in the
# project. Debian's own python3 runs them (pyverbs is built for it). Passes
# when unittest reports no failure and no error; prints every skip with its
# reason (docs/COMPAT.md explains them).
#   pyverbs.sh BIN_DIR
. "$(dirname "$0")/lib.sh"

SRC=/usr/share/doc/rdma-core/tests
PY=/usr/bin/python3
if [ ! -f "$SRC/run_tests.py" ] || [ ! -x "$PY" ] || ! "$PY" -c 'import pyverbs' 2>/dev/null; then
  log "SKIP: rdma-core's tests need python3-pyverbs ($SRC) and $PY"
  exit $SKIP
fi
compat_setup
# Unpacked as run_tests.py expects them: the package `tests` next to its
# runner, gzipped modules restored.
work="$COMPAT_DIR/rdma-core"
mkdir -p "$work" && cp -r "$SRC" "$work/tests" || { fail "cannot copy $SRC"; finish; }
find "$work/tests" -name '*.gz' -exec gunzip -f {} + || fail "gunzip failed"
out="$COMPAT_DIR/pyverbs.out"
(cd "$work" && PYTHONDONTWRITEBYTECODE=1 sv_run "$PY" tests/run_tests.py -v) >"$out" 2>&1
rc=$?
# unittest's summary: "Ran N tests in T s", then "OK (skipped=S)" or
# "FAILED (failures=F, errors=E, skipped=S)".
ran=$(grep -E '^Ran [0-9]+ tests? in ' "$out" | tail -n 1)
verdict=$(grep -E '^(OK|FAILED)( \(.*\))?$' "$out" | tail -n 1)
if [ -z "$ran" ] || [ -z "$verdict" ]; then
  fail "run_tests.py (exit $rc) printed no unittest summary"
else
  log "pyverbs: $ran: $verdict"
  case $verdict in
  OK*) [ "$rc" -eq 0 ] || fail "run_tests.py said OK but exited $rc" ;;
  *) fail "rdma-core's tests: $verdict" ;;
  esac
fi
# The skips, one line per reason with its count.
log "pyverbs: skipped, by reason:"
grep -Eo "\.\.\. skipped .*" "$out" | sed -E 's/^\.\.\. skipped //' | sort | uniq -c | sort -rn >&2
if [ "$_compat_failures" -ne 0 ]; then
  grep -E -A 30 '^(ERROR|FAIL): ' "$out" >&2 || show run_tests.py "$out"
fi
finish
